"""Nothing of the user's is ever deleted: `ner.export` OUT, `--overwrite-output-dir`, and the temporary
names of ner/files.py (created here, never reused, removed on failure)."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest
from conftest import python_module, run_cli

import ner.export_onnx
from ner import files
from ner.errors import UserError
from ner.export import main as export_main
from ner.run import claim_output_dir


@pytest.fixture
def export(random_model, tmp_path):
    """An export as this tool writes it (config.json + training_args.json), built without training."""
    folder = tmp_path / "src"
    shutil.copytree(random_model, folder)
    (folder / "training_args.json").write_text(json.dumps({"label_list": ["O"]}))
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


def test_a_failing_export_keeps_the_old_one_whole(export, tmp_path, monkeypatch, capsys):
    out = tmp_path / "exported"
    assert export_main([str(export), str(out)]) == 0
    before = snapshot(out)

    def broken(folder, quantize=None):
        (folder / "model.onnx").write_bytes(b"half a graph")
        raise UserError("ONNX export differs from PyTorch")

    monkeypatch.setattr(ner.export_onnx, "write_onnx", broken)
    assert export_main([str(export), str(out), "--onnx", "--overwrite"]) == 2
    assert "ONNX export differs" in one_error_line(capsys)
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "src"]


def test_export_in_place_adds_onnx_without_overwrite(export, monkeypatch):
    def fake(folder, quantize=None):
        (folder / "model.onnx").write_bytes(b"graph")
        return {"max_logit_diff": 0.0}

    monkeypatch.setattr(ner.export_onnx, "write_onnx", fake)
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


# ----------------------------------------------------------------------------- --overwrite-output-dir

def claim(out, overwrite=True, resume=None):
    cfg = SimpleNamespace(output_path=out, resume=resume, overwrite_output_dir=overwrite)
    claim_output_dir(cfg, SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None))


def a_finished_run(out, export):
    (out / "checkpoints" / "step_4").mkdir(parents=True)
    (out / "checkpoints" / "step_4" / "manifest.json").write_text("{}")
    (out / "predictions").mkdir()
    (out / "predictions" / "validation.conll").write_text("Ada\tB-PER\tB-PER\n")
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "loss_lr.png").write_bytes(b"png")
    shutil.copytree(export, out / "final")


def test_overwrite_output_dir_removes_the_run_and_nothing_else(export, tmp_path):
    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    (out / "data" / "train.conll").write_text("Ada B-PER\n")
    (out / "notes.md").write_text("mine")
    a_finished_run(out, export)
    claim(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["data", "data/train.conll", "notes.md"]


@pytest.mark.parametrize("users, named", [("predictions/test_predictions.jsonl", "predictions/test_predictions.jsonl"),
                                          ("checkpoints/best_model.pt", "checkpoints/best_model.pt"),
                                          ("final/weights.bin", "final")])
def test_overwrite_output_dir_refuses_a_users_file_among_a_runs(export, tmp_path, users, named):
    out = tmp_path / "run"
    out.mkdir()
    a_finished_run(out, export)
    if users.startswith("final/"):
        shutil.rmtree(out / "final")
    (out / users).parent.mkdir(parents=True, exist_ok=True)
    (out / users).write_text("mine")
    before = snapshot(out)
    with pytest.raises(UserError, match=f"holds files a training run does not write \\({out / named}\\)"):
        claim(out)
    assert snapshot(out) == before


def test_resume_refuses_a_final_folder_it_would_have_to_replace(tmp_path):
    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "final" / "report.pdf").write_text("mine")
    with pytest.raises(UserError, match="does not write"):
        claim(out, overwrite=False, resume="auto")
    assert (out / "final" / "report.pdf").read_text() == "mine"


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
