"""CoNLL files: word first, tag last, a blank line between sentences, -DOCSTART- between documents. Reading
them as examples, writing examples back, and the predictions file (word, gold, predicted) a run writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from ner.data.examples import Example
from ner.data.tags import TAG_HELP, TAG_PATTERN
from ner.data.text_files import read_utf8, write_lines
from ner.errors import UserError, at

CONLL_HELP = "expected 'word ... TAG': two or more columns separated by spaces or tabs, tag last"
DOCSTART = "-DOCSTART-"


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
