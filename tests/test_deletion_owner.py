"""One function removes files: ner/files.py's remove_recorded, given a record of what the tool wrote. Every other
module goes through it (an AST scan of ner/ finds any other call that deletes or renames over a path), and it removes
only what the record lists, as it was recorded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ner import files

NER = Path(__file__).resolve().parent.parent / "ner"
OWNER = NER / "files.py"
# Calls that remove a path or rename one onto another (os.replace / os.rename replace what is at the target). A
# method named so is flagged on any object (Path.unlink, Path.rmdir, Path.rename); `.replace(` is not, since str and
# dataclasses have one: Path.replace is caught by review, not here.
DELETING_FUNCTIONS = {("os", "remove"), ("os", "unlink"), ("os", "rmdir"), ("os", "removedirs"), ("os", "replace"),
                      ("os", "rename"), ("os", "renames"), ("shutil", "rmtree"), ("shutil", "move")}
DELETING_METHODS = {"unlink", "rmdir", "rmtree", "rename", "removedirs"}


def deleting_calls(source: str, filename: str) -> list[str]:
    """`file:line: call` for each call in `source` that deletes or renames over a path, or imports such a function."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            found += [f"{filename}:{node.lineno}: from {node.module} import {alias.name}" for alias in node.names
                      if (node.module, alias.name) in DELETING_FUNCTIONS]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            if (owner, node.func.attr) in DELETING_FUNCTIONS or node.func.attr in DELETING_METHODS:
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_no_module_but_files_py_removes_files():
    found = []
    for path in sorted(NER.rglob("*.py")):
        if path != OWNER:
            found += deleting_calls(path.read_text(encoding="utf-8"), str(path.relative_to(NER.parent)))
    assert found == [], "remove files through ner.files.remove_recorded, with a record of what the tool wrote"


@pytest.mark.parametrize("code", ["import shutil\nshutil.rmtree(p)", "p.unlink(missing_ok=True)", "os.replace(a, b)",
                                  "from shutil import rmtree", "(p / 'x').rmdir()", "os.remove(p)", "p.rename(q)"])
def test_the_scan_finds_each_deleting_primitive(code):
    assert len(deleting_calls(code, "m.py")) == 1


def test_the_scan_leaves_calls_that_delete_nothing():
    assert deleting_calls("queue.remove(item)\n'a'.replace('a', 'b')\nos.path.exists(p)\nshutil.copy2(a, b)",
                          "m.py") == []


def test_remove_recorded_removes_what_the_record_lists_as_it_was_and_returns_the_rest(tmp_path):
    folder = tmp_path / "run"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights").write_bytes(b"w")
    (folder / "model" / "config.json").write_text("{}")
    (folder / "log").write_text("log")
    (folder / "notes.txt").write_text("mine")  # never recorded
    entries = {"model/weights": files.file_entry(folder / "model" / "weights"),
               "model/config.json": files.file_entry(folder / "model" / "config.json"), "log": {}, "gone": {}}
    (folder / "model" / "config.json").write_text("{'edited': 1}")  # recorded, edited since
    kept = files.remove_recorded(folder, entries, whole=True)
    assert kept == [folder / "model" / "config.json", folder / "notes.txt"]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == ["model", "model/config.json",
                                                                                   "notes.txt"]


def test_remove_recorded_compares_sizes_without_contents_and_removes_the_folder_once_empty(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights").write_bytes(b"w")
    entry = files.file_entry(folder / "model" / "weights")
    (folder / "model" / "weights").write_bytes(b"W")  # the same size: unseen without hashing
    assert files.remove_recorded(folder, {"model/weights": entry}, contents=False, whole=True) == []
    assert not folder.exists()
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights").write_bytes(b"grown")
    assert files.remove_recorded(folder, {"model/weights": entry}, contents=False) == [folder / "model" / "weights"]


def test_made_here_records_a_folder_whole(tmp_path):
    (tmp_path / ".step_4.new-0123abcd" / "model").mkdir(parents=True)
    (tmp_path / ".step_4.new-0123abcd" / "model" / "w").write_bytes(b"w")
    (tmp_path / "mine.txt").write_text("mine")
    assert files.remove_recorded(tmp_path, files.made_here(tmp_path, ".step_4.new-0123abcd")) == [
        tmp_path / "mine.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
