"""Tag text with an exported model; no training backend needed.

    echo "Angela Merkel met Emmanuel Macron in Paris." | python -m ner.predict runs/ner/final
    python -m ner.predict runs/ner/final articles.txt                  # raw text, one text per line
    python -m ner.predict runs/ner/final words.txt --pretokenized      # words already split on spaces
    python -m ner.predict runs/ner/final test.conll --conll            # gold tags too: seqeval report on stderr
    python -m ner.predict runs/ner/final test.conll --conll --format conll > tagged.conll
    python -m ner.predict runs/ner/final texts.jsonl --jsonl --format spans > pre_annotated.jsonl
    python -m ner.predict runs/ner/final corpus/ --output-dir tagged --merge   # a corpus: ner/corpus/tagging.py

JSON output, one line per input line (raw text: an empty line gives no entities):
    {"entities": [{"text": "Angela Merkel", "type": "PER", "start": 0, "end": 13, "score": 0.99}], "confidence": 0.98}
`confidence`: how sure the model is of the text's whole tag sequence, entities or none (low = unsure; every
    output format but conll carries it, and `python -m ner.select` picks the least sure texts to annotate).
--format spans: span JSONL, what ner.train reads back and annotation tools (doccano, Label Studio
    via its converters) import, for correction:
    {"text": "Angela Merkel met ...", "entities": [[0, 13, "PER"], ...]}
    (--pretokenized / --conll: the words joined by spaces are the text)
--jsonl: each line is {"text": ...} (span JSONL: texts may hold line breaks); its other fields are
    kept in --format spans output, its entities replaced by the predicted ones.
--format label-studio (raw text, --jsonl): one JSON list of Label Studio tasks with the entities as
    predictions, to import and correct there (its Named Entity Recognition template's names).
raw text (default): `start`/`end` are character offsets into the line, end exclusive, and
    `text == line[start:end]`; words are split CoNLL-style (ner/data/text.py), long texts windowed.
--pretokenized and --conll: one JSON line per sentence (blank lines skipped), with its `words`;
    `start`/`end` are word indices (`words[start:end]`) and `text` is those words joined by spaces.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ner.corpus.tagging import add_corpus_arguments, tag_corpus
from ner.data.conll import read_conll
from ner.data.examples import Example
from ner.data.jsonl import parse_jsonl
from ner.data.span_files import text_of
from ner.data.spans import SPAN_HELP, entities_record, label_studio_task, span_record
from ner.data.tags import check_known_labels
from ner.data.text import split_whitespace
from ner.errors import UserError, cli
from ner.inference.entities import entities, text_confidence, word_positions
from ner.inference.model_folder import model_version
from ner.inference.options import add_inference_arguments, show_choice_on_stderr
from ner.inference.tagger import Tagger

RAW_HELP = ("raw text (the default): each line is one text; entities carry character offsets "
            "(text == line[start:end])")


def read_plain(lines: list[str], source: str) -> list[Example]:
    """--pretokenized: the words of each line that has any, split as text.split_whitespace splits them."""
    sentences = [[word for word, _, _ in split_whitespace(line)] for line in lines]
    return [Example(words, ["O"] * len(words), source) for words in sentences if words]


def read_lines(file: Path | None) -> list[str]:
    """Input lines, split on \\n only: a form feed or U+2028 inside a text stays in that text."""
    if file is not None and not file.is_file():
        raise UserError(f"{file}: file not found")
    try:
        text = (file.read_bytes() if file is not None else sys.stdin.buffer.read()).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{file or '<stdin>'}: not UTF-8 text; re-save it as UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start another
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_input(args: argparse.Namespace) -> list[Example]:
    if args.conll:
        if args.file is None:
            raise UserError("--conll needs a FILE argument (CoNLL is read from a file, not stdin)")
        return read_conll(args.file)
    return read_plain(read_lines(args.file), str(args.file or "<stdin>"))


def read_text_records(args: argparse.Namespace) -> list[dict]:
    """Raw-text input as records: {"text": line} per line, or the --jsonl records."""
    lines = read_lines(args.file)
    if not args.jsonl:
        return [{"text": line} for line in lines]
    source = args.file or "<stdin>"
    records = []
    for line_no, record in parse_jsonl(lines, source, SPAN_HELP):
        text_of(record, f"{source}:{line_no}")
        records.append(record)
    return records


def write_output(examples: list[Example], tags: list[list[str]], probs: list[np.ndarray], fmt: str) -> None:
    out = sys.stdout
    for example, sentence_tags, sentence_probs in zip(examples, tags, probs):
        if fmt == "conll":
            out.write("".join(f"{w}\t{t}\n" for w, t in zip(example.words, sentence_tags)) + "\n")
        elif fmt == "spans":
            record = {**span_record([(example.words, sentence_tags)]), "confidence": text_confidence(sentence_probs)}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            record = {"words": example.words, "entities": entities(sentence_tags, sentence_probs,
                                                                     word_positions(example.words)),
                      "confidence": text_confidence(sentence_probs)}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ner.predict", description=__doc__.splitlines()[0],
                                     epilog=__doc__[__doc__.index("JSON output"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="an exported model folder (OUTPUT_DIR/final)")
    parser.add_argument("inputs", type=Path, nargs="*", metavar="INPUT",
                        help="input file (default: stdin); " + RAW_HELP + "; with --output-dir: files, globs, "
                             "folders, parquet files or a datasets folder")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--pretokenized", action="store_true",
                      help="each line is one sentence of words separated by spaces; entities carry word indices "
                           "(words[start:end]) and the output has `words`")
    mode.add_argument("--conll", action="store_true",
                      help="FILE is CoNLL (word ... TAG); word indices as --pretokenized; prints a seqeval report")
    mode.add_argument("--jsonl", action="store_true",
                      help='each line is a JSON object with a "text" (span JSONL); character offsets as raw text')
    parser.add_argument("--format", choices=("json", "conll", "spans", "label-studio"), default="json",
                        help="output: json (entities with scores), conll (word<TAB>tag), spans (span JSONL, "
                             "which ner.train and annotation tools read) or label-studio (tasks with "
                             "predictions to import) (default: json)")
    add_inference_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_corpus_arguments(parser)
    return parser


def predict_raw(tagger: Tagger, args: argparse.Namespace, progress) -> int:
    records = read_text_records(args)
    results = tagger.predict([r["text"] for r in records], args.batch_size, args.max_tokens, progress)
    if args.format == "label-studio":
        version = model_version(args.model_dir)
        tasks = [label_studio_task(r, result, version) for r, result in zip(records, results)]
        sys.stdout.write(json.dumps(tasks, ensure_ascii=False, indent=1) + "\n")
        return 0
    if args.format == "spans":
        results = [entities_record(record, result) for record, result in zip(records, results)]
    sys.stdout.writelines(json.dumps(result, ensure_ascii=False) + "\n" for result in results)
    return 0


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_choice_on_stderr(args.quiet)
    if args.output_dir is not None:
        return tag_corpus(args)
    if len(args.inputs) > 1:
        raise UserError("several INPUTs need --output-dir (corpus tagging); without it, give one file or stdin")
    args.file = args.inputs[0] if args.inputs else None
    if args.format == "conll" and not (args.pretokenized or args.conll):
        raise UserError("--format conll writes one word a line: pass --pretokenized or --conll")
    if args.format == "label-studio" and (args.pretokenized or args.conll):
        raise UserError("--format label-studio writes character offsets: give raw text or --jsonl")
    tagger = Tagger.from_args(args)
    progress = partial(tqdm, disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
    if not (args.pretokenized or args.conll):
        return predict_raw(tagger, args, progress)
    examples = read_input(args)
    if args.conll:
        check_known_labels(examples, tagger.label2id)
    tags, probs = tagger.tag(examples, args.batch_size, args.max_tokens, progress)
    write_output(examples, tags, probs, args.format)
    if args.conll:
        from seqeval.metrics import classification_report  # imports scikit-learn: only for this report

        print(classification_report([e.tags for e in examples], tags, digits=4, zero_division=0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
