"""How an exported model is run: the inference options of ner.predict, ner.evaluate and ner.serve, the
per-device forward budgets, the defaults a model runs with where its training did not record them, and the runtime
--runtime auto picks for the device (from one table of measurements by CPU class).

    python -m ner.predict runs/ner/final articles.txt                # auto: the log line says what and why
    python -m ner.export runs/ner/final runs/ner/final --export-int8 --calibrate train.conll   # the files it may pick
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ner.backends import BF16, NO_MIXED_PRECISION
from ner.data.batching import NO_TOKEN_BUDGET
from ner.errors import UserError
from ner.extras import install_hint
from ner.inference.decode import DECODERS
from ner.process import log_to_stderr, process_rank_from_env

log = logging.getLogger("ner")

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


# What computes the logits at inference (inference/torch_runtime.py, onnx_runtime.py, openvino_runtime.py), and the
# files of the model folder that only it reads (the weights, config and tokenizer count for every runtime). The names
# are declared once, here: config, command line, tables and tests read the constants.
TORCH, ONNX, ONNX_INT8, OPENVINO, OPENVINO_INT8 = RUNTIMES = ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8")
RUNTIME_FILES = {TORCH: (), ONNX: ("model.onnx",), ONNX_INT8: ("model.int8.onnx",),
                 OPENVINO: ("model.onnx",), OPENVINO_INT8: ("model.int8.xml", "model.int8.bin")}
RUNTIME_PACKAGES = {TORCH: ("torch",), ONNX: ("onnxruntime",), ONNX_INT8: ("onnxruntime",),
                    OPENVINO: ("openvino",), OPENVINO_INT8: ("openvino",)}
# The runtimes OpenVINO runs (on the CPU only, without torch): read from the packages each needs
OPENVINO_RUNTIMES = tuple(runtime for runtime in RUNTIMES if "openvino" in RUNTIME_PACKAGES[runtime])
# --runtime's default: the fastest of RUNTIMES for the device that the export's files allow (resolve_runtime, below)
AUTO_RUNTIME = "auto"
RUNTIME_CHOICES = (AUTO_RUNTIME, *RUNTIMES)
# The one flag (ner.export, ner.train; TrainConfig.export_int8) that writes every file a runtime of RUNTIMES reads
# besides torch's: model.onnx, model.int8.onnx and OpenVINO's static model.int8.xml, each past its accuracy gate
FAST_RUNTIMES_FLAG = "--export-int8"
FAST_RUNTIMES_COMMAND = "python -m ner.export {model} {model} " + FAST_RUNTIMES_FLAG + " --calibrate TRAIN_FILE"


def export_command(model_dir: Path | str = "MODEL_DIR") -> str:
    """The command that writes every runtime's files into `model_dir` (an export or a checkpoint's), for the errors
    and hints that name it."""
    return FAST_RUNTIMES_COMMAND.format(model=model_dir)


# The ner.train flags that write each runtime's files into OUTPUT_DIR/final (checked against PyTorch, and calibrated
# on the training data where the runtime needs it): Label Studio's retraining passes the served runtime's, so the
# model it swaps in can be run the way the server runs. Every runtime says; () where the weights alone do.
RUNTIME_TRAIN_FLAGS = {TORCH: (), ONNX: (FAST_RUNTIMES_FLAG,), ONNX_INT8: (FAST_RUNTIMES_FLAG,),
                       OPENVINO: (FAST_RUNTIMES_FLAG,), OPENVINO_INT8: (FAST_RUNTIMES_FLAG,)}


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


# ----------------------------------------------------------------------------- --runtime auto
# The fastest runtime for the device at hand among those the export's files and the installed packages allow, from
# one table of measurements keyed by CPU class (docs/performance.md, "Runtimes by CPU class"). The order is a
# property of the instruction set, measured: on an AVX2-only EPYC per-token int8 in onnxruntime was fastest and
# OpenVINO's static int8 slowest (int8 without VNNI gains little in OpenVINO's kernels); with AVX-512 VNNI the order
# flips; with AMX OpenVINO's bf16 leads. The CPU class is read from /proc/cpuinfo's flags, so the choice is the same
# on every run on one machine. On a GPU torch runs (onnxruntime's CUDA provider has not been measured). An explicit
# --runtime is never second-guessed: only "auto" is resolved.

# The fastest first, each with the figure the place rests on: raw-text tagging of the 14,041 CoNLL-2003 train
# sentences against transformers' pipeline, whole processes (AMX: one forward of 16 x 32 tokens). "reasoned": not
# measured on that class; the reason says which measurement it follows. docs/performance.md has the table.
RUNTIME_ORDER: dict[str, tuple[tuple[str, str], ...]] = {
    "amx": (
        (OPENVINO, "bf16 on AMX, 53,931 tokens/s a forward"),
        (OPENVINO_INT8, "reasoned: OpenVINO runs int8 on AMX too; not measured on AMX"),
        (ONNX_INT8, "28,063 tokens/s a forward"),
        (TORCH, "bf16, 20,943 tokens/s a forward"),
        (ONNX, "reasoned: fp32, no AMX units; not measured on AMX")),
    "avx512-vnni-bf16": (
        (OPENVINO_INT8, "8.54x a pipeline"),
        (OPENVINO, "bf16, 6.69x a pipeline"),
        (ONNX_INT8, "5.13x a pipeline"),
        (TORCH, "bf16, 4.32x a pipeline"),
        (ONNX, "3.55x a pipeline")),
    "avx512-vnni": (
        (OPENVINO_INT8, "reasoned: the 8.54x of AVX-512 VNNI with BF16 is int8 on VNNI (a bf16 hint gained nothing)"),
        (ONNX_INT8, "reasoned: the 5.13x of AVX-512 VNNI with BF16, int8 on VNNI"),
        (OPENVINO, "reasoned: fp32 without bf16 units, as on AVX2 (2.73x a pipeline)"),
        (ONNX, "reasoned: fp32, as on AVX2 (2.62x a pipeline)"),
        (TORCH, "reasoned: fp32, as on AVX2 (2.24x a pipeline)")),
    "avx2": (
        (ONNX_INT8, "3.53x a pipeline"),
        (OPENVINO, "fp32, 2.73x a pipeline"),
        (ONNX, "2.62x a pipeline"),
        (TORCH, "fp32, 2.24x a pipeline"),
        (OPENVINO_INT8, "1.99x a pipeline: int8 without VNNI gains little in OpenVINO's kernels")),
    "arm": (
        (ONNX_INT8, "reasoned: onnxruntime's integer kernels use Arm's dot-product instructions; AVX2's order"),
        (ONNX, "reasoned: AVX2's order (2.62x a pipeline there)"),
        (TORCH, "reasoned: AVX2's order (2.24x a pipeline there)"),
        (OPENVINO, "reasoned: OpenVINO's Arm plugin is not measured"),
        (OPENVINO_INT8, "reasoned: OpenVINO's Arm plugin is not measured")),
    "gpu": (
        (TORCH, "the GPU budgets of docs/performance.md; onnxruntime's CUDA provider is not measured"),
        (ONNX, "not measured on a GPU"), (ONNX_INT8, "not measured on a GPU"),
        (OPENVINO, "CPU only"), (OPENVINO_INT8, "CPU only")),
}
CPU_CLASS_HELP = {"amx": "AMX (amx_bf16)", "avx512-vnni-bf16": "AVX-512 VNNI and BF16, no AMX",
                  "avx512-vnni": "AVX-512 VNNI without BF16", "avx2": "x86 without VNNI (AVX2-only and older)",
                  "arm": "Arm (aarch64)", "gpu": "a GPU"}


def install_command(runtime: str) -> str:
    """The package `runtime` needs and the command that installs it, for its one-line error."""
    package = RUNTIME_PACKAGES[runtime][0]
    return f"{package}: {install_hint(package)}"


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The instruction-set flags of the first processor in /proc/cpuinfo's text ("flags" on x86, "Features" on Arm)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_class(flags: frozenset[str] | set[str], machine: str) -> str:
    """The row of RUNTIME_ORDER for a CPU: its flags decide, the machine name only tells Arm apart."""
    if machine.lower() in ("aarch64", "arm64") or machine.lower().startswith("arm"):
        return "arm"
    if "amx_bf16" in flags or "amx_int8" in flags:
        return "amx"
    if "avx512_vnni" in flags:
        return "avx512-vnni-bf16" if "avx512_bf16" in flags else "avx512-vnni"
    return "avx2"


def this_cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""  # no /proc (macOS): the machine name, else the AVX2 order, the most conservative
    return cpu_class(cpu_flags(text), platform.machine())


def missing(runtime: str, model_dir: Path, installed=importlib.util.find_spec) -> str | None:
    """What `runtime` lacks to run this export here, as the fix (the install or export command); None: nothing."""
    for package in RUNTIME_PACKAGES[runtime]:
        if installed(package) is None:
            return install_hint(package)
    if any(not (Path(model_dir) / name).is_file() for name in RUNTIME_FILES[runtime]):
        return export_command(model_dir)
    return None


@dataclass(frozen=True)
class Choice:
    """What auto resolved to, on which class and figure, and the faster runtimes it could not use (with the fix)."""

    runtime: str
    device_class: str
    figure: str
    faster: tuple[tuple[str, str, str], ...] = field(default=())  # (runtime, figure, fix)

    def line(self) -> str:
        said = (f"--runtime auto: {self.runtime} ({CPU_CLASS_HELP[self.device_class]}: {self.figure}; the fastest "
                "this export and the installed packages allow, docs/performance.md)")
        if self.faster:
            runtime, figure, fix = self.faster[0]
            said += f"; {runtime} would be faster here ({figure}): {fix}"
        return said


def choose(device_class: str, model_dir: Path, installed=importlib.util.find_spec) -> Choice:
    """The first runtime of the class's order that this export and these packages allow; none: torch (whose
    loading then names what is missing)."""
    faster = []
    for runtime, figure in RUNTIME_ORDER[device_class]:
        fix = missing(runtime, model_dir, installed)
        if fix is None:
            return Choice(runtime, device_class, figure, tuple(faster))
        faster.append((runtime, figure, fix))
    return Choice(TORCH, device_class, dict(RUNTIME_ORDER[device_class])[TORCH], tuple(faster))


def device_class_of(device: str | None) -> str:
    """"gpu" where the runtime would run on an accelerator (the given device, else torch's default), else the CPU's
    class. torch is asked only where it is loaded already or an accelerator's driver is present, so choosing an
    ONNX or OpenVINO runtime on a CPU never imports it."""
    if device is not None:
        return this_cpu_class() if device.split(":")[0] == "cpu" else "gpu"
    if "torch" in sys.modules or accelerator_present():
        try:
            from ner.backends import default_device
        except ImportError:  # no torch: nothing can run on a GPU here but onnxruntime, whose CUDA is unmeasured
            return this_cpu_class()
        return this_cpu_class() if default_device().type == "cpu" else "gpu"
    return this_cpu_class()


ACCELERATOR_NODES = ("/dev/nvidia0", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm, WSL's GPU


def accelerator_present(nodes: tuple[str, ...] = ACCELERATOR_NODES) -> bool:
    return sys.platform == "darwin" or any(Path(node).exists() for node in nodes)


def resolve_runtime(runtime: str, model_dir: Path, device: str | None = None) -> str:
    """`runtime` itself unless it is "auto"; auto: choose()'s pick for this device, said in one log line."""
    if runtime != AUTO_RUNTIME:
        return runtime
    choice = choose(device_class_of(device), Path(model_dir))
    log.info("%s", choice.line())
    return choice.runtime


def show_choice_on_stderr(quiet: bool = False) -> None:
    """For the commands that tag (ner.predict, ner.evaluate): ner's own INFO lines, auto's choice among them, on
    stderr, once per job (rank 0); other libraries stay at warnings. `quiet`: logging is left as it was."""
    if quiet or process_rank_from_env() != 0:
        return
    log_to_stderr(logging.WARNING, "%(message)s")
    logging.getLogger("ner").setLevel(logging.INFO)
