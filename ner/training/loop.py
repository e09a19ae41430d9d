"""The one training loop, written only against the Backend protocol (ner/backends/__init__.py).

Loss normalisation: each update's loss is the sum of token losses over every micro-batch on
every rank, divided by the number of labelled tokens in all of them. Each rank scales its part
by world size because DDP averages gradients. So 2 ranks x 1 micro-batch, 1 rank x 2
micro-batches, and 1 rank x 1 double batch give the same gradient, to float rounding.
"""

from __future__ import annotations

import contextlib
import logging
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LRScheduler

from ner.backends import Backend
from ner.data.encode import IGNORE_INDEX, model_inputs

log = logging.getLogger(__name__)

@dataclass
class TrainState:
    """Where training stands; JSON-safe so it goes into every checkpoint as is."""

    global_step: int = 0
    epoch: int = 0
    batches_done: int = 0  # micro-batches this rank has consumed in `epoch`
    best_f1: float | None = None
    best_step: int | None = None
    step_losses: list[float] = field(default_factory=list)
    step_batches: list[int] = field(default_factory=list)  # crc32 of each update's sentence ids (rank 0)
    eval_history: list[dict] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)  # fp16 overflow: no optimizer or scheduler step
    evals_without_improvement: int = 0  # the early-stopping patience counter
    stop_reason: str | None = None  # set when training ends before its planned length

    def to_dict(self) -> dict:
        return asdict(self)


def token_loss_sum(model: torch.nn.Module, batch: dict, backend: Backend) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over labelled tokens, and the logits."""
    with backend.autocast():
        logits = model(**model_inputs(batch)).logits
    # Loss in fp32 outside the model: under nn.DataParallel this sees the gathered logits
    # of all replicas, so the reduction is over the whole batch, like the other backends.
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(),
                               ignore_index=IGNORE_INDEX, reduction="sum")
    return loss_sum, logits


def train_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 micro_batches: list[dict], backend: Backend, max_grad_norm: float) -> tuple[float, bool]:
    """One optimizer update over this rank's micro-batches.

    Returns the global mean token loss, and whether the weights changed: under fp16 an update
    whose gradients overflowed is skipped, and then the schedule must not advance either.
    """
    local_tokens = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in micro_batches)
    global_tokens = backend.reduce_sum(torch.tensor(float(local_tokens), device=backend.device)).item()
    scale = backend.num_processes / max(global_tokens, 1.0)
    loss_total = torch.zeros((), device=backend.device)
    for i, batch in enumerate(micro_batches):
        is_last = i == len(micro_batches) - 1
        # Micro-steps that do not update skip DDP's gradient all-reduce.
        with contextlib.nullcontext() if is_last else backend.no_sync(model):
            loss_sum, _ = token_loss_sum(model, batch, backend)
            backend.backward(loss_sum * scale)
        loss_total += loss_sum.detach()
    if max_grad_norm > 0:
        backend.clip_grad_norm_(model.parameters(), max_grad_norm)
    stepped = backend.step(optimizer)
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return backend.reduce_sum(loss_total).item() / max(global_tokens, 1.0), stepped


def batch_fingerprint(micro_batches: list[dict]) -> int:
    """Which sentences an update saw, in order: resume tests compare these, step by step."""
    ids = torch.cat([b["example_index"].cpu() for b in micro_batches]).numpy().astype(np.int64)
    return zlib.crc32(ids.tobytes())


def grouped(batches: Iterable[dict], size: int, device: torch.device) -> Iterator[list[dict]]:
    """Micro-batches in groups of `size` (the last group may be shorter): one group, one update."""
    group: list[dict] = []
    for batch in batches:
        group.append({k: v.to(device, non_blocking=True) for k, v in batch.items()})
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def updates_in_epoch(micro_batches_per_rank: int, accumulation: int) -> int:
    return math.ceil(micro_batches_per_rank / accumulation)


class Hooks(Protocol):
    def on_update(self, state: TrainState, loss: float, micro_batches: list[dict]) -> None: ...

    def on_epoch_end(self, state: TrainState) -> None: ...


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
        train_loader: Iterable[dict], backend: Backend, state: TrainState, total_steps: int,
        num_epochs: int | None, accumulation: int, max_grad_norm: float, hooks: Hooks) -> TrainState:
    """Epochs of updates until `total_steps` or an early stop; resumes from `state` (epoch and batch position).

    `global_step` counts updates attempted (each consumes its batches); one skipped on fp16
    overflow is listed in `state.skipped_steps`, so the scheduler has stepped
    `global_step - len(skipped_steps)` times.
    """
    while (state.stop_reason is None and state.global_step < total_steps
           and (num_epochs is None or state.epoch < num_epochs)):
        backend.set_epoch(train_loader, state.epoch, state.batches_done)
        for group in grouped(train_loader, accumulation, backend.device):
            loss, stepped = train_update(model, optimizer, scheduler, group, backend, max_grad_norm)
            state.global_step += 1
            state.batches_done += len(group)
            state.step_losses.append(loss)
            state.step_batches.append(batch_fingerprint(group))
            if not stepped:
                state.skipped_steps.append(state.global_step)
            hooks.on_update(state, loss, group)
            if state.stop_reason is not None or (num_epochs is None and state.global_step >= total_steps):
                return state
        state.epoch += 1
        state.batches_done = 0
        hooks.on_epoch_end(state)
    return state
