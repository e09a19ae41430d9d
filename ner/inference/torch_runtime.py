"""The PyTorch model as a runtime: the weights of the model folder (or a training run's model) on its device.

    python -m ner.predict runs/ner/final articles.txt --runtime torch

On a CPU, torch runs every forward pass on one thread and several passes at once, one per thread it may use
(`TorchRuntime.map`): a CPU kernel picks its blocking, and so its summation order, by its threads as well as by
the shape (oneDNN's bf16 GEMMs on AMX give other logits for one 128-token window on 1 thread than on 2), so one
thread a pass makes a window's numbers a function of its pass's shape alone: 1 process x 2 threads and
2 processes x 1 thread write the same bytes, in every precision (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ner.inference.cpu_threads import process_threads
from ner.inference.runtime import Batch, in_order, passes_at_once

if TYPE_CHECKING:
    import torch


class TorchRuntime:
    """The PyTorch model on its device, under the given autocast; float32 logits back on the CPU."""

    def __init__(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> None:
        self.model, self.device, self.autocast = model, device, autocast
        self.num_labels = model.config.num_labels
        self.device_type = device.type  # picks the default batch budget (options.inference_budget)
        self.threads_per_forward = 1 if device.type == "cpu" else None  # see the module's docstring
        self._pool: ThreadPoolExecutor | None = None
        self._pool_workers = 0

    def map(self, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
        """(batch, logits) of each batch, in order. On a CPU, one pass per thread torch may use runs at once,
        each on one thread (passes_at_once)."""
        if self.threads_per_forward is None:
            yield from in_order(self, batches)
            return
        pool, workers = self._workers()
        yield from passes_at_once(pool, workers, self, batches)

    def _workers(self) -> tuple[ThreadPoolExecutor, int]:
        """The pool of one-thread passes, as many as the process's torch threads (process_threads)."""
        import torch

        workers = process_threads()
        if self._pool is None or self._pool_workers != workers:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ner-forward",
                                            initializer=torch.set_num_threads, initargs=(1,))
            self._pool_workers = workers
        return self._pool, workers

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        import torch

        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        with torch.no_grad(), self.autocast():
            logits = self.model(**{k: torch.from_numpy(v).to(self.device) for k, v in inputs.items()
                                   if v is not None}).logits
        return logits.float().cpu().numpy()
