"""An install that lacks a runtime's packages: every job asked to run that runtime refuses at start, in one line,
naming the command that installs what is missing; nothing is written. Each case runs the real command in a process
where the packages are hidden (tests/installs_hide.py), so it holds on the full install too; on a partial install
(.ci/run makes the core install and `.[serve,onnx]`) the packages are really missing as well. Read from the runtime
registry, so a runtime added there gets every row.

    python -m pytest -q tests/test_installs.py
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ner.extras import EXTRA_PACKAGES, install_hint
from ner.inference.runtimes import RUNTIME_FILES, RUNTIME_PACKAGES, RUNTIMES

HIDE = Path(__file__).with_name("installs_hide.py")
TEXTS = "Ada Lovelace visited London .\nGrace Hopper met Alan Turing in Paris .\n"


def run_hidden(hidden: tuple[str, ...], module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m module argv...` with `hidden` packages missing, as on an install without them."""
    return subprocess.run([sys.executable, str(HIDE), ",".join(hidden), module, *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def assert_refused_at_start(result: subprocess.CompletedProcess, hint: str, folder: Path, before: set[Path]) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert hint in lines[0], lines[0]
    assert set(folder.rglob("*")) == before, "a refusal wrote something"


@pytest.fixture(scope="module")
def every_runtimes_folder(random_model, tmp_path_factory) -> Path:
    """A model folder with every runtime's files present (placeholders: a runtime whose packages are missing must
    refuse before it reads them), so the package is the only thing missing."""
    folder = shutil.copytree(random_model, tmp_path_factory.mktemp("installs") / "final")
    (folder / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "viterbi"}))
    for names in RUNTIME_FILES.values():
        for name in names:
            (folder / name).write_bytes(b"placeholder")
    return folder


def jobs(folder: Path, work: Path, tiny_data: dict[str, Path]) -> dict[str, tuple[str, ...]]:
    """Each job that runs a model: its module and arguments (the runtime is added by the caller)."""
    (work / "texts.txt").write_text(TEXTS, encoding="utf-8")
    return {"predict": ("ner.predict", str(folder), "texts.txt"),
            "evaluate": ("ner.evaluate", str(folder), str(tiny_data["test"])),
            "corpus": ("ner.predict", str(folder), "texts.txt", "--output-dir", "tagged"),
            "serve": ("ner.serve", str(folder), "--port", "0")}


@pytest.mark.parametrize("job", ["predict", "evaluate", "corpus", "serve"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_runtime_without_its_packages_is_refused_at_start_naming_the_install(
        runtime, job, every_runtimes_folder, tiny_data, tmp_path):
    module, *argv = jobs(every_runtimes_folder, tmp_path, tiny_data)[job]
    before = set(tmp_path.rglob("*"))
    result = run_hidden(RUNTIME_PACKAGES[runtime], module, *argv, "--runtime", runtime, cwd=tmp_path)
    serve_lacking = [package for package in EXTRA_PACKAGES["serve"] if importlib.util.find_spec(package) is None]
    wanted = RUNTIME_PACKAGES[runtime] if not (job == "serve" and serve_lacking) else serve_lacking  # asked first
    assert_refused_at_start(result, install_hint(*wanted), tmp_path, before)


def test_serve_without_the_serve_extra_is_refused_at_start_naming_the_install(every_runtimes_folder, tmp_path):
    before = set(tmp_path.rglob("*"))
    result = run_hidden(EXTRA_PACKAGES["serve"], "ner.serve", str(every_runtimes_folder), cwd=tmp_path)
    assert_refused_at_start(result, install_hint(*EXTRA_PACKAGES["serve"]), tmp_path, before)
