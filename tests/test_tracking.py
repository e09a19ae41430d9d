"""--report-to tensorboard through Accelerate's trackers, and a clear message without tensorboard."""

from __future__ import annotations

from conftest import tiny_args

from ner import train as train_cli


def test_tensorboard_events_are_written(tiny_bert, tiny_data, tmp_path):
    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--report-to", "tensorboard", "--max-steps", "4",
                                    "--logging-steps", "2")) == 0
    events = list(out.rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    assert {"loss", "lr", "eval/f1"} <= set(accumulator.Tags()["scalars"])


def test_missing_tensorboard_is_one_clear_error(tiny_bert, tiny_data, tmp_path, capsys, monkeypatch):
    import ner.backends.hf_accelerate as hf

    monkeypatch.setattr(hf, "is_tensorboard_available", lambda: False)
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--report-to", "tensorboard"))
    err = capsys.readouterr().err
    assert code == 2 and "error: --report-to tensorboard: tensorboard is not installed (pip install tensorboard)" in err
    assert not (tmp_path / "run").exists()
