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
import torch
from seqeval.metrics import classification_report
from seqeval.metrics.sequence_labeling import get_entities
from tqdm.auto import tqdm

from ner.backends import autocast_for, default_device, resolve_precision
from ner.batching import inference_batches
from ner.config import PAD_TO_MULTIPLE_OF
from ner.data import Example, check_known_labels, read_conll
from ner.encode import encode_examples, merge_predictions, padded_lengths
from ner.errors import USAGE_EXIT_CODE, UserError
from ner.loop import predict_word_labels


class Tagger:
    """An exported model folder, ready to tag lists of words."""

    def __init__(self, model_dir: str | Path, device: str | None = None, precision: str = "auto",
                 max_seq_length: int = 128, pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF) -> None:
        import transformers
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise UserError(f"{model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
        self.device = torch.device(device) if device else default_device()
        self.model.to(self.device)
        self.precision = resolve_precision(precision, self.device)
        self.id2label = {int(k): v for k, v in self.model.config.id2label.items()}
        self.label2id = {v: k for k, v in self.id2label.items()}
        self.max_seq_length = max_seq_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def tag(self, examples: list[Example], max_sentences: int = 64, max_tokens: int = 8192,
            progress=lambda it, **kw: it) -> tuple[list[list[str]], list[np.ndarray]]:
        """(tags, per-word probabilities) for each example, batched by length."""
        placeholder = {label: 0 for label in {t for e in examples for t in e.tags}}  # gold tags are not needed
        features = encode_examples(examples, self.tokenizer, placeholder, self.max_seq_length)
        batches = inference_batches(padded_lengths(features, self.pad_to_multiple_of), max_sentences, max_tokens)
        sentence_ids, word_ids, label_ids, probs = predict_word_labels(
            self.model, features, batches, self.device, lambda: autocast_for(self.device, self.precision),
            self.tokenizer.pad_token_id, progress, self.pad_to_multiple_of)
        tags = merge_predictions(examples, sentence_ids, word_ids, label_ids, self.id2label)
        offsets = np.cumsum([0] + [len(e.words) for e in examples])
        flat_probs = np.zeros(offsets[-1], dtype=np.float32)
        flat_probs[offsets[sentence_ids] + word_ids] = probs
        return tags, [flat_probs[offsets[i]:offsets[i + 1]] for i in range(len(examples))]


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
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens per window (default: 128)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch at most (default: 64)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="padded tokens per batch (default: 8192)")
    parser.add_argument("--mixed-precision", choices=("auto", "no", "bf16"), default="auto",
                        help="autocast dtype (default: auto, bf16 where supported)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tagger = Tagger(args.model_dir, precision=args.mixed_precision, max_seq_length=args.max_seq_length)
        examples = read_input(args)
        if args.conll:
            check_known_labels(examples, tagger.label2id)
        progress = partial(tqdm, disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
        tags, probs = tagger.tag(examples, args.batch_size, args.max_tokens, progress)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_EXIT_CODE
    write_output(examples, tags, probs, args.format)
    if args.conll:
        print(classification_report([e.tags for e in examples], tags, digits=4, zero_division=0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
