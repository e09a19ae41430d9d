"""Every command in README.md and docs/*.md parses: a renamed flag, a removed option or a bad choice in a doc
fails here, with the file and line named.

Each `python -m ner.X` / `benchmarks.X`, `python scripts/X.py`, `accelerate launch ner/train.py` and `torchrun
... ner/train.py` line of a fenced shell block is given to its own `main(argv)`, stopped as soon as argparse has
accepted the arguments (nothing loads, trains or writes). Paths need not exist: parsing does not open them.
Commands that are not ours (pip, curl, pytest, label-studio) are left alone; a line that holds a shell value
argparse would have to convert (`--port $PORT`), or a program without a parser, is listed in NOT_PARSED
with why. The commands that run in
seconds offline are run for real in their own tests (test_cli.py, test_spans.py, test_corpus.py, ...).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"}
NOT_PARSED = {  # program -> why its commands are not parsed
    "scripts/make_sample_data.py": "takes no flags (an optional output folder), so it has no parser",
}


class Parsed(BaseException):
    """Raised in place of returning from parse_args: the command's arguments were accepted."""


def commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv from the program on) of every command of ours in the file's shell blocks."""
    text = path.read_text(encoding="utf-8")
    found = []
    for fence in FENCE.finditer(text):
        if fence.group(1) not in SHELL:
            continue
        first_line = text.count("\n", 0, fence.start(2)) + 1
        lines = fence.group(2).split("\n")
        index, variables = 0, {}
        while index < len(lines):
            start, line = index, lines[index]
            while line.endswith("\\") and index + 1 < len(lines):  # continuation lines
                index += 1
                line = line[:-1] + " " + lines[index]
            index += 1
            line = expand(line, variables)
            if not remember(line, variables):
                found.extend((first_line + start, argv) for argv in ours(line))
    return found


def expand(line: str, variables: dict[str, str]) -> str:
    """$NAME and ${NAME} of the block's own assignments (`L="--clients 64"` on a line of its own), as a shell
    expands them unquoted."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)


def remember(line: str, variables: dict[str, str]) -> bool:
    """True, with the values kept, where the line only assigns variables."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return False
    pairs = [re.fullmatch(r"([A-Za-z_]\w*)=(.*)", word, re.DOTALL) for word in words]
    if not words or not all(pairs):
        return False
    variables.update(pair.groups() for pair in pairs)
    return True


def ours(line: str) -> list[list[str]]:
    """The commands of ours on one shell line: split at pipes, `&&`, `;` and redirections, environment
    assignments and `$(` left off."""
    lexer = shlex.shlex(line.replace("$(", " ( "), posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: not a command line (prose in a block)
        return []
    segments, current = [], []
    for word in words:
        if word in SEPARATORS or set(word) <= set("|&;<>()"):
            segments.append(current)
            current = []
        else:
            current.append(word)
    segments.append(current)
    return [argv for argv in (program(segment) for segment in segments) if argv]


def program(words: list[str]) -> list[str] | None:
    """["module or script", *args] for a command of ours, else None."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    if not words:
        return None
    name = Path(words[0]).name
    if name in ("accelerate", "torchrun"):
        rest = words[2:] if name == "accelerate" and words[1:2] == ["launch"] else words[1:]
        for i, word in enumerate(rest):
            if word.endswith(".py") and word.startswith(("ner/", "scripts/", "benchmarks/")):
                return [word, *rest[i + 1:]]
            if word == "-m" and i + 1 < len(rest):
                return [rest[i + 1], *rest[i + 2:]]
        return None
    if not re.fullmatch(r"python3?", name) or len(words) < 2:
        return None
    if words[1] == "-m" and len(words) > 2 and words[2].split(".")[0] in ("ner", "benchmarks"):
        return [words[2], *words[3:]]
    if words[1].endswith(".py") and words[1].startswith(("scripts/", "benchmarks/", "ner/")):
        return words[1:]
    return None


def module_of(target: str):
    if target.endswith(".py") and not target.startswith("ner/"):
        name = f"_docs_{Path(target).stem}"
        if name not in sys.modules:  # registered before it runs: dataclasses look their module up
            spec = importlib.util.spec_from_file_location(name, ROOT / target)
            sys.modules[name] = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(sys.modules[name])
            except BaseException:  # not left half-made for the next command of the same script
                del sys.modules[name]
                raise
        return sys.modules[name]
    return importlib.import_module(target[:-3].replace("/", ".") if target.endswith(".py") else target)


def parse_only(target: str, argv: list[str], monkeypatch) -> str | None:
    """None when `target`'s main accepts `argv`; else what argparse said."""
    original = argparse.ArgumentParser.parse_args
    said: list[str] = []

    def accept(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    def error(self, message):
        said.append(message)
        raise SystemExit(2)

    module = module_of(target)
    if not re.search(r"parse_args\(|parse_config\(", inspect.getsource(module)):  # main would run for real
        return f"{target} has no argparse parser to check (list it in NOT_PARSED, with why)"
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", accept)
    monkeypatch.setattr(argparse.ArgumentParser, "error", error)
    try:
        module.main(argv)
    except Parsed:
        return None
    except SystemExit as exc:
        if exc.code == 0 and not said and "--help" in argv:
            return None
        return said[0] if said else "exited before its arguments were parsed"
    finally:
        monkeypatch.undo()
    return "main returned without parsing its arguments"


def all_commands() -> list:
    cases = []
    for path in DOCS:
        for line, argv in commands(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if argv[0] not in NOT_PARSED:
                cases.append(pytest.param(where, argv, id=f"{where}:{argv[0]}"))
    return cases


def test_the_docs_have_commands_to_check():
    targets = {argv[0] for case in all_commands() for argv in [case.values[1]]}
    assert {"ner.train", "ner.predict", "ner.serve", "ner.export", "ner.evaluate"} <= targets
    assert len(all_commands()) >= 60


@pytest.mark.parametrize(("where", "argv"), all_commands())
def test_every_documented_command_parses(where, argv, monkeypatch):
    target, args = argv[0], argv[1:]
    trained = args[args.index("--") + 1:] if target in ("benchmarks.seeds",) and "--" in args else None
    try:
        problem = parse_only(target, args, monkeypatch)
    except ModuleNotFoundError as exc:  # a partial install (.ci/run): the command needs an extra it lacks
        pytest.skip(f"{target} needs {exc.name}, not installed")
    assert problem is None, f"{where}: `{shlex.join(argv)}`: {problem}"
    if trained is not None:  # what follows `--` goes to ner.train
        problem = parse_only("ner.train", trained, monkeypatch)
        assert problem is None, f"{where}: the ner.train flags after `--`: {problem}"


def test_a_renamed_flag_is_caught(monkeypatch):
    assert parse_only("ner.predict", ["runs/x/final", "--batch-size", "8"], monkeypatch) is None
    assert "unrecognized arguments: --batch-sise" in parse_only("ner.predict", ["runs/x/final", "--batch-sise", "8"],
                                                               monkeypatch)


def test_the_model_cards_commands_parse_and_say_what_predict_does(tmp_path, monkeypatch):
    """The card every export carries is documentation too: its commands parse, and it describes raw-text
    input as ner.predict reads it (one JSON line per input line, character offsets)."""
    from ner.training.model_card import model_card

    card = tmp_path / "README.md"
    card.write_text(model_card({"model": "bert-base-cased", "label_list": ["O", "B-PER", "I-PER"],
                                "tag_scheme": "iob2", "global_step": 3, "casing": "types", "decode": "viterbi"},
                               {"validation": None}), encoding="utf-8")
    found = commands(card)
    assert {argv[0] for _, argv in found} >= {"ner.predict", "ner.evaluate"}
    for line, argv in found:
        assert parse_only(argv[0], argv[1:], monkeypatch) is None, (line, argv)
    text = card.read_text(encoding="utf-8")
    assert "one JSON line per input line" in text and "split on spaces, one JSON line per sentence" not in text
