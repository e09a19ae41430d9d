"""The backend seam holds: only ner/backends/ imports the distributed machinery."""

from __future__ import annotations

import ast
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


def test_no_cuda_literals_outside_backends():
    for path in (ROOT / "ner").rglob("*.py"):
        if "backends" in path.relative_to(ROOT / "ner").parts:
            continue
        source = path.read_text(encoding="utf-8")
        assert ".cuda()" not in source, path


def test_no_module_named_after_a_dependency():
    names = {p.stem for p in (ROOT / "ner").rglob("*.py")}
    assert not names & {"datasets", "accelerate", "transformers", "torch", "seqeval"}
