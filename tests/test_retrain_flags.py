"""Label Studio's retraining writes what the served runtime reads, with the packages that runtime's files need to be
written and no others, and a server that could not retrain says so when it starts.

    python -m pytest -q tests/test_retrain_flags.py

The installs users have are simulated in a subprocess whose sitecustomize makes the blocked packages look absent
(importlib.util.find_spec finds nothing) and fail to import, as on `pip install -e ".[serve,onnx]"`.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("fastapi")

from ner.errors import UserError  # noqa: E402
from ner.extras import EXTRA_PACKAGES, install_hint  # noqa: E402
from ner.inference.runtimes import (  # noqa: E402
    ONNX,
    ONNX_INT8,
    RUNTIME_FILES,
    RUNTIME_PACKAGES,
    RUNTIME_TRAIN_FLAGS,
    RUNTIMES,
    TORCH,
    export_packages,
)
from tests.conftest import python_module, run_cli, tiny_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# what `pip install -e ".[serve,onnx]"` has not: the packages only OpenVINO's files need (openvino, nncf)
ONNX_INSTALL_LACKS = tuple(set(export_packages(RUNTIMES)) - set(export_packages((ONNX,))))
# what writes model.onnx but is not needed to run it (onnxruntime alone runs it): the package a serving-only install
# of --runtime onnx may lack
GRAPH_WRITER = next(package for package in export_packages((ONNX,)) if package not in RUNTIME_PACKAGES[ONNX])

BLOCKER = """
import importlib.abc, importlib.util, sys

BLOCKED = set({blocked!r})
real_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
    return None if name.split(".")[0] in BLOCKED else real_find_spec(name, package)


class Blocked(importlib.abc.MetaPathFinder):
    \"\"\"An import of a blocked package fails as on an install without it.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None


importlib.util.find_spec = find_spec
sys.meta_path.insert(0, Blocked())
"""


def without(tmp_path: Path, *blocked: str) -> dict[str, str]:
    """The environment of a subprocess that runs as if `blocked` were not installed."""
    hook = tmp_path / "blocker"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(textwrap.dedent(BLOCKER.format(blocked=sorted(blocked))))
    return {"PYTHONPATH": f"{hook}:{ROOT}"}


def hide(monkeypatch, *packages: str) -> None:
    """In this process: find_spec finds none of `packages` (what every install check asks)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] in packages else real(name, *a, **k))


def onnx_install_runs(runtime: str) -> bool:
    return not set(RUNTIME_PACKAGES[runtime]) & set(ONNX_INSTALL_LACKS)


@pytest.mark.parametrize("runtime", [runtime for runtime in RUNTIMES if onnx_install_runs(runtime)])
def test_the_retraining_flags_of_what_the_onnx_install_serves_are_accepted_there(runtime, monkeypatch):
    """On `.[serve,onnx]` --runtime auto serves onnx-int8 (AVX2, Arm): ner.train must take its retraining's flags.
    Before, every ONNX runtime's were --export-int8, which needs OpenVINO and NNCF: every retraining exited 2."""
    from ner.training.config import parse_config

    hide(monkeypatch, *ONNX_INSTALL_LACKS)
    parse_config(["--train-file", "x.conll", *RUNTIME_TRAIN_FLAGS[runtime]])


@pytest.mark.slow
def test_a_retraining_for_onnx_int8_on_the_onnx_install_writes_its_file_and_nothing_openvino(tiny_bert, tiny_data,
                                                                                            tmp_path):
    """The real command on the real install: ner.train with onnx-int8's retraining flags, OpenVINO and NNCF absent,
    ends 0 with model.int8.onnx in final/ and no OpenVINO file."""
    out = tmp_path / "run"
    done = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "1"),
                                 *RUNTIME_TRAIN_FLAGS[ONNX_INT8]), env=without(tmp_path, *ONNX_INSTALL_LACKS))
    assert done.returncode == 0, done.stderr[-2000:]
    written = {p.name for p in (out / "final").iterdir()}
    fast_files = {name for names in RUNTIME_FILES.values() for name in names}
    assert written & fast_files == set(RUNTIME_FILES[ONNX_INT8])


# -- the server says at start that it could not retrain --------------------------------------------------------

@pytest.fixture(scope="module")
def onnx_model(random_model, tmp_path_factory) -> Path:
    """The random model with model.onnx, so --runtime onnx can serve it."""
    from ner.inference.onnx_export import write_onnx

    folder = shutil.copytree(random_model, tmp_path_factory.mktemp("onnx_model") / "final")
    (folder / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "viterbi"}))
    write_onnx(folder)
    return folder


def test_a_label_studio_server_that_could_not_retrain_refuses_at_start_in_one_line(onnx_model, tmp_path):
    """onnxruntime alone runs model.onnx; writing it needs the onnx package too. With retraining configured
    (LABEL_STUDIO_URL), ner.serve refuses at start, naming what to install, instead of failing each retraining."""
    from ner.testing import free_local_port

    env = {**without(tmp_path, GRAPH_WRITER), "LABEL_STUDIO_URL": "http://label-studio.test",
           "LABEL_STUDIO_API_KEY": "k"}
    done = run_cli(python_module("ner.serve", str(onnx_model), "--runtime", ONNX, "--label-studio", "--port",
                                 str(free_local_port())), timeout=90, env=env)
    err = done.stderr.strip().splitlines()[-1]  # after the log lines of the model's loading
    assert done.returncode == 2 and err.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    assert f"--runtime {ONNX} needs {GRAPH_WRITER} " in err and install_hint(GRAPH_WRITER) in err
    assert "LABEL_STUDIO_URL" in err


def test_without_label_studio_url_retraining_is_off_and_nothing_is_checked(random_model, monkeypatch):
    from ner.serving.label_studio import LabelStudioModel

    monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    hide(monkeypatch, GRAPH_WRITER)
    LabelStudioModel(None, random_model, [], runtime=ONNX)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_start_check_asks_for_each_package_that_writes_the_runtimes_files(runtime, random_model, monkeypatch):
    from ner.inference.runtimes import REGISTRY
    from ner.serving.label_studio import LabelStudioModel

    skip_unless_installed(REGISTRY[runtime].export_packages)
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://label-studio.test")
    monkeypatch.setenv("NER_RETRAIN_DIR", str(random_model.parent / "runs"))
    LabelStudioModel(None, random_model, [], runtime=runtime)
    for package in REGISTRY[runtime].export_packages:
        with monkeypatch.context() as patched:
            hide(patched, package)
            with pytest.raises(UserError, match=rf"--runtime {runtime} needs .*{package}"):
                LabelStudioModel(None, random_model, [], runtime=runtime)


# -- every runtime of the registry: its export declared, its retraining's flags checked against it ----------------

def skip_unless_installed(packages: tuple[str, ...]) -> None:
    """A partial install (.ci/run's `.[serve,onnx]`) lacks some runtimes' writers: their rows cannot be run there."""
    lacking = [package for package in packages if importlib.util.find_spec(package) is None]
    if lacking:
        pytest.skip(f"not installed: {', '.join(lacking)}")


def optional_packages() -> set[str]:
    from ner.inference.runtimes import REGISTRY

    declared = {package for runtime in REGISTRY.values() for package in (*runtime.packages, *runtime.export_packages)}
    return ({package for packages in EXTRA_PACKAGES.values() for package in packages} | declared) - \
        set(RUNTIME_PACKAGES[TORCH])  # ner.train's own


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_runtimes_retraining_flags_validate_with_exactly_its_export_packages(runtime, monkeypatch):
    """A runtime added to REGISTRY gets this row: its files declare what writes them, its retraining flags ask
    ner.train for exactly those files, and validate with exactly those packages installed, and not without one."""
    from ner.inference.runtimes import REGISTRY
    from ner.training.config import parse_config, runtimes_to_export
    from ner.training.export import onnx_names

    declared = REGISTRY[runtime]
    assert bool(declared.files) == bool(declared.export_packages) == bool(declared.train_flags)
    skip_unless_installed(declared.export_packages)
    argv = ["--train-file", "x.conll", *RUNTIME_TRAIN_FLAGS[runtime]]
    with monkeypatch.context() as patched:
        hide(patched, *(optional_packages() - set(declared.export_packages)))
        cfg, _ = parse_config(argv)
    asked = runtimes_to_export(cfg.export_int8, cfg.export_runtime)
    assert onnx_names(asked) == set(declared.files)
    for package in declared.export_packages:
        with monkeypatch.context() as patched:
            hide(patched, package)
            with pytest.raises(UserError, match=rf"needs .*{package}.*: pip install"):
                parse_config(argv)


def test_an_unknown_runtime_to_export_is_one_line_naming_the_known():
    from ner.training.config import TrainConfig

    expected = rf"--export-runtime onnx,onx: no runtime 'onx' \(expected some of {', '.join(RUNTIMES)}, comma"
    with pytest.raises(UserError, match=expected):
        TrainConfig(export_runtime="onnx,onx").validate()


def test_under_auto_a_retraining_writes_the_files_of_the_runtime_auto_picked(onnx_model, tmp_path, monkeypatch):
    """The swap loads the new model with the runtime auto picked at start (Tagger.like keeps it), so the retraining
    asks for that runtime's files alone: not every installed runtime's (calibration and packages nobody reads)."""
    from ner.inference.runtimes import AUTO_RUNTIME
    from ner.inference.tagger import Tagger
    from ner.serving.app import create_app
    from ner.serving.requests import Limits

    monkeypatch.setenv("NER_RETRAIN_DIR", str(tmp_path / "runs"))
    tagger = Tagger(onnx_model, runtime=AUTO_RUNTIME)
    app = create_app(tagger, onnx_model, Limits(), label_studio=True)
    command = app.state.label_studio.retrainer.command(tmp_path / "export.json", tmp_path / "run")
    flags = RUNTIME_TRAIN_FLAGS[tagger.runtime_name]
    assert tagger.runtime_name != AUTO_RUNTIME and command[len(command) - len(flags):] == list(flags)
    others = {flag for names in RUNTIME_TRAIN_FLAGS.values() for flag in names} - set(flags)
    assert not others & set(command), command
