"""How an exported model is run: the inference options of ner.predict, ner.evaluate and ner.serve on the command
line, the per-device forward budgets, and the defaults a model runs with where its training did not record them.
Which runtimes exist is declared in runtimes.py; which one --runtime auto picks, in runtime_choice.py.

    python -m ner.predict runs/ner/final articles.txt                # auto: the log line says what and why
"""

from __future__ import annotations

import argparse
import logging

from ner.backends import BF16, NO_MIXED_PRECISION
from ner.data.batching import NO_TOKEN_BUDGET
from ner.errors import UserError
from ner.inference.decode import DECODERS
from ner.inference.runtimes import AUTO_RUNTIME, RUNTIME_CHOICES, export_command
from ner.process import log_to_stderr, process_rank_from_env

# Defaults a model is run with where its training_args.json does not say (training's defaults too)
MAX_SEQ_LENGTH = 128  # subword tokens per window incl. [CLS]/[SEP]
WINDOW_STRIDE_WORDS = 0  # words shared by consecutive windows of one long sentence (0: a quarter of the window)
PAD_TO_MULTIPLE_OF = 4  # batch widths; measured on CPU (docs/performance.md)
CONTEXTS = ("auto", "document", "none")
# --mixed-precision at inference; fp16 is offered to training only (GPUs without bf16, with its loss scaler)
INFERENCE_PRECISIONS = ("auto", NO_MIXED_PRECISION, BF16)
AUTO_SENTENCES_PER_BATCH = 32  # training's micro-batch where --batch-size is auto; inference takes twice it


# Padded tokens per inference forward pass. Every pass of padded width W runs with exactly max_tokens // W rows
# (encode.fixed_shape_plan: a text's answer never depends on its batch neighbours), so a short batch is filled
# and a lone text costs the whole budget. 512 tagged corpora fastest and lone texts at a few times one row's cost,
# in bf16 and fp32 on CPU, against 8,192 (a lone text far slower) and one row a pass (docs/performance.md, "Batch
# independence").
INFERENCE_TOKENS_PER_FORWARD = 512


# (windows, padded tokens) per inference forward pass by device type, where --batch-size / --max-tokens are not
# given. A GPU runs a pass of 512 tokens no faster than one of thousands (kernel launches dominate), so it gets
# a budget of its own, measured on an H200 (docs/performance.md, "On a GPU").
INFERENCE_BUDGETS = {"cpu": (AUTO_SENTENCES_PER_BATCH * 2, INFERENCE_TOKENS_PER_FORWARD), "cuda": (1024, 8192)}


def inference_budget(device_type: str, max_sentences: int | None = None,
                     max_tokens: int | None = None) -> tuple[int, int]:
    """(windows, padded tokens) per forward pass: what was given, else (None or 0: auto) the device type's default;
    max_tokens NO_TOKEN_BUDGET: none, max_sentences windows a pass."""
    rows, tokens = INFERENCE_BUDGETS.get(device_type, INFERENCE_BUDGETS["cpu"])
    return max_sentences or rows, max_tokens or tokens


def inference_batch_limits(batch_size: int, max_tokens: int) -> tuple[int, int]:
    """(windows, padded tokens) per inference forward pass for a training run's evaluation: no activations
    are kept for a backward pass, so twice the training micro-batch would fit; the token budget is capped at
    INFERENCE_TOKENS_PER_FORWARD, the fixed-shape passes' measured best."""
    return batch_size * 2, min(max_tokens * 2, INFERENCE_TOKENS_PER_FORWARD) if max_tokens > 0 else NO_TOKEN_BUDGET


MIN_SEQ_LENGTH = 8  # [CLS], [SEP] and a few words


def check_max_seq_length(value: int, max_positions: int | None = None) -> None:
    """Training and inference windows: at least MIN_SEQ_LENGTH tokens, at most the model's positions."""
    if value < MIN_SEQ_LENGTH:
        raise UserError(f"--max-seq-length {value} is too small: a window needs [CLS], [SEP] and a few words "
                        f"(use {MIN_SEQ_LENGTH} or more" + (f", up to {max_positions})" if max_positions else ")"))
    if max_positions is not None and value > max_positions:
        raise UserError(f"--max-seq-length {value} is longer than the model's {max_positions} positions "
                        f"(use {MIN_SEQ_LENGTH} to {max_positions})")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """How an exported model is run (ner.predict, ner.evaluate, ner.serve); defaults: as it was trained."""
    parser.add_argument("--max-seq-length", type=int, default=None,
                        help="tokens per window (default: the value the model was trained with)")
    parser.add_argument("--context", choices=CONTEXTS, default="auto",
                        help="document context (default auto: where the model was trained with it and the "
                             "input has documents, e.g. CoNLL -DOCSTART- lines)")
    parser.add_argument("--decode", choices=DECODERS, default=None,
                        help="viterbi: only tag sequences the scheme allows; argmax: best tag per word "
                             "(default: what the model was trained with, viterbi for new models)")
    parser.add_argument("--mixed-precision", choices=INFERENCE_PRECISIONS, default="auto",
                        help="autocast dtype (default: auto, bf16 where supported)")
    parser.add_argument("--min-score", action="append", default=None, metavar="SCORE|TYPE=SCORE",
                        help="drop entities scored below SCORE, overall or for one type (PER=0.8); repeatable "
                             "(default: the model's, from training's --min-score, else none)")
    parser.add_argument("--runtime", choices=RUNTIME_CHOICES, default=AUTO_RUNTIME,
                        help="auto (default): the fastest runtime for this CPU class or GPU among those the model "
                             "folder has files for and whose packages are installed; the log says which and why "
                             "(docs/performance.md, \"Runtimes by CPU class\"). torch; onnx / onnx-int8: onnxruntime "
                             "(CUDA where it has the provider and the device is a GPU, else the CPU) over model.onnx / "
                             "model.int8.onnx; openvino: OpenVINO on the CPU over model.onnx (bf16 as "
                             "--mixed-precision decides); openvino-int8: model.int8.xml, OpenVINO's static int8. "
                             + export_command() + " writes every runtime's files")


def parse_min_score(spec: str | list[str] | None) -> dict[str, float]:
    """--min-score "0.5,PER=0.8" (or the flag repeated) -> {"": 0.5, "PER": 0.8}; "" is every other type."""
    parts = [p.strip() for item in ([spec] if isinstance(spec, str) else spec or []) for p in item.split(",")]
    thresholds: dict[str, float] = {}
    for part in filter(None, parts):
        kind, _, value = part.rpartition("=")
        try:
            score = float(value)
        except ValueError:
            score = -1.0
        if not 0.0 <= score <= 1.0 or "=" in kind:
            raise UserError(f"--min-score {part}: expected a score in [0, 1], overall (0.5) or for one type "
                            "(PER=0.8)")
        thresholds[kind.strip()] = score
    return thresholds


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """The model options plus batch limits, for the commands that tag files (ner.predict, ner.evaluate)."""
    add_model_arguments(parser)
    budgets = "; ".join(f"{rows} / {tokens} on {kind}" for kind, (rows, tokens) in INFERENCE_BUDGETS.items())
    parser.add_argument("--batch-size", type=int, default=0,
                        help=f"windows per forward pass at most; 0: auto, by device (with --max-tokens: {budgets})")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="padded tokens per forward pass: every pass of padded width W has max_tokens // W rows "
                             "(at most --batch-size), whatever else is tagged; 0: auto, by device, as --batch-size; "
                             f"{NO_TOKEN_BUDGET}: none, --batch-size windows a pass whatever their width")


def show_choice_on_stderr(quiet: bool = False) -> None:
    """For the commands that tag (ner.predict, ner.evaluate): ner's own INFO lines, auto's choice among them, on
    stderr, once per job (rank 0); other libraries stay at warnings. `quiet`: logging is left as it was."""
    if quiet or process_rank_from_env() != 0:
        return
    log_to_stderr(logging.WARNING, "%(message)s")
    logging.getLogger("ner").setLevel(logging.INFO)
