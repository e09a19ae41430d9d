"""The one inference path: batched forward, argmax, windows merged back to words.

Training's evaluation (`predict_tags` / `evaluate`, sharded over ranks), `ner.predict`,
`ner.evaluate` and the benchmarks (`Tagger`, one process) all run `predict_word_labels`.

    from ner.infer import Tagger
    tags, probabilities = Tagger("runs/ner/final").tag(examples)
    results = Tagger("runs/ner/final").predict(["Angela Merkel met Emmanuel Macron in Paris."])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ner.backends import Backend, autocast_for, default_device, resolve_precision
from ner.batching import inference_batches
from ner.config import TrainConfig
from ner.data import Example
from ner.encode import (
    MODEL_INPUTS,
    Feature,
    collate,
    encode_examples,
    merge_predictions,
    padded_lengths,
    predicted_words,
)
from ner.errors import UserError
from ner.metrics import entity_scores
from ner.text import Word, split_words

Progress = Callable  # tqdm-like: progress(iterable, desc=..., leave=...) -> iterable


def no_progress(iterable, **_):
    return iterable


def inference_batch_limits(batch_size: int, max_tokens: int) -> tuple[int, int]:
    """(sentences, padded tokens) per inference batch: no activations are kept for a backward
    pass, so twice the training micro-batch fits in the same memory."""
    return batch_size * 2, max_tokens * 2


@dataclass
class EvalSet:
    examples: list[Example]
    features: list[Feature]
    batches: list[list[int]]  # length-sorted, each sentence's windows in exactly one batch
    pad_to_multiple_of: int = 1


def build_eval_set(examples: list[Example], features: list[Feature], batch_size: int, max_tokens: int,
                   pad_to_multiple_of: int) -> EvalSet:
    """Evaluation batches under the training run's limits (see inference_batch_limits)."""
    max_sentences, max_batch_tokens = inference_batch_limits(batch_size, max_tokens)
    batches = inference_batches(padded_lengths(features, pad_to_multiple_of), max_sentences, max_batch_tokens)
    return EvalSet(examples, features, batches, pad_to_multiple_of)


@torch.no_grad()
def predict_word_labels(model: torch.nn.Module, features: list[Feature], batches: list[list[int]],
                        device: torch.device, autocast: Callable, pad_token_id: int,
                        progress: Progress = no_progress, pad_to_multiple_of: int = 1) -> tuple[np.ndarray, ...]:
    """(sentence, word, label id, probability) for every word the given batches own, flat arrays."""
    parts = []
    for indices in progress(batches, desc="predict", leave=False):
        batch = collate([features[i] for i in indices], pad_token_id, pad_to_multiple_of)
        with autocast():
            logits = model(**{k: batch[k].to(device) for k in MODEL_INPUTS}).logits
        probabilities, predicted = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        sentence_ids, word_ids, label_ids = predicted_words(batch["word_index"], batch["example_index"],
                                                            predicted.cpu())
        word_probs = probabilities.cpu()[batch["word_index"] >= 0].numpy()
        parts.append((sentence_ids, word_ids, label_ids, word_probs))
    if not parts:
        return tuple(np.zeros(0, dtype=dtype) for dtype in (np.int64, np.int64, np.int64, np.float32))
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(4))


def predict_tags(model: torch.nn.Module, eval_set: EvalSet, backend: Backend, pad_token_id: int,
                 id2label: dict[int, str], progress: Progress = no_progress) -> list[list[str]]:
    """Tags for every word of every sentence; batches sharded over ranks with no padding."""
    bare = backend.unwrap_model(model)
    was_training = bare.training
    bare.eval()
    my_batches = eval_set.batches[backend.process_index::backend.num_processes]
    mine = predict_word_labels(bare, eval_set.features, my_batches, backend.device, backend.autocast,
                               pad_token_id, progress, eval_set.pad_to_multiple_of)
    bare.train(was_training)
    gathered = backend.gather_object(mine[:3])  # every sentence's words live in exactly one shard
    flat = [np.concatenate([part[k] for part in gathered]) for k in range(3)]
    return merge_predictions(eval_set.examples, *flat, id2label)


def evaluate(model: torch.nn.Module, eval_set: EvalSet, backend: Backend, pad_token_id: int,
             id2label: dict[int, str], scheme: str, progress: Progress = no_progress) -> dict:
    predicted = predict_tags(model, eval_set, backend, pad_token_id, id2label, progress)
    return entity_scores([e.tags for e in eval_set.examples], predicted, scheme)


DEFAULTS = TrainConfig()
DEFAULT_MAX_SENTENCES, DEFAULT_MAX_TOKENS = inference_batch_limits(DEFAULTS.batch_size, DEFAULTS.max_tokens)


class Tagger:
    """An exported model folder on one device, ready to tag lists of words."""

    def __init__(self, model_dir: str | Path, device: str | None = None, precision: str = "auto",
                 max_seq_length: int = DEFAULTS.max_seq_length,
                 pad_to_multiple_of: int = DEFAULTS.pad_to_multiple_of) -> None:
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

    def tag(self, examples: list[Example], max_sentences: int = DEFAULT_MAX_SENTENCES,
            max_tokens: int = DEFAULT_MAX_TOKENS,
            progress: Progress = no_progress) -> tuple[list[list[str]], list[np.ndarray]]:
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

    def predict(self, texts: list[str], max_sentences: int = DEFAULT_MAX_SENTENCES,
                max_tokens: int = DEFAULT_MAX_TOKENS, progress: Progress = no_progress) -> list[dict]:
        """{"entities": [{"text", "type", "start", "end", "score"}]} per raw text; offsets are characters
        (end exclusive) and `text == texts[i][start:end]`. A text longer than a window is windowed."""
        split = [split_words(text) for text in texts]
        examples = [Example([w for w, _, _ in words], ["O"] * len(words), "<text>") for words in split]
        tags, probs = self.tag(examples, max_sentences, max_tokens, progress)
        return [{"entities": char_entities(text, words, t, p)} for text, words, t, p in zip(texts, split, tags, probs)]


def char_entities(text: str, words: list[Word], tags: list[str], probs: np.ndarray) -> list[dict]:
    """Word-level entities (seqeval's reading of the tags) as character spans of `text`."""
    from seqeval.metrics.sequence_labeling import get_entities

    found = []
    for kind, first, last in get_entities(tags):
        start, end = words[first][1], words[last][2]
        found.append({"text": text[start:end], "type": kind, "start": start, "end": end,
                      "score": round(float(probs[first:last + 1].mean()), 4)})
    return found
