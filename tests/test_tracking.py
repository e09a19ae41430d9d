"""--report-to: Accelerate's trackers, offline, reading the logged values back; `all`; one clear
line for a tracker that is not installed.

tensorboard and mlflow-skinny are in the test extra: of the trackers that keep a run in local
files and leave the run alone, mlflow-skinny measured lightest to install (docs/backends.md).
"""

from __future__ import annotations

import json

import pytest
from conftest import python_module, run_cli, tiny_args

from ner import train as train_cli
from ner.backends.trackers import TRACKERS
from ner.errors import UserError


def logged_losses(out) -> dict[int, float]:
    """metrics.jsonl: step -> mean loss of the interval, what every tracker must show too."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def tensorboard_scalars(out, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(out / "trackers" / "ner"))  # a resumed run adds an event file there
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def test_tensorboard_logs_the_metrics_and_goes_on_after_resume(tiny_bert, tiny_data, tmp_path):
    out = tmp_path / "run"
    args = tiny_args(tiny_bert, tiny_data, out, "--report-to", "tensorboard", "--logging-steps", "2")
    assert train_cli.main([*args, "--max-steps", "4"]) == 0
    assert train_cli.main([*args, "--max-steps", "6", "--resume", "auto"]) == 0
    losses = logged_losses(out)
    assert sorted(losses) == [2, 4, 6]
    assert tensorboard_scalars(out, "loss") == pytest.approx(losses, rel=1e-6)  # float32 in the event file
    assert set(tensorboard_scalars(out, "eval/f1")) == {4, 6}


def mlflow_metric(out, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    folder = out / "trackers"
    database = folder / "mlflow.db"  # with full mlflow; mlflow-skinny has only the file store
    client = MlflowClient(f"sqlite:///{database}" if database.exists() else (folder / "mlruns").as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "ner"]
    (run,) = client.search_runs([experiment.experiment_id])
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}


def test_mlflow_and_tensorboard_together_offline_in_the_output_folder(tiny_bert, tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)  # the run must choose its own local store
    out = tmp_path / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--report-to",
                                                           "tensorboard,mlflow", "--max-steps", "4",
                                                           "--logging-steps", "2")))
    assert result.returncode == 0, result.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert mlflow_metric(out, "loss") == pytest.approx(logged_losses(out), rel=1e-6)
    assert set(mlflow_metric(out, "eval/f1")) == {4}
    assert tensorboard_scalars(out, "loss") == pytest.approx(logged_losses(out), rel=1e-6)


def test_all_means_every_installed_tracker(monkeypatch):
    import ner.backends.hf_accelerate as hf

    monkeypatch.setattr(hf, "tracker_installed", lambda name: name in ("dvclive", "tensorboard"))
    assert hf.chosen_trackers("all") == ["tensorboard", "dvclive"]
    assert hf.chosen_trackers("none") == []
    assert hf.chosen_trackers("dvclive, tensorboard") == ["dvclive", "tensorboard"]
    with pytest.raises(UserError, match=r"^--report-to tensorboard,wandb,aim: wandb, aim are not installed "
                                        r"\(pip install wandb aim\), or drop them"):
        hf.chosen_trackers("tensorboard,wandb,aim")


def test_every_tracker_accelerate_supports_is_accepted():
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    assert set(TRACKERS) == set(LOGGER_TYPE_TO_CLASS)


@pytest.mark.parametrize("value", ["neptune", "all,wandb", "none,tensorboard"])
def test_an_unknown_tracker_is_one_clear_error(tiny_bert, tiny_data, tmp_path, capsys, value):
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--report-to", value)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --report-to {value}: expected none, all, or trackers separated by commas")
    assert len(err.strip().splitlines()) == 1


def test_missing_tracker_is_one_clear_error(tiny_bert, tiny_data, tmp_path, capsys, monkeypatch):
    import ner.backends.hf_accelerate as hf

    monkeypatch.setattr(hf, "tracker_installed", lambda name: name != "tensorboard")
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--report-to", "tensorboard"))
    err = capsys.readouterr().err
    assert code == 2 and "error: --report-to tensorboard: tensorboard is not installed (pip install tensorboard)" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
