"""End to end through the command lines: train -> checkpoint -> resume -> export -> predict,
and the bad-input matrix (one line naming file and line, exit code 2, nothing half-written)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import python_module, read_state, run_cli, tiny_args

from ner import train as train_cli
from ner.backends import NO_MIXED_PRECISION
from ner.errors import UserError
from ner.inference.runtimes import ONNX, TORCH
from ner.metrics import best_evaluation
from ner.training.checkpoint import list_checkpoints
from ner.training.output_dir import MetricsLog


@pytest.fixture(scope="module")
def trained(tiny_bert, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "6",
                                                           "--learning-rate", "3e-3", "--save-total-limit", "2",
                                                           "--plots")))
    assert result.returncode == 0, result.stderr[-3000:]
    (out / "stdout.txt").write_text(result.stdout, encoding="utf-8")
    return out


def test_final_folder_is_a_standard_hugging_face_model(trained):
    final = trained / "final"
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", "training_args.json", "metrics.json",
                 "README.md"):
        assert (final / name).is_file(), name
    config = json.loads((final / "config.json").read_text())
    assert config["id2label"]["0"] == "O" and "B-PER" in config["label2id"]
    metrics = json.loads((final / "metrics.json").read_text())
    assert metrics["validation"]["f1"] > 0.5  # the tiny model does learn the templated data
    assert set(metrics["test"]["per_type"]) == {"LOC", "ORG", "PER"}
    from transformers import AutoModelForTokenClassification, pipeline

    model = AutoModelForTokenClassification.from_pretrained(final)
    assert model.config.id2label[0] == "O"
    entities = pipeline("token-classification", model=str(final), aggregation_strategy="simple")(
        "Grace Hopper visited Paris on Monday .")
    assert {e["entity_group"] for e in entities} <= {"PER", "LOC", "ORG"}


def test_training_ends_on_where_the_model_is_and_how_to_use_it(trained):
    printed = (trained / "stdout.txt").read_text(encoding="utf-8").splitlines()
    metrics = json.loads((trained / "final" / "metrics.json").read_text())
    summary = [json.loads(line) for line in printed if line.startswith("{")]
    assert summary[-1]["validation"] == metrics["validation"]["f1"]  # the JSON line stays, before the text
    validation, test = metrics["validation"]["f1"] * 100, metrics["test"]["f1"] * 100
    assert f"Model ready: {trained / 'final'} (validation F1 {validation:.2f}, test F1 {test:.2f})" in printed
    commands = [line.split("#")[0].strip() for line in printed if "python -m ner." in line]
    assert [c.split("python -m ")[1].split()[0] for c in commands] == ["ner.predict", "ner.predict", "ner.serve",
                                                                        "ner.evaluate", "ner.plot"]
    assert all(str(trained / "final") in c for c in commands[:-1]) and commands[-1].endswith(str(trained))


def test_training_with_plots_leaves_every_plot(trained):
    """--plots: drawn once the run has ended (without it, none: test_a_run_imports_no_library...)."""
    for name in ("loss_lr.png", "validation_f1.png", "per_type_f1.png", "confusion.png"):
        assert (trained / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name


def test_a_run_imports_no_library_that_only_other_steps_need(tiny_bert, tiny_data, tmp_path):
    """Train, evaluate, test and export without matplotlib (plots: --plots), scikit-learn or pandas (seqeval.metrics
    pulls them in: ner.metrics counts the scores itself), datasets (--dataset) or onnx (--onnx): each costs seconds of
    a run. (scipy is not in the list: transformers' modeling_utils imports scipy.optimize wherever it is installed.)"""
    import sys

    code = ("import sys; from ner.train import main; code = main(sys.argv[1:]); print('imported:', *(m for m in "
            "('matplotlib', 'sklearn', 'pandas', 'datasets', 'onnx', 'onnxruntime') if m in sys.modules)); "
            "sys.exit(code)")
    result = run_cli([sys.executable, "-c", code, *tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--num-epochs",
                                                             "1")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "imported:"
    assert not list((tmp_path / "run").glob("*.png"))
    assert json.loads((tmp_path / "run" / "final" / "metrics.json").read_text())["test"]["support"] > 0


def test_rotation_keeps_the_newest_two_and_the_best(trained):
    """6 epochs, a checkpoint at each epoch end (where each evaluation is): kept are epochs 5, 6 and the best."""
    state = read_state(list_checkpoints(trained)[-1])
    evaluations = state["eval_history"]
    assert len(evaluations) == 6
    best = best_evaluation(evaluations)
    assert state["best_step"] == best["step"]
    kept = [int(p.name.split("_")[1]) for p in list_checkpoints(trained)]
    assert kept == sorted({evaluations[-2]["step"], evaluations[-1]["step"], best["step"]})


def test_loss_plot_marks_each_epoch_where_it_really_ended(trained, monkeypatch):
    """Logging every 10 updates: the boundary is the epoch's last update, not the next logged step."""
    import ner.training.plots as plots

    state = read_state(list_checkpoints(trained)[-1])
    epoch_last_steps = [e["step"] for e in state["eval_history"]]  # one evaluation at each epoch's end
    assert any(step % 10 for step in epoch_last_steps)  # else this test could not tell the two apart
    run = plots.read_metrics(trained / "metrics.jsonl")
    assert run.epoch_ends == dict(enumerate(epoch_last_steps, start=1))
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: figures.append(figure) or path)
    plots.plot_loss_lr(run.logs, run.epoch_ends, trained / "unused.png")
    drawn = sorted({line.get_xdata()[0] for line in figures[0].axes[0].lines[1:]})
    assert drawn == [step for step in epoch_last_steps if step < run.logs[-1]["step"]]


def test_metrics_log_real_and_padded_tokens_of_every_update(trained):
    """What the benchmark reads instead of re-deriving the batch plan: each micro-batch's shape and real tokens."""
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    logs = [r for r in records if "loss" in r]
    assert logs and all(r["step"] % 10 == 0 for r in logs)  # --logging-steps 10
    for record in logs:
        shapes = record["batch_shapes"]
        assert len(shapes) == 10  # one micro-batch per update, 10 updates per record
        assert record["padded_tokens"] == sum(rows * width for rows, width, _ in shapes)
        assert record["real_tokens"] == sum(real for _, _, real in shapes) < record["padded_tokens"]
        assert all(rows <= 4 and width % 4 == 0 for rows, width, _ in shapes)  # --batch-size 4, widths rounded


def test_predict_json_from_stdin_and_conll_output(trained, tiny_data):
    final = trained / "final"
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "ner.predict", str(final), "--pretokenized"],
                            input="Ada Lovelace visited London .\n",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[0])
    assert record["words"] == ["Ada", "Lovelace", "visited", "London", "."]
    for entity in record["entities"]:
        assert set(entity) == {"text", "type", "start", "end", "score"}
        assert entity["text"] == " ".join(record["words"][entity["start"]:entity["end"]])
    tagged = run_cli(python_module("ner.predict", str(final), str(tiny_data["test"]), "--conll", "--format", "conll"))
    assert tagged.returncode == 0, tagged.stderr
    assert "micro avg" in tagged.stderr  # the seqeval report for gold input
    words = [line.split("\t")[0] for line in tagged.stdout.splitlines() if line]
    gold_words = [line.split()[0] for line in tiny_data["test"].read_text().splitlines()
                  if line.strip() and not line.startswith("-DOCSTART-")]
    assert words == gold_words  # every word tagged, none dropped


def test_export_any_checkpoint_gives_the_same_format(trained, tmp_path):
    checkpoint = list_checkpoints(trained)[0]
    result = run_cli(python_module("ner.export", str(checkpoint), str(tmp_path / "exported")))
    assert result.returncode == 0, result.stderr
    exported = {p.name for p in (tmp_path / "exported").iterdir()}
    assert exported == {p.name for p in (trained / "final").iterdir()}


def test_export_checkpoint_with_onnx_adds_checked_onnx_files(trained, tiny_data, tmp_path):
    """SRC a checkpoint (manifest.json): the usual folder plus both ONNX files; onnx tags as torch does."""
    pytest.importorskip("onnxruntime")
    from ner.export import main as export_main

    checkpoint = list_checkpoints(trained)[-1]
    out = tmp_path / "exported"
    assert export_main([str(checkpoint), str(out), "--onnx", "--quantize", "int8"]) == 0
    exported = {p.name for p in out.iterdir()}
    assert exported == {p.name for p in (trained / "final").iterdir()} | {"model.onnx", "model.int8.onnx"}
    tagged = {}
    for runtime in (TORCH, ONNX):
        result = run_cli(python_module("ner.predict", str(out), str(tiny_data["test"]), "--conll", "--quiet",
                                       "--mixed-precision", NO_MIXED_PRECISION, "--runtime", runtime))
        assert result.returncode == 0, result.stderr[-2000:]
        tagged[runtime] = result.stdout
    assert tagged[ONNX] == tagged[TORCH] and tagged[TORCH]


def test_resume_auto_continues_and_matches_an_uninterrupted_run(tiny_bert, tiny_data, tmp_path):
    full = tmp_path / "full"
    args = tiny_args(tiny_bert, tiny_data, full, "--save-steps", "4", "--save-total-limit", "0", "--no-eval")
    assert train_cli.main(args) == 0
    cut = tmp_path / "cut"
    shutil.copytree(full / "checkpoints" / "step_20", cut / "checkpoints" / "step_20")
    (cut / "checkpoints" / "step_24").mkdir()  # an interrupted save: no manifest, must be skipped
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, cut, "--save-steps", "4", "--save-total-limit", "0",
                                    "--no-eval", "--resume", "auto")) == 0
    a = read_state(list_checkpoints(full)[-1])["train_state"]
    b = read_state(list_checkpoints(cut)[-1])["train_state"]
    assert a["step_losses"] == b["step_losses"] and a["global_step"] == b["global_step"] == 30


def test_resume_auto_with_no_complete_checkpoint_starts_afresh_only_where_no_run_was(tiny_bert, tiny_data, tmp_path,
                                                                                   capsys):
    """Nothing written yet (a launcher's first start): a fresh run. A folder holding a run whose saves never
    finished: refused, naming what it holds, and left as it was, unless --overwrite-output-dir replaces that run."""
    fresh = tmp_path / "fresh"
    args = ["--max-steps", "2", "--no-eval", "--resume", "auto"]
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, fresh, *args)) == 0
    out = tmp_path / "run"
    (out / "checkpoints" / "step_24").mkdir(parents=True)  # an interrupted save: no manifest
    MetricsLog(out).append('{"step": 1, "loss": 9.0}\n')  # as the run wrote it: pinned in its record
    (out / "notes.md").write_text("mine")
    before = sorted((str(p.relative_to(out)), p.is_file() and p.read_text()) for p in out.rglob("*"))
    capsys.readouterr()
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, *args)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"error: {out}: --resume auto found no complete checkpoint, and the folder holds a run (checkpoints, "
        "metrics.jsonl); pass --overwrite-output-dir to start afresh there, or choose another --output-dir")
    assert "Traceback" not in err
    assert sorted((str(p.relative_to(out)), p.is_file() and p.read_text()) for p in out.rglob("*")) == before
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, *args, "--overwrite-output-dir")) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records and all(record.get("loss") != 9.0 for record in records)  # the new run's records only
    assert (out / "notes.md").read_text() == "mine"
    assert [p.name for p in list_checkpoints(out)] == ["step_2"]


# ----------------------------------------------------------------------------- bad input matrix

def bad_conll(tmp_path, name, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


BAD_TRAIN_FILES = {
    "no_tag": (b"Ada B-PER\nLovelace\n", ":2: expected 'word ... TAG'"),
    "bad_tag": (b"Ada B-PER\nLovelace I_PER\n", ":2: 'I_PER' is not a valid tag"),
    "empty": (b"", ": file is empty"),
    "latin1": (b"Ada B-PER\nna\xefve O\n", ":2: not UTF-8"),
    "binary": (b"\x7fELF\x00\x00\x01", ": looks like a binary file"),
}


def assert_clean_failure(code: int, err: str, out_dir, expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip() and "INFO" not in line]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert "Traceback" not in err
    assert not out_dir.exists() or not any(out_dir.iterdir())


@pytest.mark.parametrize("case", sorted(BAD_TRAIN_FILES))
def test_bad_training_file(case, tiny_bert, tiny_data, tmp_path, capsys):
    content, message = BAD_TRAIN_FILES[case]
    path = bad_conll(tmp_path, f"{case}.conll", content)
    data = {**tiny_data, "train": path}
    code = train_cli.main(tiny_args(tiny_bert, data, tmp_path / "out"))
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out", f"{path}{message}")


def test_missing_file(tiny_bert, tiny_data, tmp_path, capsys):
    data = {**tiny_data, "validation": tmp_path / "nope.conll"}
    code = train_cli.main(tiny_args(tiny_bert, data, tmp_path / "out"))
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out", f"{tmp_path / 'nope.conll'}: file not found")


def test_the_command_exits_with_its_code_and_its_last_words(tiny_bert, tiny_data, tmp_path):
    """python -m ner.train ends without the interpreter's teardown (process.exit_now): the code and the error line
    still come out."""
    data = {**tiny_data, "validation": tmp_path / "nope.conll"}
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, data, tmp_path / "out")))
    assert_clean_failure(result.returncode, result.stderr, tmp_path / "out", "nope.conll: file not found")


def test_the_console_script_ends_as_the_module_does(tiny_bert, tiny_data, tmp_path):
    """`ner-train` (pyproject's [project.scripts]) runs ner.train:command, the same main and fast exit."""
    import sys

    from conftest import ROOT

    assert 'ner-train = "ner.train:command"' in (ROOT / "pyproject.toml").read_text()
    data = {**tiny_data, "validation": tmp_path / "nope.conll"}
    argv = ["ner-train", *tiny_args(tiny_bert, data, tmp_path / "out")]
    code = f"import sys; sys.argv = {argv!r}; from ner.train import command; command()"
    result = run_cli([sys.executable, "-c", code])
    assert_clean_failure(result.returncode, result.stderr, tmp_path / "out", "nope.conll: file not found")


def test_model_folder_that_does_not_exist(tiny_data, tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "folder"
    code = train_cli.main(tiny_args(missing, tiny_data, tmp_path / "out"))
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out",
                         f"--model {missing}: folder does not exist")


def test_an_export_with_a_damaged_training_args_file_is_named_without_a_traceback(trained, tmp_path, capsys):
    from ner import predict as predict_cli

    damaged = tmp_path / "final"
    shutil.copytree(trained / "final", damaged)
    (damaged / "training_args.json").write_text('{"max_seq_length": 12', encoding="utf-8")
    code = predict_cli.main([str(damaged), str(tmp_path / "texts.txt")])
    err = capsys.readouterr().err
    assert code == 2 and f"{damaged / 'training_args.json'}: not readable JSON" in err and "Traceback" not in err


@pytest.mark.parametrize("name, hub_id", [("bert-base-cased", True), ("org/name.v2", True), ("./bert", False),
                                           ("/models/bert", False), ("org/name/sub", False), ("~/bert", False),
                                           ("my bert", False), ("C:\\bert", False)])
def test_a_model_name_not_spelled_as_a_hub_id_is_a_missing_folder(name, hub_id):
    """One rule tells a hub id from a folder: model loading and the model card's hub link both use it."""
    from ner.training.model import is_hub_id, resolve_model_path

    assert is_hub_id(name) == hub_id
    if not hub_id:
        with pytest.raises(UserError, match="folder does not exist"):
            resolve_model_path(name)


def test_validation_label_unseen_in_training(tiny_bert, tiny_data, tmp_path, capsys):
    path = bad_conll(tmp_path, "valid.conll", b"Ada B-PER\n\nacme B-COMPANY\n")
    code = train_cli.main(tiny_args(tiny_bert, {**tiny_data, "validation": path}, tmp_path / "out"))
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out",
                         f"{path}:3: tag 'B-COMPANY' never appears in the training data")


@pytest.mark.parametrize("text, message", [("learning_rte: 1\n", "unknown option 'learning_rte'"),
                                           ("num_epochs: three\n", "option 'num_epochs' expects int")])
def test_bad_yaml(tiny_bert, tiny_data, tmp_path, capsys, text, message):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    code = train_cli.main(["--config", str(config), *tiny_args(tiny_bert, tiny_data, tmp_path / "out")])
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out", f"{config}: {message}")


def test_max_seq_length_too_small_for_the_tokenizer(tiny_bert, tiny_data, tmp_path, capsys):
    code = train_cli.main([*tiny_args(tiny_bert, tiny_data, tmp_path / "out"), "--max-seq-length", "3"])
    assert_clean_failure(code, capsys.readouterr().err, tmp_path / "out", "--max-seq-length 3 is too small")


def test_output_dir_holding_another_run_is_refused(trained, tiny_bert, tiny_data, capsys):
    before = sorted(p.name for p in trained.iterdir())
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, trained))
    err = capsys.readouterr().err
    assert code == 2 and "holds another run" in err and "--overwrite-output-dir" in err
    assert sorted(p.name for p in trained.iterdir()) == before


def test_explicit_resume_of_a_corrupt_checkpoint_is_refused(trained, tiny_bert, tiny_data, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(list_checkpoints(trained)[-1], broken)
    with open(broken / "optimizer.pt", "r+b") as handle:
        handle.truncate(100)
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "out", "--resume", str(broken)))
    err = capsys.readouterr().err
    assert code == 2 and f"{broken}: not a complete checkpoint: optimizer.pt has 100 bytes" in err


def test_resume_with_other_labels_or_hyperparameters_lists_differences(trained, tiny_bert, tiny_data, tmp_path,
                                                                     capsys):
    checkpoint = list_checkpoints(trained)[-1]
    train_path = bad_conll(tmp_path, "t.conll", b"Ada B-PER\nsays O\n\nParis B-LOC\n")
    data = {**tiny_data, "train": train_path, "validation": train_path, "test": train_path}
    code = train_cli.main(tiny_args(tiny_bert, data, tmp_path / "out", "--resume", str(checkpoint),
                                    "--learning-rate", "0.5"))
    err = capsys.readouterr().err
    assert code == 2 and "cannot resume" in err
    assert "learning_rate: checkpoint 0.003, now 0.5" in err and "labels: checkpoint" in err


