"""The runtime names are written once, in ner/inference/runtimes.py's `REGISTRY = {...}`: the code,
benchmarks and tests read the constants, so a renamed or added runtime is one edit (CONVENTIONS.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from ner.inference.runtimes import RUNTIMES

ROOT = Path(__file__).resolve().parents[1]
DECLARED_IN = "ner/inference/runtimes.py"

# The strings equal to a runtime's name that stand for something else: (file, string) -> (how many, why)
NOT_RUNTIMES = {
    (DECLARED_IN, "openvino"): (1, "the package OPENVINO_RUNTIMES are read off"),
    ("ner/inference/runtime_choice.py", "torch"): (1, "the package, installed or in sys.modules"),
    ("ner/extras.py", "torch"): (1, "a package INSTALL names"),
    ("ner/extras.py", "onnx"): (2, "an extra of pyproject.toml and a package it brings"),
    ("ner/extras.py", "openvino"): (2, "an extra of pyproject.toml and a package it brings"),
    (DECLARED_IN, "onnx"): (1, "the package ONNX_WRITER names: torch.onnx writes the graphs with it"),
    ("ner/inference/cpu_threads.py", "torch"): (2, "the module in sys.modules"),
    ("ner/training/checkpoint.py", "torch"): (2, "the key of torch's RNG state in a checkpoint"),
    ("ner/training/hooks.py", "torch"): (1, "a package whose version a run records"),
    ("benchmarks/measure.py", "openvino"): (1, "the package whose matmul peak is measured"),
    ("benchmarks/report.py", "torch"): (1, "the torch version a report records"),
    ("tests/test_bench.py", "torch"): (1, "the torch version a report records"),
    ("tests/test_constraints.py", "torch"): (1, "a requirement's package name"),
    ("tests/test_layout.py", "torch"): (1, "a module the import rules name"),
    ("tests/test_layout.py", "onnx"): (1, "a module the import rules name"),
    ("tests/test_reliability.py", "torch"): (1, "a package whose version a run records"),
    ("tests/test_openvino.py", "openvino"): (1, "pytest.importorskip's package"),
    ("tests/test_runtime_choice.py", "openvino"): (1, "the package a stubbed find_spec lacks"),
    ("tests/test_extras.py", "onnx"): (1, "the package a stubbed find_spec lacks"),
    ("tests/conftest.py", "onnx"): (1, "a package the tests that need it are skipped without"),
    ("tests/conftest.py", "openvino"): (1, "a package the tests that need it are skipped without"),
}


def declaration_strings(tree: ast.Module) -> set[int]:
    """The ids of the string constants of `REGISTRY = {...}`: the one place the names are written."""
    for node in tree.body:
        targets = getattr(node, "targets", [getattr(node, "target", None)])
        if any(isinstance(t, ast.Name) and t.id == "REGISTRY" for t in targets):
            return {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return set()


def runtime_literals() -> dict[tuple[str, str], list[int]]:
    """(file, runtime name) -> the lines where a string constant equal to it is written."""
    found: dict[tuple[str, str], list[int]] = {}
    files = [*ROOT.glob("ner/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("tests/*.py")]
    for path in sorted(set(files) - {Path(__file__).resolve()}):  # this file names them to allow them
        name = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=name)
        skip = declaration_strings(tree) if name == DECLARED_IN else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in RUNTIMES and id(node) not in skip:
                found.setdefault((name, node.value), []).append(node.lineno)
    return found


def test_runtime_names_are_written_only_where_they_are_declared():
    found = runtime_literals()
    assert all(RUNTIMES) and declaration_strings(ast.parse((ROOT / DECLARED_IN).read_text(encoding="utf-8")))
    extra = [f"{file}:{line}: {value!r}" for (file, value), lines in sorted(found.items())
             if len(lines) > NOT_RUNTIMES.get((file, value), (0, ""))[0] for line in sorted(lines)]
    assert not extra, "runtime names written as literals (import them from ner.inference.runtimes, or add the " \
                      "use to NOT_RUNTIMES with its reason):\n" + "\n".join(extra)
    stale = {key for key, (count, _) in NOT_RUNTIMES.items() if len(found.get(key, ())) < count}
    assert not stale, f"NOT_RUNTIMES allows more than is written: {sorted(stale)}"
