"""A padded batch's attention mask, built on the device for transformers to take as given (model.py,
attention_mask_as_given): the same numbers as the 2D mask in every encoder family, and no read of the device."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch
import transformers
from encoders import FAMILIES, build_encoder

from ner.training.model import attention_mask_as_given

LIBRARY_DIR = str(Path(transformers.__file__).resolve().parent)
READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__")
LENGTHS = [24, 17, 9, 3]  # wider than ModernBERT's local window (16), so its sliding layers mask something


# Per family, what the tiny encoder is loaded with: ModernBERT gets a sliding-window layer beside its global one.
OVERRIDES = {"modernbert": {"layer_types": ["full_attention", "sliding_attention"]}}


@pytest.fixture(scope="module", params=FAMILIES)
def encoder(request, tmp_path_factory) -> tuple[Path, dict]:
    return build_encoder(request.param, tmp_path_factory.mktemp(request.param)), OVERRIDES.get(request.param, {})


def padded_batch(vocab_size: int) -> dict:
    width = max(LENGTHS)
    mask = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(5, vocab_size, mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids % 3, -100)}


@contextlib.contextmanager
def library_reads(monkeypatch):
    """Yields a list that collects `file:line` of every tensor read whose caller is in transformers."""
    sites: list[str] = []

    def wrap(original):
        def read(tensor, *args, **kwargs):
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(LIBRARY_DIR):
                sites.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            return original(tensor, *args, **kwargs)

        return read

    with monkeypatch.context() as patch:
        for name in READS:
            patch.setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
        yield sites


def loss_and_grads(model, batch: dict, mask, autocast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)  # the same dropout masks
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch["input_ids"], attention_mask=mask).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), reduction="sum")
    return loss, list(torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad],
                                          allow_unused=True))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_built_mask_trains_the_same_and_reads_nothing(encoder, attention, autocast, monkeypatch):
    """Loss and gradients bit-equal to the 2D mask's, dropout on; transformers reads nothing from the device with
    the built mask. Red with allow_is_bidirectional_skip left on (a read per batch), with one 4D mask given to
    ModernBERT for both kinds of layer, and with a bf16 mask under eager attention (other numbers)."""
    folder, overrides = encoder
    try:
        model = transformers.AutoModelForTokenClassification.from_pretrained(
            folder, num_labels=3, attn_implementation=attention, **overrides).train()
    except ValueError as exc:  # DeBERTa has no SDPA kernel: it runs eager, the other parametrization
        assert attention == "sdpa" and "deberta" in type(exc).__module__ + str(exc).lower(), exc
        return
    batch = padded_batch(model.config.vocab_size)
    expected_loss, expected_grads = loss_and_grads(model, batch, batch["attention_mask"], autocast)
    with library_reads(monkeypatch) as sites:
        built = attention_mask_as_given(model, batch["attention_mask"])
        loss, grads = loss_and_grads(model, batch, built, autocast)
    assert sites == []
    assert torch.equal(loss, expected_loss)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))
