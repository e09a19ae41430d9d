"""Reading span-annotated files into SpanRecords: texts with character spans, as annotation tools export them.

    span JSONL    {"text": "...", "entities": [[start, end, "TYPE"], ...]}, one text a line; the list may
                  be called "label" or "labels" (doccano) or "spans" (Prodigy; records it rejected are
                  skipped, and its "tokens" are kept as the words), and a span may be
                  {"start": .., "end": .., "label": ..}
    Label Studio  its JSON export (a list of tasks): the latest annotation of each task
    spaCy         a .spacy DocBin (needs spaCy: pip install -e ".[spacy]")

spans.py turns the records into words with tags (and tags back into spans).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from ner.data.examples import Columns
from ner.data.jsonl import jsonl_records
from ner.data.spans import SPAN_HELP, SPAN_KEYS, Span, SpanRecord
from ner.data.text import Word
from ner.data.text_files import read_utf8
from ner.errors import UserError, at
from ner.extras import install_hint

log = logging.getLogger("ner")
_LABEL = re.compile(r"^\S+$")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_spans(items: object, where: str) -> list[Span]:
    """[[start, end, label], ...] or [{"start", "end", "label" | "labels", "text"?}, ...]."""
    if not isinstance(items, list):
        raise UserError(f"{where}: the spans must be a list; {SPAN_HELP}")
    spans = []
    for item in items:
        text = None
        if isinstance(item, (list, tuple)) and len(item) >= 3:
            start, end, labels = item[0], item[1], [item[2]]
        elif isinstance(item, dict):
            start, end, text = item.get("start", item.get("start_offset")), item.get("end", item.get("end_offset")), \
                item.get("text")
            labels = item["labels"] if isinstance(item.get("labels"), list) else [item.get("label")]
        else:
            raise UserError(f"{where}: span {item!r} is not [start, end, label]; {SPAN_HELP}")
        if not (_int(start) and _int(end)):
            raise UserError(f"{where}: span {item!r} needs integer start and end offsets; {SPAN_HELP}")
        for label in labels:
            if not isinstance(label, str) or not _LABEL.match(label):
                raise UserError(f"{where}: span {item!r} has label {label!r}; a label is one word with no spaces "
                                "(it becomes the tag B-LABEL): rename it")
            spans.append(Span(start, end, label, text if isinstance(text, str) else None))
    return spans


def read_span_records(path: Path, data_format: str, columns: Columns = Columns()) -> list[SpanRecord]:
    """The texts and spans of a span JSONL file, a Label Studio export or a spaCy DocBin."""
    if data_format == "spans":
        return read_span_jsonl(path, jsonl_records(path, SPAN_HELP), columns.document)
    if data_format == "label-studio":
        try:
            tasks = json.loads(read_utf8(path))
        except json.JSONDecodeError as exc:
            raise at(path, exc.lineno, f"not valid JSON ({exc.msg}); expected Label Studio's JSON export") from None
        return read_label_studio(path, tasks)
    if data_format == "spacy":
        return read_docbin(path)
    raise ValueError(data_format)


def text_of(record: object, where: str) -> str:
    """A span JSONL record's text."""
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise UserError(f"{where}: no \"text\" string; {SPAN_HELP}")
    return record["text"]


def record_tokens(record: dict, text: str, where: str) -> list[Word] | None:
    """Prodigy's "tokens" ([{"text", "start", "end"}, ...]): the words the spans were drawn on, kept as they are."""
    tokens = record.get("tokens")
    if tokens is None:
        return None
    words: list[Word] = []
    for token in tokens if isinstance(tokens, list) else [tokens]:
        start, end = (token.get("start"), token.get("end")) if isinstance(token, dict) else (None, None)
        after = words[-1][2] if words else 0  # in text order, none overlapping
        if not (_int(start) and _int(end) and after <= start < end <= len(text)) or \
                token.get("text", text[start:end]) != text[start:end]:
            raise UserError(f'{where}: token {token!r} is not {{"text", "start", "end"}} over the text, after '
                            'the one before; fix it or leave "tokens" out (the text is then split into words)')
        words.append((text[start:end], start, end))
    return words


def read_span_jsonl(path: Path, records: Iterable[tuple[int, object]], document_key: str) -> list[SpanRecord]:
    """`records`: (line, parsed JSON) per line of a span JSONL file."""
    out = []
    skipped = 0
    for line, record in records:
        where = f"{path}:{line}"
        text = text_of(record, where)
        if record.get("answer") in ("reject", "ignore"):  # Prodigy: the annotator turned this text down
            skipped += 1
            continue
        key = next((k for k in SPAN_KEYS if k in record), None)
        spans = parse_spans(record[key], where) if key and record[key] is not None else []
        document = record.get(document_key, f"line {line}")
        if not isinstance(document, (str, int)) or isinstance(document, bool):
            raise UserError(f'{where}: "{document_key}" must be a string or an integer (got {document!r})')
        out.append(SpanRecord(text, spans, where, line, document, record_tokens(record, text, where)))
    if skipped:
        log.info("%s: skipped %d texts the annotator rejected or ignored (\"answer\")", path, skipped)
    return out


def task_text(data: dict, where: str) -> str:
    """The task's text: data["text"], or its only string."""
    if isinstance(data.get("text"), str):
        return data["text"]
    strings = [key for key, value in data.items() if isinstance(value, str)]
    if len(strings) != 1:
        raise UserError(f"{where}: which field of \"data\" holds the text? found {strings or 'no strings'}; "
                        "name it \"text\"")
    return data[strings[0]]


def _latest(annotations: list[dict]) -> dict:
    """The annotation updated last (then created last, then the highest id)."""
    def when(a: dict) -> tuple[str, int]:
        return str(a.get("updated_at") or a.get("created_at") or ""), a["id"] if _int(a.get("id")) else 0

    return max(annotations, key=when)


def read_label_studio(path: Path, tasks: object) -> list[SpanRecord]:
    """Label Studio's JSON export: each task's latest annotation not cancelled; the choice is logged."""
    if not isinstance(tasks, list):
        raise UserError(f"{path}: expected Label Studio's JSON export, a list of tasks")
    out, choices, unannotated, ignored = [], [], 0, Counter()
    for index, task in enumerate(tasks, start=1):
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise UserError(f"{path}: task {index} has no \"data\" object; expected Label Studio's JSON export "
                            "(Export > JSON), not JSON-MIN or CSV")
        where = f"{path}: task {index} (id {task.get('id')})"
        annotations = [a for a in task.get("annotations", task.get("completions")) or []
                       if isinstance(a, dict) and not a.get("was_cancelled")]
        if not annotations:
            unannotated += 1
            continue
        latest = _latest(annotations)
        if len(annotations) > 1:
            choices.append(f"task {task.get('id', index)}: annotation {latest.get('id')} "
                           f"(updated {latest.get('updated_at') or latest.get('created_at')}) of {len(annotations)}")
        spans = []
        for result in latest.get("result") or []:
            value = result.get("value") if isinstance(result, dict) else None
            if isinstance(value, dict) and "labels" in value:
                spans += parse_spans([value], where)
            else:
                ignored[str(result.get("type") if isinstance(result, dict) else type(result).__name__)] += 1
        out.append(SpanRecord(task_text(task["data"], where), spans, where, None, task.get("id", index)))
    if choices:
        log.info("%s: %d tasks have several annotations; took the latest of each: %s%s", path, len(choices),
                 "; ".join(choices[:10]), "; ..." if len(choices) > 10 else "")
    if unannotated:
        log.info("%s: skipped %d tasks without an annotation (cancelled ones and predictions do not count)",
                 path, unannotated)
    if ignored:
        log.info("%s: ignored results that are not text spans: %s", path, dict(ignored))
    return out


def read_docbin(path: Path) -> list[SpanRecord]:
    """A spaCy DocBin: each doc's text and entities (doc.ents)."""
    try:
        import spacy
        from spacy.tokens import DocBin
    except ImportError:
        raise UserError(f"{path}: reading a spaCy DocBin needs spaCy: {install_hint('spacy')} "
                        "(or export the data as span JSONL)") from None
    try:
        docs = list(DocBin().from_disk(path).get_docs(spacy.blank("xx").vocab))
    except Exception as exc:  # srsly/zlib raise many types on a file that is not a DocBin
        raise UserError(f"{path}: not a spaCy DocBin ({exc}); pass --data-format if it is another format") from None
    records = []
    for number, doc in enumerate(docs, start=1):
        where = f"{path}: doc {number}"
        spans = parse_spans([[e.start_char, e.end_char, e.label_] for e in doc.ents], where)
        records.append(SpanRecord(doc.text, spans, where, None, number))
    return records
