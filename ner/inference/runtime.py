"""What every runtime keeps to and shares: the call, the order passes run in, the file it reads, its warnings.

    python -m ner.predict exported articles.txt --runtime onnx-int8       # the default, auto, may pick it

A runtime (ner/inference/torch_runtime.py, onnx_runtime.py, openvino_runtime.py) is called as
`runtime(input_ids, attention_mask) -> logits` on one padded batch, numpy in (int64, rows x width) and numpy
out (float32, rows x width x labels), and `runtime.map(batches)` runs a stream of collated batches, in order:
one pass after the other (in_order), or several at once on one thread each (passes_at_once). Windows, document
context, merging and decoding stay in ner/inference/tagger.py, so every runtime tags the same way.

Nothing here imports torch, so the ONNX and OpenVINO runtimes that build on it never do.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ner.errors import UserError
from ner.inference.runtimes import RUNTIME_FILES, export_command

log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]  # one collated batch (data/encode.collate)


def forward(runtime, batch: Batch) -> np.ndarray:
    return runtime(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))


def passes_at_once(pool, workers: int, runtime, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, logits) of each batch, in input order, with up to `workers` passes running on `pool`
    at once; at most that many run ahead of the caller, so a caller that stops reading (a server's drain) stops
    the passes at the next boundary."""
    running: deque = deque()  # (batch, its pass) in input order
    try:
        for batch in batches:
            running.append((batch, pool.submit(forward, runtime, batch)))
            if len(running) >= workers:
                batch_done, logits = running.popleft()
                yield batch_done, logits.result()
        while running:
            batch_done, logits = running.popleft()
            yield batch_done, logits.result()
    finally:
        for _, logits in running:
            logits.cancel()


def in_order(runtime, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, logits) of each batch, one pass after the other."""
    for batch in batches:
        yield batch, forward(runtime, batch)


def runtime_path(model_dir: Path, runtime: str) -> Path:
    """The file an ONNX or OpenVINO runtime reads; missing: a one-line error naming the command that writes it."""
    path = Path(model_dir) / RUNTIME_FILES[runtime][0]
    if not path.is_file():
        raise UserError(f"{path}: not found; --runtime {runtime} needs an export: {export_command()}")
    return path


def warn_runs_on_cpu(path: Path, device: str | None, runtime: str, why: str) -> None:
    """The one line a runtime logs when it was asked for a device it will not use: it runs on the CPU instead, and
    `why` (ONNX: no provider for the device; OpenVINO: CPU only). Nothing when no device or the CPU was asked for."""
    if device and device.split(":")[0] != "cpu":
        log.warning("%s: %s runs on the CPU, not on %s: %s", path.name, runtime, device, why)


def first_line(exc: Exception) -> str:
    """A runtime's error in one line: its first, or its type where it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
