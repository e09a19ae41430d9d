"""The one inference path: batched forward, argmax, windows merged back to words.

Training's evaluation (ner/training/evaluation.py, sharded over ranks), `ner.predict`,
`ner.evaluate` and the benchmarks (`Tagger`, one process) all run `predict_word_scores`, then
the same merge (each word from the window that owns it) and decoding (ner/inference/decode.py). What computes
the logits is a runtime (ner/inference/runtime.py): the PyTorch model (torch_runtime.py), an ONNX export
(`Tagger(..., runtime="onnx"|"onnx-int8")`, onnx_runtime.py), or OpenVINO (`"openvino"|"openvino-int8"`,
openvino_runtime.py).

    from ner.inference.tagger import Tagger
    tags, probabilities = Tagger("runs/ner/final").tag(examples)
    results = Tagger("runs/ner/final").predict(["Angela Merkel met Emmanuel Macron in Paris."])

The runtime is ner.predict's default, "auto" (runtime_choice.py): the fastest this device and the folder's files
allow, so the Python API gives what the command gives; `runtime="torch"` (or another) names one.

torch is imported only where the torch runtime or training needs it: tagging with an ONNX runtime never
imports it (nor transformers' AutoConfig / AutoTokenizer, which import torch in transformers 5: the
config is read as JSON and the tokenizer class is looked up by its name, see data/tokenizer.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ner.data.encode import Feature, collate, encode_examples, fixed_shape_plan, merge_predictions, owned_positions
from ner.data.examples import Example
from ner.data.tags import scheme_of_labels
from ner.data.text import Word, split_words
from ner.data.tokenizer import load_tokenizer
from ner.errors import UserError
from ner.extras import require
from ner.inference.decode import Decoder
from ner.inference.entities import drop_below, text_result
from ner.inference.model_folder import ModelSettings, max_positions, model_labels, read_model_json
from ner.inference.onnx_runtime import OnnxRuntime
from ner.inference.openvino_runtime import OpenVinoRuntime
from ner.inference.options import PAD_TO_MULTIPLE_OF, check_max_seq_length, inference_budget, parse_min_score
from ner.inference.runtime import runtime_path
from ner.inference.runtime_choice import resolve_runtime
from ner.inference.runtimes import (
    AUTO_RUNTIME,
    OPENVINO_RUNTIMES,
    RUNTIME_CHOICES,
    RUNTIME_FILES,
    RUNTIME_PACKAGES,
    TORCH,
)
from ner.inference.torch_runtime import TorchRuntime

log = logging.getLogger("ner")

Progress = Callable  # tqdm-like: progress(iterable, desc=..., leave=...) -> iterable
Runtime = TorchRuntime | OnnxRuntime | OpenVinoRuntime  # runtime(input_ids, attention_mask, token_type_ids) -> logits


def no_progress(iterable, **_):
    return iterable


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, in float32 (as torch.log_softmax computes it)."""
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def predict_word_scores(runtime: Runtime, features: list[Feature], batches: list[list[int]], pad_token_id: int,
                        progress: Progress = no_progress, pad_to_multiple_of: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(flat word index, label log-probabilities) of every word the given batches own."""
    word_ids, scores = [], []
    collated = (collate([features[i] for i in indices], pad_token_id, pad_to_multiple_of)
                for indices in progress(batches, desc="predict", leave=False))
    for batch, logits in runtime.map(collated):
        (rows, cols), ids = owned_positions(batch["word_index"])
        word_ids.append(ids)
        scores.append(log_softmax(logits[rows, cols]))
    if not word_ids:
        return np.zeros(0, dtype=np.int64), np.zeros((0, runtime.num_labels), dtype=np.float32)
    return np.concatenate(word_ids), np.concatenate(scores)


class Tagger:
    """An exported model folder on one device, ready to tag lists of words.

    Encoding (window size, stride, document context) and decoding follow the export's
    training_args.json unless overridden: `context="none"` tags sentence by sentence,
    `decode="argmax"` turns off the valid-sequence constraint.
    """

    def __init__(self, model_dir: str | Path, device: str | None = None, precision: str = "auto",
                 max_seq_length: int | None = None, pad_to_multiple_of: int = PAD_TO_MULTIPLE_OF,
                 context: str = "auto", decode: str | None = None, runtime: str = AUTO_RUNTIME,
                 min_score: str | list[str] | None = None) -> None:
        self.options = {"device": device, "precision": precision, "max_seq_length": max_seq_length,
                        "pad_to_multiple_of": pad_to_multiple_of, "context": context, "decode": decode,
                        "runtime": runtime, "min_score": min_score}  # as given: like() loads another the same way
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise UserError(f"{model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
        if runtime not in RUNTIME_CHOICES:
            raise UserError(f"--runtime {runtime}: expected one of {', '.join(RUNTIME_CHOICES)}")
        # options keep "auto": like() resolves it again for the new folder, whose export may lack this pick's files
        runtime = resolve_runtime(runtime, model_dir, device)
        # before anything is loaded: the runtime's file (named first: the export that writes it needs the packages
        # too), then its packages as the registry declares them (torch too, which an ONNX-only deployment may leave out)
        if RUNTIME_FILES[runtime]:
            runtime_path(model_dir, runtime)
        require(f"--runtime {runtime}", *RUNTIME_PACKAGES[runtime])
        import transformers

        transformers.utils.logging.disable_progress_bar()
        self.tokenizer = load_tokenizer(model_dir, as_saved=True)  # the pieces the model was trained on
        config = read_model_json(model_dir / "config.json")  # not AutoConfig: it imports torch (transformers 5)
        self.id2label = model_labels(config)
        self.runtime_name = runtime
        self.runtime = self._load_runtime(model_dir, len(self.id2label), device, precision)
        self.label2id = {v: k for k, v in self.id2label.items()}
        self.settings = ModelSettings.of(model_dir)
        self.max_seq_length = max_seq_length or self.settings.max_seq_length
        check_max_seq_length(self.max_seq_length, max_positions(config, self.tokenizer))
        self.pad_to_multiple_of = pad_to_multiple_of
        self.context = context
        labels = tuple(self.id2label[i] for i in range(len(self.id2label)))
        scheme = self.settings.tag_scheme or scheme_of_labels(labels)
        if scheme == "iob":
            log.warning("%s: no training_args.json, and its labels fit IOB1 and IOB2 alike: decoded with no "
                        "transition rule (as --decode argmax); entities read leniently", model_dir)
        self.decoder = Decoder(labels, scheme, decode or self.settings.decode)
        self.min_score = parse_min_score(min_score if min_score is not None else self.settings.min_score)

    def _load_runtime(self, model_dir: Path, num_labels: int, device: str | None, precision: str) -> Runtime:
        """Sets `device` and `precision` too: for ONNX and OpenVINO, the device type the passes run on, as a string,
        and the precision they run in ("no" for ONNX: no autocast)."""
        if self.runtime_name in OPENVINO_RUNTIMES:  # the CPU, and no torch either
            runtime = OpenVinoRuntime(runtime_path(model_dir, self.runtime_name), num_labels, precision,
                                      self.runtime_name, device)
            self.device, self.precision = runtime.device_type, runtime.precision
            return runtime
        if self.runtime_name != TORCH:  # the ONNX file alone: the PyTorch weights (and torch) are never loaded
            runtime = OnnxRuntime(runtime_path(model_dir, self.runtime_name), num_labels, device)
            self.device, self.precision = runtime.device_type, "no"
            return runtime
        import torch
        from transformers import AutoModelForTokenClassification

        from ner.backends import autocast_for, default_device, resolve_precision

        self.device = torch.device(device) if device else default_device()
        self.precision = resolve_precision(precision, self.device)
        model = AutoModelForTokenClassification.from_pretrained(model_dir).eval().to(self.device)
        return TorchRuntime(model, self.device, lambda: autocast_for(self.device, self.precision))

    @classmethod
    def from_args(cls, args, *, device: str | None = None) -> Tagger:
        """From the options options.add_model_arguments defines (the one place a command builds a Tagger);
        device: where this process runs it (a corpus process's own device), else the default."""
        return cls(args.model_dir, device=device, precision=args.mixed_precision, max_seq_length=args.max_seq_length,
                   context=args.context, decode=args.decode, runtime=args.runtime, min_score=args.min_score)

    def like(self, model_dir: str | Path) -> Tagger:
        """Another export, loaded with the options this one was given (a server's swap keeps its settings); "auto"
        picks for that export's files."""
        return Tagger(model_dir, **self.options)

    def uses_context(self, examples: list[Example]) -> bool:
        """auto: document context where the model was trained with it and the input has documents
        (CoNLL -DOCSTART- sections, document ids; each raw text is one)."""
        if self.context == "auto":
            return self.settings.context == "document" and any(e.document is not None for e in examples)
        return self.context == "document"

    def encode(self, examples: list[Example]) -> list[Feature]:
        """The windows the model sees for `examples`, cut and encoded as it was trained (gold tags unused)."""
        placeholder = {label: 0 for label in {t for e in examples for t in e.tags}}
        return encode_examples(examples, self.tokenizer, placeholder, self.max_seq_length,
                               self.settings.window_stride_words, context=self.uses_context(examples),
                               context_tokens=self.settings.context_tokens, casing=self.settings.casing == "types")

    def tag(self, examples: list[Example], max_sentences: int | None = None, max_tokens: int | None = None,
            progress: Progress = no_progress) -> tuple[list[list[str]], list[np.ndarray]]:
        """(tags, per-word probabilities of those tags) for each example, batched by length; batch limits not
        given: the default of the device the runtime runs on (options.inference_budget)."""
        max_sentences, max_tokens = inference_budget(self.runtime.device_type, max_sentences, max_tokens)
        features = self.encode(examples)
        features, batches = fixed_shape_plan(features, self.pad_to_multiple_of, max_sentences, max_tokens)
        word_ids, scores = predict_word_scores(self.runtime, features, batches, self.tokenizer.pad_token_id,
                                               progress, self.pad_to_multiple_of)
        tags, probabilities = self.decoder(merge_predictions(examples, word_ids, scores))
        if self.min_score:  # every output (tags, entities, spans, tasks) is read from these tags
            tags = [drop_below(t, p, self.min_score) for t, p in zip(tags, probabilities)]
        return tags, probabilities

    def predict(self, texts: list[str], max_sentences: int | None = None,
                max_tokens: int | None = None, progress: Progress = no_progress,
                splitter: Callable[[str], list[Word]] = split_words,
                words: list[list[Word]] | None = None) -> list[dict]:
        """{"entities": [{"text", "type", "start", "end", "score"}], "confidence"} per raw text (entities.
        text_confidence: low = unsure, also for a text with no entity); offsets are characters
        (end exclusive) and `text == texts[i][start:end]`. Each text is one document: tagged with document
        context where the model was trained with it, and windowed where longer than a window (cutting
        texts into sentences first measured no better: docs/raw_text.md). `splitter`: for comparisons.
        `words`: each text already split (by `splitter`), so a caller that split them once does not pay twice."""
        split = words if words is not None else [splitter(text) for text in texts]
        examples = [Example([w for w, _, _ in words], ["O"] * len(words), "<text>", document=i)
                    for i, words in enumerate(split)]
        tags, probs = self.tag(examples, max_sentences, max_tokens, progress)
        return [text_result(t, p, words, text) for text, words, t, p in zip(texts, split, tags, probs)]
