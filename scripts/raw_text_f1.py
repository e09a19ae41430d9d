"""Does tagging raw text lose anything? CoNLL detokenised into plain text, scored on character spans.

    python scripts/raw_text_f1.py ../shared/data/conll2003/test.txt                      # splitters only, no model
    python scripts/raw_text_f1.py ../shared/data/conll2003/test.txt --model runs/conll2003-minilm/final
    python scripts/raw_text_f1.py ../shared/data/conll2003/test.txt --write-jsonl test_raw.jsonl

Each document (the sentences between -DOCSTART- lines) becomes one line of text: tokens joined by a
space, except none before closing punctuation (. , ; : ! ? ) ] } %) or a clitic ('s, n't), and none
after an opening bracket. Gold entities are recorded as character spans of that text. For each word
splitter in ner/data/text.py it reports how many CoNLL tokens it reproduces exactly and how many gold
entities start and end on its word boundaries (recall can be no higher); with --model, the entity F1
on exact character spans (Tagger.predict's path, one document per text) next to the same model's
word-level F1 on the CoNLL file itself. Results: docs/raw_text.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from ner.data.conll import read_conll, read_conll_documents
from ner.data.examples import Example
from ner.data.jsonl import write_jsonl
from ner.data.text import SPLITTERS
from ner.metrics import get_entities  # seqeval's reading, without its scikit-learn import (a benchmark's start-up)

CLOSING = re.compile(r"^(?:[.,;:!?)\]}%]|\.\.\.|n't|'(?:s|S|re|ve|ll|d|m))$")
OPENING = {"(", "[", "{"}

Span = tuple[int, int, str]  # (start, end, type) in characters


def detokenize(document: list[Example]) -> tuple[str, list[tuple[int, int]], list[Span]]:
    """(text, character span of every token, gold entities as character spans)."""
    text, spans, entities, previous = "", [], [], None
    for example in document:
        first_span = len(spans)
        for word in example.words:
            if previous is not None and previous not in OPENING and not CLOSING.match(word):
                text += " "
            spans.append((len(text), len(text) + len(word)))
            text += word
            previous = word
        for kind, first, last in get_entities(example.tags):
            entities.append((spans[first_span + first][0], spans[first_span + last][1], kind))
    return text, spans, entities


def prf(gold: set, predicted: set) -> dict:
    hits = len(gold & predicted)
    precision, recall = hits / max(len(predicted), 1), hits / max(len(gold), 1)
    return {"precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall) if hits else 0.0}


def splitter_stats(docs: list[tuple[str, list, list[Span]]]) -> dict:
    """Per splitter: share of CoNLL tokens reproduced exactly, share of gold entities on word boundaries."""
    stats = {}
    for name, split in SPLITTERS.items():
        tokens = reproduced = aligned = entity_count = 0
        for text, spans, entities in docs:
            words = split(text)
            starts, ends = {s for _, s, _ in words}, {e for _, _, e in words}
            reproduced += len(set(spans) & {(s, e) for _, s, e in words})
            tokens += len(spans)
            aligned += sum(start in starts and end in ends for start, end, _ in entities)
            entity_count += len(entities)
        stats[name] = {"tokens_reproduced": reproduced / tokens, "entities_on_boundaries": aligned / entity_count}
    return stats


def raw_text_scores(model_dir: Path, docs: list[tuple[str, list, list[Span]]], conll: Path) -> dict:
    from ner.inference.tagger import Tagger
    from ner.metrics import entity_scores

    tagger = Tagger(model_dir, precision="no")
    texts = [text for text, _, _ in docs]
    gold = {(i, *span) for i, (_, _, entities) in enumerate(docs) for span in entities}
    scores = {}
    for name, split in SPLITTERS.items():
        started = time.perf_counter()
        results = tagger.predict(texts, splitter=split)
        predicted = {(i, e["start"], e["end"], e["type"]) for i, result in enumerate(results)
                     for e in result["entities"]}
        scores[f"raw_{name}"] = {**prf(gold, predicted), "seconds": time.perf_counter() - started}
    # The CoNLL tokens themselves, one document per text: separates what the splitter costs from what
    # losing CoNLL's sentence (line) boundaries costs.
    documents = read_conll_documents(conll)
    examples = [Example([w for e in d for w in e.words], [t for e in d for t in e.tags], "doc", document=i)
                for i, d in enumerate(documents)]
    tags, _ = tagger.tag(examples)
    predicted = {(i, spans[first][0], spans[last][1], kind) for i, ((_, spans, _), t) in enumerate(zip(docs, tags))
                 for kind, first, last in get_entities(t)}
    scores["documents_conll_tokens"] = prf(gold, predicted)
    examples = read_conll(conll)
    tags, _ = tagger.tag(examples)
    word_level = entity_scores([e.tags for e in examples], tags, "iob2")
    scores["word_level_conll"] = {k: word_level[k] for k in ("precision", "recall", "f1")}
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("conll", type=Path, help="a CoNLL file with -DOCSTART- lines (CoNLL-2003 test.txt)")
    parser.add_argument("--model", type=Path, help="an exported model folder: also score raw-text F1")
    parser.add_argument("--write-jsonl", type=Path, help='write {"text", "entities": [[start, end, type]]} a line')
    args = parser.parse_args(argv)
    docs = [detokenize(document) for document in read_conll_documents(args.conll)]
    if args.write_jsonl:
        write_jsonl(args.write_jsonl, ({"text": text, "entities": entities} for text, _, entities in docs))
    results = {"documents": len(docs), "splitters": splitter_stats(docs)}
    if args.model:
        results["scores"] = raw_text_scores(args.model, docs, args.conll)
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
