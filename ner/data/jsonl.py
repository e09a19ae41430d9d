"""JSON lines: one JSON value a line, read with the line of each error; examples as {"tokens": [...],
"tags": [...]} records (their keys named by `Columns`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from ner.data.examples import Columns, Example
from ner.data.tags import TAG_HELP, TAG_PATTERN
from ner.data.text_files import read_utf8, write_lines
from ner.errors import UserError, at


def jsonl_records(path: Path, expected: str) -> Iterator[tuple[int, object]]:
    """(line, parsed JSON) per non-blank line; lines end at \\n only (JSON text may hold U+2028 as is)."""
    return parse_jsonl(read_utf8(path).split("\n"), path, expected)


def parse_jsonl(lines: Iterable[str], source: object, expected: str) -> Iterator[tuple[int, object]]:
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except json.JSONDecodeError as exc:
            raise at(source, line_no, f"not valid JSON ({exc.msg}); expected {expected}") from None


def write_jsonl(path: Path, records: Iterable[object]) -> Path:
    """One JSON value a line, non-ASCII as is: what jsonl_records reads back."""
    return write_lines(path, (json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def read_jsonl(path: Path, columns: Columns = Columns()) -> list[Example]:
    expected = f'{{"{columns.tokens}": [...], "{columns.tags}": [...]}}'
    examples = [example_from_record(record, str(path), line_no, columns)
                for line_no, record in jsonl_records(path, expected)]
    if not examples:
        raise UserError(f"{path}: no sentences found (expected one JSON object per line)")
    return examples


def example_from_record(record: object, source: str, line_no: int | None, columns: Columns) -> Example:
    expected = f'expected {{"{columns.tokens}": [words], "{columns.tags}": [tags]}} of equal length'
    if not isinstance(record, dict):
        raise at(source, line_no, expected)
    words = record.get(columns.tokens)
    tags = record.get(columns.tags, record.get("ner_tags"))
    if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags):
        raise at(source, line_no, expected)
    for tag in tags:
        if not isinstance(tag, str) or not TAG_PATTERN.match(tag):
            raise at(source, line_no, f"{tag!r} is not a valid tag ({TAG_HELP})")
    lines = [line_no] * len(words) if line_no is not None else None
    document = record.get(columns.document)
    if document is not None and (not isinstance(document, (str, int)) or isinstance(document, bool)):
        raise at(source, line_no, f'"{columns.document}" must be a string or an integer (got {document!r})')
    return Example([str(w) for w in words], list(tags), source, lines, document)
