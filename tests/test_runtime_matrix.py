"""Every runtime through every use. On one tiny model exported once with the files of every runtime installed here:
ner.predict (raw text, CoNLL, a corpus with a resume), ner.serve (POST /predict, a Label Studio retrain swap) and
ner.evaluate each work; on a model folder without the runtime's files, each refuses at start with one line naming the
command that writes them. Every row is parametrized over RUNTIME_CHOICES (auto, the default, and each of REGISTRY), so
a runtime added there gets every row; a cell is skipped only where its runtime's packages (RUNTIME_PACKAGES) or its
use's are not installed, so the refusals and the installed runtimes' cells run on any install.

    python -m pytest -q tests/test_runtime_matrix.py              # ~90 s of CPU: the export, two trainings, the rest
    python -m pytest -q tests/test_runtime_matrix.py -m 'not slow'  # the refusals only
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from conftest import fitted_export, make_sentences

from ner.backends import NO_MIXED_PRECISION
from ner.data.batching import NO_TOKEN_BUDGET
from ner.evaluate import main as evaluate_main
from ner.extras import EXTRA_PACKAGES
from ner.inference.model_folder import model_version
from ner.inference.onnx_export import EXPORT_PACKAGES
from ner.inference.openvino_export import STATIC_INT8_PACKAGES
from ner.inference.runtime_choice import resolve_runtime
from ner.inference.runtimes import (
    AUTO_RUNTIME,
    RUNTIME_CHOICES,
    RUNTIME_FILES,
    RUNTIME_PACKAGES,
    RUNTIME_TRAIN_FLAGS,
    RUNTIMES,
    export_command,
)
from ner.predict import main as predict_main
from ner.serve import main as serve_main
from ner.testing import free_local_port

SERVE_PACKAGES = (*EXTRA_PACKAGES["serve"], "httpx")  # httpx: FastAPI's TestClient and the Label Studio client


def installed(*packages: str) -> bool:
    return all(importlib.util.find_spec(package) is not None for package in packages)


def cells(runtimes=RUNTIME_CHOICES, *use_packages: str) -> list:
    """`runtimes` as parametrize cells, each skipped where its packages or the use's are not installed (auto needs
    none of its own: it picks among what is installed)."""
    def lacking(runtime: str) -> list[str]:
        return [p for p in (*RUNTIME_PACKAGES.get(runtime, ()), *use_packages) if not installed(p)]

    return [pytest.param(runtime, marks=pytest.mark.skipif(bool(lacking(runtime)),
                                                           reason=f"not installed: {', '.join(lacking(runtime))}"))
            for runtime in runtimes]


TEXTS = ["Ada Lovelace visited London on Monday .", "", "Shares of Acme Corp rose in Paris after Alan Turing spoke .",
         "Grace Hopper said the weather was fine .", "Initech hired Niels Bohr in Cairo ."]
FAST = ("--mixed-precision", NO_MIXED_PRECISION, "--quiet")
# Small and quick: the retraining's flags that are not the runtime's (tests/test_label_studio.py's)
RETRAIN_ARGS = f"--max-seq-length 32 --batch-size 8 --max-tokens {NO_TOKEN_BUDGET} --num-epochs 1 " \
               "--learning-rate 1e-3 --mixed-precision no --seed 7"
NEEDS_FILES = [runtime for runtime in RUNTIMES if RUNTIME_FILES[runtime]]  # a runtime that reads weights alone cannot
# miss its files


def export_flags(train_file: Path) -> list[str]:
    """ner.export's flags for the files of every runtime installed here: the ONNX graphs where their export's
    packages are, and OpenVINO's static int8 (calibrated on the training data) where its packages are too."""
    onnx = ["--onnx", "--quantize", "int8"] if installed(*EXPORT_PACKAGES) else []
    return [*onnx, "--calibrate", str(train_file)] if onnx and installed(*STATIC_INT8_PACKAGES) else onnx


@pytest.fixture(scope="module")
def exported(random_model, tiny_data, tmp_path_factory) -> Path:
    """The tiny model, briefly fitted, exported with the files of every runtime whose packages are installed."""
    flags = export_flags(tiny_data["train"])
    folder = fitted_export(random_model, tiny_data, tmp_path_factory, "matrix", *flags)
    runnable = [runtime for runtime in RUNTIMES if installed(*RUNTIME_PACKAGES[runtime])]
    assert not [(r, name) for r in runnable for name in RUNTIME_FILES[r] if not (folder / name).is_file()], flags
    return folder


@pytest.fixture(scope="module")
def bare(random_model, tmp_path_factory) -> Path:
    """An exported model folder with the weights, config and tokenizer only: no runtime's own files."""
    folder = shutil.copytree(random_model, tmp_path_factory.mktemp("bare") / "final")
    (folder / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "viterbi"}))
    assert not {name for names in RUNTIME_FILES.values() for name in names} & {p.name for p in folder.iterdir()}
    return folder


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def spans(results: list[dict]) -> list[list[tuple]]:
    return [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in results]


def runs_as(runtime: str, folder: Path) -> str:
    """The runtime a use given --runtime `runtime` runs on `folder`: itself, or what auto picks there."""
    return resolve_runtime(runtime, folder)


# -- each use works -------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("runtime", cells())
def test_predict_tags_raw_text_and_a_corpus_that_resumes(runtime, exported, texts_file, tmp_path, capsys):
    """Raw text to stdout, and the same file as a corpus in chunks of 2: a part removed is written again, byte for
    byte, the others skipped; the manifest names the runtime (auto's pick); the entities are the raw-text command's."""
    args = [str(exported), str(texts_file), "--runtime", runtime, *FAST]
    capsys.readouterr()
    assert predict_main(args) == 0
    raw = json_lines(capsys.readouterr().out)
    assert len(raw) == len(TEXTS) and any(r["entities"] for r in raw)
    assert all(e["text"] == text[e["start"]:e["end"]] for text, r in zip(TEXTS, raw) for e in r["entities"])
    out = tmp_path / "corpus"
    corpus_args = [*args, "--output-dir", str(out), "--chunk-texts", "2", "--merge"]
    assert predict_main(corpus_args) == 0
    assert json.loads((out / "manifest.json").read_text())["computation"]["runtime"] == runs_as(runtime, exported)
    written = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
    assert len(written) == 4  # 3 parts and the merged file
    kept = {name: (out / name).stat().st_mtime_ns for name in ("part-00000.jsonl", "part-00002.jsonl")}
    (out / "part-00001.jsonl").unlink()
    (out / "predictions.jsonl").unlink()
    assert predict_main(corpus_args) == 0
    assert {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))} == written
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    assert spans(json_lines((out / "predictions.jsonl").read_text())) == spans(raw)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", cells())
def test_predict_tags_conll_and_evaluate_scores_it(runtime, exported, tiny_data, tmp_path, capsys):
    capsys.readouterr()
    assert predict_main([str(exported), str(tiny_data["test"]), "--conll", "--runtime", runtime, *FAST]) == 0
    output = capsys.readouterr()
    sentences = json_lines(output.out)
    assert len(sentences) == 11 and all(s["words"] for s in sentences) and "precision" in output.err
    report = tmp_path / "report.json"
    assert evaluate_main([str(exported), str(tiny_data["test"]), "--runtime", runtime,
                          "--mixed-precision", NO_MIXED_PRECISION, "--json", str(report)]) == 0
    scores = json.loads(report.read_text())
    assert scores["sentences"] == 11 and scores["f1"] > 0  # the fitted model finds entities
    assert (scores["runtime"], scores["runtime_auto"]) == (runs_as(runtime, exported), runtime == AUTO_RUNTIME)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", cells(RUNTIME_CHOICES, *SERVE_PACKAGES))
def test_serve_answers_predict(runtime, exported):
    from fastapi.testclient import TestClient

    from ner.inference.tagger import Tagger
    from ner.serving.app import create_app
    from ner.serving.requests import Limits

    tagger = Tagger(exported, precision=NO_MIXED_PRECISION, runtime=runtime)
    assert tagger.runtime_name == runs_as(runtime, exported)
    with TestClient(create_app(tagger, exported, Limits())) as client:
        answer = client.post("/predict", json={"texts": TEXTS})
        health = client.get("/health").json()
    assert answer.status_code == 200, answer.text
    assert spans(answer.json()["results"]) == spans(tagger.predict(TEXTS)) and health["model"] == str(exported)


@pytest.fixture(scope="module")
def trained_by_command() -> dict[tuple[str, ...], Path]:
    """Run folders of retrainings, by their ner.train command less its paths: the runtimes whose retraining runs the
    same command share one training (it would write the same files), so the matrix trains once per distinct
    command, not once per runtime."""
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("runtime", cells(RUNTIME_CHOICES, *SERVE_PACKAGES))
def test_a_label_studio_retraining_swaps_in_a_model_the_runtime_runs(runtime, exported, tmp_path, monkeypatch,
                                                                     trained_by_command):
    """START_TRAINING under --runtime R: ner.train writes R's files into the new final/ (RUNTIME_TRAIN_FLAGS), and the
    swap loads it with R, so the server answers with the new model_version. Under auto, R is auto's pick, and the
    swap picks for the new folder: the same runtime, its files being there."""
    import httpx
    from fastapi.testclient import TestClient

    from ner.inference.tagger import Tagger
    from ner.serving.app import create_app
    from ner.serving.requests import Limits
    from tests.test_label_studio import (
        NER_CONFIG,
        label_studio_export,
        retraining_environment,
        tasks_of,
        wait_for_training,
    )

    retraining_environment(monkeypatch, tmp_path / "runs", RETRAIN_ARGS)
    export = label_studio_export(make_sentences(24, seed=5))
    served = Tagger(exported, precision=NO_MIXED_PRECISION, runtime=runtime)
    picked = runs_as(runtime, exported)
    assert served.runtime_name == picked
    app = create_app(served, exported, Limits(), label_studio=True)
    retrainer = app.state.label_studio.retrainer
    retrainer.transport = httpx.MockTransport(lambda request: httpx.Response(200, json=export))
    train = retrainer.train

    async def train_once_per_command(export_file: Path, run_dir: Path) -> int:
        key = tuple(arg for arg in retrainer.command(export_file, run_dir) if arg not in (str(export_file),
                                                                                          str(run_dir)))
        if key in trained_by_command:
            shutil.copytree(trained_by_command[key] / "final", run_dir / "final")
            return 0
        code = await train(export_file, run_dir)
        if code == 0:
            trained_by_command[key] = run_dir
        return code

    retrainer.train = train_once_per_command
    with TestClient(app) as client:
        before = client.get("/label-studio/health").json()["model_version"]
        started = client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": 5}})
        assert started.json()["training"] is True
        status = wait_for_training(client)
        assert status["status"] == "done", status
        new_dir = Path(status["output_dir"]) / "final"
        assert all((new_dir / name).is_file() for name in RUNTIME_FILES[picked])
        answer = client.post("/label-studio/predict", json={"tasks": tasks_of(TEXTS[:1]), "label_config": NER_CONFIG})
        health = client.get("/health").json()
    assert status["model_version"] == model_version(new_dir) != before
    assert answer.json()["results"][0]["model_version"] == status["model_version"] and health["model"] == str(new_dir)
    swapped = app.state.batcher.predict.__self__  # the tagger the server calls now
    assert swapped is not served and swapped.runtime_name == picked


def test_every_runtime_names_the_training_flags_that_write_its_files():
    """RUNTIME_TRAIN_FLAGS has every runtime, each with flags ner.train takes (a flag renamed there fails here)."""
    from ner.training.config import build_parser

    assert set(RUNTIME_TRAIN_FLAGS) == set(RUNTIMES)
    for runtime in RUNTIMES:
        build_parser().parse_args(["--train-file", "x.conll", *RUNTIME_TRAIN_FLAGS[runtime]])


# -- each use refuses at start without the runtime's files --------------------------------------------------------

def one_line_naming_the_export(capsys, runtime: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert export_command() in err and RUNTIME_FILES[runtime][0] in err and captured.out == ""
    return err


@pytest.mark.parametrize("runtime", NEEDS_FILES)
def test_without_its_files_each_command_refuses_at_start_naming_the_export(runtime, bare, texts_file, tiny_data,
                                                                          tmp_path, capsys):
    """On any install: the missing file is named before the runtime's package is asked for."""
    flags = ("--runtime", runtime, *FAST)
    capsys.readouterr()
    assert predict_main([str(bare), str(texts_file), *flags]) == 2
    one_line_naming_the_export(capsys, runtime)
    assert predict_main([str(bare), str(tiny_data["test"]), "--conll", *flags]) == 2
    one_line_naming_the_export(capsys, runtime)
    assert predict_main([str(bare), str(texts_file), "--output-dir", str(tmp_path / "out"), *flags]) == 2
    one_line_naming_the_export(capsys, runtime)
    assert not (tmp_path / "out").exists()
    assert evaluate_main([str(bare), str(tiny_data["test"]), "--runtime", runtime]) == 2
    one_line_naming_the_export(capsys, runtime)


@pytest.mark.parametrize("runtime", cells(NEEDS_FILES, *SERVE_PACKAGES))
def test_without_its_files_the_server_refuses_at_start_naming_the_export(runtime, bare, capsys):
    capsys.readouterr()
    assert serve_main([str(bare), "--runtime", runtime, "--port", str(free_local_port()), "--label-studio"]) == 2
    one_line_naming_the_export(capsys, runtime)
