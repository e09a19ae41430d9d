"""Reading NER data (CoNLL, JSONL, `datasets`), tag schemes, and the label list. Which reader a file needs
(annotation-tool spans included) is ner/data/formats.py's job.

Every reader returns `Example`s that remember where they came from, so a bad tag in the
validation file is reported as `valid.txt:1042: ...`, not as a KeyError deep in training.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ner.errors import UserError, at
from ner.files import staged_file

log = logging.getLogger("ner")

TAG_PATTERN = re.compile(r"^(O|[BIES]-\S+)$")
TAG_HELP = "expected O, or B-TYPE / I-TYPE / E-TYPE / S-TYPE such as B-PER"
CONLL_HELP = "expected 'word ... TAG': two or more columns separated by spaces or tabs, tag last"
DOCSTART = "-DOCSTART-"
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_data"


@dataclass
class Example:
    words: list[str]
    tags: list[str]
    source: str  # file the sentence came from
    lines: list[int] | None = None  # 1-based line of each word, for error messages
    document: str | int | None = None  # consecutive examples with the same value form one document

    def where(self, i: int) -> tuple[str, int | None]:
        return self.source, (self.lines[i] if self.lines else None)


@dataclass(frozen=True)
class Columns:
    """Where words, tags and (optionally) document ids live in JSON lines and `datasets` rows."""

    tokens: str = "tokens"
    tags: str = "tags"
    document: str = "document"


def has_documents(examples: list[Example]) -> bool:
    """Two or more documents: a single -DOCSTART- on top of a file marks no boundary between sentences."""
    return len({e.document for e in examples if e.document is not None}) >= 2


def read_utf8(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise UserError(f"{path}: file is empty")
    if b"\x00" in data[:65536]:
        raise UserError(f"{path}: looks like a binary file (NUL bytes); expected UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise at(path, line, f"not UTF-8 (byte 0x{data[exc.start]:02x}); re-save the file as UTF-8") from None


def conll_blocks(path: Path) -> Iterator[tuple[list[int], list[list[str]], int | None]]:
    """(line numbers, columns of each line, document number) per sentence of a CoNLL-style file.

    Blank lines end sentences; each -DOCSTART- line starts a new document (numbered from 0; None
    before the first one). The one CoNLL reader; callers check the columns.
    """
    lines: list[int] = []
    rows: list[list[str]] = []
    document: int | None = None
    for line_no, line in enumerate(read_utf8(path).splitlines(), start=1):
        columns = line.split()
        if (not columns or columns[0] == DOCSTART) and rows:
            yield lines, rows, document
            lines, rows = [], []
        if columns and columns[0] == DOCSTART:
            document = 0 if document is None else document + 1
        elif columns:
            lines.append(line_no)
            rows.append(columns)
    if rows:  # no blank line after the last sentence
        yield lines, rows, document


def read_conll(path: str | Path) -> list[Example]:
    """CoNLL columns: word first, tag last."""
    path = Path(path)
    examples: list[Example] = []
    for lines, rows, document in conll_blocks(path):
        for line_no, columns in zip(lines, rows):
            if len(columns) < 2:
                raise at(path, line_no, f"{CONLL_HELP}; got one column {columns[0]!r}")
            if not TAG_PATTERN.match(columns[-1]):
                raise at(path, line_no, f"{columns[-1]!r} is not a valid tag ({TAG_HELP})")
        examples.append(Example([c[0] for c in rows], [c[-1] for c in rows], str(path), lines, document))
    if not examples:
        raise UserError(f"{path}: no sentences found ({CONLL_HELP})")
    return examples



def read_conll_documents(path: Path) -> list[list[Example]]:
    """read_conll's sentences grouped into their documents (one group if there is no -DOCSTART-)."""
    documents: list[list[Example]] = []
    for example in read_conll(Path(path)):
        if not documents or example.document != documents[-1][-1].document:
            documents.append([])
        documents[-1].append(example)
    return documents


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    """UTF-8 lines (each ending in \\n) written to a temporary name, then renamed: whole or not at all."""
    path = Path(path)
    with staged_file(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)
    return path


def write_columns(path: Path, sentences: Iterable[Iterable[tuple[str, ...]]]) -> Path:
    """One tab-separated row per word, a blank line after each sentence; written whole or not at all."""
    def lines() -> Iterator[str]:
        for rows in sentences:
            yield from ("\t".join(row) + "\n" for row in rows)
            yield "\n"

    return write_lines(path, lines())


def write_conll(path: Path, examples: list[Example]) -> Path:
    """`word<TAB>TAG` lines that read_conll reads back as the same examples (documents included)."""
    def sentences() -> Iterator[Iterable[tuple[str, ...]]]:
        for i, example in enumerate(examples):
            if example.document is not None and (i == 0 or examples[i - 1].document != example.document):
                yield [(DOCSTART, "O")]
            yield zip(example.words, example.tags, strict=True)

    return write_columns(path, sentences())


def write_predictions(path: Path, words: list[list[str]], gold: list[list[str]], predicted: list[list[str]]) -> Path:
    """`word<TAB>gold<TAB>predicted` per word, blank line between sentences."""
    return write_columns(path, (zip(*sentence, strict=True) for sentence in zip(words, gold, predicted, strict=True)))


def read_predictions(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    """(gold, predicted) tag sequences of a file written by write_predictions."""
    gold: list[list[str]] = []
    predicted: list[list[str]] = []
    for lines, rows, _ in conll_blocks(path):
        for line_no, columns in zip(lines, rows):
            if len(columns) < 3:
                raise at(path, line_no, f"expected 'word<TAB>gold<TAB>predicted', got {' '.join(columns)!r}")
        gold.append([c[-2] for c in rows])
        predicted.append([c[-1] for c in rows])
    return gold, predicted


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
    examples = [_example_from_record(record, str(path), line_no, columns)
                for line_no, record in jsonl_records(path, expected)]
    if not examples:
        raise UserError(f"{path}: no sentences found (expected one JSON object per line)")
    return examples


def _example_from_record(record: object, source: str, line_no: int | None, columns: Columns) -> Example:
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


def read_hf_dataset(name_or_dir: str, split: str, columns: Columns = Columns()) -> list[Example]:
    """A hub dataset (where a hub is reachable) or a folder written by `save_to_disk`."""
    import datasets

    try:
        if Path(name_or_dir).is_dir():
            loaded = datasets.load_from_disk(name_or_dir)
        else:
            loaded = datasets.load_dataset(name_or_dir)
    except Exception as exc:  # datasets raises many types; the user needs the message, not the class
        raise UserError(f"{name_or_dir}: could not load dataset ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(f"{name_or_dir}: no '{split}' split (has {', '.join(loaded)})")
        loaded = loaded[split]
    tags_column = columns.tags
    if tags_column not in loaded.column_names and "ner_tags" in loaded.column_names:
        tags_column = "ner_tags"
    for column in (columns.tokens, tags_column):
        if column not in loaded.column_names:
            raise UserError(f"{name_or_dir}: no column '{column}' (has {', '.join(loaded.column_names)}); "
                            "set --tokens-column / --tags-column")
    names = getattr(getattr(loaded.features[tags_column], "feature", None), "names", None)
    with_documents = columns.document in loaded.column_names
    source = f"{name_or_dir}[{split}]"
    examples = []
    for row_no, row in enumerate(loaded):
        tags = [names[t] for t in row[tags_column]] if names else row[tags_column]
        record = {"tokens": row[columns.tokens], "tags": tags,
                  "document": row[columns.document] if with_documents else None}
        examples.append(_example_from_record(record, source, row_no + 1, Columns()))
    return examples


# ----------------------------------------------------------------------------- tag schemes

def split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type): ("B", "PER") for B-PER, ("O", "") for O. The one tag parser."""
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def entity_types(labels: Iterable[str]) -> list[str]:
    """The entity types a label list names, sorted: PER for B-PER, I-PER, ..."""
    return sorted({split_tag(label)[1] for label in labels} - {""})


def detect_scheme(examples: list[Example]) -> str:
    """IOBES if E-/S- occur; IOB1 if an I- tag starts an entity; otherwise IOB2."""
    if scheme_of_labels({tag for example in examples for tag in example.tags}) == "iobes":
        return "iobes"
    for example in examples:
        previous_kind = ""
        for tag in example.tags:
            prefix, kind = split_tag(tag)
            if prefix == "I" and previous_kind != kind:
                return "iob1"
            previous_kind = kind
    return "iob2"


def scheme_of_labels(labels: Iterable[str]) -> str:
    """A model's tag scheme from its label list alone, for exports that do not record it.

    E-/S- labels: iobes. A type with I- but no B- can only be IOB1 (IOB2 starts every entity with
    B-); one with B- but no I- only IOB2 (IOB1 starts an entity with I- unless it follows one of
    its type). Otherwise the two schemes have the same labels and nothing tells them apart:
    "iob", which the decoder reads as either (no transition is forbidden, so Viterbi is argmax)
    and seqeval reads leniently, as it reads IOB1 and IOB2.
    """
    parts = {split_tag(label) for label in labels}
    if any(prefix in "ES" for prefix, _ in parts):
        return "iobes"
    kinds = {kind for _, kind in parts} - {""}
    if any(("I", kind) in parts and ("B", kind) not in parts for kind in kinds):
        return "iob1"
    if any(("B", kind) in parts and ("I", kind) not in parts for kind in kinds):
        return "iob2"
    return "iob" if kinds else "iob2"


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1 or IOBES -> IOB2: every entity starts with B-."""
    out = []
    previous_kind = ""
    for tag in tags:
        prefix, kind = split_tag(tag)
        if prefix in "BS" or (prefix in "IE" and kind != previous_kind):
            out.append(f"B-{kind}")
        elif prefix in "IE":
            out.append(f"I-{kind}")
        else:
            out.append("O")
        previous_kind = "" if prefix in "OES" else kind
    return out


def to_iobes(tags: list[str]) -> list[str]:
    iob2 = to_iob2(tags)
    out = []
    for i, tag in enumerate(iob2):
        prefix, kind = split_tag(tag)
        continues = i + 1 < len(iob2) and iob2[i + 1] == f"I-{kind}"
        if prefix == "B":
            out.append(f"B-{kind}" if continues else f"S-{kind}")
        elif prefix == "I":
            out.append(f"I-{kind}" if continues else f"E-{kind}")
        else:
            out.append("O")
    return out


def convert_scheme(examples: list[Example], target: str) -> list[Example]:
    if target == "none":
        return examples
    convert = to_iob2 if target == "iob2" else to_iobes
    return [Example(e.words, convert(e.tags), e.source, e.lines, e.document) for e in examples]


# ----------------------------------------------------------------------------- labels

_PREFIX_ORDER = {"B": 0, "I": 1, "E": 2, "S": 3}


def build_label_list(examples: list[Example]) -> list[str]:
    """Stable order whatever the data order: O, then each type's B, I, E, S."""
    seen = {tag for example in examples for tag in example.tags}
    entity_tags = sorted(seen - {"O"}, key=lambda t: (t[2:], _PREFIX_ORDER[t[0]]))
    return ["O", *entity_tags]


def check_known_labels(examples: list[Example], label2id: dict[str, int]) -> None:
    """A tag the model has no output for would be scored as always wrong: refuse it."""
    for example in examples:
        for i, tag in enumerate(example.tags):
            if tag not in label2id:
                source, line = example.where(i)
                known = ", ".join(label2id)
                raise at(source, line, f"tag {tag!r} never appears in the training data "
                         f"(the model knows: {known}); fix the tag or add it to the training data")
