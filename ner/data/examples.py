"""What every reader gives: `Example`, a sentence's words and tags that remember where they came from, so a bad
tag in the validation file is reported as `valid.txt:1042: ...`, not as a KeyError deep in training. The readers
are ner/data/conll.py, jsonl.py and hf_datasets.py; ner/data/formats.py picks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
