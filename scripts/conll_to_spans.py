"""CoNLL -> span JSONL, the format annotation tools export; then read it back and say what changed.

    python scripts/conll_to_spans.py ../shared/data/conll2003/train.txt runs/spans/train.jsonl
    python scripts/conll_to_spans.py ../shared/data/conll2003/train.txt runs/spans/train.jsonl \
        --documents 200 --conll-subset runs/spans/train.conll     # the first 200 documents, both formats

One record per document (-DOCSTART- section; `--per sentence`: per sentence, with a "document" field):
its sentences joined by newlines, words by spaces, each entity a [start, end, TYPE] character span.
Reading the records back goes through the raw-text word splitter, as any annotation-tool export does
(`--tokens` writes the words too, which are then kept); the check at the end counts the sentences
whose words or entities come back different (docs/data_formats.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ner.data.conll import read_conll_documents, write_conll
from ner.data.examples import Example
from ner.data.formats import read_examples
from ner.data.jsonl import write_jsonl
from ner.data.spans import span_record
from ner.data.tags import to_iob2
from ner.errors import cli


def records(documents: list[list[Example]], per: str, tokens: bool) -> list[dict]:
    if per == "document":
        return [span_record(((s.words, s.tags) for s in document), tokens) for document in documents]
    return [{**span_record([(s.words, s.tags)], tokens), "document": number}
            for number, document in enumerate(documents) for s in document]


def compare(original: list[Example], read_back: list[Example]) -> str:
    """How many sentences came back split into other words, and how many entities differ: each entity is
    placed by its characters with the spaces left out, so another split of the same text changes nothing."""
    from seqeval.metrics.sequence_labeling import get_entities

    def entities(example: Example) -> set[tuple[int, int, str]]:
        ends = [0]
        for word in example.words:
            ends.append(ends[-1] + len(word))
        return {(ends[a], ends[b + 1], kind) for kind, a, b in get_entities(to_iob2(example.tags))}

    words_differ = sum(a.words != b.words for a, b in zip(original, read_back))
    differ = sum(len(entities(a) ^ entities(b)) for a, b in zip(original, read_back))
    return (f"{len(original)} sentences in, {len(read_back)} back; {words_differ} split into other words; "
            f"{differ} entities differ")


@cli
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("conll", type=Path)
    parser.add_argument("out", type=Path, help="span JSONL to write")
    parser.add_argument("--per", choices=("document", "sentence"), default="document")
    parser.add_argument("--documents", type=int, default=0, help="only the first N documents (0: all)")
    parser.add_argument("--tokens", action="store_true",
                        help='also write the words as "tokens" (Prodigy\'s field), kept as the words when read back')
    parser.add_argument("--conll-subset", type=Path, help="also write those documents as CoNLL here")
    args = parser.parse_args(argv)
    documents = read_conll_documents(args.conll)
    documents = documents[:args.documents] if args.documents else documents
    write_jsonl(args.out, records(documents, args.per, args.tokens))
    original = [sentence for document in documents for sentence in document]
    if args.conll_subset:
        write_conll(args.conll_subset, original)
    print(f"{args.out}: {len(documents)} documents; {compare(original, read_examples(args.out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
