"""--early-stopping-patience: training stops after N evaluations without a validation F1 gain above
--early-stopping-threshold, at the same update on every rank, says why, exports the best model,
and a resumed run keeps counting where the killed one was.

The runs train the tiny BERT without dropout at a high learning rate for 6 epochs, evaluating
every 4 updates: validation F1 sits at 0, climbs to 1.0 and stays there, so patience 2 stops
the run well before its planned 48 updates. The expected stop is recomputed here from the
logged evaluations, by the rule as the option's help states it.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from conftest import python_module, read_state, run_cli, tiny_args
from safetensors.torch import load_file

from ner import train as train_cli
from ner.training.checkpoint import list_checkpoints
from ner.training.hooks import count_without_improvement
from ner.training.loop import TrainState

PLANNED_UPDATES = 48  # 6 epochs x 8 updates (15 batches, 2 per update)
EVAL_STEPS = 4
PATIENCE = 2


def early_stopping_args(model, data, out, *extra: str) -> list[str]:
    return tiny_args(model, data, out, "--learning-rate", "5e-3", "--num-epochs", "6", "--eval-steps", str(EVAL_STEPS),
                     "--early-stopping-patience", str(PATIENCE), "--save-steps", "4", "--save-total-limit", "0",
                     "--casing", "none", "--label-smoothing", "0", *extra)  # the F1 path the module docstring describes


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_stop(evaluations: list[tuple[int, float]], patience: int, threshold: float) -> int | None:
    best, count = None, 0
    for step, f1 in evaluations:
        count = 0 if best is None or f1 > best + threshold else count + 1
        best = f1 if best is None or f1 > best else best
        if count >= patience:
            return step
    return None


def train(args: list[str], env: dict | None = None):
    result = run_cli(python_module("ner.train", *args), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def one_process(tiny_bert_no_dropout, tiny_data, tmp_path_factory):
    """1 raw-DDP process, 2 micro-batches per update: the global batch of 2 ranks x 1."""
    out = tmp_path_factory.mktemp("one") / "run"
    result = train(early_stopping_args(tiny_bert_no_dropout, tiny_data, out, "--raw-ddp",
                                       "--gradient-accumulation-steps", "2"))
    evaluations = [(r["step"], r["eval"]["f1"]) for r in records(out) if "eval" in r]
    stop = expected_stop(evaluations, PATIENCE, 0.0)
    assert stop is not None and stop < PLANNED_UPDATES  # the data must make it stop early, or nothing is shown
    return {"out": out, "stop": stop, "stderr": result.stderr, "state": read_state(list_checkpoints(out)[-1])}


def test_one_process_stops_where_the_rule_says_says_why_and_exports_the_best(one_process):
    out, stop, state = one_process["out"], one_process["stop"], one_process["state"]["train_state"]
    assert state["global_step"] == stop and state["evals_without_improvement"] == PATIENCE
    (stopped,) = [r for r in records(out) if "stop" in r]
    assert stopped["step"] == stop and stopped["stop"] == "early_stopping"
    assert f"{PATIENCE} evaluations without a validation F1 gain above 0" in stopped["reason"]
    assert f"training stopped at step {stop}: early stopping" in one_process["stderr"]
    final = json.loads((out / "final" / "metrics.json").read_text())
    assert final["best_step"] == state["best_step"] < stop and final["stop_reason"] == stopped["reason"]
    best = load_file(out / "checkpoints" / f"step_{state['best_step']}" / "model" / "model.safetensors")
    exported = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(best[k], exported[k]) for k in best)


@pytest.mark.slow
def test_two_raw_ddp_ranks_stop_at_the_same_update_as_one_process(tiny_bert_no_dropout, tiny_data, tmp_path,
                                                                   one_process):
    out = tmp_path / "two"
    train(early_stopping_args(tiny_bert_no_dropout, tiny_data, out, "--raw-ddp", "--nproc", "2",
                              "--dist-timeout", "60"))
    state = read_state(list_checkpoints(out)[-1])
    assert state["world_size"] == 2
    assert state["train_state"]["global_step"] == one_process["stop"]
    assert [r["step"] for r in records(out) if r.get("stop") == "early_stopping"] == [one_process["stop"]]


def test_data_parallel_stops_at_the_same_update(tiny_bert_no_dropout, tiny_data, tmp_path, one_process):
    out = tmp_path / "dp"
    train(early_stopping_args(tiny_bert_no_dropout, tiny_data, out, "--data-parallel",
                              "--gradient-accumulation-steps", "2"))
    assert read_state(list_checkpoints(out)[-1])["train_state"]["global_step"] == one_process["stop"]


def test_resume_keeps_the_patience_counter(tiny_bert_no_dropout, tiny_data, tmp_path, one_process):
    """Killed at the evaluation before the stop (counter 1 of 2); the resumed run (under Accelerate)
    must stop at the same update, not count afresh and run on."""
    kill_step = one_process["stop"] - EVAL_STEPS
    out = tmp_path / "killed"
    args = early_stopping_args(tiny_bert_no_dropout, tiny_data, out, "--gradient-accumulation-steps", "2",
                               "--resume", "auto")
    killed = run_cli(python_module("ner.train", *args), env={"NER_FAULT_INJECT": f"kill:{kill_step}"})
    assert killed.returncode == -9
    assert read_state(out / "checkpoints" / f"step_{kill_step}")["train_state"]["evals_without_improvement"] == 1
    train(args)
    state = read_state(list_checkpoints(out)[-1])["train_state"]
    assert state["global_step"] == one_process["stop"] and state["stop_reason"]


class Ranks:
    """Stand-in backends for ranks that run side by side (threads): reduce_sum adds what every rank
    contributed, as all_reduce does."""

    def __init__(self, world_size: int) -> None:
        self.barrier = threading.Barrier(world_size)
        self.contributions: list[torch.Tensor] = []
        self.lock = threading.Lock()

    def rank(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(is_main_process=index == 0, device=torch.device("cpu"), reduce_sum=self.reduce_sum)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.contributions.append(tensor)
        self.barrier.wait(timeout=10)
        return torch.stack(self.contributions).sum(dim=0)


def counts_on_each_rank(state: TrainState, f1_by_rank: list[float], threshold: float) -> list[int]:
    ranks = Ranks(len(f1_by_rank))
    with ThreadPoolExecutor(len(f1_by_rank)) as pool:
        return list(pool.map(lambda i: count_without_improvement(state, f1_by_rank[i], threshold, ranks.rank(i)),
                             range(len(f1_by_rank))))


def test_the_counter_is_rank_zeros_on_every_rank_and_gains_must_exceed_the_threshold():
    state = TrainState(best_f1=0.5, evals_without_improvement=1)
    assert counts_on_each_rank(state, [0.505], 0.01) == [2]  # a gain of 0.005 <= 0.01
    assert counts_on_each_rank(state, [0.52], 0.01) == [0]
    # rank 0 saw no gain, rank 1 did: rank 0 decides, so both stop at the same update
    assert counts_on_each_rank(state, [0.5, 0.9], 0.0) == [2, 2]
    # rank 0 saw a gain, ranks 1 and 2 did not: neither may add its own count to rank 0's
    assert counts_on_each_rank(state, [0.9, 0.5, 0.4], 0.0) == [0, 0, 0]


def test_early_stopping_without_validation_is_one_clear_error(tiny_bert, tiny_data, tmp_path, capsys):
    args = tiny_args(tiny_bert, tiny_data, tmp_path / "a", "--early-stopping-patience", "2", "--no-eval")
    assert train_cli.main(args) == 2
    assert "error: --early-stopping-patience needs validation F1; drop --no-eval" in capsys.readouterr().err
    args = tiny_args(tiny_bert, tiny_data, tmp_path / "b", "--early-stopping-patience", "2")
    del args[args.index("--validation-file"):args.index("--validation-file") + 2]
    assert train_cli.main(args) == 2
    assert "error: --early-stopping-patience needs validation data" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(("name", "other"), [("validation_file", "other.conll"), ("eval_steps", 7), ("no_eval", True),
                                             ("early_stopping_patience", 3)])
def test_resume_refuses_a_change_of_what_picks_the_best_model(tmp_path, name, other):
    """Which evaluations happen, and on what, decide the best model and when patience runs out, as the
    early-stopping options do: a resumed run with other values would be a run no single setting gives."""
    from ner.errors import UserError
    from ner.training.checkpoint import check_compatible
    from ner.training.config import TrainConfig

    config = TrainConfig().to_dict()
    saved = {"config": config, "label_list": ["O"], "world_size": 1}
    with pytest.raises(UserError, match=f": cannot resume: {name}: checkpoint {config[name]!r}, now {other!r}$"):
        check_compatible(saved, {**config, name: other}, ["O"], 1, tmp_path)
