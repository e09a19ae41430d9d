"""--compile: torch.compile of the model, with the graphs bounded by the padded widths, not one per batch."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_args

from ner.backends import BACKENDS, DATA_PARALLEL
from ner.errors import UserError
from ner.train import main as train_main
from ner.training import model as model_module
from ner.training.config import TrainConfig, parse_config


def losses_and_widths(out) -> tuple[list[float], set[int]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    widths = {shape[1] for r in steps for shape in r["batch_shapes"]}
    return [r["loss"] for r in steps], widths


@pytest.mark.slow
def test_a_compiled_run_builds_a_few_graphs_whatever_the_widths_and_trains_the_same(tiny_bert, tiny_data, tmp_path,
                                                                                      monkeypatch):
    import torch._dynamo

    graphs = []

    def counting_backend(graph_module, example_inputs):  # dynamo's eager backend, counted
        graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(model_module, "COMPILE_BACKEND", counting_backend)
    torch._dynamo.reset()
    runs = {}
    for setting in ("off", "on"):
        out = tmp_path / setting
        assert train_main(tiny_args(tiny_bert, tiny_data, out, "--compile", setting, "--logging-steps", "1",
                                    "--no-eval", "--pad-to-multiple-of", "1")) == 0
        runs[setting] = losses_and_widths(out)
    (plain, widths), (compiled, _) = runs["off"], runs["on"]
    assert len(widths) >= 8  # batches of several padded widths, so a graph per width would show
    assert graphs, "the model was not compiled"
    # Training: a static graph, then one with dynamic widths, then dynamic rows (a short last batch); the final
    # scores (no grad, one-thread passes) as many again. A graph per width would be one per batch shape.
    assert len(graphs) <= 6
    assert compiled == pytest.approx(plain, rel=1e-5, abs=1e-6)


def test_compile_auto_resolves_to_off_and_data_parallel_refuses_it():
    from ner.training.auto import auto_compile

    assert auto_compile("cpu") == auto_compile("cuda") == "off"
    with pytest.raises(UserError, match="--compile on does not work with --data-parallel"):
        parse_config(["--compile", "on", "--data-parallel"])
    with pytest.raises(UserError, match="--compile on does not work with --data-parallel"):
        TrainConfig(compile="on", backend=DATA_PARALLEL).validate()
    for backend in set(BACKENDS) - {DATA_PARALLEL}:
        assert parse_config(["--compile", "on", "--backend", backend])[0].compile == "on"
