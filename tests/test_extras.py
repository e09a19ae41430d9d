"""Install hints come from one table (ner/extras.py), and the extras it names are pyproject.toml's."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from ner.errors import UserError
from ner.extras import EXTRA_PACKAGES, install_hint
from ner.inference.runtimes import ONNX, OPENVINO, RUNTIME_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
TABLE = "ner/extras.py"


def requirement_names(requirements: list[str]) -> set[str]:
    """"prometheus-client>=0.20" -> "prometheus-client"; "ray[data]>=2.9" -> "ray" (pip's names, - for _)."""
    return {re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_every_extra_the_table_names_is_declared_and_brings_its_packages():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for extra, packages in EXTRA_PACKAGES.items():
        assert extra in declared, extra
        assert {package.replace("_", "-") for package in packages} <= requirement_names(declared[extra]), extra


def test_a_hint_names_each_extra_once_and_other_packages_by_name():
    assert install_hint("onnxruntime") == 'pip install -e ".[onnx]"'
    assert install_hint("fastapi", "uvicorn", "prometheus_client") == 'pip install -e ".[serve]"'
    assert install_hint("wandb", "aim") == "pip install wandb aim"
    assert install_hint("spacy", "wandb") == 'pip install -e ".[spacy]"; pip install wandb'


def pip_commands_spelled(source: str) -> list[int]:
    """Lines of string constants (f-string parts included) that spell a pip command; docstrings, the pasteable
    commands at the top of a module, are the user's to read and left alone."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
                  and isinstance(node.value, str) and "pip install" in node.value and id(node) not in docstrings)


def test_no_module_but_the_table_spells_a_pip_command():
    found = {}
    for path in sorted((ROOT / "ner").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = pip_commands_spelled(path.read_text(encoding="utf-8"))
        if lines and name != TABLE:
            found[name] = lines
    assert found == {}, f"spell install hints with ner.extras.install_hint: {found}"


def test_the_check_finds_a_pip_command_in_an_f_string_and_spares_docstrings():
    source = '"""pip install x"""\ndef f(p):\n    """pip install y"""\n    return f"needs {p}: pip install -e z"\n'
    assert pip_commands_spelled(source) == [4]


def load_runtime(runtime: str, path: Path):
    if runtime == ONNX:
        from ner.inference.onnx_runtime import onnx_session

        return onnx_session(path)
    from ner.inference.openvino_runtime import OpenVinoRuntime

    return OpenVinoRuntime(path, num_labels=3)


@pytest.mark.parametrize("runtime, says", [
    (ONNX, 'ONNX runtimes need onnxruntime: pip install -e ".[onnx]"'),
    (OPENVINO, 'OpenVINO runtimes need openvino: pip install -e ".[openvino]"'),
])
def test_a_runtime_without_its_package_names_the_command_that_installs_it(runtime, says, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, RUNTIME_PACKAGES[runtime][0], None)  # its import now raises ImportError
    with pytest.raises(UserError) as refused:
        load_runtime(runtime, tmp_path / "model.onnx")
    assert str(refused.value) == says


def test_an_onnx_export_without_onnx_stops_before_writing_and_names_the_command(tmp_path, monkeypatch, capsys):
    import importlib.util

    from ner import export

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "onnx" else real_find_spec(name, *rest))
    out = tmp_path / "exported"
    assert export.main([str(tmp_path / "no_model"), str(out), "--onnx"]) == 2
    assert capsys.readouterr().err.strip() == 'error: --onnx needs onnx and onnxruntime: pip install -e ".[onnx]"'
    assert not out.exists()
