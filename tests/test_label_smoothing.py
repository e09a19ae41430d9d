"""--label-smoothing: the training loss spreads a share of each labelled token's target over every tag."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_args

from ner.train import main as train_main
from ner.training import loop
from ner.training.config import TrainConfig

IGNORED = loop.IGNORE_INDEX


class FixedLogits(torch.nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, **inputs):
        return type("Output", (), {"logits": self.logits})()


def by_hand(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> float:
    """(1 - e) * -log p(gold) + e * mean over tags of -log p(tag), summed over labelled tokens."""
    total = 0.0
    for row, gold in zip(logits.flatten(0, 1).tolist(), labels.flatten().tolist(), strict=True):
        if gold == IGNORED:
            continue
        log_norm = math.log(sum(math.exp(x) for x in row))
        log_probs = [x - log_norm for x in row]
        total += -(1 - smoothing) * log_probs[gold] - smoothing * sum(log_probs) / len(row)
    return total


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_the_loss_is_the_smoothed_cross_entropy_over_labelled_tokens_only(smoothing):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=generator)
    labels = torch.tensor([[0, 3, IGNORED, 1, 2], [IGNORED, IGNORED, 2, 0, IGNORED]])
    model = FixedLogits(logits)
    loss_sum, _ = loop.loss_and_logits(model, model, {"input_ids": labels.clamp(min=0)}, labels, smoothing)
    assert loss_sum.item() == pytest.approx(by_hand(logits, labels, smoothing), rel=1e-5)


def test_training_uses_the_configured_smoothing(tiny_bert, tiny_data, tmp_path, monkeypatch):
    """The run binds --label-smoothing into the loss it trains with (red if run.py passed the plain loss)."""
    seen = []
    cross_entropy = loop.F.cross_entropy

    def spy(*args, **kwargs):
        seen.append(kwargs.get("label_smoothing", 0.0))
        return cross_entropy(*args, **kwargs)

    monkeypatch.setattr(loop.F, "cross_entropy", spy)
    assert train_main(tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--max-steps", "2", "--no-eval",
                                "--label-smoothing", "0.25")) == 0
    assert seen and set(seen) == {0.25}


def test_the_default_is_declared_and_out_of_range_values_are_refused(tmp_path, capsys):
    assert TrainConfig().label_smoothing == pytest.approx(0.1)
    for bad in ("1", "-0.1"):
        assert train_main(["--label-smoothing", bad, "--output-dir", str(tmp_path / "never-made")]) == 2
        assert "--label-smoothing must be in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "never-made").exists()
