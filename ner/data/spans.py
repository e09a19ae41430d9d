"""Character spans over raw text (read from annotation tools' files by span_files.py) to words with IOB2 tags,
and back.

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
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ner.data.examples import Example
from ner.data.text import Word, split_words
from ner.errors import UserError

log = logging.getLogger("ner")

ALIGNMENTS = ("strict", "expand", "contract")
SPAN_KEYS = ("entities", "label", "labels", "spans")  # where a record lists its spans, first found wins
SPAN_HELP = ('expected {"text": "...", "entities": [[start, end, "TYPE"], ...]} '
             "(character offsets, end exclusive)")
ALIGNMENT_HELP = ("fix it, or pass --span-alignment expand (grow spans to whole words; the longer of overlapping "
                  "spans is kept) or contract (shrink spans to the words inside)")


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
    from ner.metrics import get_entities

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


def entities_record(record: dict, result: dict) -> dict:
    """`record` ({"text", ...}) with its spans replaced by a raw-text result of Tagger.predict ({"entities",
    "confidence"}; the offsets are characters already), and that text's confidence."""
    entities = [[e["start"], e["end"], e["type"]] for e in result["entities"]]
    return {**_without_spans(record), "entities": entities, "confidence": result["confidence"]}


def label_studio_task(record: dict, result: dict, model_version: str, cluster: int | None = None) -> dict:
    """A Label Studio task holding a raw-text result of Tagger.predict as a prediction to correct (the
    `label`/`text` names of its Named Entity Recognition template); `cluster`: ner.select's."""
    prediction = label_studio_prediction(result["entities"], result["confidence"], model_version, cluster=cluster)
    return {"data": _without_spans(record), "predictions": [prediction]}


def label_studio_prediction(entities: list[dict], confidence: float, model_version: str, from_name: str = "label",
                            to_name: str = "text", cluster: int | None = None) -> dict:
    """Entities ({"start", "end", "text", "type", "score"}, "type" a label of the project) as one Label Studio
    prediction: `labels` regions of the <Labels name=from_name> over the <Text name=to_name>, Python string
    offsets (what its Text tag counts). Its `score` is the text's confidence (entities.text_confidence: set for a
    text with no entity too, low = unsure), which Label Studio's uncertainty sampling orders tasks by, lowest
    first, spread over `cluster` where given. The one writer of Label Studio regions."""
    result = [{"from_name": from_name, "to_name": to_name, "type": "labels", "score": e["score"],
               "value": {"start": e["start"], "end": e["end"], "text": e["text"], "labels": [e["type"]]}}
              for e in entities]
    prediction = {"model_version": model_version, "score": confidence, "result": result}
    return prediction if cluster is None else {**prediction, "cluster": cluster}
