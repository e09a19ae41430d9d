"""The backend seam holds: only ner/backends/ imports the distributed machinery; nothing edits sys.path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESTRICTED = ("accelerate", "torch.distributed", "torch.nn.parallel", "torch.multiprocessing")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def is_restricted(name: str) -> bool:
    return any(name == r or name.startswith(r + ".") for r in RESTRICTED)


def test_only_backends_import_distributed_modules():
    offenders = {}
    for path in (ROOT / "ner").rglob("*.py"):
        if "backends" in path.relative_to(ROOT / "ner").parts:
            continue
        bad = sorted(n for n in imported_modules(path) if is_restricted(n))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_the_check_itself_catches_an_offender(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import torch.distributed as dist\nfrom torch.nn import parallel\nfrom accelerate import A\n")
    assert sorted(n for n in imported_modules(sample) if is_restricted(n)) == [
        "accelerate", "accelerate.A", "torch.distributed", "torch.nn.parallel"]


DEVICE_LITERAL = re.compile(r"^(cuda|mps|xpu)(:\d+)?$")


def device_choices(source: str) -> list[str]:
    """`.cuda()` calls and device strings ("cuda", "cuda:0", ...) used anywhere but as a dictionary key."""
    tree = ast.parse(source)
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            keys.add(id(node.left))  # `"cuda" in state`
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            found.append((node.lineno, ".cuda()"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and DEVICE_LITERAL.match(node.value)
              and id(node) not in keys):
            found.append((node.lineno, repr(node.value)))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_no_device_choices_outside_backends():
    offenders = {}
    for path in (ROOT / "ner").rglob("*.py"):
        if "backends" in path.relative_to(ROOT / "ner").parts:
            continue
        found = device_choices(path.read_text(encoding="utf-8"))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_device_check_catches_literals_and_spares_dictionary_keys():
    bad = 'import torch\nm.cuda()\ntorch.device("cuda")\nx.to("cuda:0")\ny = "mps"\n'
    assert [f.split(": ", 1)[1] for f in device_choices(bad)] == [".cuda()", "'cuda'", "'cuda:0'", "'mps'"]
    fine = 'state["cuda"] = 1\nif "cuda" in state:\n    pass\nd = {"cuda": 2}\nx = "cudagraph"\n'
    assert device_choices(fine) == []


def test_no_module_named_after_a_dependency():
    names = {p.stem for p in (ROOT / "ner").rglob("*.py")}
    assert not names & {"datasets", "accelerate", "transformers", "torch", "seqeval"}


def sys_path_edits(source: str) -> list[str]:
    """Lines that touch `sys.path` or prepend to it through pytest: imports must resolve as installed/packaged."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"):
            found.append((node.lineno, "sys.path"))
        elif isinstance(node, ast.Attribute) and node.attr == "syspath_prepend":
            found.append((node.lineno, "syspath_prepend"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_nothing_edits_sys_path():
    offenders = {}
    for folder in ("ner", "benchmarks", "scripts", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            found = sys_path_edits(path.read_text(encoding="utf-8"))
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_sys_path_check_catches_both_forms():
    bad = "import sys\nsys.path.insert(0, 'scripts')\nmonkeypatch.syspath_prepend('x')\n"
    assert sys_path_edits(bad) == ["line 2: sys.path", "line 3: syspath_prepend"]
    assert sys_path_edits("import os\nos.path.join('a')\n") == []
