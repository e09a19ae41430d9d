"""The private library APIs ner relies on, each where no public one serves: when a release drops or changes one,
its test here fails by name, with what to do, rather than a training run failing somewhere downstream."""

from __future__ import annotations

import pytest
import torch


def changed(api: str, library, user: str, todo: str) -> str:
    version = f"{library.__name__} {library.__version__}"
    return f"{api} (private) is gone or changed in {version}; {user} relies on it. {todo}"


SCALE = changed("torch.amp.GradScaler._scale", torch, "ner.backends.device_scale",
                "Use a public accessor that returns the scale as a device tensor if this torch has one; else "
                "get_scale() (a host read more per fp16 update: tests/test_fp16.py counts them).")


def test_grad_scaler_keeps_its_scale_as_a_device_tensor():
    """The scale tensor is the only no-host-read sign that GradScaler skipped an update (a fused optimizer skips
    inside its own step). Red with `_scale` renamed in device_scale (AttributeError caught below), and with
    scale_on_device's copy dropped (update() halves the scale in place)."""
    from ner.backends import device_scale, scale_held, scale_on_device

    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(weight.sum()).backward()
    try:
        scale = device_scale(scaler)
    except AttributeError as error:
        pytest.fail(f"{SCALE} ({error})")
    assert isinstance(scale, torch.Tensor) and scale.item() == scaler.get_scale() == 1024.0, SCALE
    before = scale_on_device(scaler)
    assert isinstance(before, torch.Tensor), SCALE
    optimizer.zero_grad()
    scaler.scale(weight.sum() * float("inf")).backward()
    scaler.step(optimizer)
    scaler.update()
    assert device_scale(scaler).item() == scaler.get_scale() == 512.0, SCALE
    assert not scale_held(scaler, before), SCALE


def init_weights_changed() -> str:
    import transformers

    return changed("transformers.PreTrainedModel._init_weights", transformers, "ner.training.model.restart_head",
                   "Find what from_pretrained now calls to initialise a missing head, and call that on the new head "
                   "and the modules above it instead.")


@pytest.mark.parametrize("family", ["bert-cased", "modernbert"])
def test_init_weights_gives_the_head_from_pretrained_draws(family, tmp_path):
    """restart_head must give a loaded head the values from_pretrained gives a missing one under the same seed: the
    model's own _init_weights on the head and each module above it (ModernBERT scales its classifier at the top).
    No public call initialises one module: initialize_weights() walks the whole model, skips every module
    from_pretrained marked as initialised, and re-draws any parameter created since (a widened token-type table).
    Red with `_init_weights` renamed in restart_head, and with the walk stopped at the head (ModernBERT)."""
    from encoders import build_encoder
    from transformers import AutoModelForTokenClassification, PreTrainedModel

    from ner.training.model import head_layer, restart_head

    assert callable(getattr(PreTrainedModel, "_init_weights", None)), init_weights_changed()
    encoder = build_encoder(family, tmp_path / family)
    for labels in (3, 5):  # one checkpoint whose head fits, one whose head is a size mismatch: only it is drawn
        model = AutoModelForTokenClassification.from_pretrained(encoder, num_labels=labels)
        model.save_pretrained(tmp_path / f"{labels}")
    torch.manual_seed(7)
    fresh = head_layer(AutoModelForTokenClassification.from_pretrained(
        tmp_path / "3", num_labels=5, ignore_mismatched_sizes=True), 5)
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "5")
    head = head_layer(model, 5)
    with torch.no_grad():
        head.weight.fill_(1.0)
        head.bias.fill_(1.0)
    torch.manual_seed(7)
    try:
        restart_head(model, head)
    except AttributeError as error:
        pytest.fail(f"{init_weights_changed()} ({error})")
    assert head_layer(model, 5) is head, "restart_head must keep the model's own head layer"
    assert torch.equal(head.weight, fresh.weight) and torch.equal(head.bias, fresh.bias), init_weights_changed()
