"""Weight averaging (--ema-decay) and layer-wise learning-rate decay (--layer-lr-decay)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import python_module, run_cli, tiny_args
from safetensors.torch import load_file

from ner import checkpoint as ckpt
from ner.averaging import WeightAverage
from ner.model import build_model, build_optimizer


def test_the_average_follows_its_recurrence_and_swapping_it_in_gives_the_training_weights_back():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    average = WeightAverage(model, decay=0.5)
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    for t in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update()
        rate = min(0.5, (1 + t) / (10 + t))
        expected = {name: rate * expected[name] + (1 - rate) * p.detach() for name, p in model.named_parameters()}
    trained = {name: p.detach().clone() for name, p in model.named_parameters()}
    with average.swapped_in() as training:
        for name, p in model.named_parameters():
            assert torch.allclose(p, expected[name], atol=1e-6)
            assert torch.equal(training[name], trained[name])
    assert all(torch.equal(p, trained[name]) for name, p in model.named_parameters())  # exactly back
    average.apply()
    assert all(torch.allclose(p, expected[name], atol=1e-6) for name, p in model.named_parameters())


def test_layer_lr_decay_gives_each_depth_its_rate_and_one_rate_without_it(tiny_bert):
    model = build_model(str(tiny_bert), ["O", "B-PER", "I-PER"])  # 2 encoder layers
    rate_of = {}
    for group in build_optimizer(model, 1e-3, 0.01, "for-loop", layer_lr_decay=0.5).param_groups:
        for param in group["params"]:
            rate_of[param] = group["lr"]
    named = dict(model.named_parameters())
    assert rate_of[named["classifier.weight"]] == pytest.approx(1e-3)
    assert rate_of[named["bert.encoder.layer.1.attention.self.query.weight"]] == pytest.approx(1e-3 * 0.5)
    assert rate_of[named["bert.encoder.layer.0.output.LayerNorm.bias"]] == pytest.approx(1e-3 * 0.25)
    assert rate_of[named["bert.embeddings.word_embeddings.weight"]] == pytest.approx(1e-3 * 0.125)
    assert len(rate_of) == len(named)  # every parameter in exactly one group
    plain = build_optimizer(model, 1e-3, 0.01, "for-loop").param_groups
    assert [(g["lr"], g["weight_decay"]) for g in plain] == [(1e-3, 0.01), (1e-3, 0.0)]


@pytest.fixture(scope="module")
def averaged_run(tiny_bert, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("averaged") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--ema-decay", "0.9",
                                                           "--num-epochs", "4", "--learning-rate", "3e-3",
                                                           "--save-total-limit", "0")))
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_validation_scores_the_average_and_the_export_holds_it(averaged_run, tiny_data):
    metrics = json.loads((averaged_run / "final" / "metrics.json").read_text())
    best = ckpt.checkpoint_root(averaged_run) / f"step_{metrics['best_step']}"
    exported = load_file(averaged_run / "final" / "model.safetensors")
    averaged = load_file(best / "model" / "model.safetensors")
    training = load_file(best / ckpt.TRAINING_WEIGHTS)
    assert all(torch.equal(exported[k], averaged[k]) for k in averaged)
    assert not all(torch.equal(training[k], averaged[k]) for k in averaged)
    report = averaged_run / "validation.json"
    result = run_cli(python_module("ner.evaluate", str(averaged_run / "final"), str(tiny_data["validation"]),
                                   "--json", str(report), "--mixed-precision", "no"))
    assert result.returncode == 0, result.stderr[-2000:]
    # the F1 training chose its best step by is the exported (averaged) model's
    assert json.loads(report.read_text())["f1"] == pytest.approx(metrics["validation"]["f1"])
