"""Pick what to annotate next from an unlabelled pool: the texts the model is least sure of, spread over kinds of text.

    python -m ner.select runs/ner/final pool.txt --words 2000 > next.json           # Label Studio tasks to import
    python -m ner.select runs/ner/final pool.jsonl --jsonl --texts 50 --format spans --output next.jsonl
    python -m ner.select runs/ner/final train.txt --conll --words 5000 --labelled labelled.conll
    python -m ner.select runs/ner/final export.json --words 1000    # a Label Studio export: its unannotated tasks

The budget counts words (a long sentence costs more to label) or texts. Each text is scored by its confidence
(ner.inference.entities.text_confidence: low = unsure); the least confident texts worth three budgets are
clustered by their words, and each round takes every cluster's least confident text, so near-duplicates and one
kind of sentence do not fill the batch (ner/inference/selection.py). Texts already labelled (--labelled, any
file ner.train reads) and repeats of an earlier pool text are left out, and counted on stderr.

Output, in the order to annotate, each pick with `_source`, where it is in the pool (`file:line` for raw text,
JSONL and --pretokenized lines, `file#N` for the N-th sentence of a CoNLL file, `file: task ID` for a Label Studio
task, `file#row` for parquet and datasets rows):
--format label-studio (default): one JSON list of tasks, each with the model's entities as a prediction whose
    `score` is the text's confidence and `cluster` its cluster: Label Studio imports it (Uncertainty sampling
    orders by them); a Label Studio pool keeps each task's data.
--format spans: span JSONL ({"text", "entities": [[start, end, TYPE]], "confidence", "cluster", "_source"}, the
    record's other fields kept), for doccano- or Prodigy-style tools and for ner.train once corrected.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from ner.corpus.inputs import expand_inputs, iter_units, parse_unit
from ner.data.conll import read_conll
from ner.data.examples import Example
from ner.data.formats import detect_format, read_examples
from ner.data.span_files import task_text
from ner.data.spans import entities_record, label_studio_task
from ner.data.text import Word, split_whitespace, split_words
from ner.errors import UserError, cli
from ner.files import atomic_write_text
from ner.inference.entities import text_result
from ner.inference.model_folder import model_version
from ner.inference.options import add_inference_arguments, show_choice_on_stderr
from ner.inference.selection import select
from ner.inference.tagger import Tagger


@dataclass
class PoolText:
    source: str  # where it is in the pool (the output's `_source`)
    text: str
    words: list[Word]  # with character offsets into `text`
    record: dict  # what the output keeps: a JSONL record's other fields, a Label Studio task's data
    example: Example | None = None  # a CoNLL sentence: tagged with its document as context
    result: dict = field(default_factory=dict)  # Tagger.predict's {"entities", "confidence"}


def joined(words: list[str]) -> tuple[str, list[Word]]:
    """Words joined by spaces, with their character offsets in that text."""
    positions, offset = [], 0
    for word in words:
        positions.append((word, offset, offset + len(word)))
        offset += len(word) + 1
    return " ".join(words), positions


def read_conll_pool(path: Path) -> list[PoolText]:
    pool = []
    for number, example in enumerate(read_conll(path), start=1):
        text, words = joined(example.words)
        pool.append(PoolText(f"{path}#{number}", text, words, {"text": text}, example))
    return pool


def read_label_studio_pool(path: Path) -> tuple[list[PoolText], int]:
    """(the tasks without an annotation, how many had one): an annotated task is labelled already."""
    try:
        tasks = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a Label Studio JSON export ({exc})") from None
    if not isinstance(tasks, list):
        raise UserError(f"{path}: expected Label Studio's JSON export, a list of tasks")
    pool, annotated = [], 0
    for index, task in enumerate(tasks, start=1):
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise UserError(f"{path}: task {index} has no \"data\" object; expected Label Studio's JSON export")
        if any(isinstance(a, dict) and not a.get("was_cancelled") for a in task.get("annotations") or []):
            annotated += 1
            continue
        where = f"{path}: task {task.get('id', index)}"
        text = task_text(task["data"], where)
        pool.append(PoolText(where, text, split_words(text), dict(task["data"])))
    return pool, annotated


def read_text_pool(paths: list[Path], jsonl: bool, text_column: str, splitter=split_words) -> list[PoolText]:
    """Raw text (a text a line), span JSONL, folders, parquet and datasets folders, as corpus tagging reads them;
    `splitter`: split_whitespace for --pretokenized lines."""
    sources = expand_inputs([str(p) for p in paths], jsonl, Path(os.devnull))  # no output folder to leave out
    pool = []
    for kind, where, payload in iter_units(sources, text_column):
        record = parse_unit(kind, where, payload)
        pool.append(PoolText(where, record["text"], splitter(record["text"]), record))
    return pool


def read_pool(args: argparse.Namespace) -> tuple[list[PoolText], int]:
    """(pool, texts left out as labelled by the pool itself: a Label Studio export's annotated tasks)."""
    for path in args.pool:
        if not path.exists():
            raise UserError(f"{path}: file not found")
    if args.conll:
        return [t for path in args.pool for t in read_conll_pool(path)], 0
    if args.pretokenized:
        return read_text_pool(args.pool, False, args.text_column, split_whitespace), 0
    pool, annotated = [], 0
    for path in args.pool:
        if path.is_file() and not args.jsonl and detect_format(path) == "label-studio":
            tasks, done = read_label_studio_pool(path)
            pool, annotated = pool + tasks, annotated + done
        else:
            pool += read_text_pool([path], args.jsonl, args.text_column)
    return pool, annotated


def word_key(words) -> tuple[str, ...]:
    return tuple(w.lower() for w in words)


def unlabelled(pool: list[PoolText], labelled_files: list[Path]) -> tuple[list[PoolText], int, int]:
    """(the texts to choose from, how many were labelled already, how many repeat an earlier pool text)."""
    labelled = {word_key(e.words) for path in labelled_files for e in read_examples(path)}
    seen, kept, already, repeats = set(), [], 0, 0
    for text in pool:
        key = word_key(w for w, _, _ in text.words)
        if key in labelled:
            already += 1
        elif key in seen:
            repeats += 1
        else:
            seen.add(key)
            kept.append(text)
    return kept, already, repeats


def tag_pool(tagger: Tagger, pool: list[PoolText], args: argparse.Namespace, progress) -> None:
    """Every text's entities and confidence; CoNLL sentences with their documents' context, as ner.predict."""
    if args.conll:
        tags, probs = tagger.tag([t.example for t in pool], args.batch_size, args.max_tokens, progress)
        for text, t, p in zip(pool, tags, probs):
            text.result = text_result(t, p, text.words, text.text)
        return
    results = tagger.predict([t.text for t in pool], args.batch_size, args.max_tokens, progress,
                             words=[t.words for t in pool])
    for text, result in zip(pool, results):
        text.result = result


def output(picks: list[tuple[PoolText, int]], fmt: str, version: str) -> str:
    if fmt == "label-studio":
        tasks = [label_studio_task({**text.record, "_source": text.source}, text.result, version, cluster)
                 for text, cluster in picks]
        return json.dumps(tasks, ensure_ascii=False, indent=1) + "\n"
    lines = [{**entities_record(text.record, text.result), "cluster": cluster, "_source": text.source}
             for text, cluster in picks]
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ner.select", description=__doc__.splitlines()[0],
                                     epilog=__doc__[__doc__.index("The budget"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="an exported model folder (OUTPUT_DIR/final)")
    parser.add_argument("pool", type=Path, nargs="+", metavar="POOL",
                        help="unlabelled texts: raw text (a text a line), --jsonl, --conll, --pretokenized, a Label "
                             "Studio JSON export, folders, parquet files or a datasets folder")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--words", type=int, metavar="N", help="pick texts holding N words at most")
    budget.add_argument("--texts", type=int, metavar="N", help="pick N texts at most")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--conll", action="store_true", help="POOL is CoNLL (its tags are ignored)")
    mode.add_argument("--pretokenized", action="store_true", help="each line is one sentence of space-separated words")
    mode.add_argument("--jsonl", action="store_true", help='each line is a JSON object with a "text" (span JSONL)')
    parser.add_argument("--text-column", default="text", help="parquet / datasets pools: the column of texts")
    parser.add_argument("--labelled", type=Path, nargs="+", default=[], metavar="FILE",
                        help="texts labelled already (any file ner.train reads): left out of the pool")
    parser.add_argument("--format", choices=("label-studio", "spans"), default="label-studio",
                        help="Label Studio tasks (one JSON list) or span JSONL (default: label-studio)")
    parser.add_argument("--output", type=Path, help="write here (whole, or not at all) instead of stdout")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    add_inference_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return parser


def check_args(args: argparse.Namespace) -> None:
    budget = args.words if args.words is not None else args.texts
    if budget <= 0:
        raise UserError(f"--{'words' if args.words is not None else 'texts'} {budget}: give a positive budget")
    if args.output is not None and args.output.exists() and not args.overwrite:
        raise UserError(f"{args.output}: exists; choose another --output, or pass --overwrite to replace it")
    if args.output is not None and args.output.resolve() in {p.resolve() for p in args.pool}:
        raise UserError(f"{args.output}: is also a POOL file; choose another --output")


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    show_choice_on_stderr(args.quiet)
    pool, annotated = read_pool(args)
    candidates, already, repeats = unlabelled(pool, args.labelled)
    tagger = Tagger.from_args(args)
    progress = partial(tqdm, disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
    tag_pool(tagger, pool if args.conll else candidates, args, progress)  # CoNLL: every sentence gives context
    picked = select([t.result["confidence"] for t in candidates], [[w for w, _, _ in t.words] for t in candidates],
                    words=args.words, texts=args.texts)
    picks = [(candidates[p.index], p.cluster) for p in picked]
    text = output(picks, args.format, model_version(args.model_dir))
    if args.output is not None:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        summary(picks, candidates, annotated + already, repeats)
    return 0


def summary(picks: list[tuple[PoolText, int]], candidates: list[PoolText], labelled: int, repeats: int) -> None:
    def mean(texts) -> float:
        return sum(t.result["confidence"] for t in texts) / max(len(texts), 1)

    words = sum(len(t.words) for t, _ in picks)
    print(f"picked {len(picks)} texts ({words} words, {len({c for _, c in picks})} clusters) of {len(candidates)} "
          f"unlabelled; left out {labelled} labelled already and {repeats} repeats; mean confidence "
          f"{mean([t for t, _ in picks]):.4f} picked, {mean(candidates):.4f} over the pool", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
