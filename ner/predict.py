"""Tag text with an exported model; no training backend needed.

    echo "Angela Merkel met Emmanuel Macron in Paris ." | python -m ner.predict runs/ner/final
    python -m ner.predict runs/ner/final sentences.txt            # one sentence per line, words split on spaces
    python -m ner.predict runs/ner/final test.conll --conll       # gold tags too: seqeval report on stderr
    python -m ner.predict runs/ner/final test.conll --conll --format conll > tagged.conll

JSON output, one line per sentence:
    {"words": [...], "entities": [{"text": "Angela Merkel", "type": "PER", "start": 0, "end": 2, "score": 0.99}]}
`start` is the first word's index and `end` is one past the last (a Python slice of `words`).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
from seqeval.metrics import classification_report
from seqeval.metrics.sequence_labeling import get_entities
from tqdm.auto import tqdm

from ner.config import add_inference_arguments
from ner.data import Example, check_known_labels, read_conll
from ner.errors import UserError, cli
from ner.infer import Tagger


def entities(words: list[str], tags: list[str], probs: np.ndarray) -> list[dict]:
    found = []
    for kind, start, last in get_entities(tags):
        found.append({"text": " ".join(words[start:last + 1]), "type": kind, "start": start, "end": last + 1,
                      "score": round(float(probs[start:last + 1].mean()), 4)})
    return found


def read_plain(lines: list[str], source: str) -> list[Example]:
    return [Example(line.split(), ["O"] * len(line.split()), source) for line in lines if line.strip()]


def read_input(args: argparse.Namespace) -> list[Example]:
    if args.conll:
        if args.file is None:
            raise UserError("--conll needs a FILE argument (CoNLL is read from a file, not stdin)")
        return read_conll(args.file)
    if args.file is None:
        return read_plain(sys.stdin.read().splitlines(), "<stdin>")
    if not args.file.is_file():
        raise UserError(f"{args.file}: file not found")
    try:
        return read_plain(args.file.read_text(encoding="utf-8-sig").splitlines(), str(args.file))
    except UnicodeDecodeError:
        raise UserError(f"{args.file}: not UTF-8 text; re-save the file as UTF-8") from None


def write_output(examples: list[Example], tags: list[list[str]], probs: list[np.ndarray], fmt: str) -> None:
    out = sys.stdout
    for example, sentence_tags, sentence_probs in zip(examples, tags, probs):
        if fmt == "conll":
            out.write("".join(f"{w}\t{t}\n" for w, t in zip(example.words, sentence_tags)) + "\n")
        else:
            record = {"words": example.words, "entities": entities(example.words, sentence_tags, sentence_probs)}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ner.predict", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an exported model folder (OUTPUT_DIR/final)")
    parser.add_argument("file", type=Path, nargs="?", help="input file (default: stdin), one sentence per line")
    parser.add_argument("--conll", action="store_true", help="FILE is CoNLL (word ... TAG); prints a seqeval report")
    parser.add_argument("--format", choices=("json", "conll"), default="json", help="output format (default: json)")
    add_inference_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tagger = Tagger.from_args(args)
    examples = read_input(args)
    if args.conll:
        check_known_labels(examples, tagger.label2id)
    progress = partial(tqdm, disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
    tags, probs = tagger.tag(examples, args.batch_size, args.max_tokens, progress)
    write_output(examples, tags, probs, args.format)
    if args.conll:
        print(classification_report([e.tags for e in examples], tags, digits=4, zero_division=0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
