"""Export a checkpoint as a standard Hugging Face model folder.

    python -m ner.export runs/ner/checkpoints/step_120 exported/
    python -m ner.export runs/ner/final runs/ner/final --export-int8 --calibrate train.conll   # every runtime's files
    python -m ner.export runs/ner/final exported_onnx/ --onnx --quantize int8   # + model.onnx, model.int8.onnx
    python -m ner.export runs/ner/final exported_onnx/ --onnx --quantize int8 --calibrate train.conll  # + .xml
    python -m ner.export runs/ner/checkpoints/step_240 exported/ --overwrite     # replace an earlier export
    python -c "from transformers import pipeline; print(pipeline('token-classification', \
        model='exported', aggregation_strategy='simple')('Ada Lovelace visited London'))"

The folder holds model.safetensors, config.json (with id2label / label2id), the tokenizer,
training_args.json, metrics.json and a README.md model card (with --onnx: model.onnx and
model.int8.onnx for `--runtime onnx|onnx-int8`, ner/inference/onnx_export.py; --export-int8: every file a runtime
reads, model.int8.xml too, so that `--runtime auto` can pick the fastest for the CPU it runs on, where a file its
check refuses is left out and named, the others kept, and the export still succeeds). The folder is written beside
its final name and renamed into place, so a crash never leaves half an export. OUT must be new, empty, or (with
--overwrite) a model folder this tool exported; a folder of anything else is refused, never replaced.
Replacing an export replaces only the files an export wrote (recorded with their SHA-256 in OUT/.ner-record.json):
everything else in OUT (a model repository's .git/, your notes) stays, carried into the new folder as hard links.
A file in OUT that the new export also writes but that no record shows an export wrote as it is now (your own
README.md, a model card edited since) is never replaced without --overwrite; with it, the log names the file
first. OUT may be SRC itself (an export) to add ONNX files in place; the end of training exports into
OUTPUT_DIR/final the same way, without --overwrite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ner.data.formats import read_examples
from ner.errors import UserError, cli
from ner.inference.onnx_export import require_packages as require_onnx_packages
from ner.inference.openvino_export import require_packages
from ner.inference.runtimes import FAST_RUNTIMES_FLAG, ONNX, ONNX_INT8, OPENVINO_INT8
from ner.training.export import export_any, export_fast_runtimes


@cli
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ner.export", description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a checkpoint folder (OUTPUT_DIR/checkpoints/step_N) or an exported "
                        "model folder (OUTPUT_DIR/final)")
    parser.add_argument("out_dir", type=Path, help="folder to write the Hugging Face model into")
    parser.add_argument(FAST_RUNTIMES_FLAG, dest="fast_runtimes", action="store_true",
                        help="write every runtime's files (model.onnx, model.int8.onnx, model.int8.xml), each checked "
                        "against PyTorch, so that --runtime auto picks the fastest this CPU runs; the static int8 is "
                        "calibrated on --calibrate FILE, else on the training file the model's training_args.json "
                        "names; a file its check refuses is left out and named, the others kept")
    parser.add_argument("--onnx", action="store_true", help="also write model.onnx (checked against PyTorch), "
                        "for --runtime onnx")
    parser.add_argument("--quantize", choices=("int8",), help="with --onnx: also model.int8.onnx (int8 weights, "
                        "activations quantized per token; its tags checked to agree with PyTorch on >= 98%% of "
                        "words and 95%% of entity words), for --runtime onnx-int8")
    parser.add_argument("--calibrate", type=Path, metavar="FILE", help="with --quantize int8 or "
                        f"{FAST_RUNTIMES_FLAG}: also model.int8.xml (+ .bin), OpenVINO's static int8 for --runtime "
                        "openvino-int8, its activation scales measured once on this file's text (the training file; "
                        "any format ner.train reads) and its tags checked as model.int8.onnx's are")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it is a model folder this tool "
                        "exported (a folder of anything else is refused, never replaced)")
    args = parser.parse_args(argv)
    if args.fast_runtimes:
        if args.onnx or args.quantize:
            raise UserError(f"{FAST_RUNTIMES_FLAG} writes the ONNX and int8 files itself: drop --onnx / --quantize")
        require_packages(FAST_RUNTIMES_FLAG)
        calibration = read_examples(args.calibrate or recorded_train_file(args.source))
        print(export_fast_runtimes(args.source, args.out_dir, calibration, args.overwrite), file=sys.stderr)
        print(args.out_dir)
        return 0
    if args.quantize and not args.onnx:
        raise UserError("--quantize int8 quantizes the ONNX model: pass --onnx too")
    if args.calibrate and not args.quantize:
        raise UserError(f"--calibrate FILE calibrates the static int8 model: pass {FAST_RUNTIMES_FLAG} (or --onnx "
                        "--quantize int8) too")
    if args.onnx:
        require_onnx_packages("--onnx")
    if args.calibrate:
        require_packages("--calibrate")
    calibration = read_examples(args.calibrate) if args.calibrate else None
    print(export_any(args.source, args.out_dir, runtimes_asked(args), args.overwrite, calibration))
    return 0


def runtimes_asked(args: argparse.Namespace) -> tuple[str, ...]:
    """The runtimes whose files --onnx, --quantize int8 and --calibrate ask for (checked consistent before)."""
    return (ONNX,) * args.onnx + (ONNX_INT8,) * bool(args.quantize) + (OPENVINO_INT8,) * bool(args.calibrate)


def recorded_train_file(source: Path) -> Path:
    """The training file that made `source` (its training_args.json, or a checkpoint's recorded config), where it
    is still there: the text to calibrate the static int8 model on when --calibrate is not given."""
    from ner.inference.model_folder import read_model_json
    from ner.training.checkpoint import MANIFEST, read_state

    config = read_state(source)["config"] if (source / MANIFEST).is_file() else (
        read_model_json(source / "training_args.json") if (source / "training_args.json").is_file() else {})
    train_file = config.get("train_file")
    if not train_file or not Path(train_file).exists():
        said = f"names {train_file}, not found here" if train_file else "names no training file"
        raise UserError(f"{FAST_RUNTIMES_FLAG} calibrates the static int8 model on training text: pass --calibrate "
                        f"TRAIN_FILE (the model's training record {said})")
    return Path(train_file)


if __name__ == "__main__":
    sys.exit(main())
