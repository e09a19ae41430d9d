"""Which reader a data file needs, and reading the splits: the one place that knows every format.

    from ner.data.formats import read_examples
    examples = read_examples("train.jsonl")                        # the format found from the content
    examples = read_examples("export.json", data_format="label-studio", span_alignment="expand")

A folder is a `datasets` save_to_disk folder; a file's format is found from its first bytes (`detect_format`)
or named with --data-format: CoNLL, JSON lines of words and tags (ner/data/conll.py, jsonl.py), or character spans over
raw text from annotation tools (ner/data/span_files.py, aligned by spans.py). This module imports both readers,
so that neither imports the other (docs/data_formats.md describes the formats).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ner.data import span_files, spans
from ner.data.conll import read_conll
from ner.data.examples import Columns, Example
from ner.data.hf_datasets import read_hf_dataset
from ner.data.jsonl import read_jsonl
from ner.data.tags import convert_scheme, detect_scheme
from ner.errors import UserError

log = logging.getLogger("ner")

# What a file holds: found from its content (auto) or named with --data-format. spans, label-studio and
# spacy are character spans over raw text (ner/data/span_files.py).
DATA_FORMATS = ("auto", "conll", "jsonl", "spans", "label-studio", "spacy")


def read_examples(path: str | Path, columns: Columns = Columns(), split: str = "train", data_format: str = "auto",
                  span_alignment: str = "strict") -> list[Example]:
    """Dispatch on what `path` is: a save_to_disk folder, or a file in one of DATA_FORMATS."""
    path = Path(path)
    if path.is_dir():
        return read_hf_dataset(str(path), split, columns)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    if data_format not in DATA_FORMATS:
        raise UserError(f"--data-format {data_format}: expected one of {', '.join(DATA_FORMATS)}")
    found = detect_format(path, columns) if data_format == "auto" else data_format
    if data_format == "auto" and found != "conll":
        log.info("%s: read as %s (found from its content; --data-format chooses another)", path, found)
    if found == "conll":
        return read_conll(path)
    if found == "jsonl":
        return read_jsonl(path, columns)
    return spans.to_examples(span_files.read_span_records(path, found, columns), str(path), span_alignment)


def detect_format(path: Path, columns: Columns = Columns()) -> str:
    """From the first bytes: a spaCy DocBin (zlib), a JSON list of tasks (Label Studio), JSON lines with
    "text" (spans) or with words and tags (jsonl); anything else is CoNLL."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    if path.suffix == ".spacy" or head[:2] in (b"\x78\x9c", b"\x78\xda"):  # DocBin.to_bytes is zlib-compressed
        return "spacy"
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    if text.startswith("[") and (path.suffix == ".json" or text[1:].lstrip()[:1] in ("{", "]")):
        return "label-studio"
    if text.startswith("{"):
        with open(path, encoding="utf-8-sig", errors="replace") as handle:
            first_line = next((line for line in handle if line.strip()), "")
        try:
            first = json.loads(first_line)
        except json.JSONDecodeError:
            first = None
        if isinstance(first, dict) and isinstance(first.get("text"), str) and columns.tags not in first \
                and "ner_tags" not in first:  # a text without tags: spans (Prodigy's may have "tokens" too)
            return "spans"
        if first is not None or path.suffix in (".jsonl", ".json"):
            return "jsonl"
    return "jsonl" if path.suffix in (".jsonl", ".json") else "conll"


@dataclass
class Splits:
    train: list[Example]
    validation: list[Example] | None
    test: list[Example] | None
    scheme: str


def load_splits(train: str | None, validation: str | None, test: str | None, dataset: str | None,
                tag_scheme: str, convert_to: str, columns: Columns = Columns(), data_format: str = "auto",
                span_alignment: str = "strict") -> Splits:
    """Read every split, settle the tag scheme once, convert where asked."""
    def read(path: str | None, split: str) -> list[Example] | None:
        if path is None:
            return None
        return read_examples(path, columns, split, data_format, span_alignment)

    if dataset:
        splits = [read_hf_dataset(dataset, "train", columns),
                  read(validation, "validation") or _optional_split(dataset, "validation", columns),
                  read(test, "test") or _optional_split(dataset, "test", columns)]
    else:
        splits = [read(train, "train"), read(validation, "validation"), read(test, "test")]
    scheme = detect_scheme(splits[0]) if tag_scheme == "auto" else tag_scheme
    if convert_to != "none":
        splits = [convert_scheme(s, convert_to) if s is not None else None for s in splits]
        scheme = convert_to
    return Splits(splits[0], splits[1], splits[2], scheme)


def _optional_split(dataset: str, split: str, columns: Columns) -> list[Example] | None:
    """A dataset's validation/test split where it has one; many hub datasets do."""
    try:
        return read_hf_dataset(dataset, split, columns)
    except UserError as exc:
        if f"no '{split}' split" in str(exc):
            return None
        raise
