"""Character spans over raw text, as annotation tools export them, to words with IOB2 tags, and back.

    span JSONL    {"text": "...", "entities": [[start, end, "TYPE"], ...]}, one text a line; the list may
                  be called "label" or "labels" (doccano) or "spans" (Prodigy; records it rejected are
                  skipped, and its "tokens" are kept as the words), and a span may be
                  {"start": .., "end": .., "label": ..}
    Label Studio  its JSON export (a list of tasks): the latest annotation of each task
    spaCy         a .spacy DocBin (needs spaCy: pip install 'ner[spacy]')

Offsets are characters (Python string indices), end exclusive. Each text is split into words by the
raw-text splitter (ner/data/text.py, the one `ner.predict` uses) and cut into sentences at line breaks;
its sentences form one document (or the record's `document` field names it), so long texts get
document context where the model uses it. Each span becomes B-/I- tags over the words it covers.

A span that cuts a word, overlaps another or lies outside its text is a problem: `strict` (the
default) refuses the file, naming the first such span and the count; `expand` grows spans to whole
words, `contract` shrinks them to the words inside, and both keep the longer of overlapping spans
(as spaCy's filter_spans). Whatever happens to a span is counted in the log. Where a span carries
its own text (Label Studio's value.text) and the offsets miss it, offsets counted in UTF-16 code
units (JavaScript) or with CRLF as one character are tried and, if they hit, used and counted.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ner.data.examples import Columns, Example, jsonl_records, read_utf8
from ner.data.text import Word, split_words
from ner.errors import UserError, at

log = logging.getLogger("ner")

ALIGNMENTS = ("strict", "expand", "contract")
SPAN_KEYS = ("entities", "label", "labels", "spans")  # where a record lists its spans, first found wins
SPAN_HELP = ('expected {"text": "...", "entities": [[start, end, "TYPE"], ...]} '
             "(character offsets, end exclusive)")
ALIGNMENT_HELP = ("fix it, or pass --span-alignment expand (grow spans to whole words; the longer of overlapping "
                  "spans is kept) or contract (shrink spans to the words inside)")
_LABEL = re.compile(r"^\S+$")


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    label: str
    text: str | None = None  # what the tool says the span covers, where it says

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}, {self.label!r}]"


@dataclass
class SpanRecord:
    """One annotated text: where it came from (for messages) and its document."""

    text: str
    spans: list[Span]
    where: str  # "train.jsonl:17" or "export.json: task 3 (id 41)"
    line: int | None = None
    document: str | int | None = None
    words: list[Word] | None = None  # the record's own tokens (Prodigy's "tokens"); None: split the text


@dataclass
class Tally:
    """What happened to a file's spans; under `strict`, its problems, to refuse the file with."""

    alignment: str
    counts: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def problem(self, kind: str, record: SpanRecord, message: str) -> None:
        self.counts[kind] += 1
        self.problems.append(f"{record.where}: {message}")

    def finish(self, source: str, texts: int) -> None:
        """Refuse the file (strict, with problems) or log what was done to its spans."""
        if self.problems and self.alignment == "strict":
            more = len(self.problems) - 1
            tail = f" ({more} more span problem{'s' * (more > 1)} in this file)" if more else ""
            raise UserError(f"{self.problems[0]}; {ALIGNMENT_HELP}{tail}")
        for message in self.problems[:5]:
            log.warning("%s (--span-alignment %s)", message, self.alignment)
        done = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items()) if kind != "spans")
        log.info("%s: %d texts, %d spans%s", source, texts, self.counts["spans"], f" ({done})" if done else "")


# ----------------------------------------------------------------------------- parsing

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


def _task_text(data: dict, where: str) -> str:
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
        out.append(SpanRecord(_task_text(task["data"], where), spans, where, None, task.get("id", index)))
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
        raise UserError(f"{path}: reading a spaCy DocBin needs spaCy: pip install 'ner[spacy]' "
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


# ----------------------------------------------------------------------------- spans -> words and tags

UTF16 = "UTF-16 code units"
CRLF = "CRLF as one character"


def _utf16_table(text: str) -> list[int]:
    """UTF-16 code units (JavaScript's string index) before each character index 0..len(text)."""
    return list(itertools.accumulate((2 if ord(char) > 0xFFFF else 1 for char in text), initial=0))


def _crlf_table(text: str) -> list[int]:
    """Characters before each index 0..len(text) with each CRLF counted as one (a browser's view): its CR adds 0."""
    return list(itertools.accumulate((0 if char == "\r" and text[i + 1:i + 2] == "\n" else 1
                                      for i, char in enumerate(text)), initial=0))


class Recount:
    """Character indices of one text for offsets counted in other units, from one table per unit, built on
    first use: re-reading all of a text's spans costs one pass over it and a bisection per offset."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tables: dict[str, list[int]] = {}

    def char_index(self, unit: str, offset: int) -> int | None:
        """The character index where `offset` in `unit` falls; None if none does (inside a surrogate pair)."""
        if unit not in self.tables:
            self.tables[unit] = {UTF16: _utf16_table, CRLF: _crlf_table}[unit](self.text)
        table = self.tables[unit]  # non-decreasing: the first index with the count is the character's own
        i = bisect.bisect_left(table, offset)
        return i if i < len(table) and table[i] == offset else None


def locate(span: Span, text: str, record: SpanRecord, tally: Tally, recount: Recount) -> tuple[int, int] | None:
    """The span's character range in `text`, re-read where the tool counted differently; None: unusable."""
    start, end = span.start, span.end
    if span.text is not None and text[max(start, 0):max(end, 0)] != span.text:
        for unit in (UTF16, CRLF):
            fixed = recount.char_index(unit, start), recount.char_index(unit, end)
            if None not in fixed and text[fixed[0]:fixed[1]] == span.text:
                tally.counts[f"offsets re-read as {unit}"] += 1
                return fixed
        tally.problem("dropped: offsets miss the span's own text", record,
                      f"span {span} covers {text[max(start, 0):max(end, 0)]!r} but says it is {span.text!r}")
        return None
    if 0 <= start < end <= len(text):
        return start, end
    if start >= end:
        tally.problem("dropped: empty", record, f"span {span} is empty (start >= end)")
        return None
    hint = " (are the offsets bytes or UTF-16 code units? they must count characters)" \
        if any(ord(c) > 0x7F for c in text) else ""
    start, end = max(start, 0), min(end, len(text))
    tally.problem("clipped to the text" if start < end else "dropped: outside the text", record,
                  f"span {span} lies outside the text ({len(text)} characters){hint}")
    return (start, end) if start < end else None


def snap(span: Span, start: int, end: int, words: list[Word], record: SpanRecord,
         tally: Tally) -> tuple[int, int] | None:
    """Word indices [first, last) the span covers, per the alignment; None: no word left."""
    text = record.text
    trimmed = len(text[start:end]) - len(text[start:end].lstrip()), len(text[start:end]) - len(text[start:end].rstrip())
    if any(trimmed):
        tally.counts["trimmed of surrounding whitespace"] += 1
        start, end = start + trimmed[0], end - trimmed[1]
    # Words are in text order without overlap: those touching [start, end) are a run, found by bisection.
    touched = range(bisect.bisect_right(words, start, key=lambda w: w[2]),
                    bisect.bisect_left(words, end, key=lambda w: w[1]))
    if not touched:
        tally.problem("dropped: covers no word", record, f"span {span} {text[start:end]!r} covers no word")
        return None
    first, last = touched[0], touched[-1] + 1
    if words[first][1] == start and words[last - 1][2] == end:
        return first, last
    cut = " ".join(repr(words[i][0]) for i in touched if words[i][1] < start or words[i][2] > end)
    message = f"span {span} {text[start:end]!r} cuts the word{'s' * (' ' in cut)} {cut}"
    if tally.alignment == "contract":
        inside = [i for i in touched if words[i][1] >= start and words[i][2] <= end]
        tally.problem("contracted" if inside else "dropped: no whole word inside", record, message)
        return (inside[0], inside[-1] + 1) if inside else None
    tally.problem("expanded" if tally.alignment == "expand" else "cuts a word", record, message)
    return first, last


Placed = tuple[int, int, str, Span]  # word range [first, last), label, and the span it came from


def keep_longest(placed: list[Placed], record: SpanRecord, tally: Tally) -> list[Placed]:
    """Spans whose words do not overlap: the longer first, then the earlier (spaCy's filter_spans rule);
    the same words with the same label twice count once."""
    kept: list[Placed] = []
    taken: set[int] = set()
    seen: set[tuple[int, int, str]] = set()
    for first, last, label, span in sorted(placed, key=lambda p: (p[0] - p[1], p[0])):
        if (first, last, label) in seen:
            tally.counts["duplicates merged"] += 1
        elif taken.isdisjoint(range(first, last)):
            kept.append((first, last, label, span))
            taken.update(range(first, last))
            seen.add((first, last, label))
        else:
            other = next(k for k in kept if k[0] < last and first < k[1])[3]
            tally.problem("dropped: overlaps a longer span", record,
                          f"span {span} {record.text[span.start:span.end]!r} overlaps span {other} "
                          f"{record.text[other.start:other.end]!r}; a word holds one entity in IOB tags")
    return sorted(kept)


def tag_record(record: SpanRecord, tally: Tally) -> tuple[list[Word], list[str]]:
    """The record's words and their IOB2 tags."""
    words = record.words if record.words is not None else split_words(record.text)
    placed: list[Placed] = []
    recount = Recount(record.text)
    for span in record.spans:
        tally.counts["spans"] += 1
        located = locate(span, record.text, record, tally, recount)
        snapped = snap(span, *located, words, record, tally) if located else None
        if snapped:
            placed.append((*snapped, span.label, span))
    tags = ["O"] * len(words)
    for first, last, label, _ in keep_longest(placed, record, tally):
        tags[first:last] = [f"B-{label}"] + [f"I-{label}"] * (last - first - 1)
    return words, tags


def sentences_of(text: str, words: list[Word], tags: list[str]) -> Iterator[range]:
    """Word index ranges between line breaks, never cutting an entity."""
    start = 0
    for i in range(1, len(words) + 1):
        if i == len(words) or ("\n" in text[words[i - 1][2]:words[i][1]] and not tags[i].startswith("I-")):
            yield range(start, i)
            start = i


def to_examples(records: list[SpanRecord], source: str, alignment: str) -> list[Example]:
    """IOB2 examples, one per line of each text, the text's lines forming one document."""
    if alignment not in ALIGNMENTS:
        raise UserError(f"--span-alignment {alignment}: expected one of {', '.join(ALIGNMENTS)}")
    tally = Tally(alignment)
    examples = []
    for record in records:
        words, tags = tag_record(record, tally)
        if not words:
            tally.counts["empty texts skipped"] += 1
        for sentence in sentences_of(record.text, words, tags):
            lines = [record.line] * len(sentence) if record.line is not None else None
            examples.append(Example([words[i][0] for i in sentence], tags[sentence.start:sentence.stop], source,
                                    lines, record.document))
    tally.finish(source, len(records))
    if not examples:
        raise UserError(f"{source}: no words in any text; {SPAN_HELP}")
    return examples


# ----------------------------------------------------------------------------- words and tags -> spans

def span_record(sentences: Iterable[tuple[list[str], list[str]]], tokens: bool = False) -> dict:
    """{"text", "entities"} for sentences of (words, tags): words joined by spaces, sentences by newlines.
    `tokens`: also the words as Prodigy's "tokens", so that reading the record back gives the same
    words whatever the splitter would make of the text."""
    from ner.data.tags import get_entities

    lines, entities, words_at, offset = [], [], [], 0
    for words, tags in sentences:
        starts = []
        for word in words:
            starts.append(offset)
            words_at.append({"text": word, "start": offset, "end": offset + len(word)})
            offset += len(word) + 1
        entities += [[starts[first], starts[last] + len(words[last]), kind] for kind, first, last in get_entities(tags)]
        lines.append(" ".join(words))
        offset += not words  # an empty line still takes its newline
    record = {"text": "\n".join(lines), "entities": entities}
    return {**record, "tokens": words_at} if tokens else record


def _without_spans(record: dict) -> dict:
    """A record's other fields (its text, an id, a document), for predicted spans to replace its own."""
    return {key: value for key, value in record.items() if key not in SPAN_KEYS}


def entities_record(record: dict, entities: list[dict]) -> dict:
    """`record` ({"text", ...}) with its spans replaced by ner.predict's raw-text entities, whose offsets
    are characters already."""
    return {**_without_spans(record), "entities": [[e["start"], e["end"], e["type"]] for e in entities]}


def label_studio_task(record: dict, entities: list[dict], model_version: str) -> dict:
    """A Label Studio task holding ner.predict's raw-text entities as a prediction to correct (the
    `label`/`text` names of its Named Entity Recognition template)."""
    return {"data": _without_spans(record), "predictions": [label_studio_prediction(entities, model_version)]}


def label_studio_prediction(entities: list[dict], model_version: str, from_name: str = "label",
                            to_name: str = "text") -> dict:
    """Entities ({"start", "end", "text", "type", "score"}, "type" a label of the project) as one Label Studio
    prediction: `labels` regions of the <Labels name=from_name> over the <Text name=to_name>, Python string
    offsets (what its Text tag counts), scored by their mean. The one writer of Label Studio regions."""
    result = [{"from_name": from_name, "to_name": to_name, "type": "labels", "score": e["score"],
               "value": {"start": e["start"], "end": e["end"], "text": e["text"], "labels": [e["type"]]}}
              for e in entities]
    score = round(sum(e["score"] for e in entities) / len(entities), 4) if entities else None
    return {"model_version": model_version, "score": score, "result": result}
