"""Words -> subword windows with first-subword labels, length-aware batches, and the way back.

Sentence level (`context=False`): each sentence is encoded alone; one longer than
`max_seq_length` becomes overlapping windows of whole words, each word *owned* by exactly one
window (the one where it sits furthest from an edge).

Document context (`context=True`): the words of a document (consecutive examples with the same
`document`) are cut into consecutive *cores* of up to `max_seq_length - 2 - 2 x context_tokens`
subword tokens; each window is its core widened with the neighbouring words of the same document
up to `max_seq_length`, at least `context_tokens` on each side where the document has them. The
core's words are owned and labelled; the context words carry IGNORE_INDEX and are never scored.

Either way only the owner's prediction is kept, so every word is predicted and counted once.
Positions carry the word's *flat* index (its offset among all words of all examples).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ner.data.batching import bucket_width, fixed_shape_batches
from ner.data.examples import Example
from ner.files import staged_file

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100
# The batch keys the model takes (token_type_ids only with casing types); the rest are bookkeeping.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# --casing types: each word's case as a token type. The export's training_args.json names the scheme
# (casing_scheme), so that a version of ner that numbers the types otherwise refuses it instead of misreading it.
UNKNOWN_CASE = 0  # case not given: what a plain transformers consumer passes, [CLS]/[SEP]/padding, casing dropout
CASING_SCHEME = "unknown-lower-capitalised-capitals"  # 0 unknown, 1 no capital, 2 capital first, 3 all capitals
CASING_TYPES = 4  # the rows of the token-type table


def casing_type(word: str) -> int:
    """A word's case as a token type, for encoders that lower-case their input and so never see it: no capital
    letter (lower case, digits, punctuation), a capital first letter, all capitals (two letters or more).
    They are numbered 1, 2, 3, keeping 0 for "unknown" (a plain `pipeline` passes 0 everywhere)."""
    letters = [c for c in word if c.isalpha()]
    if not letters or not letters[0].isupper():
        case = 0
    else:
        case = 2 if len(letters) >= 2 and all(c.isupper() for c in letters) else 1
    return case + 1


@dataclass
class Feature:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX where no loss is taken
    word_index: list[int]  # flat index of the word predicted at this position, -1 elsewhere
    example_index: int  # the example of the window's first owned word
    token_type_ids: list[int] | None = None  # casing types (casing_type), with --casing types


def unique_word_pieces(words: dict[str, None] | list[str], tokenizer) -> dict[str, list[int]]:
    """{word: its subword ids} of distinct words ([UNK] for a word the tokenizer drops). A fast tokenizer reads
    pre-split words one at a time (each is normalised, pre-tokenised and cut on its own), so a word tokenised alone,
    as a one-word sequence, gets what it gets inside any sentence. One batched call to the Rust tokenizer
    (transformers' wrapper converts each sequence in Python: most of the time on one-word ones), with no truncation
    and no padding, as transformers sets it for a call without them."""
    words = list(words)
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    encoded = backend.encode_batch([[word] for word in words], is_pretokenized=True, add_special_tokens=False)
    return {word: encoding.ids or [tokenizer.unk_token_id] for word, encoding in zip(words, encoded)}


def plan_windows(piece_counts: list[int], budget: int, stride_words: int) -> list[tuple[int, int, int, int]]:
    """(start, end, own_start, own_end) word ranges; windows overlap by about `stride_words`."""
    n = len(piece_counts)
    if sum(piece_counts) <= budget:
        return [(0, n, 0, n)]
    spans = []
    start = 0
    while True:
        end, used = start, 0
        while end < n and (used + piece_counts[end] <= budget or end == start):
            used += piece_counts[end]
            end += 1
        spans.append((start, end))
        if end >= n:
            break
        overlap = stride_words or max(1, (end - start) // 4)
        start = max(start + 1, end - overlap)
    owned = []
    for k, (start, end) in enumerate(spans):
        own_start = 0 if k == 0 else (spans[k - 1][1] + start) // 2
        own_end = n if k == len(spans) - 1 else (end + spans[k + 1][0]) // 2
        owned.append((start, end, own_start, own_end))
    return owned


def plan_context_windows(piece_counts: list[int], budget: int, context_tokens: int) -> list[tuple[int, int, int, int]]:
    """(start, end, own_start, own_end): consecutive owned cores, each widened by context to `budget`."""
    core_budget = max(budget - 2 * context_tokens, 1)
    n = len(piece_counts)
    if sum(piece_counts) <= core_budget:  # one core holds it all (a short raw text): no word loop
        return [(0, n, 0, n)] if n else []
    windows = []
    own_start = 0
    while own_start < n:
        own_end, used = own_start, 0
        while own_end < n and (used + piece_counts[own_end] <= core_budget or own_end == own_start):
            used += piece_counts[own_end]
            own_end += 1
        start, end = own_start, own_end
        # Left context first (up to half of what is left), then right, then left again at a document's end.
        for side, share in (("left", (budget - used) // 2), ("right", budget), ("left", budget)):
            room = min(share, budget - used)
            while side == "left" and start > 0 and piece_counts[start - 1] <= room:
                start -= 1
                room -= piece_counts[start]
                used += piece_counts[start]
            while side == "right" and end < n and piece_counts[end] <= room:
                room -= piece_counts[end]
                used += piece_counts[end]
                end += 1
        windows.append((start, end, own_start, own_end))
        own_start = own_end
    return windows


def runs_of(examples: list[Example], by_document: bool) -> list[range]:
    """Example index ranges encoded together: documents (consecutive, same id) or single sentences."""
    runs: list[range] = []
    start = 0
    for i in range(1, len(examples) + 1):
        if (i == len(examples) or not by_document or examples[i].document is None
                or examples[i].document != examples[start].document):
            runs.append(range(start, i))
            start = i
    return runs


def encode_examples(examples: list[Example], tokenizer, label2id: dict[str, int], max_seq_length: int,
                    stride_words: int = 0, label_all_subwords: bool = False, context: bool = False,
                    context_tokens: int = 0, casing: bool = False) -> list[Feature]:
    """Tokenise each distinct word once (one batched call to the fast tokenizer) and cut windows; `casing`:
    casing types too."""
    budget = max_seq_length - 2  # [CLS] and [SEP]
    flat = FlatWords.of(examples, tokenizer, label2id, budget, casing)
    continuation = _continuation_labels(label2id) if label_all_subwords else None
    offsets = np.cumsum([0] + [len(e.words) for e in examples]).tolist()
    special = (tokenizer.cls_token_id, tokenizer.sep_token_id)  # read once: each read goes through __getattr__
    features: list[Feature] = []
    for run in runs_of(examples, context):
        first, last = offsets[run.start], offsets[run.stop]
        counts = flat.counts[first:last].tolist()
        plan = (plan_context_windows(counts, budget, context_tokens or max_seq_length // 8) if context
                else plan_windows(counts, budget, stride_words))
        for start, end, own_start, own_end in plan:
            window = (first + start, first + end, first + own_start, first + own_end)
            example = int(flat.word_example[first + own_start]) if own_start < own_end else run.start  # empty
            features.append(flat.window_feature(window, example, special, continuation, label_context=not context))
    return features


@dataclass
class FlatWords:
    """Every word of every example in one row of numpy arrays: its pieces (a slice of `ids`), tag id, casing
    type and example, so that a window is a few slices, not a loop over its words."""

    ids: np.ndarray  # the pieces of all words, concatenated
    starts: np.ndarray  # word w's pieces are ids[starts[w]:starts[w + 1]]
    counts: np.ndarray  # pieces per word
    token_word: np.ndarray  # the word of each piece
    tag_ids: np.ndarray  # per word: label2id of its tag, IGNORE_INDEX where absent
    casing_types: np.ndarray | None  # per word (casing_type), with --casing types
    word_example: np.ndarray  # per word: its example's index

    @classmethod
    def of(cls, examples: list[Example], tokenizer, label2id: dict[str, int], budget: int, casing: bool) -> FlatWords:
        words = [word for e in examples for word in e.words]
        distinct = {word: None for word in words}
        # a single word longer than a window keeps its head
        pieces_of = {w: ids[:budget] for w, ids in unique_word_pieces(distinct, tokenizer).items()} if words else {}
        pieces = [pieces_of[word] for word in words]
        counts = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        starts = np.concatenate([[0], np.cumsum(counts)])
        ids = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=int(starts[-1]))
        tag_ids = np.array([label2id.get(tag, IGNORE_INDEX) for e in examples for tag in e.tags], dtype=np.int64)
        types = None
        if casing:
            type_of = {word: casing_type(word) for word in distinct}
            types = np.array([type_of[word] for word in words], dtype=np.int64)
        word_example = np.repeat(np.arange(len(examples)), [len(e.words) for e in examples])
        return cls(ids, starts, counts, np.repeat(np.arange(len(words)), counts), tag_ids, types, word_example)

    def window_feature(self, window: tuple[int, int, int, int], example_index: int, special: tuple[int, int],
                       continuation: dict[int, int] | None, label_context: bool) -> Feature:
        """[CLS] words [SEP] (`special`: their ids); owned words predicted; context words labelled only at
        sentence level (where they are the same sentence's overlap, as before document context existed)."""
        start, end, own_start, own_end = window
        a, b = int(self.starts[start]), int(self.starts[end])
        token_word = self.token_word[a:b]
        is_first = np.zeros(b - a, dtype=bool)
        is_first[self.starts[start:end] - a] = True
        owned = (token_word >= own_start) & (token_word < own_end)
        first = np.where(owned | label_context, self.tag_ids[token_word], IGNORE_INDEX)
        if continuation is None:
            rest = np.full(b - a, IGNORE_INDEX, dtype=np.int64)
        else:
            rest = np.array([continuation.get(label, label) for label in first.tolist()], dtype=np.int64)
        labels = np.where(is_first, first, rest)
        word_index = np.where(is_first & owned, token_word, -1)
        types = None
        if self.casing_types is not None:  # every subword of a word carries the word's type
            types = [UNKNOWN_CASE, *self.casing_types[token_word].tolist(), UNKNOWN_CASE]
        cls_id, sep_id = special
        return Feature([cls_id, *self.ids[a:b].tolist(), sep_id],
                       [IGNORE_INDEX, *labels.tolist(), IGNORE_INDEX], [-1, *word_index.tolist(), -1],
                       example_index, types)


def drop_casing(features: list[Feature], share: float, seed: int) -> list[Feature]:
    """A seeded `share` of the windows with every type UNKNOWN_CASE (what a plain consumer passes);
    the same windows every epoch and on every rank. Its own generator: the run's other random draws stay."""
    if share <= 0 or not features or features[0].token_type_ids is None:
        return features
    dropped = np.random.default_rng(seed).random(len(features)) < share
    return [dataclasses.replace(f, token_type_ids=[UNKNOWN_CASE] * len(f.input_ids)) if drop else f
            for f, drop in zip(features, dropped)]


def _continuation_labels(label2id: dict[str, int]) -> dict[int, int]:
    """With all subwords labelled, a word's later pieces of `B-X` are `I-X` (where I-X exists)."""
    mapping = {}
    for label, label_id in label2id.items():
        if label.startswith("B-") and f"I-{label[2:]}" in label2id:
            mapping[label_id] = label2id[f"I-{label[2:]}"]
    return mapping


def padded_length(length: int, multiple: int) -> int:
    """`length` rounded up to a multiple of `multiple` (1: unchanged)."""
    return -(-length // multiple) * multiple


def padded_lengths(features: list[Feature], pad_to_multiple_of: int) -> list[int]:
    """The width each feature will be padded to: batching budgets count the rounding too."""
    return [padded_length(len(f.input_ids), pad_to_multiple_of) for f in features]


def fixed_shape_plan(features: list[Feature], pad_to_multiple_of: int, max_rows: int,
                     max_tokens: int) -> tuple[list[Feature], list[list[int]]]:
    """(features, batches) for inference: every forward pass of width W has exactly rows_for_width(W) rows
    (batching.fixed_shape_batches), so a window's numbers never depend on its batch neighbours. A short batch
    is filled with copies of its first window that predict nothing (word_index -1): real tokens, so no row
    is all-masked, and the same padded width, so the batch's width stays W. Fillers are appended to the
    returned features; the given list is left as it is."""
    planned = list(features)
    batches = []
    for indices, rows in fixed_shape_batches(padded_lengths(features, pad_to_multiple_of), max_rows, max_tokens):
        if len(indices) < rows:
            first = features[indices[0]]
            planned.append(Feature(first.input_ids, [IGNORE_INDEX] * len(first.input_ids),
                                   [-1] * len(first.input_ids), first.example_index, first.token_type_ids))
            indices = indices + [len(planned) - 1] * (rows - len(indices))
        batches.append(indices)
    return planned, batches


def collate(features: list[Feature], pad_token_id: int, pad_to_multiple_of: int = 1) -> dict[str, np.ndarray]:
    """One padded batch as int64 numpy arrays (inference feeds every runtime from these, torch or not)."""
    # Rounding the width keeps the number of distinct batch shapes small: CPU kernels (oneDNN) are
    # built and cached per shape, which costs time and memory for every new one (docs/performance.md).
    longest = padded_length(max(len(f.input_ids) for f in features), pad_to_multiple_of)
    shape = (len(features), longest)
    input_ids = np.full(shape, pad_token_id, dtype=np.int64)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    word_index = np.full(shape, -1, dtype=np.int64)
    for row, f in enumerate(features):
        input_ids[row, :len(f.input_ids)] = f.input_ids
        labels[row, :len(f.labels)] = f.labels
        word_index[row, :len(f.word_index)] = f.word_index
    lengths = np.array([len(f.input_ids) for f in features])
    batch = {
        "input_ids": input_ids,
        "attention_mask": (np.arange(longest)[None, :] < lengths[:, None]).astype(np.int64),
        "labels": labels,
        "word_index": word_index,
        "example_index": np.array([f.example_index for f in features], dtype=np.int64),
    }
    if features[0].token_type_ids is not None:
        batch["token_type_ids"] = np.zeros(shape, dtype=np.int64)
        for row, f in enumerate(features):
            batch["token_type_ids"][row, :len(f.token_type_ids)] = f.token_type_ids
    return batch


def model_inputs(batch: dict) -> dict:
    """The model's arguments among a batch's keys."""
    return {key: batch[key] for key in MODEL_INPUTS if key in batch}


def collate_tensors(features: list[Feature], pad_token_id: int, pad_to_multiple_of: int = 1) -> dict[str, torch.Tensor]:
    """collate as torch tensors, for training's DataLoader."""
    import torch

    return {key: torch.from_numpy(value) for key, value in collate(features, pad_token_id, pad_to_multiple_of).items()}


def collate_to_bucket(features: list[Feature], pad_token_id: int, widths: Sequence[int]) -> dict[str, torch.Tensor]:
    """Training's collate under a token budget: the batch padded to its longest window's width bucket
    (batching.width_buckets; a multiple of that width is the width itself, since no window is wider)."""
    return collate_tensors(features, pad_token_id, bucket_width(max(len(f.input_ids) for f in features), widths))


def owned_positions(word_index: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """(rows, columns) of the positions a batch predicts, and the flat word index of each."""
    rows, cols = np.nonzero(word_index >= 0)
    return (rows, cols), word_index[rows, cols]


def merge_predictions(examples: list[Example], word_ids: np.ndarray, values: np.ndarray) -> list[np.ndarray]:
    """Per-word values (label ids, or rows of log-probabilities) from all windows -> one array per sentence."""
    offsets = np.cumsum([0] + [len(e.words) for e in examples])
    seen = np.zeros(offsets[-1], dtype=bool)
    seen[word_ids] = True
    if not seen.all() or len(word_ids) != offsets[-1]:
        raise RuntimeError("a word got no prediction, or two: a windowing bug")
    flat = np.empty((offsets[-1], *values.shape[1:]), dtype=values.dtype)
    flat[word_ids] = values
    return [flat[offsets[i]:offsets[i + 1]] for i in range(len(examples))]


def _encoder_source_digest() -> str:
    """This module's source: editing the encoding code invalidates every cache entry by itself."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _cache_key(examples: list[Example], tokenizer, settings: dict) -> str:
    digest = hashlib.sha256()
    digest.update(_encoder_source_digest().encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    digest.update(tokenizer.backend_tokenizer.to_str().encode())
    for example in examples:
        digest.update("\x1f".join(example.words).encode())
        digest.update("\x1e".join(example.tags).encode())
        digest.update(f"\x1d{example.document}".encode())
    return digest.hexdigest()[:32]


def cached_encode(examples: list[Example], tokenizer, label2id: dict[str, int], max_seq_length: int,
                  stride_words: int = 0, label_all_subwords: bool = False, context: bool = False,
                  context_tokens: int = 0, casing: bool = False, cache_dir: Path | None = None) -> list[Feature]:
    """encode_examples, memoised on disk by a hash of the data, tokenizer and settings."""
    settings = {"label2id": label2id, "max_seq_length": max_seq_length, "stride": stride_words,
                "all_subwords": label_all_subwords, "context": context, "context_tokens": context_tokens,
                "casing": casing}
    if cache_dir is None:
        return encode_examples(examples, tokenizer, label2id, max_seq_length, stride_words, label_all_subwords,
                               context, context_tokens, casing)
    path = Path(cache_dir) / f"{_cache_key(examples, tokenizer, settings)}.npz"
    if path.is_file():
        try:
            return _load_features(path)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is rebuilt, never trusted
    features = encode_examples(examples, tokenizer, label2id, max_seq_length, stride_words, label_all_subwords,
                               context, context_tokens, casing)
    _save_features(path, features)
    return features


FEATURE_COLUMNS = ("input_ids", "labels", "word_index", "token_type_ids")


def _save_features(path: Path, features: list[Feature]) -> None:
    lengths = np.array([len(f.input_ids) for f in features], dtype=np.int64)
    # Several ranks may write the same entry, each under its own temporary name: last rename wins, all identical.
    columns = {name: np.concatenate([getattr(f, name) for f in features]).astype(np.int64) for name in
               FEATURE_COLUMNS if features and getattr(features[0], name) is not None}
    with staged_file(path) as tmp:
        np.savez(tmp, lengths=lengths, example_index=np.array([f.example_index for f in features], dtype=np.int64),
                 **columns)


def _load_features(path: Path) -> list[Feature]:
    with np.load(path, allow_pickle=False) as data:
        bounds = np.cumsum(np.concatenate([[0], data["lengths"]])).tolist()
        columns = {name: [part.tolist() for part in np.split(data[name], bounds[1:-1])]
                   for name in FEATURE_COLUMNS if name in data}
        examples = data["example_index"].tolist()
        return [Feature(example_index=int(example), **{name: parts[i] for name, parts in columns.items()})
                for i, example in enumerate(examples)]
