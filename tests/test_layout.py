"""The backend seam holds: only ner/backends/ imports the distributed machinery; nothing edits sys.path."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# The one exception: ner/train.py run as a file (`accelerate launch ner/train.py`) takes its own folder off sys.path,
# where Python puts it first, so that ner/select.py is not imported as the standard library's select
RUN_AS_A_FILE = {"ner/train.py": ["line 25: sys.path", "line 25: sys.path"]}  # read and written on one line


def test_nothing_edits_sys_path():
    offenders = {}
    for folder in ("ner", "benchmarks", "scripts", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            found = sys_path_edits(path.read_text(encoding="utf-8"))
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == RUN_AS_A_FILE


def test_ner_train_runs_as_a_file_beside_modules_named_as_the_standard_librarys():
    shadowing = sorted(p.stem for p in (ROOT / "ner").glob("*.py") if p.stem in sys.stdlib_module_names)
    assert shadowing == ["select"]  # a new one is fine where this test still passes; list it here
    result = subprocess.run([sys.executable, "ner/train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_sys_path_check_catches_both_forms():
    bad = "import sys\nsys.path.insert(0, 'scripts')\nmonkeypatch.syspath_prepend('x')\n"
    assert sys_path_edits(bad) == ["line 2: sys.path", "line 3: syspath_prepend"]
    assert sys_path_edits("import os\nos.path.join('a')\n") == []


def unused_loggers(source: str) -> list[str]:
    """Module-level `name = logging.getLogger(...)` that nothing in the module reads: a logger nobody logs to."""
    tree = ast.parse(source)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    found = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "getLogger"):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            found += [f"line {node.lineno}: {name}" for name in names if name not in read]
    return found


def test_every_module_level_logger_is_used():
    offenders = {}
    for folder in ("ner", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            found = unused_loggers(path.read_text(encoding="utf-8"))
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_logger_check_catches_an_unused_one():
    bad = "import logging\n\nlog = logging.getLogger(__name__)\n\ndef f():\n    return 1\n"
    assert unused_loggers(bad) == ["line 3: log"]
    fine = "import logging\nlog = logging.getLogger('ner')\n\ndef f():\n    log.info('x')\n"
    assert unused_loggers(fine) == []


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ner_imports(source: str) -> tuple[set[str], set[str]]:
    """The ner modules a file imports (`from ner.data import spans` names ner.data.spans): (module level, functions)."""
    def resolve(module: str, name: str) -> str:
        file = ROOT / Path(*module.split("."), name)
        return f"{module}.{name}" if file.with_suffix(".py").is_file() or file.is_dir() else module

    def found(nodes) -> set[str]:
        names = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name == "ner" or a.name.startswith("ner.")}
            elif isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("ner."):
                names |= {resolve(node.module, a.name) for a in node.names}
        return names

    tree = ast.parse(source)
    in_functions = [n for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for n in ast.walk(f)]
    inside = {id(n) for n in in_functions}
    return found(n for n in ast.walk(tree) if id(n) not in inside), found(in_functions)


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += graph.get(node, ())
    return False


# Function-level imports that close a cycle on purpose: a backend implements the protocol its package defines,
# and is imported only once chosen (it pulls in accelerate or torch.distributed).
LAZY_BY_DESIGN = {("ner.backends", f"ner.backends.{name}") for name in ("hf_accelerate", "raw_ddp", "data_parallel")}


def import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    top, lazy = {}, {}
    for path in (ROOT / "ner").rglob("*.py"):
        top[module_name(path)], lazy[module_name(path)] = ner_imports(path.read_text(encoding="utf-8"))
    return top, lazy


def test_data_readers_import_one_way():
    # formats.py picks the reader; the readers of words and tags (CoNLL, JSON lines, datasets) and spans.py
    # (character spans) never import it, and the former never import spans.py (spans.py builds on their Example);
    # span_files.py reads the files whose spans spans.py aligns.
    top, lazy = import_graphs()
    for reader in ("examples", "text_files", "conll", "jsonl", "hf_datasets", "tags"):
        assert not (top[f"ner.data.{reader}"] | lazy[f"ner.data.{reader}"]) & {"ner.data.spans", "ner.data.formats"}
    for spans in ("ner.data.spans", "ner.data.span_files"):
        assert "ner.data.formats" not in top[spans] | lazy[spans]
    assert {"ner.data.conll", "ner.data.jsonl", "ner.data.spans"} <= top["ner.data.formats"]


def test_no_function_level_import_hides_an_import_cycle():
    # A function-level import of a ner module is for cost (torch, onnx) only: made at module level, it must not
    # close a cycle, and module-level imports have none.
    top, lazy = import_graphs()
    hidden = sorted((module, target) for module, targets in lazy.items() for target in targets
                    if (module, target) not in LAZY_BY_DESIGN and reaches(top, target, module))
    assert hidden == []
    cycles = sorted((module, target) for module, targets in top.items() for target in targets
                    if target != module and reaches(top, target, module))
    assert cycles == []


def modules_the_layout_doc_lists(layout_doc: str) -> list[str]:
    map_start = layout_doc.index("```text", layout_doc.index("## Every module"))
    code_map = layout_doc[map_start:layout_doc.index("```\n", map_start + 7)]
    return [line.split()[0] for line in code_map.splitlines()[1:] if line.strip()]


def test_layout_doc_names_every_module():
    """docs/layout.md's map of the code has one line for each module in ner/, so it cannot go stale unnoticed."""
    listed = modules_the_layout_doc_lists((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"))
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "ner").rglob("*.py")}
    files -= {"ner/__init__.py"} | {f for f in files if f.endswith("/__init__.py") and f != "ner/backends/__init__.py"}
    assert sorted(listed) == sorted(files)


# ner/ grouped by job (docs/layout.md). Imports run one way: a group may import only the groups listed
# for it. Commands (`python -m ner.X`, the modules at the top) wire the groups together and may import any.
SHARED = {"ner.errors", "ner.process", "ner.extras", "ner.cpu", "ner.files", "ner.metrics", "ner.testing"}
COMMANDS = {"ner", "ner.train", "ner.predict", "ner.select", "ner.evaluate", "ner.export", "ner.serve", "ner.plot"}
MAY_IMPORT = {
    "shared": {"shared"},
    "data": {"shared", "data"},
    "backends": {"shared", "backends"},
    "inference": {"shared", "data", "backends", "inference"},
    "training": {"shared", "data", "backends", "inference", "training"},
    "serving": {"shared", "data", "inference", "serving"},  # retraining starts `ner.train` as a process
    "corpus": {"shared", "data", "backends", "inference", "corpus"},
}


def group_of(module: str) -> str:
    if module in SHARED:
        return "shared"
    if module in COMMANDS:
        return "commands"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in MAY_IMPORT:
        return parts[1]
    raise AssertionError(f"{module} belongs to no group: add it to one (tests/test_layout.py, docs/layout.md)")


def arrows_against_the_direction(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        group = group_of(module)
        if group == "commands":
            continue
        wrong += [f"{module} ({group}) imports {target} ({group_of(target)})" for target in sorted(targets)
                  if group_of(target) not in MAY_IMPORT[group]]
    return sorted(wrong)


def test_imports_run_one_way_between_the_groups():
    top, lazy = import_graphs()
    assert arrows_against_the_direction({m: top[m] | lazy[m] for m in top}) == []


def test_the_direction_check_catches_an_arrow_against_it():
    graph = {"ner.inference.tagger": {"ner.training.config", "ner.data.text"}, "ner.data.text": {"ner.errors"},
             "ner.serving.app": {"ner.training.run"}, "ner.predict": {"ner.training.run"}, "ner.errors": set()}
    assert arrows_against_the_direction(graph) == [
        "ner.inference.tagger (inference) imports ner.training.config (training)",
        "ner.serving.app (serving) imports ner.training.run (training)"]


@pytest.mark.parametrize("module", ["ner.evaluate", "ner.training.config", "ner.backends.trackers",
                                    "ner.inference.onnx_runtime", "ner.inference.openvino_runtime",
                                    "ner.inference.cpu_threads"])
def test_importing_a_module_that_needs_no_torch_does_not_load_it(module):
    """ner.evaluate scores tags before it loads a model (torch takes seconds to import); it reaches
    ner.backends through training/config.py -> backends/trackers.py, so the package must not load torch either.
    The ONNX and OpenVINO runtimes, and the thread policy they read, run where torch is not installed."""
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "False"


# What only some runs use, each seconds to import on 2 cores: plots, seqeval's report (scikit-learn, which pulls in
# scipy and pandas), --dataset and save_to_disk folders, --onnx.
ON_REQUEST = ("matplotlib", "sklearn", "seqeval.metrics", "scipy", "pandas", "datasets", "onnx", "onnxruntime")


def test_the_training_command_imports_no_step_it_has_not_reached():
    """Start-up is paid by every run (issue 45): `python -m ner.train` imports these in the step that uses them."""
    probe = ("import sys, ner.train, ner.training.run, ner.training.export, ner.training.hooks; "
             f"print(' '.join(m for m in {ON_REQUEST!r} if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == []
