"""Training hooks: what happens around each update.

The progress bar; metrics.jsonl (loss, learning rate and tokens per logged interval, every
evaluation, why training stopped); the evaluation and checkpoint schedule; early stopping; the
trainer state a checkpoint carries; library versions; and the fault-injection hook the
reliability tests use.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ner.backends import Backend
from ner.backends.trackers import TrackerClaim
from ner.metrics import best_evaluation, entity_scores, format_scores
from ner.testing import inject_fault
from ner.training import checkpoint as ckpt
from ner.training.evaluation import predict_tags
from ner.training.loop import TrainState, UnreadUpdates, UpdateRecord
from ner.training.output_dir import MetricsLog

log = logging.getLogger("ner")


def versions() -> dict:
    """Library versions for the checkpoint, read from package metadata (no imports needed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "accelerate", "seqeval", "datasets"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def flatten_record(record: dict) -> dict:
    """{"eval": {"f1": .., "per_type": {"PER": {"f1": ..}}}} -> {"eval/f1": .., "eval/PER/f1": ..} for trackers."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            for sub_key, sub_value in flatten_record(value).items():
                flat[f"{key}/{sub_key}".replace("per_type/", "")] = sub_value
        elif isinstance(value, (int, float)) and key not in ("step", "time"):
            flat[key] = value
    return flat


def trainer_state(cfg, state: TrainState, data, world_size: int) -> dict:
    """Everything a checkpoint needs besides tensors, JSON-safe."""
    return {"train_state": state.to_dict(), "config": cfg.to_dict(), "label_list": data.label_list,
            "tag_scheme": data.splits.scheme, "world_size": world_size, "global_step": state.global_step,
            "eval_history": state.eval_history, "best_step": state.best_step, "versions": versions()}


def count_without_improvement(state: TrainState, f1: float, threshold: float, backend: Backend) -> int:
    """The early-stopping counter after an evaluation, as rank 0 computed it, on every rank.

    Call before `state.best_f1` takes the new score. Rank 0 decides and the others take its
    value: were each rank to decide on its own, one rank stopping a step before another would
    leave the other waiting in its next collective until --dist-timeout.
    """
    improved = state.best_f1 is None or f1 > state.best_f1 + threshold
    count = 0 if improved else state.evals_without_improvement + 1
    mine = torch.tensor(float(count if backend.is_main_process else 0), device=backend.device)
    return int(backend.reduce_sum(mine).item())


class TokenCounter:
    """Real (non-pad) and computed (padded) tokens of every micro-batch between two log records."""

    def __init__(self) -> None:
        self.shapes: list[list[int]] = []
        self.start = time.perf_counter()

    def add(self, records: list[UpdateRecord]) -> None:
        self.shapes += [shape for record in records for shape in record.batch_shapes]

    def take(self, backend: Backend) -> dict:
        """Totals over all ranks since the last call (a collective: every rank calls it), then reset."""
        shapes = [shape for part in backend.gather_object(self.shapes) for shape in part]
        elapsed = time.perf_counter() - self.start
        real = sum(shape[2] for shape in shapes)
        self.shapes, self.start = [], time.perf_counter()
        return {"tokens_per_s": real / elapsed if elapsed > 0 else 0.0, "real_tokens": real,
                "padded_tokens": sum(rows * width for rows, width, _ in shapes),
                "batch_shapes": shapes}  # [rows, padded width, real tokens] per micro-batch, rank by rank


class RunHooks:
    def __init__(self, cfg, backend: Backend, model, optimizer, scheduler, data, state: TrainState, total_steps: int,
                 trackers: TrackerClaim):
        self.cfg, self.backend, self.data, self.trackers = cfg, backend, data, trackers
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.is_main = backend.is_main_process
        self.bar = tqdm(total=total_steps, initial=state.global_step, desc="train", unit="step", dynamic_ncols=True,
                        disable=not self.is_main or cfg.quiet)
        self.metrics = MetricsLog(Path(cfg.output_dir))  # metrics.jsonl, pinned line by line
        self.tokens = TokenCounter()
        self.logged_losses = len(state.step_losses)  # step_losses before this index are in an earlier record
        self.grad_norms: list[float] = []  # since the last record
        self.last_saved: tuple[int, Path] | None = None
        self.state = state
        self.best_predictions: list[list[str]] | None = None
        self.epoch_start = time.perf_counter()

    def _write(self, record: dict) -> None:
        self.backend.log_metrics(flatten_record(record), step=record["step"])
        if self.is_main:
            self.metrics.append(json.dumps({"time": round(time.time(), 3), **record}) + "\n")

    def _progress(self, iterable, **kwargs):
        return tqdm(iterable, disable=not self.is_main or self.cfg.quiet, dynamic_ncols=True, **kwargs)

    def read(self, state: TrainState, unread: UnreadUpdates) -> None:
        """Read the updates' values off the device into `state` (the host waits for the device here, and only here
        during the updates)."""
        records = unread.read_into(state)
        self.tokens.add(records)
        self.grad_norms += [r.grad_norm for r in records if r.grad_norm is not None and math.isfinite(r.grad_norm)]

    def on_update(self, state: TrainState, unread: UnreadUpdates) -> None:
        self.bar.update(1)
        due = [self.cfg.logging_steps, self.cfg.eval_steps, self.cfg.save_steps]
        if any(steps and state.global_step % steps == 0 for steps in due):  # they need the values read
            self.read(state, unread)
        if self.cfg.logging_steps and state.global_step % self.cfg.logging_steps == 0:
            self.log_interval(state)
        if self.cfg.eval_steps and state.global_step % self.cfg.eval_steps == 0:
            self.evaluate(state)
        if self.cfg.save_steps and state.global_step % self.cfg.save_steps == 0:
            self.save(state)
        inject_fault(state.global_step, self.backend.process_index)

    def log_interval(self, state: TrainState) -> None:
        """One metrics.jsonl record for the updates since the last one: mean loss, learning rate, tokens."""
        tokens = self.tokens.take(self.backend)
        losses = state.step_losses[self.logged_losses:]
        mean_loss = sum(losses) / len(losses)
        self.logged_losses = len(state.step_losses)
        lr = self.scheduler.get_last_lr()[0]
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens['tokens_per_s']:.0f}")
        record = {"step": state.global_step, "epoch": state.epoch, "loss": mean_loss, "lr": lr, **tokens}
        if self.grad_norms:  # before clipping, mean over the interval's finite norms (fp16 overflows are not)
            record["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
            self.grad_norms = []
        if self.backend.grad_scaler is not None:  # fp16: a falling scale means overflowing gradients
            record.update(loss_scale=self.backend.grad_scaler.get_scale(), skipped_steps=len(state.skipped_steps))
        self._write(record)

    def on_epoch_end(self, state: TrainState, unread: UnreadUpdates) -> None:
        self.read(state, unread)  # the epoch's evaluation and checkpoint need them
        # Where plots draw the boundary, and the epoch's training seconds (its end-of-epoch evaluation
        # and checkpoint come after and are not counted).
        self._write({"step": state.global_step, "epoch_end": state.epoch,
                     "epoch_train_s": round(time.perf_counter() - self.epoch_start, 3)})
        if not self.cfg.eval_steps:
            self.evaluate(state)
        self.save(state)  # every epoch end, whatever --save-steps says (a no-op if this step is saved)
        self.epoch_start = time.perf_counter()

    def evaluate(self, state: TrainState, can_stop: bool = True) -> dict | None:
        eval_set = self.data.eval_sets.get("validation")
        if eval_set is None or self.cfg.no_eval:
            return None
        predicted = predict_tags(self.model, eval_set, self.backend, self.data.tokenizer.pad_token_id,
                                 self.data.decoder, self._progress)
        scores = entity_scores([e.tags for e in eval_set.examples], predicted, self.data.splits.scheme)
        state.eval_history.append({"step": state.global_step, "epoch": state.epoch, "scores": scores})
        self._write({"step": state.global_step, "epoch": state.epoch, "eval": scores})
        if self.is_main:
            self.bar.write(f"step {state.global_step} validation {format_scores(scores)}")
        if self.cfg.early_stopping_patience and can_stop:
            state.evals_without_improvement = count_without_improvement(
                state, scores["f1"], self.cfg.early_stopping_threshold, self.backend)
            if state.evals_without_improvement >= self.cfg.early_stopping_patience:
                state.stop_reason = (
                    f"early stopping: {state.evals_without_improvement} evaluations without a validation F1 gain "
                    f"above {self.cfg.early_stopping_threshold:g} (best F1 {state.best_f1 * 100:.2f} at step "
                    f"{state.best_step})")
        if state.best_f1 is None or scores["f1"] > state.best_f1:
            state.best_f1, state.best_step = scores["f1"], state.global_step
            self.best_predictions = predicted  # the export's validation predictions, without a second pass
            self.save(state)  # the best model must exist on disk whatever --save-steps says
        return scores

    def on_train_end(self, state: TrainState, planned: str) -> None:
        """Why training stopped, in the log and in metrics.jsonl."""
        reason = state.stop_reason or planned
        log.info("training stopped at step %d: %s", state.global_step, reason)
        self._write({"step": state.global_step, "epoch": state.epoch,
                     "stop": "early_stopping" if state.stop_reason else "planned", "reason": reason})

    def save(self, state: TrainState) -> Path:
        if self.last_saved and self.last_saved[0] == state.global_step:
            return self.last_saved[1]
        payload = trainer_state(self.cfg, state, self.data, self.backend.num_processes)
        folder = ckpt.save_checkpoint(self.backend, Path(self.cfg.output_dir), state.global_step, self.model,
                                      self.data.tokenizer, self.optimizer, self.scheduler, payload, self.trackers)
        if self.is_main:
            ckpt.rotate(Path(self.cfg.output_dir), self.cfg.save_total_limit, state.best_step)
        self.backend.wait_for_everyone()
        self.last_saved = (state.global_step, folder)
        return folder

    def best_scores(self) -> dict | None:
        best = best_evaluation(self.state.eval_history)
        return best["scores"] if best else None

    def close(self) -> None:
        self.bar.close()
