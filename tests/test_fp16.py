"""fp16 with a gradient scaler: an overflowing update is skipped (weights, optimizer and schedule
untouched) and the loss scale halves; resume restores the scaler bit-exactly.

The raw backends run their own `torch.amp.GradScaler` and are tested on the CPU where torch can
autocast to fp16 there. Accelerate has a scaler only on accelerators, so its case is `gpu`.
An overflow is forced by multiplying the loss by 1e30 inside the backend's `backward`: scaled,
its gradients exceed fp16's range in the autocast regions, as a real overflow does.
"""

from __future__ import annotations

import importlib
import json
import shutil

import pytest
import torch
from conftest import read_state, tiny_args
from safetensors.torch import load_file

from ner import train as train_cli
from ner.backends import ACCELERATE, BACKENDS, BF16, DATA_PARALLEL, FP16, RAW_DDP
from ner.training.checkpoint import list_checkpoints


def cpu_autocasts_fp16() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    except RuntimeError:
        return False


def backend_class(name: str):
    module, cls = {RAW_DDP: ("raw_ddp", "RawDDPBackend"), DATA_PARALLEL: ("data_parallel", "DataParallelBackend"),
                   ACCELERATE: ("hf_accelerate", "AccelerateBackend")}[name]
    return getattr(importlib.import_module(f"ner.backends.{module}"), cls)


# Every backend; Accelerate's own scaler exists on accelerators only, the raw backends' on any device that autocasts
BACKEND_PARAMS = [pytest.param(name, marks=pytest.mark.gpu if name == ACCELERATE else
                               pytest.mark.skipif(not cpu_autocasts_fp16(), reason="no fp16 autocast on CPU"))
                  for name in BACKENDS]


def force_overflow(monkeypatch, backend: str, on_calls: set[int]) -> None:
    """The backend's backward, with the loss times 1e30 on the given calls (1-based) of this process."""
    cls = backend_class(backend)
    original = cls.backward
    calls = {"n": 0}

    def backward(self, loss):
        calls["n"] += 1
        original(self, loss * 1e30 if calls["n"] in on_calls else loss)

    monkeypatch.setattr(cls, "backward", backward)


def fp16_args(tiny_bert, tiny_data, out, backend: str, *extra: str) -> list[str]:
    return tiny_args(tiny_bert, tiny_data, out, "--mixed-precision", FP16, "--no-eval", "--save-total-limit", "0",
                     "--backend", backend, *extra)


def checkpoint(out, step: int):
    return out / "checkpoints" / f"step_{step}"


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_an_overflowing_update_is_skipped_and_the_scale_halves(tiny_bert, tiny_data, tmp_path, monkeypatch,
                                                               backend):
    out = tmp_path / "run"
    force_overflow(monkeypatch, backend, on_calls={3})
    assert train_cli.main(fp16_args(tiny_bert, tiny_data, out, backend, "--max-steps", "5", "--save-steps", "1",
                                    "--warmup-ratio", "0", "--logging-steps", "1")) == 0
    assert read_state(checkpoint(out, 5))["train_state"]["skipped_steps"] == [3]
    scales = [torch.load(checkpoint(out, s) / "scaler.pt", weights_only=True)["scale"] for s in range(1, 6)]
    assert scales == [65536.0, 65536.0, 32768.0, 32768.0, 32768.0]
    # the skipped update changed neither the weights nor the optimizer...
    before, after = (load_file(checkpoint(out, s) / "model" / "model.safetensors") for s in (2, 3))
    assert all(torch.equal(before[k], after[k]) for k in before)
    steps = [torch.load(checkpoint(out, s) / "optimizer.pt", weights_only=True)["state"][0]["step"].item()
             for s in (2, 3, 4)]
    assert steps == [2.0, 2.0, 3.0]
    # ...nor the schedule: linear decay over 5 updates, 4 of them taken at the end
    lrs = [torch.load(checkpoint(out, s) / "scheduler.pt", weights_only=True)["_last_lr"][0] for s in (2, 3, 5)]
    assert lrs == pytest.approx([1e-3 * 3 / 5, 1e-3 * 3 / 5, 1e-3 * 1 / 5], rel=1e-9)
    logged = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["loss_scale"] for r in logged] == scales and logged[-1]["skipped_steps"] == 1


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_resume_restores_the_loss_scale_bit_exactly(tiny_bert, tiny_data, tmp_path, monkeypatch, backend):
    """Resume after the overflow (scale 32768, growth tracker counting) ends exactly like the run that went on."""
    force_overflow(monkeypatch, backend, on_calls={3})
    reference = tmp_path / "reference"
    args = ("--max-steps", "8", "--save-steps", "4")
    assert train_cli.main(fp16_args(tiny_bert, tiny_data, reference, backend, *args)) == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(checkpoint(reference, 4), checkpoint(resumed, 4))
    force_overflow(monkeypatch, backend, on_calls=set())
    assert train_cli.main(fp16_args(tiny_bert, tiny_data, resumed, backend, *args, "--resume", "auto")) == 0
    saved_scaler = torch.load(checkpoint(reference, 4) / "scaler.pt", weights_only=True)
    assert saved_scaler["scale"] == 32768.0 and saved_scaler["_growth_tracker"] == 1
    a, b = list_checkpoints(reference)[-1], list_checkpoints(resumed)[-1]
    assert a.name == b.name == "step_8"
    assert torch.load(a / "scaler.pt", weights_only=True) == torch.load(b / "scaler.pt", weights_only=True)
    assert read_state(a)["train_state"]["step_losses"] == read_state(b)["train_state"]["step_losses"]
    assert read_state(b)["train_state"]["skipped_steps"] == [3]
    weights_a, weights_b = (load_file(c / "model" / "model.safetensors") for c in (a, b))
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize("fused", [True, False])
def test_accelerate_backend_sees_a_skipped_fused_update(fused):
    """Accelerate's `step_was_skipped` says False when a fused AdamW skips an overflowing update (GradScaler
    hands it found_inf; seen on an H200, where training defaults to fused): the backend reads the scale."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.state import AcceleratorState

    from ner.backends.hf_accelerate import AccelerateBackend

    Accelerator(cpu=True)
    try:
        weight = torch.nn.Parameter(torch.ones(4))
        scaler = torch.amp.GradScaler("cpu")
        optimizer = AcceleratedOptimizer(torch.optim.AdamW([weight], lr=1e-3, fused=fused), device_placement=False,
                                         scaler=scaler)
        backend = object.__new__(AccelerateBackend)  # only its step: the accelerator's scaler is all it reads
        backend.accelerator = type("Stub", (), {"scaler": scaler})()
        scaler.scale((weight * float("inf")).sum()).backward()
        assert backend.step(optimizer) is False
        assert scaler.get_scale() == 32768.0 and torch.equal(weight.detach(), torch.ones(4))
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        assert backend.step(optimizer) is True
    finally:
        AcceleratorState._reset_state(True)


def test_two_runs_in_one_process_may_ask_for_different_precisions(tiny_bert, tiny_data, tmp_path):
    """A notebook trains twice: Accelerate's per-process state must not pin the first run's precision."""
    from conftest import tiny_args

    from ner import train as train_cli

    assert train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "a", "--max-steps", "1", "--no-eval")) == 0
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "b", "--max-steps", "1", "--no-eval",
                                    "--mixed-precision", BF16)) == 0


@pytest.mark.skipif(not cpu_autocasts_fp16(), reason="no fp16 autocast on CPU")
@pytest.mark.parametrize("overflow", [False, True])
def test_the_scaler_step_reads_the_device_once(monkeypatch, overflow):
    """LossScaler.step with a fused AdamW (the GPU default) reads one device value per update, whether the step
    was skipped: GradScaler.get_scale() before and after the step was two (red with it: 2 reads)."""
    from ner.backends import LossScaler

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = LossScaler(torch.device("cpu"), FP16)
    scaler.optimizer = optimizer
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.ones(3, 4)).float().pow(2).mean()
    scaler.backward(loss * (1e30 if overflow else 1.0))
    scaler.clip_grad_norm_(model.parameters(), 1.0)
    reads = []
    for name in ("item", "__bool__", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: reads.append(_n)
                            or _o(self, *a, **k))
    before = scaler.scaler.get_scale()
    reads.clear()
    stepped = scaler.step(optimizer)
    assert len(reads) == 1, reads
    assert stepped is (not overflow)
    assert scaler.scaler.get_scale() == (before / 2 if overflow else before)
