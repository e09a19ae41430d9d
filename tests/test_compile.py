"""--compile: torch.compile of the training step, with the graphs bounded by the batch shapes, not one per batch."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_args

from ner.backends import BACKENDS, DATA_PARALLEL
from ner.errors import UserError
from ner.train import main as train_main
from ner.training import model as model_module
from ner.training.config import TrainConfig, parse_config


@pytest.mark.slow
def test_a_compiled_epoch_builds_a_graph_per_batch_shape_at_most_and_trains_the_same(tiny_bert, tiny_data, tmp_path,
                                                                                      monkeypatch):
    """The whole step (mask, forward, loss; the backward with it under AOTAutograd) compiled with static shapes over
    bucketed batches: the graphs dynamo builds are at most the epoch's batch shapes. Red with a graph break in
    loop.loss_and_logits (a host read of the loss: two graphs a shape)."""
    import torch._dynamo

    graphs = []

    def counting_backend(graph_module, example_inputs):  # dynamo's eager backend, counted
        graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(model_module, "COMPILE_BACKEND", counting_backend)
    runs = {}
    for setting in ("off", "on"):
        torch._dynamo.reset()
        out = tmp_path / setting
        assert train_main(tiny_args(tiny_bert, tiny_data, out, "--compile", setting, "--logging-steps", "1",
                                    "--no-eval", "--batch-size", "8", "--max-tokens", "128")) == 0
        runs[setting] = losses_and_shapes(out)
    (plain, shapes), (compiled, _) = runs["off"], runs["on"]
    assert len(shapes) >= 3  # batches of several shapes, so a graph per batch would show
    assert 1 <= len(graphs) <= len(shapes), (len(graphs), shapes)
    assert compiled == pytest.approx(plain, rel=1e-5, abs=1e-6)


def losses_and_shapes(out) -> tuple[list[float], set[tuple[int, int]]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    return [r["loss"] for r in steps], {(rows, width) for r in steps for rows, width, _ in r["batch_shapes"]}


def test_compile_auto_resolves_to_off_and_data_parallel_refuses_it():
    from ner.training.auto import auto_compile

    assert auto_compile("cpu") == auto_compile("cuda") == "off"
    with pytest.raises(UserError, match="--compile on does not work with --data-parallel"):
        parse_config(["--compile", "on", "--data-parallel"])
    with pytest.raises(UserError, match="--compile on does not work with --data-parallel"):
        TrainConfig(compile="on", backend=DATA_PARALLEL).validate()
    for backend in set(BACKENDS) - {DATA_PARALLEL}:
        assert parse_config(["--compile", "on", "--backend", backend])[0].compile == "on"
