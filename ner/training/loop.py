"""The one training loop, written only against the Backend protocol (ner/backends/__init__.py).

Loss normalisation: each update's loss is the sum of token losses over every micro-batch on
every rank, divided by the number of labelled tokens in all of them. Each rank scales its part
by world size because DDP averages gradients. So 2 ranks x 1 micro-batch, 1 rank x 2
micro-batches, and 1 rank x 1 double batch give the same gradient, to float rounding.
"""

from __future__ import annotations

import contextlib
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
from ner.training.model import attention_mask_as_given


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


def loss_and_logits(model: torch.nn.Module, encoder: torch.nn.Module, inputs: dict,
                    labels: torch.Tensor, label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over labelled tokens, and the logits: the unit `--compile on` compiles (the mask, the
    forward pass, the loss, and through AOTAutograd their backward). `encoder`: the model unwrapped;
    `label_smoothing`: --label-smoothing (run.py binds it)."""
    if "attention_mask" in inputs:
        inputs = {**inputs, "attention_mask": attention_mask_as_given(encoder, inputs["attention_mask"])}
    logits = model(**inputs).logits
    # Loss in fp32 outside the model: under nn.DataParallel this sees the gathered logits
    # of all replicas, so the reduction is over the whole batch, like the other backends.
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum", label_smoothing=label_smoothing)
    return loss_sum, logits


def token_loss_sum(model: torch.nn.Module, batch: dict, backend: Backend,
                   compute=loss_and_logits) -> tuple[torch.Tensor, torch.Tensor]:
    """loss_and_logits (or `compute`, its compiled form) of a batch, under the backend's autocast (which leaves
    the fp32 loss of fp32 logits as it is)."""
    with backend.autocast():
        return compute(model, backend.unwrap_model(model), model_inputs(batch), batch["labels"])


# Updates whose CPU batches are fetched and counted together: one read of host memory per window, none per update.
HOST_WINDOW = 16


@dataclass
class Update:
    """One update's micro-batches on the device, and what the host knows of them, read from their CPU copies:
    a count read back from the device would make the host wait there every update."""

    micro_batches: list[dict]  # on the device
    labelled_tokens: int  # on this rank
    batch_shapes: list[list[int]]  # [rows, padded width, real tokens] per micro-batch
    fingerprint: int  # batch_fingerprint of its sentence ids


def grouped(batches: Iterable[dict], size: int, device: torch.device) -> Iterator[Update]:
    """Micro-batches in groups of `size` (the last group may be shorter): one group, one update.

    Every backend's loader gives CPU batches (Accelerate's is prepared without device placement). They are
    counted HOST_WINDOW updates at a time, then moved; the loaders draw no random numbers, so fetching ahead
    changes nothing else.
    """
    for window in chunks(chunks(batches, size), HOST_WINDOW):
        for group, (labelled, shapes, fingerprint) in zip(window, host_counts(window), strict=True):
            on_device = [to_device(batch, device, rows * width == real) for batch, (rows, width, real)
                         in zip(group, shapes, strict=True)]
            yield Update(on_device, labelled, shapes, fingerprint)


def chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def host_counts(groups: list[list[dict]]) -> list[tuple[int, list[list[int]], int]]:
    """(labelled tokens, batch shapes, fingerprint) of each group of CPU batches, in one read: the labelled and
    real tokens of each micro-batch, then the sentence id of each row."""
    batches = [batch for group in groups for batch in group]
    tokens = [[(batch["labels"] != IGNORE_INDEX).sum(), batch["attention_mask"].sum()] for batch in batches]
    flat = torch.cat([torch.stack(sum(tokens, [])), *(batch["example_index"] for batch in batches)]).tolist()
    end = 2 * len(batches)
    sums, ids = iter(zip(flat[0:end:2], flat[1:end:2])), iter(flat[end:])
    counts = []
    for group in groups:
        labelled, shapes, example_ids = 0, [], []
        for batch in group:
            batch_labelled, real = next(sums)
            rows, width = batch["attention_mask"].shape
            labelled += batch_labelled
            shapes.append([rows, width, real])
            example_ids += [next(ids) for _ in range(rows)]
        counts.append((labelled, shapes, batch_fingerprint(example_ids)))
    return counts


def batch_fingerprint(example_ids: list[int]) -> int:
    """Which sentences an update saw, in order: resume tests compare these, step by step."""
    return zlib.crc32(np.asarray(example_ids, dtype=np.int64).tobytes())


def to_device(batch: dict, device: torch.device, padding_free: bool) -> dict:
    """What the model and the loss read; sentence and word ids stay on the CPU, where only the host reads them.

    A batch without padding goes without its attention mask: transformers reads a mask back from the device to
    see whether it can drop it (`padding_mask.all()`), and no mask means all ones to every encoder family.
    """
    needed = {**model_inputs(batch), "labels": batch["labels"]}
    if padding_free:
        del needed["attention_mask"]
    return {key: value.to(device, non_blocking=True) for key, value in needed.items()}


@dataclass
class DeviceValues:
    """An update's numbers, left on the device until someone needs them (UnreadUpdates reads them in bulk)."""

    loss_sum: torch.Tensor  # summed over every rank's labelled tokens
    tokens: torch.Tensor  # labelled tokens on every rank
    grad_norm: torch.Tensor | None  # before clipping; None without clipping


def train_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 update: Update, backend: Backend, max_grad_norm: float,
                 compute=loss_and_logits) -> tuple[DeviceValues, bool]:
    """One optimizer update over this rank's micro-batches.

    Returns its loss, token count and gradient norm, still on the device, and whether the weights changed:
    under fp16 an update whose gradients overflowed is skipped, and then the schedule must not advance either.
    """
    # Queued to the device, not read back: the reduction's result stays there.
    local_tokens = torch.tensor(float(update.labelled_tokens)).to(backend.device, non_blocking=True)
    global_tokens = backend.reduce_sum(local_tokens)
    # One float32 division gives the float32 that the host's float64 division rounded to; `n / tensor` would
    # multiply by a reciprocal (two roundings).
    scale = torch.full_like(global_tokens, backend.num_processes) / global_tokens.clamp(min=1.0)
    loss_total = torch.zeros((), device=backend.device)
    for i, batch in enumerate(update.micro_batches):
        is_last = i == len(update.micro_batches) - 1
        # Micro-steps that do not update skip DDP's gradient all-reduce.
        with contextlib.nullcontext() if is_last else backend.no_sync(model):
            loss_sum, _ = token_loss_sum(model, batch, backend, compute)
            backend.backward(loss_sum * scale)
        loss_total += loss_sum.detach()
    grad_norm = backend.clip_grad_norm_(model.parameters(), max_grad_norm) if max_grad_norm > 0 else None
    stepped = backend.step(optimizer)
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return DeviceValues(backend.reduce_sum(loss_total), global_tokens, grad_norm), stepped


@dataclass
class UpdateRecord:
    """One update as the logs and TrainState need it, its device values read."""

    loss: float  # mean over every rank's labelled tokens
    grad_norm: float | None
    batch_shapes: list[list[int]]  # [rows, padded width, real tokens] per micro-batch on this rank
    fingerprint: int


class UnreadUpdates:
    """Updates whose values are still on the device, read together when someone needs them: a logging record,
    an evaluation, a checkpoint, the end of training. Each read of a device value makes the host wait for the
    device; one read per logging interval instead of several per update keeps a GPU fed."""

    def __init__(self) -> None:
        self.values: list[DeviceValues] = []
        self.known: list[tuple[list[list[int]], int]] = []  # (batch shapes, fingerprint) of each update

    def add(self, update: Update, values: DeviceValues) -> None:
        """Keeps what the host knows of `update`, never its micro-batches: unread for a whole epoch (no logging, no
        evaluation), they would hold the epoch's batches in device memory."""
        self.values.append(values)
        self.known.append((update.batch_shapes, update.fingerprint))

    def read_into(self, state: TrainState) -> list[UpdateRecord]:
        """Append the unread updates' losses and fingerprints to `state`; returns them, oldest first."""
        if not self.values:
            return []
        records = [UpdateRecord(loss / max(tokens, 1.0), norm, shapes, fingerprint)
                   for (loss, tokens, norm), (shapes, fingerprint) in zip(self._read(), self.known, strict=True)]
        state.step_losses += [record.loss for record in records]
        state.step_batches += [record.fingerprint for record in records]
        self.values, self.known = [], []
        return records

    def _read(self) -> list[tuple[float, float, float | None]]:
        """(loss sum, tokens, grad norm) per update, in one read."""
        per_update = [[v.loss_sum, v.tokens] + ([] if v.grad_norm is None else [v.grad_norm]) for v in self.values]
        flat = iter(torch.stack([t.float() for values in per_update for t in values]).tolist())
        return [(next(flat), next(flat), next(flat) if len(values) == 3 else None) for values in per_update]


def updates_in_epoch(micro_batches_per_rank: int, accumulation: int) -> int:
    return math.ceil(micro_batches_per_rank / accumulation)


class Hooks(Protocol):
    def on_update(self, state: TrainState, unread: UnreadUpdates) -> None: ...

    def on_epoch_end(self, state: TrainState, unread: UnreadUpdates) -> None: ...


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
        train_loader: Iterable[dict], backend: Backend, state: TrainState, total_steps: int,
        num_epochs: int | None, accumulation: int, max_grad_norm: float, hooks: Hooks,
        compute=loss_and_logits) -> TrainState:
    """Epochs of updates until `total_steps` or an early stop; resumes from `state` (epoch and batch position).

    `global_step` counts updates attempted (each consumes its batches); one skipped on fp16
    overflow is listed in `state.skipped_steps`, so the scheduler has stepped
    `global_step - len(skipped_steps)` times. Losses reach `state.step_losses` when the hooks read them
    (logging, evaluation, checkpoint) and, at the latest, before this returns. `compute`: loss_and_logits, or
    its compiled form (model.compile_loss).
    """
    unread = UnreadUpdates()
    while (state.stop_reason is None and state.global_step < total_steps
           and (num_epochs is None or state.epoch < num_epochs)):
        backend.set_epoch(train_loader, state.epoch, state.batches_done)
        for update in grouped(train_loader, accumulation, backend.device):
            values, stepped = train_update(model, optimizer, scheduler, update, backend, max_grad_norm, compute)
            unread.add(update, values)
            state.global_step += 1
            state.batches_done += len(update.micro_batches)
            if not stepped:
                state.skipped_steps.append(state.global_step)
            hooks.on_update(state, unread)
            if state.stop_reason is not None or (num_epochs is None and state.global_step >= total_steps):
                unread.read_into(state)
                return state
        state.epoch += 1
        state.batches_done = 0
        hooks.on_epoch_end(state, unread)
    unread.read_into(state)
    return state
