"""Host reads of tensor values per training update (issue 45).

On a GPU every read of a device value (`.item()`, `int()` / `float()` / `bool()` of a tensor, `.cpu()`,
`.tolist()`, `.numpy()`) makes the host wait until the device has run everything queued before it, so it
cannot queue the next kernels meanwhile: a small encoder is then bound by the host. The loop keeps its
counters on the device and reads them at the logging interval and where a decision needs them (evaluation,
checkpoint, early stopping). On the CPU these calls cost nothing, but they are counted all the same: the
test runs where the suite runs, and the call sites are the same on every device.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import tiny_args
from torch.optim.optimizer import register_optimizer_step_post_hook

import ner
import ner.train as train_cli

NER_DIR = str(Path(ner.__file__).resolve().parent)
TENSOR_API = (str(Path(torch.__file__).resolve().parent / "_tensor.py"),)  # __format__, __array__ -> item, numpy
READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__")
SAMPLE = Path(ner.__file__).resolve().parent / "sample_data"
FIRST, LAST = 20, 40  # updates; the sample's first epoch is ~110 updates of 4 sentences: no epoch end between
MAX_READS_PER_UPDATE = 0.25


class ReadCounter:
    """Counts reads whose caller is in ner/, between optimizer steps FIRST and LAST (torch's global step hook)."""

    def __init__(self) -> None:
        self.steps = 0
        self.sites: Counter[str] = Counter()

    def after_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1

    def wrap(self, name: str, original):
        def read(tensor, *args, **kwargs):
            if FIRST <= self.steps < LAST:
                self.record(name)
            return original(tensor, *args, **kwargs)

        return read

    def record(self, name: str) -> None:
        frame = sys._getframe(2)  # the caller of the patched method
        while frame is not None and frame.f_code.co_filename in TENSOR_API:
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith(NER_DIR):
            where = Path(frame.f_code.co_filename).relative_to(Path(NER_DIR).parent)
            self.sites[f"{where}:{frame.f_lineno} {name}"] += 1


@pytest.fixture
def read_counter(monkeypatch) -> ReadCounter:
    counter = ReadCounter()
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counter.wrap(name, getattr(torch.Tensor, name)))
    handle = register_optimizer_step_post_hook(counter.after_step)
    yield counter
    handle.remove()


def test_reads_per_update_stay_below_a_quarter(tiny_bert, tmp_path, read_counter):
    """fp32, the default backend, logging every 10 updates: updates 20 -> 40 hold two logging records and no
    evaluation or checkpoint. Seen red before the loop kept its values on the device: 6 reads an update; now
    0.15 (one read of the device values per logging record, one of the loader's CPU batches per 16 updates)."""
    data = {"train": SAMPLE / "train.conll", "validation": SAMPLE / "valid.conll", "test": SAMPLE / "test.conll"}
    argv = tiny_args(tiny_bert, data, tmp_path / "out", "--max-steps", str(LAST), "--logging-steps", "10")
    assert train_cli.main(argv) == 0
    assert read_counter.steps == LAST
    reads = sum(read_counter.sites.values())
    per_update = reads / (LAST - FIRST)
    assert per_update <= MAX_READS_PER_UPDATE, f"{per_update:.2f} reads an update: {dict(read_counter.sites)}"
