"""Which text confidence finds the sentences a model gets wrong: the definitions a text's confidence could take,
compared on gold data by the errors found in the least confident sentences within a budget of words.

    python -m benchmarks.confidence runs/conll/final ../shared/data/conll2003/valid.txt --out bench_out/confidence

Each definition scores a sentence from its words' probabilities of the decoded tags (Tagger.tag): `mnlp`, the
geometric mean (exp of the length-normalised log-probability of the path; what ner.select and Label Studio use),
`least`, the least confident word, `path`, the path's whole log-probability (longer sentences look less sure), and
`entity-mean`, the mean of its entities' scores (Label Studio's score before; a sentence without entities is never
unsure). Sentences are taken least confident first until the budget's words are spent; a definition is better where
those sentences hold more of the word errors (wrong tags) and of the sentences with any error. Writes
OUT/confidence.json and OUT/confidence.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

BUDGETS = (0.02, 0.05, 0.10, 0.20)  # shares of the file's words


def definitions(probs: np.ndarray, tags: list[str]) -> dict[str, float]:
    from ner.inference.entities import entities, text_confidence, word_positions

    if not len(probs):
        return {"mnlp": 1.0, "least": 1.0, "path": 0.0, "entity-mean": 1.0}
    found = entities(tags, probs, word_positions([""] * len(tags)))
    log_probs = np.log(np.maximum(probs.astype(np.float64), 1e-30))
    return {"mnlp": text_confidence(probs), "least": float(probs.min()), "path": float(log_probs.sum()),
            "entity-mean": float(np.mean([e["score"] for e in found])) if found else 1.0}


def found_within(scores: list[float], words: list[int], errors: list[int], share: float) -> dict:
    """Least confident first within `share` of the words: the share of all word errors and of erroneous sentences
    those sentences hold."""
    budget, spent, caught, caught_sentences = share * sum(words), 0, 0, 0
    for index in sorted(range(len(scores)), key=lambda i: (scores[i], i)):
        if spent + words[index] > budget:
            continue
        spent += words[index]
        caught += errors[index]
        caught_sentences += errors[index] > 0
    return {"word_errors": caught / max(sum(errors), 1),
            "sentences_with_errors": caught_sentences / max(sum(e > 0 for e in errors), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("conll", type=Path, help="gold CoNLL (its documents give context, as in ner.predict --conll)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from ner.data.conll import read_conll
    from ner.inference.tagger import Tagger

    sentences = read_conll(args.conll)
    tags, probs = Tagger(args.model_dir).tag(sentences)
    words = [len(s.words) for s in sentences]
    errors = [sum(g != p for g, p in zip(s.tags, t)) for s, t in zip(sentences, tags)]
    scored = [definitions(p, t) for p, t in zip(probs, tags)]
    results = {name: {f"{share:.0%}": found_within([s[name] for s in scored], words, errors, share)
                      for share in BUDGETS} for name in scored[0]}
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"model": str(args.model_dir), "file": str(args.conll), "sentences": len(sentences),
               "words": sum(words), "word_errors": sum(errors), "results": results}
    (args.out / "confidence.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"{len(sentences)} sentences, {sum(words)} words, {sum(errors)} wrong tags "
             f"in {sum(e > 0 for e in errors)} sentences.", "",
             "| definition | " + " | ".join(f"{s:.0%} of the words: errors / sentences with one" for s in BUDGETS)
             + " |", "|---|" + "---:|" * len(BUDGETS)]
    for name, by_share in results.items():
        cells = [f"{100 * r['word_errors']:.1f}% / {100 * r['sentences_with_errors']:.1f}%" for r in by_share.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (args.out / "confidence.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
