"""TrainConfig: every hyperparameter with its default, unit and help, validated once.

Precedence: dataclass defaults < `--config FILE.yaml` < command-line flags. Hardware
(processes, GPUs, precision plumbing) lives in `accelerate_configs/*.yaml`, not here.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ner.backends import ACCELERATE, BACKENDS, DATA_PARALLEL, MIXED_PRECISIONS, RAW_DDP
from ner.backends.trackers import TRACKERS, report_trackers
from ner.data.batching import NO_TOKEN_BUDGET
from ner.data.examples import SAMPLE_DIR
from ner.data.formats import DATA_FORMATS
from ner.data.spans import ALIGNMENTS
from ner.errors import UserError
from ner.extras import install_hint, require
from ner.inference.decode import DECODERS
from ner.inference.options import (
    CONTEXTS,
    MAX_SEQ_LENGTH,
    PAD_TO_MULTIPLE_OF,
    WINDOW_STRIDE_WORDS,
    check_max_seq_length,
    parse_min_score,
)
from ner.inference.runtimes import (
    EXPORT_RUNTIME_FLAG,
    FAST_RUNTIMES,
    FAST_RUNTIMES_FLAG,
    REGISTRY,
    RUNTIMES,
    export_packages,
)
from ner.training.run_files import PLOTS

log = logging.getLogger("ner")

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CASINGS = ("auto", "types", "none")
# --label-smoothing: 0.1 gave +0.28 test F1 on CoNLL-2003 (higher on each of 3 seeds) and +0.16 on ATIS, 3 seeds each
# (docs/accuracy.md, "Techniques for 89.5").
LABEL_SMOOTHING = 0.1


# How a resumed run treats each field (checkpoint.check_compatible), declared by every field as its `resume=`. Most
# that may change say where output goes or how often, not the math; a field that changes the math must match.
MAY_CHANGE = "may change"  # the resumed run may give another value
MUST_MATCH = "must match"  # another value is refused, listed with the checkpoint's


@dataclass(frozen=True)
class AddedLater:
    """Must match; a checkpoint written before the field existed ran with `value` (it is compared as that)."""

    value: Any


@dataclass(frozen=True)
class StoredResolvedLater:
    """Must match as it ran (the run stores the value `auto` resolved to); a checkpoint written before it was stored
    so holds `unresolved`, which does not say what ran: any value matches that (what the check compared then)."""

    unresolved: Any


ResumeRule = str | AddedLater | StoredResolvedLater


def _opt(default: Any, help: str, *, resume: ResumeRule, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, "resume": resume, **extra})


def resume_rule(spec: dataclasses.Field) -> ResumeRule | None:
    """The field's declared resume rule; None where it declares none (tests/test_config.py refuses that)."""
    rule = spec.metadata.get("resume")
    return rule if rule in (MAY_CHANGE, MUST_MATCH) or isinstance(rule, (AddedLater, StoredResolvedLater)) else None


@dataclass
class TrainConfig:
    # data
    train_file: str | None = _opt(
        None, "training data: CoNLL file, JSONL file, or a `datasets` save_to_disk folder "
        "(default: the small sample shipped in ner/sample_data)", resume=MUST_MATCH)
    # Must match, as the early-stopping options do (see there): the validation data, --eval-steps and --no-eval decide
    # which evaluations pick the best model and count towards patience.
    validation_file: str | None = _opt(None, "validation data, same formats (default: none, or the sample's)",
                                       resume=MUST_MATCH)
    test_file: str | None = _opt(None, "test data scored once at the end with the best model", resume=MAY_CHANGE)
    dataset: str | None = _opt(
        None, "Hugging Face dataset name or save_to_disk folder with train/validation/test splits", resume=MUST_MATCH)
    data_format: str = _opt(
        "auto", "what the data files hold; auto: found from each file's content. conll, jsonl (words and tags), "
        "spans (JSONL of texts with character spans: doccano, Prodigy), label-studio (its JSON export), "
        "spacy (.spacy DocBin); docs/data_formats.md", choices=DATA_FORMATS, resume=AddedLater("auto"))
    span_alignment: str = _opt(
        "strict", "span data: what to do with a span that cuts a word, overlaps another or leaves its text. "
        "strict: refuse the file; expand: grow it to whole words; contract: shrink it to the words inside "
        "(both keep the longer of overlapping spans and count what they did in the log)", choices=ALIGNMENTS,
        resume=AddedLater("strict"))
    tokens_column: str = _opt("tokens", "column of words in a `datasets` dataset or JSONL file", resume=MUST_MATCH)
    tags_column: str = _opt("tags", "column of tags in a `datasets` dataset or JSONL file (`ner_tags` also tried)",
                            resume=MUST_MATCH)
    tag_scheme: str = _opt("auto", "tag scheme of the input files", choices=("auto", "iob1", "iob2", "iobes"),
                           resume=MUST_MATCH)
    convert_tags_to: str = _opt("none", "convert tags before training", choices=("none", "iob2", "iobes"),
                                resume=MUST_MATCH)
    max_seq_length: int = _opt(
        MAX_SEQ_LENGTH, "subword tokens per window incl. [CLS]/[SEP]; longer sentences become overlapping windows",
        resume=MUST_MATCH)
    window_stride_words: int = _opt(WINDOW_STRIDE_WORDS, "words shared by consecutive windows of one long sentence "
                                    "(0: a quarter of the window)", resume=MUST_MATCH)
    context: str = _opt(
        "auto", "document context: encode each sentence with neighbouring words of its document "
        "(CoNLL -DOCSTART-, a JSONL/datasets `document` field); auto: document when the training data "
        "has two or more documents, else none", choices=CONTEXTS, resume=AddedLater("none"))
    context_tokens: int = _opt(0, "with document context, subword tokens of context guaranteed on each side "
                                  "of every predicted word; 0: max-seq-length / 8", resume=AddedLater(0))
    document_column: str = _opt("document", "JSONL field / `datasets` column holding each sentence's document id",
                                resume=AddedLater("document"))
    casing: str = _opt(
        "auto", "give the model each word's case as a token type (1 no capital / 2 capital first letter / 3 all "
        "capitals; 0 case unknown, what a plain transformers pipeline passes); auto: types for an encoder that "
        "lower-cases its input and takes token types (the packaged MiniLM, bert-base-uncased), else none",
        choices=CASINGS, resume=AddedLater("none"))
    casing_dropout: float = _opt(
        0.5, "with casing types, the share of training windows shown without case (every type 0, unknown), so "
        "the model also tags text whose case it is not given, as in a plain transformers pipeline",
        resume=AddedLater(0.0))
    # Older checkpoints: None. With casing types they used the legacy 3-type scheme, which a resume must refuse;
    # without, None is what a run records today.
    casing_scheme: str | None = _opt(
        None, "recorded, not an option: which types the case became (encode.CASING_SCHEME), so an export is "
        "read the way it was trained", recorded=True, resume=AddedLater(None))
    label_all_subwords: bool = _opt(False, "train on every subword, not only the first of each word",
                                    resume=MUST_MATCH)
    min_score: str | None = _opt(
        None, "entities whose score (the mean probability of their tags) is below this are dropped at inference: "
        "0.5, or per type, 0.5,PER=0.8; stored in the export, so ner.predict, ner.evaluate, ner.serve and corpus "
        "tagging all apply it (their own --min-score overrides it)", resume=AddedLater(None))
    # model
    model: str = _opt(DEFAULT_MODEL, "hub id or local folder of a pretrained encoder (MiniLM is packaged offline)",
                      resume=MUST_MATCH)
    trust_remote_code: bool = _opt(False, "allow model repositories to run their own Python code", resume=MUST_MATCH)
    # May change on resume: eager and sdpa compute the same function up to float rounding, and `auto` picks per
    # device, so a checkpoint can move between CPU and GPU.
    attn_implementation: str = _opt(
        "auto", "attention kernel; auto: eager on CPU (measured faster there on short sentences, docs/defaults.md), "
        "sdpa on GPUs",
        choices=("auto", "sdpa", "eager"), resume=MAY_CHANGE)
    optimizer_impl: str = _opt("fused", "AdamW implementation: fused (one kernel), foreach (multi-tensor) or for-loop",
                               choices=("foreach", "fused", "for-loop"), resume=AddedLater("foreach"))
    # May change on resume: the same function, compiled or not (losses agree to 1e-5, tests/test_compile.py).
    compile: str = _opt(
        "auto", "torch.compile the training step's forward pass, loss and backward (inductor, a graph per batch "
        "shape, a few an epoch; CUDA graphs on CUDA); auto: off, the faster choice wherever it was measured "
        "(docs/performance.md, \"Compiled steps\"); not with --data-parallel", choices=("auto", "on", "off"),
        resume=MAY_CHANGE)
    # May change on resume: where encoded data is cached; a cached encoding equals a fresh one.
    tokenization_cache: str = _opt(
        "auto", "folder for cached tokenised data; auto: $NER_CACHE_DIR, else $XDG_CACHE_HOME/ner, "
        "else ~/.cache/ner (a features/ folder inside); none: off", resume=MAY_CHANGE)
    # optimisation
    # The run's length may change on resume: with a new --num-epochs / --max-steps the learning-rate schedule is
    # rebuilt for the new total, so from the resumed step on it follows the new length's curve.
    num_epochs: int = _opt(
        0, "passes over the training data; 0: auto, enough for ~1,500 updates, at least 3 and at most 10 "
        "(ignored when --max-steps > 0)", resume=MAY_CHANGE)
    max_steps: int = _opt(-1, "optimizer updates to run; -1: use --num-epochs", resume=MAY_CHANGE)
    batch_size: int = _opt(
        0, "windows per device per micro-batch, an upper bound with --max-tokens; 0: auto, 32 sentences on CPU, "
        "128 on CUDA (with document context: as many windows as hold about that many sentences)", resume=MUST_MATCH)
    max_tokens: int = _opt(
        0, "padded tokens per device per micro-batch (length-aware batching); 0: auto, by device, 4096 on CPU "
        f"(measured), 16384 on CUDA (reasoned, docs/defaults.md); {NO_TOKEN_BUDGET}: none, fixed --batch-size",
        resume=MUST_MATCH)
    pad_to_multiple_of: int = _opt(
        PAD_TO_MULTIPLE_OF, "round each batch's padded length up to a multiple of this: fewer distinct "
        "shapes for the kernel caches, so less memory and warm-up (docs/performance.md); 1: longest row only",
        resume=AddedLater(1))
    gradient_accumulation_steps: int = _opt(1, "micro-batches per optimizer update", resume=MUST_MATCH)
    learning_rate: float = _opt(
        0.0, "peak learning rate after warmup; 0: auto, 2e-4 for encoders of hidden size <= 512 "
        "(MiniLM-class), 5e-5 for larger (BERT-base and up); twice that for CUDA's auto micro-batch, 4x the CPU's "
        "(square-root scaling, docs/defaults.md)", resume=MUST_MATCH)
    warmup_ratio: float = _opt(0.1, "fraction of all updates spent warming up linearly from 0", resume=MUST_MATCH)
    weight_decay: float = _opt(0.01, "AdamW decoupled weight decay (not on biases and LayerNorm)", resume=MUST_MATCH)
    lr_scheduler: str = _opt("linear", "decay after warmup", choices=("linear", "cosine", "constant"),
                             resume=MUST_MATCH)
    max_grad_norm: float = _opt(1.0, "clip gradients to this global L2 norm; 0: no clipping", resume=MUST_MATCH)
    label_smoothing: float = _opt(
        LABEL_SMOOTHING, "share of each labelled token's training target spread evenly over all tags (torch's "
        "cross_entropy label_smoothing); 0: none (docs/accuracy.md)", resume=AddedLater(0.0))
    seed: int = _opt(42, "seed for weights of the new head, dropout and data order", resume=MUST_MATCH)
    decode: str = _opt("viterbi", "tags from per-word scores: viterbi (only sequences the tag scheme allows) "
                       "or argmax; used by evaluation here and by default by ner.predict / ner.evaluate",
                       choices=DECODERS, resume=AddedLater("argmax"))
    # Stored as the backend runs it, so a resume where auto resolves otherwise (another CPU or GPU) is refused
    # rather than trained on in other math; the message names the value that ran, which may be passed.
    mixed_precision: str = _opt(
        "auto", "autocast dtype; auto: bf16 where the device supports it, else fp32; fp16 (GPUs without bf16: "
        "T4, V100) adds a gradient scaler", choices=("auto", *MIXED_PRECISIONS), resume=StoredResolvedLater("auto"))
    # evaluation, logging, saving
    eval_steps: int = _opt(0, "evaluate every N updates; 0: at the end of each epoch", resume=MUST_MATCH)
    save_steps: int = _opt(0, "checkpoint every N updates too; epoch ends and new best models are always saved",
                           resume=MAY_CHANGE)
    no_eval: bool = _opt(False, "skip validation during training", resume=MUST_MATCH)
    # The early-stopping options must match: a checkpoint records the counter, the best model so far and whether the
    # run already stopped under the old values, so new ones would give a run that no single setting gives. So must
    # what is evaluated and when (--validation-file, --eval-steps, --no-eval).
    early_stopping_patience: int = _opt(
        0, "stop after this many evaluations in a row without a validation F1 gain above "
        "--early-stopping-threshold; 0: never stop early", resume=AddedLater(0))
    early_stopping_threshold: float = _opt(
        0.0, "smallest validation F1 gain that counts as better for early stopping, as a fraction (0.001 = 0.1 points)",
        resume=AddedLater(0.0))
    logging_steps: int = _opt(10, "log loss and learning rate every N updates", resume=MAY_CHANGE)
    # May change on resume: more files at the end, the same training.
    export_int8: bool = _opt(
        False, "at the end, also write every fast runtime's files into OUTPUT_DIR/final: model.onnx, model.int8.onnx "
        "and model.int8.xml (OpenVINO's static int8, calibrated on the training data), each checked against PyTorch, "
        "for --runtime onnx, onnx-int8, openvino and openvino-int8, of which --runtime auto picks the fastest here; a "
        "file its check refuses is left out and named in the summary, and the run still ends as finished "
        f"({install_hint('nncf')}; ner.export has the same flag)", resume=MAY_CHANGE)
    # May change on resume: more files at the end, the same training.
    export_runtime: str | None = _opt(
        None, "at the end, also write these runtimes' files into OUTPUT_DIR/final, comma-separated "
        f"({', '.join(RUNTIMES)}), each checked against PyTorch (openvino-int8 calibrated on the training data): only "
        "those files, needing only the packages that write them (Label Studio's retraining passes the served "
        f"runtime); {FAST_RUNTIMES_FLAG} writes every runtime's", resume=MAY_CHANGE)
    output_dir: str = _opt("runs/ner", "where checkpoints, the final export and metrics go", resume=MAY_CHANGE)
    overwrite_output_dir: bool = _opt(
        False, "replace the run in --output-dir: removes only what a run writes (checkpoints/, final/, metrics.jsonl, "
        "predictions/, plots, trackers/), and nothing if a file of yours is among them", resume=MAY_CHANGE)
    save_total_limit: int = _opt(2, "newest checkpoints kept (the best one is always kept too); 0: keep all",
                                 resume=MAY_CHANGE)
    resume: str | None = _opt(None, "`auto` (newest complete checkpoint in --output-dir) or a checkpoint folder",
                              resume=MAY_CHANGE)
    quiet: bool = _opt(False, "no progress bars", resume=MAY_CHANGE)
    report_to: str = _opt(
        "none", "also log to these trackers through Accelerate, comma-separated: " + ", ".join(TRACKERS)
        + "; all: every one installed; none: only metrics.jsonl (always written). Offline unless the "
        "tracker's own settings name a server (docs/backends.md)", resume=MAY_CHANGE)
    # distribution (which code path; the hardware itself comes from the launcher): may change on resume, since the
    # backends train the same model (tests/test_backends.py resumes each one's checkpoint under another)
    backend: str = _opt(ACCELERATE, f"training backend (--{RAW_DDP} / --{DATA_PARALLEL} are shortcuts)",
                        choices=BACKENDS, resume=MAY_CHANGE)
    nproc: int = _opt(0, "raw DDP without a launcher: worker processes to start (0: GPUs visible, or 1)",
                      resume=MAY_CHANGE)
    dist_timeout: float = _opt(600.0, "seconds a collective may wait for a lost rank before failing",
                               resume=MAY_CHANGE)

    def validate(self) -> TrainConfig:
        for spec in dataclasses.fields(self):
            choices, value = spec.metadata.get("choices"), getattr(self, spec.name)
            if choices and value not in choices:
                raise UserError(f"--{_flag(spec.name)} must be one of {', '.join(choices)} (got {value!r})")
        positive = ("gradient_accumulation_steps", "max_seq_length", "pad_to_multiple_of")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"--{_flag(name)} must be positive (got {getattr(self, name)})")
        non_negative = ("batch_size", "eval_steps", "save_steps", "logging_steps", "save_total_limit",
                        "weight_decay", "max_grad_norm", "nproc", "window_stride_words", "context_tokens",
                        "early_stopping_patience")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise UserError(f"--{_flag(name)} must be zero or more (got {getattr(self, name)})")
        if not 0.0 <= self.casing_dropout <= 1.0:
            raise UserError(f"--casing-dropout must be in [0, 1] (got {self.casing_dropout})")
        parse_min_score(self.min_score)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UserError(f"--label-smoothing must be in [0, 1) (got {self.label_smoothing})")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UserError(f"--warmup-ratio must be in [0, 1) (got {self.warmup_ratio})")
        if self.learning_rate < 0:
            raise UserError(f"--learning-rate must be positive, or 0 for auto (got {self.learning_rate})")
        if self.num_epochs < 0:
            raise UserError(f"--num-epochs must be positive, or 0 for auto (got {self.num_epochs})")
        if self.max_tokens < NO_TOKEN_BUDGET:
            raise UserError(f"--max-tokens must be positive, 0 for auto or {NO_TOKEN_BUDGET} for a fixed --batch-size "
                            f"(got {self.max_tokens})")
        check_max_seq_length(self.max_seq_length)
        if 2 * self.context_tokens >= self.max_seq_length - 2:
            raise UserError(f"--context-tokens {self.context_tokens} leaves no room in a window of "
                            f"--max-seq-length {self.max_seq_length} (use less than {(self.max_seq_length - 2) // 2})")
        if self.early_stopping_threshold < 0:
            raise UserError(f"--early-stopping-threshold must be zero or more (got {self.early_stopping_threshold})")
        if self.early_stopping_patience and self.no_eval:
            raise UserError("--early-stopping-patience needs validation F1; drop --no-eval")
        report_trackers(self.report_to)
        runtimes = runtimes_to_export(self.export_int8, self.export_runtime)
        if runtimes:
            asked = FAST_RUNTIMES_FLAG if self.export_int8 else f"{EXPORT_RUNTIME_FLAG} {self.export_runtime}"
            require(asked, *export_packages(runtimes))
        if self.compile == "on" and self.backend == DATA_PARALLEL:
            raise UserError(f"--compile on does not work with --{DATA_PARALLEL} (its replicas would call the compiled "
                            f"original); use --compile off, or DDP (accelerate launch, --{RAW_DDP})")
        if self.dist_timeout <= 0:
            raise UserError(f"--dist-timeout must be positive seconds (got {self.dist_timeout})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir)


def runtimes_to_export(export_int8: bool, export_runtime: str | None) -> tuple[str, ...]:
    """The runtimes whose files the run's end writes: every one with files of its own for --export-int8, else those
    --export-runtime names (torch's weights are written anyway)."""
    if export_int8:
        return FAST_RUNTIMES
    names = tuple(dict.fromkeys(name.strip() for name in (export_runtime or "").split(",") if name.strip()))
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise UserError(f"{EXPORT_RUNTIME_FLAG} {export_runtime}: no runtime {unknown[0]!r} (expected some of "
                        f"{', '.join(RUNTIMES)}, comma-separated)")
    return tuple(name for name in names if name in FAST_RUNTIMES)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """How data files are read (ner.evaluate); ner.train takes the same from TrainConfig."""
    for name in ("data_format", "span_alignment"):
        spec = next(f for f in dataclasses.fields(TrainConfig) if f.name == name)
        parser.add_argument(f"--{_flag(name)}", choices=spec.metadata["choices"], default=spec.default,
                            help=spec.metadata["help"] + f" (default: {spec.default})")


def with_sample_data(cfg: TrainConfig) -> TrainConfig:
    """No data given: the shipped sample, so a bare `python -m ner.train` trains something real."""
    if cfg.train_file is not None or cfg.dataset is not None:
        return cfg
    log.info("no --train-file: training on the shipped sample in %s", SAMPLE_DIR)
    return dataclasses.replace(cfg, train_file=str(SAMPLE_DIR / "train.conll"),
                               validation_file=cfg.validation_file or str(SAMPLE_DIR / "valid.conll"),
                               test_file=cfg.test_file or str(SAMPLE_DIR / "test.conll"))


def tokenization_cache_dir(setting: str) -> Path | None:
    """--tokenization-cache: a folder, `none`, or `auto` (NER_CACHE_DIR, XDG_CACHE_HOME, ~/.cache)."""
    if setting == "none":
        return None
    if setting != "auto":
        return Path(setting)
    root = os.environ.get("NER_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ner"
    return Path(root) / "features"


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(tp: Any) -> type:
    """`str | None` -> str; the type a flag's text is parsed into."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return next(arg for arg in typing.get_args(tp) if arg is not type(None))
    return tp


_FIELD_TYPES = {f.name: _base_type(t) for f, t in zip(
    dataclasses.fields(TrainConfig), typing.get_type_hints(TrainConfig).values())}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ner.train",
        description="Fine-tune a BERT-style encoder for named-entity recognition.",
        argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", metavar="FILE.yaml", help="hyperparameters in YAML; flags override it",
                        default=None)
    parser.add_argument("--plots", action="store_true", default=False,
                        help=f"draw {', '.join(PLOTS[:-1])} and {PLOTS[-1]} into --output-dir "
                        "once the run has ended (a cost of its own, docs/performance.md; `python -m ner.plot "
                        "OUTPUT_DIR` draws them for any run, live or finished)")
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("recorded"):
            continue
        kind = _FIELD_TYPES[f.name]
        help_text = f.metadata["help"] + f" (default: {f.default})"
        if kind is bool:
            parser.add_argument(f"--{_flag(f.name)}", action="store_true", help=help_text)
        else:
            metavar = None if f.metadata.get("choices") else kind.__name__.upper()
            parser.add_argument(f"--{_flag(f.name)}", type=kind, choices=f.metadata.get("choices"), help=help_text,
                                metavar=metavar)
    parser.add_argument(f"--{RAW_DDP}", dest="backend", action="store_const", const=RAW_DDP,
                        help="plain torch DistributedDataParallel, no Accelerate (torchrun or self-spawned)")
    parser.add_argument(f"--{DATA_PARALLEL}", dest="backend", action="store_const", const=DATA_PARALLEL,
                        help="one process, nn.DataParallel over the visible GPUs")
    # torch.distributed.launch (legacy) passes the local rank as an argument instead of LOCAL_RANK.
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, help=argparse.SUPPRESS)
    return parser


def parse_config(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Defaults, then the YAML file, then the flags that were actually given."""
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    if args.config:
        values.update(load_yaml(Path(args.config)))
    values.update({k: v for k, v in vars(args).items() if k in _FIELD_TYPES})
    return TrainConfig(**values).validate(), args


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f"{path}:{line + 1}" if line is not None else f"{path}"
        raise UserError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of option: value at the top level")
    return {_yaml_key(path, key): _coerce(path, key, value) for key, value in raw.items()}


def _yaml_key(path: Path, key: Any) -> str:
    name = str(key).replace("-", "_")
    if name not in _FIELD_TYPES:
        known = ", ".join(sorted(_FIELD_TYPES))
        raise UserError(f"{path}: unknown option '{key}' (known options: {known})")
    return name


def _coerce(path: Path, key: Any, value: Any) -> Any:
    name = str(key).replace("-", "_")
    kind = _FIELD_TYPES[name]
    spec = dataclasses.fields(TrainConfig)[list(_FIELD_TYPES).index(name)]
    choices = spec.metadata.get("choices")
    if value is None and spec.default is None:
        return None  # an option that may be unset; elsewhere null is refused below as not a `kind`
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if kind is float and isinstance(value, str):
        try:  # YAML 1.1 reads `5e-5` as a string
            value, ok = float(value), True
        except ValueError:
            pass
    if not ok:
        raise UserError(f"{path}: option '{key}' expects {kind.__name__}, got {value!r}")
    if choices and value not in choices:
        raise UserError(f"{path}: option '{key}' must be one of {', '.join(choices)} (got {value!r})")
    return value
