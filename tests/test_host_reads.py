"""Host reads of tensor values per training update (issue 45).

On a GPU every read of a device value (`.item()`, `int()` / `float()` / `bool()` of a tensor, `.cpu()`,
`.tolist()`, `.numpy()`) makes the host wait until the device has run everything queued before it, so it
cannot queue the next kernels meanwhile: a small encoder is then bound by the host. The loop keeps its
counters on the device and reads them at the logging interval and where a decision needs them (evaluation,
checkpoint, early stopping). On the CPU these calls cost nothing, but they are counted all the same: the
test runs where the suite runs, and the call sites are the same on every device.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import weakref
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import tiny_args
from torch.optim.optimizer import register_optimizer_step_post_hook

import ner
import ner.train as train_cli
from ner.data.encode import IGNORE_INDEX
from ner.training.loop import (
    HOST_WINDOW,
    DeviceValues,
    TrainState,
    UnreadUpdates,
    Update,
    batch_fingerprint,
    grouped,
    token_loss_sum,
)

NER_DIR = str(Path(ner.__file__).resolve().parent)
LIBRARY_DIRS = tuple(str(Path(module.__file__).resolve().parent) for module in (transformers,))
TENSOR_API = (str(Path(torch.__file__).resolve().parent / "_tensor.py"),)  # __format__, __array__ -> item, numpy
READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__")
SAMPLE = Path(ner.__file__).resolve().parent / "sample_data"
FIRST, LAST = 20, 40  # updates; the sample's first epoch is ~55 updates of 8 sentences: no epoch end between
MAX_READS_PER_UPDATE = 0.15
MAX_LIBRARY_READS_PER_UPDATE = 0.1


class ReadCounter:
    """Counts reads whose caller is in ner/ (`sites`) or in a library the model runs in (`library_sites`), between
    optimizer steps `first` and `last` (torch's global step hook)."""

    def __init__(self, first: float, last: float) -> None:
        self.first, self.last, self.steps = first, last, 0
        self.sites: Counter[str] = Counter()
        self.library_sites: Counter[str] = Counter()

    def after_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1

    def wrap(self, name: str, original):
        def read(tensor, *args, **kwargs):
            if self.first <= self.steps < self.last:
                self.record(name)
            return original(tensor, *args, **kwargs)

        return read

    def record(self, name: str) -> None:
        frame = sys._getframe(2)  # the caller of the patched method
        while frame is not None and frame.f_code.co_filename in TENSOR_API:
            frame = frame.f_back
        if frame is None:
            return
        for root, sites in [(NER_DIR, self.sites)] + [(library, self.library_sites) for library in LIBRARY_DIRS]:
            if frame.f_code.co_filename.startswith(root):
                where = Path(frame.f_code.co_filename).relative_to(Path(root).parent)
                sites[f"{where}:{frame.f_lineno} {name}"] += 1

    def total(self) -> int:
        return sum(self.sites.values())


@pytest.fixture
def count_reads(monkeypatch):
    """count_reads(first, last) -> a ReadCounter counting from now on (every read, by default)."""
    handles = []

    def start(first: float = 0, last: float = math.inf) -> ReadCounter:
        counter = ReadCounter(first, last)
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, counter.wrap(name, getattr(torch.Tensor, name)))
        handles.append(register_optimizer_step_post_hook(counter.after_step))
        return counter

    yield start
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_reads_per_update_are_at_most_0_15_and_the_libraries_make_none(tiny_bert, tmp_path, count_reads,
                                                                           attention):
    """fp32, the default backend, logging every 10 updates: updates 20 -> 40 hold two logging records and no
    evaluation or checkpoint. Seen red before the loop kept its values on the device: 6 reads an update; now
    0.15 (one read of the device values per logging record, one of the loader's CPU batches per 16 updates).
    transformers read each padded batch's mask (masking_utils' `padding_mask.all()`, whether it may drop it):
    red with the 2D mask passed as it is, one read an update under either attention kernel."""
    data = {"train": SAMPLE / "train.conll", "validation": SAMPLE / "valid.conll", "test": SAMPLE / "test.conll"}
    argv = tiny_args(tiny_bert, data, tmp_path / "out", "--max-steps", str(LAST), "--logging-steps", "10",
                     "--batch-size", "8", "--attn-implementation", attention)
    counter = count_reads(FIRST, LAST)
    assert train_cli.main(argv) == 0
    assert counter.steps == LAST
    per_update = counter.total() / (LAST - FIRST)
    assert per_update <= MAX_READS_PER_UPDATE, f"{per_update:.2f} reads an update: {dict(counter.sites)}"
    library_per_update = sum(counter.library_sites.values()) / (LAST - FIRST)
    assert library_per_update <= MAX_LIBRARY_READS_PER_UPDATE, dict(counter.library_sites)


def cpu_batch(lengths: list[int], first_id: int) -> dict:
    """A collated batch as the loader gives it: padded to the longest; position 0 and every 4th unlabelled."""
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    labelled = mask.bool() & (torch.arange(width) % 4 != 0)
    ids = torch.arange(first_id, first_id + len(lengths))
    return {"input_ids": mask * 7, "attention_mask": mask, "labels": torch.where(labelled, 1, IGNORE_INDEX),
            "word_index": torch.where(labelled, 0, -1), "example_index": ids}


def test_updates_are_counted_on_the_cpu_copies_one_read_a_window(count_reads):
    """35 micro-batches in updates of 2: 18 updates, so two windows of HOST_WINDOW (16) updates and two reads.
    Batches without padding lose their mask, the others keep it; sentence and word ids stay on the CPU."""
    batches = [cpu_batch([5, 3] if i % 2 else [4, 4], first_id=2 * i) for i in range(35)]
    counter = count_reads()
    updates = list(grouped(batches, 2, torch.device("cpu")))
    assert counter.total() == math.ceil(len(updates) / HOST_WINDOW) == 2, dict(counter.sites)
    for update, group in zip(updates, [batches[i:i + 2] for i in range(0, 35, 2)], strict=True):
        assert update.labelled_tokens == sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in group)
        assert update.batch_shapes == [[*b["attention_mask"].shape, int(b["attention_mask"].sum())] for b in group]
        assert update.fingerprint == batch_fingerprint(torch.cat([b["example_index"] for b in group]).tolist())
        for moved, batch in zip(update.micro_batches, group, strict=True):
            assert ("attention_mask" in moved) == (not bool(batch["attention_mask"].all()))
            assert set(moved) <= {"input_ids", "attention_mask", "token_type_ids", "labels"}


def test_a_batch_without_padding_trains_the_same_without_its_mask(tiny_bert):
    """What dropping the mask rests on: to the encoder, no mask is a mask of ones (loss and gradients equal, with
    dropout on). The other encoder families were checked the same way by hand (docs/performance.md)."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=3).train()
    batch = cpu_batch([6, 6, 6], first_id=0)
    backend = SimpleNamespace(autocast=contextlib.nullcontext, unwrap_model=lambda model: model)
    results = []
    for inputs in (batch, {k: v for k, v in batch.items() if k != "attention_mask"}):
        torch.manual_seed(0)
        loss, _ = token_loss_sum(model, inputs, backend)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (with_mask, grads_with), (without, grads_without) = results
    assert torch.equal(with_mask, without)
    assert all(torch.equal(a, b) for a, b in zip(grads_with, grads_without, strict=True))


def test_unread_updates_keep_no_batch_once_it_is_trained():
    """Unread updates keep what the logs read later (shapes, fingerprint), not the micro-batches: with
    --logging-steps 0 and no evaluation they stay unread for a whole epoch, which would keep every batch of it in
    device memory."""
    unread = UnreadUpdates()
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": torch.zeros(2, 3, dtype=torch.long)}
    watched = [weakref.ref(tensor) for tensor in batch.values()]
    update = Update([batch], labelled_tokens=6, batch_shapes=[[2, 3, 6]], fingerprint=7)
    unread.add(update, DeviceValues(torch.tensor(3.0), torch.tensor(6.0), None))
    del update, batch
    gc.collect()
    assert [ref() for ref in watched] == [None, None]
    [record] = unread.read_into(TrainState())
    assert (record.loss, record.batch_shapes, record.fingerprint) == (0.5, [[2, 3, 6]], 7)
