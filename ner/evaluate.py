"""Score an exported model on a file with gold tags, then show the sentences it tags worst.

    python -m ner.evaluate runs/ner/final test.conll
    python -m ner.evaluate runs/ner/final test.conll --worst 25 --json test_report.json
    python -m ner.evaluate runs/ner/final label_studio_export.json     # any format ner.train reads
    python -m ner.evaluate runs/ner/final test.conll --plots out/ --target-precision 0.95

Prints seqeval's report per entity type and the overall micro-averaged precision, recall and F1
(entity-level, exact spans); then (ner/inference/analysis.py, docs/evaluation.md) the kinds of error
(correct, wrong type, boundary, boundary and type, missed, spurious), scores under nervaluate's
strict / exact / partial / type schemas with macro F1, the confusion matrix of types, precision and
recall per type at entity-score thresholds (`--target-precision`: the lowest threshold reaching it)
and the calibration of those scores; then the N sentences with the most entity errors (missed +
spurious; a wrong type or a wrong boundary counts once each way, as in seqeval; ties: shorter
first), each as its text and the gold and predicted entities side by side, wrong ones marked `x`.
`--json` writes the same numbers (seqeval's in the shape of metrics.json) and the worst sentences;
`--plots DIR` draws confusion.png, precision_recall.png and reliability.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from seqeval.metrics import classification_report

from ner.data.examples import Example
from ner.data.formats import read_examples
from ner.data.tags import check_known_labels
from ner.errors import UserError, cli
from ner.inference.analysis import Match, Span, analyse, format_analysis, match_entities
from ner.inference.options import add_inference_arguments, show_choice_on_stderr
from ner.inference.runtimes import AUTO_RUNTIME
from ner.metrics import entity_scores, get_entities, seqeval_kwargs
from ner.training.config import add_data_arguments

# What the side-by-side view says of each kind of match.
PROBLEM = {"correct": "", "wrong_type": "wrong type", "boundary": "wrong span",
           "boundary_and_type": "wrong span and type", "missed": "missed", "spurious": "spurious"}


def side_by_side(gold: list[str], predicted: list[str]) -> list[Match]:
    """One row per match of ner.inference.analysis (the kinds of error the report counts), in sentence order."""
    return match_entities(get_entities(gold), get_entities(predicted))


def count_entity_errors(gold: list[str], predicted: list[str]) -> int:
    """False negatives + false positives of one sentence."""
    gold_spans, pred_spans = set(get_entities(gold)), set(get_entities(predicted))
    return len(gold_spans ^ pred_spans)


def worst_sentences(examples: list[Example], predicted: list[list[str]], count: int) -> list[int]:
    """Indices of the `count` sentences with the most entity errors (none without errors)."""
    errors = [count_entity_errors(e.tags, p) for e, p in zip(examples, predicted, strict=True)]
    ranked = sorted(range(len(examples)), key=lambda i: (-errors[i], len(examples[i].words), i))
    return [i for i in ranked[:count] if errors[i] > 0]


def _describe(words: list[str], span: Span | None) -> str:
    return "-" if span is None else f"{' '.join(words[span[1]:span[2] + 1])} [{span[0]}]"


def format_sentence(rank: int, example: Example, predicted: list[str]) -> str:
    rows = side_by_side(example.tags, predicted)
    where = f"{example.source}:{example.lines[0]}" if example.lines else example.source
    text = textwrap.fill(" ".join(example.words), width=100, initial_indent="    ", subsequent_indent="    ")
    cells = [(_describe(example.words, r.gold), _describe(example.words, r.predicted), PROBLEM[r.kind]) for r in rows]
    width = max([len("gold")] + [len(c[0]) for c in cells])
    pred_width = max([len("predicted")] + [len(c[1]) for c in cells])
    lines = [f"#{rank}  {where}  ({count_entity_errors(example.tags, predicted)} entity errors)", text,
             f"      {'gold':<{width}} | predicted"]
    for gold_text, pred_text, problem in cells:
        mark = "x" if problem else " "
        lines.append(f"    {mark} {gold_text:<{width}} | {pred_text:<{pred_width}}  {problem}".rstrip())
    return "\n".join(lines)


def to_json(examples: list[Example], predicted: list[list[str]], worst: list[int]) -> list[dict]:
    def entity(words: list[str], span: Span | None) -> dict | None:
        if span is None:
            return None
        return {"text": " ".join(words[span[1]:span[2] + 1]), "type": span[0], "start": span[1], "end": span[2] + 1}

    return [{"source": e.source, "line": e.lines[0] if e.lines else None, "words": e.words,
             "errors": count_entity_errors(e.tags, predicted[i]),
             "rows": [{"gold": entity(e.words, r.gold), "predicted": entity(e.words, r.predicted),
                       "problem": PROBLEM[r.kind] or None} for r in side_by_side(e.tags, predicted[i])]}
            for i in worst for e in [examples[i]]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ner.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an exported model folder (OUTPUT_DIR/final)")
    parser.add_argument("file", type=Path, help="gold data: CoNLL (word ... TAG), JSONL, span JSONL, a Label Studio "
                                                "export or a spaCy DocBin, found from the content (see --data-format)")
    parser.add_argument("--worst", type=int, default=10, metavar="N", help="worst sentences to show (default: 10)")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="also write scores and worst sentences here")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="draw confusion.png, precision_recall.png and "
                                                                  "reliability.png into DIR (made if missing)")
    parser.add_argument("--target-precision", type=float, metavar="P",
                        help="per type, the lowest entity-score threshold whose precision reaches P (0 < P <= 1)")
    add_inference_arguments(parser)
    add_data_arguments(parser)
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """The cheap checks, before the model loads."""
    if args.worst < 0:
        raise UserError(f"--worst must be zero or more (got {args.worst})")
    if args.target_precision is not None and not 0 < args.target_precision <= 1:
        raise UserError(f"--target-precision must be above 0 and at most 1 (got {args.target_precision})")
    for flag, path in (("--json", args.json), ("--plots", args.plots)):
        if path is not None and not path.parent.is_dir():
            raise UserError(f"{flag} {path}: folder {path.parent} does not exist")
    if args.plots is not None and args.plots.exists() and not args.plots.is_dir():
        raise UserError(f"--plots {args.plots}: not a folder (give a folder for the PNG files)")
    if not args.file.is_file():
        raise UserError(f"{args.file}: file not found")


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_arguments(args)
    show_choice_on_stderr()
    from ner.inference.tagger import Tagger  # after the cheap checks: loading torch + transformers takes seconds

    tagger = Tagger.from_args(args)
    examples = read_examples(args.file, data_format=args.data_format, span_alignment=args.span_alignment)
    check_known_labels(examples, tagger.label2id)
    predicted, probs = tagger.tag(examples, args.batch_size, args.max_tokens)
    gold = [e.tags for e in examples]
    scheme = tagger.decoder.scheme
    scores = entity_scores(gold, predicted, scheme)
    analysis = analyse(gold, predicted, probs, scores, args.target_precision)
    print(f"{args.file}: {len(examples)} sentences, model {args.model_dir}, entity-level (seqeval, {scheme})\n")
    print(classification_report(gold, predicted, digits=4, zero_division=0, **seqeval_kwargs(scheme)))
    print(f"overall (micro): precision {scores['precision']:.4f}  recall {scores['recall']:.4f}  "
          f"f1 {scores['f1']:.4f}  support {scores['support']}\n")
    print(format_analysis(analysis) + "\n")
    worst = worst_sentences(examples, predicted, args.worst)
    print(f"== {len(worst)} worst sentences (most entity errors: missed + spurious) ==")
    print("\n\n".join(format_sentence(rank, examples[i], predicted[i]) for rank, i in enumerate(worst, start=1))
          or "(no sentence has an entity error)")
    if args.json is not None:
        # the runtime computed the scores: the one auto resolved to, and whether it was auto's pick
        report = {"model_dir": str(args.model_dir), "file": str(args.file), "sentences": len(examples),
                  "runtime": tagger.runtime_name, "runtime_auto": args.runtime == AUTO_RUNTIME,
                  "scheme": scheme, **scores, **analysis, "worst": to_json(examples, predicted, worst)}
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.plots is not None:
        from ner.inference.analysis_plots import write_evaluation_plots

        args.plots.mkdir(exist_ok=True)
        for path in write_evaluation_plots(analysis, args.plots, on=args.file.name):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
