"""Nothing of the user's is ever deleted: `ner.export` OUT (the model card included), `--overwrite-output-dir` (at
any depth: checkpoints, final/, trackers/), checkpoint rotation, and the temporary names of ner/files.py (created
here, never reused, removed on failure)."""

from __future__ import annotations

import json
import os
import re
import shutil
from types import SimpleNamespace

import pytest
from conftest import ONNX_PACKAGES, needs, python_module, run_cli, tiny_args

import ner.inference.onnx_export
from ner import files
from ner import train as train_cli
from ner.backends import trackers
from ner.errors import UserError
from ner.export import main as export_main
from ner.training import checkpoint as ckpt
from ner.training.export import EXPORT_TOOL, export_checkpoint
from ner.training.output_dir import MetricsLog, claim_output_dir, metrics_are_the_runs


def list_as_export(folder):
    """The record an export writes: its files with their size and SHA-256."""
    entries = {p.name: files.file_entry(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != files.RECORD}
    files.write_record(folder, EXPORT_TOOL, entries)


def listing(folder):
    return files.read_record(folder, EXPORT_TOOL)


def relist(folder, entries):
    files.write_record(folder, EXPORT_TOOL, entries)


@pytest.fixture
def export(random_model, tmp_path):
    """An export as this tool writes it (config.json + training_args.json, listed), built without training."""
    folder = tmp_path / "src"
    shutil.copytree(random_model, folder)
    (folder / "training_args.json").write_text(json.dumps({"label_list": ["O"]}))
    list_as_export(folder)
    return folder


@pytest.fixture
def checkpoint(random_model, tmp_path):
    """A complete checkpoint folder (model/, trainer_state.json, manifest.json), built without training."""
    folder = tmp_path / "checkpoints" / "step_4"
    shutil.copytree(random_model, folder / "model")
    state = {"config": {"model": "tiny-bert"}, "label_list": ["O", "B-PER", "I-PER"], "tag_scheme": "IOB2",
             "global_step": 4, "versions": {}, "eval_history": []}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    manifest = {p.relative_to(folder).as_posix(): files.file_entry(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    files.write_record(folder, ckpt.CHECKPOINT_TOOL, manifest, ckpt.MANIFEST, step=4)
    return folder


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_users_folder_as_out_is_refused_and_left_untouched(export, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "thesis.tex").write_text("three years of work")
    (project / "data").mkdir()
    (project / "data" / "notes.txt").write_text("keep me")
    before = snapshot(tmp_path)
    result = run_cli(python_module("ner.export", str(export), str(project)))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {project}: exists and holds files that are not an exported model (no config.json + "
        "training_args.json); nothing was changed: choose a new or empty folder for OUT"]
    assert snapshot(tmp_path) == before  # the user's files, and no staging folder left beside them


def test_our_own_export_is_replaced_only_with_overwrite(export, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export_main([str(export), str(out)]) == 0
    (out / "from_the_first_export").write_text("old")
    before = snapshot(out)
    capsys.readouterr()
    assert export_main([str(export), str(out)]) == 2
    assert one_error_line(capsys) == (f"error: {out}: already holds an exported model; pass --overwrite to "
                                      "replace it, or choose another OUT")
    assert snapshot(out) == before
    assert export_main([str(export), str(out), "--overwrite"]) == 0
    assert (out / "from_the_first_export").read_text() == "old" and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "src"]  # nothing staged or set aside left


def test_overwrite_replaces_only_the_exports_files_in_a_model_repository(export, tmp_path, caplog):
    """A clone of a model repository: .git/, the user's notes and an edited model card around an export."""
    out = tmp_path / "exported"
    (export / "README.md").write_text("# the model card an export writes\n")
    list_as_export(export)
    assert export_main([str(export), str(out)]) == 0
    (out / ".git" / "objects").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / ".git" / "objects" / "ab12").write_bytes(b"blob")
    (out / "NOTES.md").write_text("my evaluation")
    (out / "README.md").write_text("# my own model card\n")
    (out / "training_args.json").write_text(json.dumps({"stale": True}))
    with caplog.at_level("WARNING", logger="ner"):
        assert export_main([str(export), str(out), "--overwrite"]) == 0
    assert (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (out / ".git" / "objects" / "ab12").read_bytes() == b"blob"
    assert (out / "NOTES.md").read_text() == "my evaluation"
    assert (out / "README.md").read_text() == "# the model card an export writes\n"  # replaced, named in the log
    assert f"{out / 'README.md'}: edited since it was exported" in caplog.text
    assert "stale" not in (out / "training_args.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "src"]


@needs(*ONNX_PACKAGES)
def test_a_failing_export_keeps_the_old_one_whole(export, tmp_path, monkeypatch, capsys):
    out = tmp_path / "exported"
    assert export_main([str(export), str(out)]) == 0
    before = snapshot(out)

    def broken(folder, quantize=None, calibrate=None, refused=None):
        (folder / "model.onnx").write_bytes(b"half a graph")
        raise UserError("ONNX export differs from PyTorch")

    monkeypatch.setattr(ner.inference.onnx_export, "write_onnx", broken)
    assert export_main([str(export), str(out), "--onnx", "--overwrite"]) == 2
    assert "ONNX export differs" in one_error_line(capsys)
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "src"]


@needs(*ONNX_PACKAGES)
def test_export_in_place_adds_onnx_without_overwrite(export, monkeypatch):
    def fake(folder, quantize=None, calibrate=None, refused=None):
        (folder / "model.onnx").write_bytes(b"graph")
        return {"max_logit_diff": 0.0}

    monkeypatch.setattr(ner.inference.onnx_export, "write_onnx", fake)
    weights = (export / "model.safetensors").read_bytes()
    assert export_main([str(export), str(export), "--onnx"]) == 0
    assert (export / "model.onnx").read_bytes() == b"graph"
    assert (export / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in export.parent.iterdir()) == ["src"]


def test_an_empty_folder_is_filled_and_an_old_staging_name_is_not_ours(export, tmp_path):
    out = tmp_path / "exported"
    out.mkdir()
    users = tmp_path / ".exported.tmp"  # the staging name this tool once used, here a folder of the user's
    users.mkdir()
    (users / "keep.txt").write_text("mine")
    assert export_main([str(export), str(out)]) == 0
    assert (out / "training_args.json").is_file()
    assert (users / "keep.txt").read_text() == "mine"


def test_a_file_as_out_is_refused(export, tmp_path, capsys):
    out = tmp_path / "model.bin"
    out.write_bytes(b"user data")
    assert export_main([str(export), str(out)]) == 2
    assert f"{out}: exists and is not a folder" in one_error_line(capsys)
    assert out.read_bytes() == b"user data"


@needs(*ONNX_PACKAGES)
def test_a_readme_of_yours_in_an_export_is_replaced_only_with_overwrite_and_named_first(export, checkpoint, tmp_path,
                                                                                        monkeypatch, caplog, capsys):
    """OUT is an export that wrote no card (SRC had none); the README.md there is the user's, in no listing."""
    out = tmp_path / "exported"
    assert export_main([str(export), str(out)]) == 0
    (out / "README.md").write_text("# my model card\n")
    assert export_main([str(checkpoint), str(out)]) == 2  # an export is replaced only with --overwrite at all
    assert "already holds an exported model" in one_error_line(capsys)

    def fake_onnx(folder, quantize=None, calibrate=None, refused=None):
        (folder / "model.onnx").write_bytes(b"graph")
        return {"max_logit_diff": 0.0}

    monkeypatch.setattr(ner.inference.onnx_export, "write_onnx", fake_onnx)
    assert export_main([str(out), str(out), "--onnx"]) == 0  # in place: the export's files only
    assert (out / "README.md").read_text() == "# my model card\n" and (out / "model.onnx").is_file()
    assert "README.md" not in listing(out)

    real_replace, warned_before_swap = files.replace_folder, []

    def replace_folder(new, path):
        warned_before_swap.append(f"{out / 'README.md'}: not written by an export" in caplog.text)
        real_replace(new, path)

    monkeypatch.setattr(files, "replace_folder", replace_folder)
    with caplog.at_level("WARNING", logger="ner"):
        assert export_main([str(checkpoint), str(out), "--overwrite"]) == 0
    assert (out / "README.md").read_text().startswith("---\nlibrary_name: transformers")  # the card, after the log
    assert warned_before_swap == [True]


@pytest.mark.parametrize("card", ["yours", "edited"])
def test_the_end_of_training_export_refuses_to_replace_a_card_no_record_shows_it_wrote(checkpoint, tmp_path, card,
                                                                                       monkeypatch):
    out = tmp_path / "final"
    export_checkpoint(checkpoint, out, update=True)
    if card == "yours":  # an export that listed no card
        entries = listing(out)
        del entries["README.md"]
        relist(out, entries)
    (out / "README.md").write_text("# my notes on this model\n")
    before, work = snapshot(tmp_path), []
    monkeypatch.setattr(ner.training.export, "add_onnx", lambda *args: work.append(args))
    with pytest.raises(UserError, match=f"^{out / 'README.md'}: .*; nothing was changed: move it away"):
        export_checkpoint(checkpoint, out, update=True)
    assert snapshot(tmp_path) == before and work == []  # refused before the export's work


def test_a_card_of_yours_written_while_the_export_runs_is_not_replaced(checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "final"
    export_checkpoint(checkpoint, out, update=True)
    entries = listing(out)
    del entries["README.md"]
    relist(out, entries)
    (out / "README.md").unlink()
    monkeypatch.setattr(ner.training.export, "add_onnx", lambda *args: (out / "README.md").write_text("# mine\n"))
    with pytest.raises(UserError, match=f"^{out / 'README.md'}: not written by an export"):
        export_checkpoint(checkpoint, out, update=True)
    assert (out / "README.md").read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "final"]


def test_the_end_of_training_export_replaces_its_own_card_and_keeps_your_files(checkpoint, tmp_path, caplog):
    out = tmp_path / "final"
    export_checkpoint(checkpoint, out, update=True)
    card = (out / "README.md").read_text()
    (out / "NOTES.md").write_text("mine")
    with caplog.at_level("WARNING", logger="ner"):
        export_checkpoint(checkpoint, out, {"validation": None, "stop_reason": "resumed and stopped"}, update=True)
    assert (out / "README.md").read_text() != card and (out / "NOTES.md").read_text() == "mine"
    assert caplog.text == ""


def test_the_runs_own_export_reads_the_hashes_of_the_checkpoint_it_sealed(checkpoint, tmp_path, monkeypatch):
    """The end of a run exports the checkpoint it sealed a moment ago (sealed_here) without hashing it again, and the
    record takes the copied model files' hashes from the manifest; it still lists every file as it is."""
    import ner.training.checkpoint

    hashed = []
    for module in (files, ner.training.checkpoint):
        monkeypatch.setattr(module, "sha256_file", lambda path, real=files.sha256_file: hashed.append(path.name) or
                            real(path))
    out = export_checkpoint(checkpoint, tmp_path / "final", update=True, sealed_here=True)
    assert sorted(hashed) == ["README.md", "metrics.json", "training_args.json"]  # what the export wrote itself
    assert listing(out) == {p.name: files.file_entry(p) for p in out.iterdir() if p.name != files.RECORD}
    hashed.clear()
    export_checkpoint(checkpoint, tmp_path / "again")
    assert "model.safetensors" in hashed and "trainer_state.json" in hashed  # any other export verifies first


# ----------------------------------------------------------------------------- --overwrite-output-dir

def claim(out, overwrite=True, resume=None, resume_from=None, run_trackers=None):
    """claim_output_dir on one process; returns the run's claim on trackers/ (`run_trackers`, else a new one)."""
    cfg = SimpleNamespace(output_path=out, resume=resume, overwrite_output_dir=overwrite)
    run_trackers = run_trackers or trackers.TrackerClaim()
    claim_output_dir(cfg, SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None), run_trackers,
                     resume_from)
    return run_trackers


def trackers_of_a_run(out):
    """What tensorboard and mlflow leave in trackers/, recorded the way a run records it."""
    run = trackers.TrackerClaim()
    run.take(out)
    (out / "trackers" / "ner" / "1700000000.5").mkdir(parents=True)
    (out / "trackers" / "ner" / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"events")
    (out / "trackers" / "ner" / "1700000000.5" / "hparams.yml").write_text("seed: 7\n")
    (out / "trackers" / "mlflow.db").write_bytes(b"sqlite")
    run.release()


def pinned_metrics(out):
    """metrics.jsonl as a run writes it: pinned in the run's record."""
    MetricsLog(out).append("{}\n")


def a_finished_run(out, export, checkpoint):
    shutil.copytree(checkpoint, out / "checkpoints" / "step_4")
    (out / "predictions").mkdir()
    (out / "predictions" / "validation.conll").write_text("Ada\tB-PER\tB-PER\n")
    pinned_metrics(out)
    (out / "loss_lr.png").write_bytes(b"png")
    shutil.copytree(export, out / "final")
    trackers_of_a_run(out)


def test_overwrite_output_dir_removes_the_run_and_nothing_else(export, checkpoint, tmp_path):
    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    (out / "data" / "train.conll").write_text("Ada B-PER\n")
    (out / "notes.md").write_text("mine")
    a_finished_run(out, export, checkpoint)
    claim(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["data", "data/train.conll", "notes.md"]


@pytest.mark.parametrize("users, named", [
    ("predictions/test_predictions.jsonl", "predictions/test_predictions.jsonl"),
    ("checkpoints/best_model.pt", "checkpoints/best_model.pt"),
    ("checkpoints/step_4/notes.txt", "checkpoints/step_4/notes.txt"),  # inside a checkpoint: not in its manifest
    ("checkpoints/step_4/model/mine/vocab.txt", "checkpoints/step_4/model/mine"),
    ("final/weights.bin", "final"),  # final/ that is not an export
    ("final/NOTES.md", "final/NOTES.md"),  # beside an export
    ("final/README.md", "final/README.md"),  # a model card edited since the export
    ("trackers/my_notes.md", "trackers/my_notes.md"),
    ("trackers/ner/notes.txt", "trackers/ner/notes.txt"),
    ("trackers/ner/1700000000.5/plots/f1.png", "trackers/ner/1700000000.5/plots")])
def test_overwrite_output_dir_refuses_a_users_file_among_a_runs(export, checkpoint, tmp_path, users, named):
    out = tmp_path / "run"
    out.mkdir()
    a_finished_run(out, export, checkpoint)
    if users == "final/weights.bin":
        shutil.rmtree(out / "final")
    (out / users).parent.mkdir(parents=True, exist_ok=True)
    (out / users).write_text("mine")
    before = snapshot(out)
    with pytest.raises(UserError, match=f"holds files a training run did not write or that changed since "
                                        f"\\({re.escape(str(out / named))}\\); nothing was removed"):
        claim(out)
    assert snapshot(out) == before


@pytest.mark.parametrize("users", ["checkpoints/.step_4.tmp-0123abcd", "checkpoints/.notes.new-0123abcd",
                                   "checkpoints/.tmp-step_x", "predictions/.validation.conll.tmp-0123abcd.txt"])
def test_overwrite_output_dir_removes_a_killed_saves_leftovers(export, checkpoint, tmp_path, users):
    """What a run killed mid-write leaves (ner/files.py's temporary names) is the run's; a folder of yours that
    only looks like one is not (ner/files.py makes no such name)."""
    out = tmp_path / "run"
    out.mkdir()
    a_finished_run(out, export, checkpoint)
    for staging in (".step_8.new-0123abcd", ".step_4.old-89abcdef"):
        (out / "checkpoints" / staging / "model").mkdir(parents=True)
        (out / "checkpoints" / staging / "optimizer.pt").write_bytes(b"half")
    (out / "predictions" / ".validation.conll.tmp-0123abcd.conll").write_text("Ada\tB-PER")
    claim(out)
    assert list(out.iterdir()) == []
    a_finished_run(out, export, checkpoint)
    if users.startswith("predictions/"):
        (out / users).write_text("mine")
    else:
        (out / users).mkdir()
    before = snapshot(out)
    with pytest.raises(UserError, match=re.escape(f"({out / users})")):
        claim(out)
    assert snapshot(out) == before


def test_overwrite_output_dir_refuses_trackers_no_record_lists(tmp_path):
    """A run killed before its first checkpoint, or one from before the record: nothing shows whose files these are."""
    out = tmp_path / "run"
    (out / "trackers" / "ner").mkdir(parents=True)
    (out / "trackers" / "ner" / "events.out.tfevents.1").write_bytes(b"events")
    before = snapshot(out)
    with pytest.raises(UserError, match=re.escape(f"({out / 'trackers' / 'ner'})")):
        claim(out)
    assert snapshot(out) == before


def test_the_tracker_record_never_lists_what_was_there_before_the_run_or_a_refused_run(checkpoint, tmp_path):
    out = tmp_path / "run"
    trackers_of_a_run(out)
    (out / "trackers" / "mine.txt").write_text("mine")  # added between two runs
    resumed = claim(out, overwrite=False, resume="auto", resume_from=checkpoint)  # resuming: nothing is removed
    (out / "trackers" / "ner" / "events.out.tfevents.1700000100.host.2.0").write_bytes(b"resumed")
    resumed.record()  # at a checkpoint
    assert trackers.unrecorded_tracker_files(out) == [out / "trackers" / "mine.txt"]
    (out / "trackers" / "later.txt").write_text("mine too")
    refused = trackers.TrackerClaim()
    with pytest.raises(UserError, match="mine.txt"):
        claim(out, run_trackers=refused)  # refused: the run holds no claim on `out`, so nothing joins the record
    refused.release()
    assert trackers.unrecorded_tracker_files(out) == [out / "trackers" / "later.txt", out / "trackers" / "mine.txt"]


def test_a_run_with_trackers_is_replaced_but_not_with_a_file_of_yours_in_trackers(tiny_bert, tiny_data, tmp_path,
                                                                                   capsys):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    args = tiny_args(tiny_bert, tiny_data, out, "--report-to", "tensorboard", "--logging-steps", "2",
                     "--max-steps", "4")
    assert train_cli.main(args) == 0
    assert trackers.unrecorded_tracker_files(out) == [] and (out / "trackers" / "ner").is_dir()
    (out / "trackers" / "ner" / "my_notes.md").write_text("mine")
    before = snapshot(out)
    capsys.readouterr()
    assert train_cli.main([*args, "--overwrite-output-dir"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: {out}: holds files a training run did not write or that changed since "
        f"({out / 'trackers' / 'ner' / 'my_notes.md'}); nothing was removed: move them away or choose another "
        "--output-dir") and "Traceback" not in err
    assert snapshot(out) == before
    (out / "trackers" / "ner" / "my_notes.md").unlink()
    assert train_cli.main([*args, "--overwrite-output-dir"]) == 0  # only the run's own files: replaced
    assert trackers.unrecorded_tracker_files(out) == []
    assert len(list((out / "trackers" / "ner").glob("events.out.tfevents.*"))) == 1  # the new run's only


def test_the_record_is_written_after_the_trackers_close(tmp_path, monkeypatch):
    """Trackers write their last files as they close (wandb's summary), after the run itself returned."""
    out = tmp_path / "run"

    def launch(cfg, worker, local_rank=None):
        claim(out, overwrite=False, run_trackers=worker.trackers)
        (out / "trackers" / "wandb").mkdir(parents=True)
        (out / "trackers" / "wandb" / "wandb-summary.json").write_text("{}")  # as the backend ends

    monkeypatch.setattr(train_cli, "launch", launch)
    assert train_cli.main(["--output-dir", str(out)]) == 0
    assert trackers.recorded_tracker_paths(out) == {"wandb", "wandb/wandb-summary.json"}


def test_a_run_killed_after_a_checkpoint_leaves_its_trackers_files_recorded(tiny_bert, tiny_data, tmp_path):
    """Each checkpoint brings the record up to date through the run's claim on trackers/: a run killed after one
    leaves no tracker file unlisted, so --overwrite-output-dir can replace it."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    args = tiny_args(tiny_bert, tiny_data, out, "--report-to", "tensorboard", "--logging-steps", "1", "--save-steps",
                     "2", "--max-steps", "4")
    killed = run_cli(python_module("ner.train", *args), env={"NER_FAULT_INJECT": "kill:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "ner" in trackers.recorded_tracker_paths(out) and trackers.unrecorded_tracker_files(out) == []
    claim(out)
    assert list(out.iterdir()) == []


def test_resume_auto_with_no_checkpoint_starts_beside_your_files_but_not_over_a_killed_first_save(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    claim(out, overwrite=False, resume="auto")  # no run here: a fresh start
    (out / "checkpoints" / ".step_4.new-0123abcd").mkdir(parents=True)  # a first save killed midway
    with pytest.raises(UserError, match=r"found no complete checkpoint, and the folder holds a run \(checkpoints\)"):
        claim(out, overwrite=False, resume="auto")
    claim(out, overwrite=True, resume="auto")
    assert [p.name for p in out.iterdir()] == ["notes.md"]


def test_resume_refuses_a_final_folder_it_would_have_to_replace(checkpoint, tmp_path):
    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "final" / "report.pdf").write_text("mine")
    with pytest.raises(UserError, match=re.escape(f"({out / 'final'})")):
        claim(out, overwrite=False, resume="auto", resume_from=checkpoint)
    assert (out / "final" / "report.pdf").read_text() == "mine"


@pytest.mark.parametrize("card", ["edited", "without a record"])
def test_resume_refuses_a_model_card_in_final_no_record_shows_the_export_wrote(checkpoint, tmp_path, card):
    out = tmp_path / "run"
    export_checkpoint(checkpoint, out / "final")
    (out / "final" / "NOTES.md").write_text("mine")  # the export carries this over: no reason to refuse
    claim(out, overwrite=False, resume="auto", resume_from=checkpoint)
    if card == "edited":
        (out / "final" / "README.md").write_text("# my card\n")
    else:
        (out / "final" / files.RECORD).unlink()
    before = snapshot(out)
    with pytest.raises(UserError, match=f"^{re.escape(str(out / 'final' / 'README.md'))}: .*; the resumed run's "
                                        "export would replace it: move it away"):
        claim(out, overwrite=False, resume="auto", resume_from=checkpoint)
    assert snapshot(out) == before


def test_rotation_keeps_a_checkpoint_that_holds_a_file_of_yours(checkpoint, tmp_path, caplog):
    out = checkpoint.parent.parent
    for step in (8, 12):
        shutil.copytree(checkpoint, out / "checkpoints" / f"step_{step}")
    (checkpoint / "model" / "my_probe.txt").write_text("mine")
    with caplog.at_level("WARNING"):
        ckpt.rotate(out, keep_newest=1, best_step=None)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_12", "step_4"]
    assert (checkpoint / "model" / "my_probe.txt").read_text() == "mine"
    assert f"{checkpoint}: not rotated" in caplog.text


def test_a_save_removes_a_killed_saves_staging_folders(random_model, tmp_path):
    """Only names a save gives (ner/files.py's for a step_N) are removed."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    root = tmp_path / "checkpoints"
    stale = [".step_8.new-0123abcd", ".step_4.old-89abcdef"]
    kept = [".step_4.tmp-0123abcd", ".notes.new-0123abcd", "tmp-step_3"]
    for name in stale + kept:
        (root / name).mkdir(parents=True)
    model = AutoModelForTokenClassification.from_pretrained(random_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backend = SimpleNamespace(is_main_process=True, process_index=0, grad_scaler=None, wait_for_everyone=lambda: None,
                              gather_object=lambda obj: [obj], unwrap_model=lambda m: m)
    folder = ckpt.save_checkpoint(backend, tmp_path, 4, model, AutoTokenizer.from_pretrained(random_model), optimizer,
                                  torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0), {"global_step": 4},
                                  trackers.TrackerClaim())
    assert folder == root / "step_4" and ckpt.verify(folder) is None
    assert sorted(p.name for p in root.iterdir()) == sorted(kept + ["step_4"])


# ----------------------------------------------------------------------------- ner/files.py

def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with files.staged_file(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    files.atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_a_failed_folder_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    path = tmp_path / "model"
    path.mkdir()
    (path / "weights").write_text("old")
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == 2:  # the new folder onto the final name
            raise OSError("crash")
        real_rename(src, dst)

    monkeypatch.setattr(files.os, "rename", rename)
    with pytest.raises(OSError, match="crash"):
        with files.staged_folder(path) as staged:
            (staged / "weights").write_text("new")
    assert (path / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_temporary_of_recognises_exactly_the_names_made_here(tmp_path):
    made = {}
    for final in ("part-00001.jsonl", "manifest.json", "step_12", "archive.tar.gz", ".hidden"):
        path = tmp_path / final
        made[files.new_file_beside(path, path.suffix).name] = (final, "tmp")
        made[files.new_file_beside(path).name] = (final, "tmp")
        made[files.new_folder_beside(path, "new").name] = (final, "new")
        made[files.new_folder_beside(path, "old").name] = (final, "old")
    with files.staged_file(tmp_path / "out.jsonl") as tmp:
        made[tmp.name] = ("out.jsonl", "tmp")
    for name, (final, role) in made.items():
        assert files.temporary_of(name) == final
        assert files.temporary_of(name, roles=(role,)) == final
        assert files.temporary_of(name, roles=tuple(r for r in files.ROLES if r != role)) is None
    # a user's names: no leading dot, no token, another token, role or suffix, the final name missing
    for name in ("notes.tmp-x", "notes.txt.tmp-0123abcd", ".notes.tmp", ".notes.txt.tmp-0123ABCD", ".notes.tmp-0123abc",
                 ".notes.txt.bak-0123abcd", ".notes.txt.tmp-0123abcd.md", ".notes.txt.tmp-0123abcd.txt.bak",
                 "..tmp-0123abcd", ".tmp-step_5"):
        assert files.temporary_of(name) is None, name
    with pytest.raises(ValueError):  # a name it would not recognise is never made
        files.new_file_beside(tmp_path / "a.json", ".txt")


def test_a_record_vouches_for_the_bytes_it_pins_and_the_paths_it_lists_and_is_its_tools_alone(tmp_path):
    """The one record every folder the tool writes into has: pinned files, free paths (a tracker's), the rest."""
    folder = tmp_path / "out"
    (folder / "logs" / "run1").mkdir(parents=True)
    (folder / "weights").write_bytes(b"w")
    (folder / "logs" / "events").write_bytes(b"e")
    files.write_record(folder, "ner.x", {"weights": files.file_entry(folder / "weights"), "logs": {},
                                         "logs/events": {}, "logs/run1": {}}, step=3)
    entries = files.read_record(folder, "ner.x")
    assert files.unrecorded(folder, entries) == [] and files.read_record(folder, "ner.y") is None
    (folder / "logs" / "events").write_bytes(b"grown")  # a free path: its contents are the tool's whatever they are
    (folder / "logs" / "run1" / "mine.txt").write_text("mine")  # inside a folder the tool made
    (folder / "notes").mkdir()
    (folder / "notes" / "a.txt").write_text("mine")
    (folder / "weights").write_bytes(b"W")  # the same size, other bytes
    assert files.unrecorded(folder, entries) == [(folder / "logs" / "run1" / "mine.txt", False),
                                                 (folder / "notes", False), (folder / "weights", True)]
    assert files.unrecorded(folder, entries, contents=False) == files.unrecorded(folder, entries)[:2]
    assert files.unrecorded(folder, entries, names={"weights"}) == [(folder / "weights", True)]
    assert [path.name for path, _ in files.unrecorded(folder, None)] == ["logs", "notes", "weights"]


# ----------------------------------------------------------------------------- --resume PATH of another run

def test_resume_from_another_runs_checkpoint_refuses_a_folder_that_holds_a_run(export, checkpoint, tmp_path):
    """--resume PATH names a checkpoint of another folder: a run already in --output-dir is not the one resumed, and
    rotation, the export and metrics.jsonl would take it over. Refused unless --overwrite-output-dir."""
    out = tmp_path / "b"
    out.mkdir()
    a_finished_run(out, export, checkpoint)
    before = snapshot(out)
    with pytest.raises(UserError, match=f"^{re.escape(str(out))}: holds another run \\(checkpoints, final, "
                                        f"metrics.jsonl.*\\), not the run of --resume {re.escape(str(checkpoint))}"):
        claim(out, overwrite=False, resume=str(checkpoint), resume_from=checkpoint)
    assert snapshot(out) == before
    claim(out, overwrite=True, resume=str(checkpoint), resume_from=checkpoint)  # told to: the old run goes
    assert list(out.iterdir()) == []


def test_resume_from_a_checkpoint_into_a_new_folder_or_its_own_run_goes_ahead(export, checkpoint, tmp_path):
    claim(tmp_path / "new", overwrite=False, resume=str(checkpoint), resume_from=checkpoint)
    own = tmp_path / "a"
    own.mkdir()
    a_finished_run(own, export, checkpoint)
    resumed = own / "checkpoints" / "step_4"
    before = snapshot(own)
    claim(own, overwrite=False, resume=str(resumed), resume_from=resumed)
    claim(own, overwrite=True, resume=str(resumed), resume_from=resumed)  # its own run: nothing is removed
    assert snapshot(own) == before


def test_the_command_refuses_to_resume_another_folders_checkpoint_over_a_finished_run(tiny_bert, tiny_data, tmp_path,
                                                                                      capsys):
    """The reported command: `--output-dir runs/b --resume runs/a/checkpoints/step_N` with runs/b finished: one line,
    exit 2, runs/b as it was (its checkpoints, final/ and metrics.jsonl included)."""
    runs = {name: tmp_path / name for name in "ab"}
    for out in runs.values():
        assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "4", "--save-steps", "2")) == 0
    step = ckpt.list_checkpoints(runs["a"])[-1]
    before = snapshot(runs["b"])
    capsys.readouterr()
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, runs["b"], "--max-steps", "6", "--resume", str(step))) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: {runs['b']}: holds another run (checkpoints, final, ")
    assert "Traceback" not in err
    assert snapshot(runs["b"]) == before


# ----------------------------------------------------------------------------- a checkpoint saved again

def test_resume_refuses_at_start_when_it_may_save_again_a_checkpoint_that_holds_a_file_of_yours(checkpoint, tmp_path):
    """A resume from step N saves step N (or a later one it finds) again, which replaces that folder whole: a file of
    yours there was removed with it. Refused at start, naming it; checkpoints before step N are left to rotation."""
    out = checkpoint.parent.parent
    shutil.copytree(checkpoint, out / "checkpoints" / "step_2")
    (out / "checkpoints" / "step_2" / "notes.txt").write_text("mine, in a checkpoint the resume never saves again")
    claim(out, overwrite=False, resume="auto", resume_from=checkpoint)
    (checkpoint / "step_99").mkdir()
    (checkpoint / "step_99" / "notes.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(UserError, match=f"^{re.escape(str(checkpoint / 'step_99'))}: .*the resumed run may save step "
                                        f"4 again.*move it away"):
        claim(out, overwrite=False, resume="auto", resume_from=checkpoint)
    assert snapshot(out) == before


def test_a_save_refuses_to_replace_a_checkpoint_that_holds_a_file_of_yours(tiny_bert, tiny_data, tmp_path, capsys):
    """The command (red before: exit 0, notes.txt gone): a resume that saves step 3 again over step_3/notes.txt."""
    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "3", "--save-steps", "1")) == 0
    (out / "checkpoints" / "step_3" / "notes.txt").write_text("mine")
    before = snapshot(out)
    capsys.readouterr()
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "3", "--save-steps", "1",
                                    "--resume", "auto")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {out / 'checkpoints' / 'step_3'}")
    assert snapshot(out) == before


def test_a_save_that_meets_a_file_of_yours_in_its_step_folder_keeps_it_and_refuses(checkpoint, tmp_path):
    """Dropped in while the run trains (the start could not see it): the save refuses, on every rank, and removes
    only its own staged copy; the old checkpoint and your file stay."""
    out = checkpoint.parent.parent
    (checkpoint / "notes.txt").write_text("mine")
    backend = SimpleNamespace(is_main_process=True, process_index=0, grad_scaler=None,
                              wait_for_everyone=lambda: None, gather_object=lambda value: [value],
                              unwrap_model=lambda model: model)
    model = SimpleNamespace(save_pretrained=lambda path, **kwargs: path.mkdir())
    tokenizer = SimpleNamespace(save_pretrained=lambda path: None)
    state = SimpleNamespace(state_dict=lambda: {})
    before = snapshot(out)
    with pytest.raises(UserError, match=f"^{re.escape(str(checkpoint))}: holds notes.txt"):
        ckpt.save_checkpoint(backend, out, 4, model, tokenizer, state, state, {}, trackers.TrackerClaim())
    assert snapshot(out) == before


# ----------------------------------------------------------------------------- metrics.jsonl, pinned line by line

@pytest.mark.parametrize("then", ["--overwrite-output-dir", "--resume auto"])
def test_an_edited_metrics_jsonl_is_yours_neither_removed_nor_appended_to(tiny_bert, tiny_data, tmp_path, capsys, then):
    """The run pins metrics.jsonl (size, sha256) in its record as it appends each line. Red before: the record listed
    it by name only, so --overwrite-output-dir removed an edited one and a resume appended to it."""
    out = tmp_path / "run"
    args = ("--max-steps", "2", "--save-steps", "1")
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, *args)) == 0
    pinned = files.read_record(out, "ner.train")["metrics.jsonl"]
    assert {key: pinned[key] for key in ("size", "sha256")} == files.file_entry(out / "metrics.jsonl")
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"note": "mine"}\n')
    before = snapshot(out)
    capsys.readouterr()
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "3", *then.split())) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert str(out / "metrics.jsonl") in err[-1] and "nothing was" in err[-1], err
    assert snapshot(out) == before


def test_a_run_killed_between_the_pin_and_the_append_still_owns_its_metrics_jsonl(tmp_path):
    """The pin is written before the line (never vouching for what follows it), with the bytes before the line."""
    out = tmp_path / "run"
    out.mkdir()
    log = MetricsLog(out)
    log.append('{"step": 1}\n')
    log.append('{"step": 2}\n')
    assert metrics_are_the_runs(out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')  # as if killed after the second pin, before its line
    assert metrics_are_the_runs(out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"mine": 1}\n')
    assert not metrics_are_the_runs(out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert metrics_are_the_runs(out)
    MetricsLog(out).append('{"step": 3}\n')  # a resume: the file read once, then hashed as it grows
    assert metrics_are_the_runs(out)
