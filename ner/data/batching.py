"""Length-aware batching: a few padded widths, a fixed row count per width, the same order on every backend.

Padding is wasted compute (a pad token costs as much as a real one), so batches group sentences of similar
length; but every new batch shape costs too: kernel caches and warm-up on a CPU, a graph per shape for a
compiled step or a CUDA graph. So each window is padded to the narrowest of a few widths (about 1.2x apart,
width_buckets), and every batch of a width has the rows the token budget gives that width (rows_for_width):
an epoch has at most one shape per width, plus one short batch, whether the budget binds or not. Order still
changes every epoch: indices are shuffled, grouped by width, cut into batches, and the batches shuffled again.
The plan is a pure function of (seed, epoch), so a resumed run sees the same batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

# Each width about 1.2x the one below, from 8: on CoNLL-2003 train (MiniLM) this keeps the padding of a width per
# batch with about half the shapes (measured in docs/performance.md, "Batch shapes").
WIDTH_STEP = 1.2
NARROWEST_WIDTH = 8

# --max-tokens (ner.train, ner.predict, ner.evaluate): 0 is auto (the device's budget), as every numeric option's 0;
# NO_TOKEN_BUDGET batches --batch-size windows whatever their width. The functions here take a budget already
# resolved, where any budget <= 0 is none.
NO_TOKEN_BUDGET = -1


def width_buckets(widest: int, multiple: int) -> tuple[int, ...]:
    """Padded widths for windows up to `widest` tokens: multiples of `multiple` from NARROWEST_WIDTH, each about
    WIDTH_STEP times the one below, the last `widest` rounded up. 128 tokens in multiples of 4:
    8 12 16 20 24 28 36 44 52 64 76 92 112 128."""
    def round_up(width: int) -> int:
        return -(-width // multiple) * multiple

    widths = [round_up(min(NARROWEST_WIDTH, widest))]
    while widths[-1] < widest:
        widths.append(min(round_up(widest), max(widths[-1] + multiple, round_up(int(widths[-1] * WIDTH_STEP)))))
    return tuple(widths)


def bucket_width(length: int, widths: Sequence[int]) -> int:
    """The narrowest width that holds `length` tokens."""
    return widths[bisect.bisect_left(widths, length)]


class TokenBudgetBatchSampler:
    """Yields lists of feature indices: the *global* sequence of micro-batches for one epoch.

    Backends shard it by batch (rank r takes batches r, r+W, ...), which is what both
    Accelerate's BatchSamplerShard and a DistributedSampler over batches do. The plan is
    padded to a multiple of `num_replicas` by repeating its first batches, so no backend
    pads on its own and a mid-epoch resume can skip a whole number of batches.
    """

    batch_size = None  # tells Accelerate that batch sizes vary

    def __init__(self, lengths: list[int], max_sentences: int, max_tokens: int, seed: int,
                 shuffle: bool = True, num_replicas: int = 1, pad_to_multiple_of: int = 1):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_sentences = max_sentences
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.epoch = 0
        self.skip_batches = 0
        self.widths = width_buckets(int(self.lengths.max(initial=1)), pad_to_multiple_of)
        self._cached: tuple[int, list[list[int]]] | None = None  # len() and iter() ask for the same plan

    def set_epoch(self, epoch: int, skip_batches: int | None = None) -> None:
        """Skip `skip_batches` of the epoch's plan (resume). Without it, a repeated call for the
        same epoch keeps the skip: Accelerate's DataLoaderShard calls set_epoch(epoch) itself
        at the start of every iteration."""
        if skip_batches is None:
            skip_batches = self.skip_batches if epoch == self.epoch else 0
        self.epoch = epoch
        self.skip_batches = skip_batches

    def plan(self, epoch: int) -> list[list[int]]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._build_plan(epoch))
        return self._cached[1]

    def _build_plan(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        if self.max_tokens > 0:
            batches = self._bucketed(order)
        else:
            batches = [order[i:i + self.max_sentences].tolist() for i in range(0, len(order), self.max_sentences)]
        if self.shuffle and self.max_tokens > 0:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        remainder = -len(batches) % self.num_replicas
        return batches + batches[:remainder] if remainder else batches

    def _bucketed(self, order: np.ndarray) -> list[list[int]]:
        """Batches of rows_for_width(W) windows of bucket width W, in `order` within a width. What a width leaves
        over goes on to the next wider one, after that width's own windows, and a batch is cut there only while it
        holds one of them: a batch of carried windows alone would be padded to a narrower width with the wider
        width's rows (fewer, where the token budget binds), a shape no width promises. So one batch of the epoch at
        most is short: what is left after the widest width, fewer rows than its own width's."""
        bucket = np.searchsorted(self.widths, self.lengths[order])
        batches: list[list[int]] = []
        carried: list[int] = []
        for index, width in enumerate(self.widths):
            own = order[bucket == index].tolist()
            members = own + carried
            rows = rows_for_width(width, self.max_sentences, self.max_tokens)
            cut = min(len(members) // rows, -(-len(own) // rows)) * rows  # whole batches that hold an own window
            batches.extend(members[start:start + rows] for start in range(0, cut, rows))
            carried = members[cut:]
        return batches + [carried] if carried else batches

    def __iter__(self):
        yield from self.plan(self.epoch)[self.skip_batches:]

    def __len__(self) -> int:
        return len(self.plan(self.epoch)) - self.skip_batches


def cut_by_budget(sorted_indices: np.ndarray, lengths: np.ndarray, max_sentences: int,
                  max_tokens: int) -> list[list[int]]:
    """Greedy cut of length-sorted (longest first) indices: rows x longest row <= max_tokens."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted_indices.tolist():
        length = int(lengths[index])
        widest = max(longest, length)
        if current and (len(current) + 1 > max_sentences or widest * (len(current) + 1) > max_tokens):
            batches.append(current)
            current, widest = [], length
        current.append(index)
        longest = widest
    if current:
        batches.append(current)
    return batches


def inference_batches(lengths: list[int], max_sentences: int, max_tokens: int) -> list[list[int]]:
    """Globally sorted by length, budget-cut: the fewest padded tokens, but a window's batch shape (rows,
    width) depends on what shares its batch, and so do its numbers (docs/performance.md, "Batch
    independence"). Inference uses fixed_shape_batches; this plan stays as the benchmarks' baseline."""
    lengths_array = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths_array, kind="stable")
    return cut_by_budget(order, lengths_array, max_sentences, max_tokens if max_tokens > 0 else 10**12)


def rows_for_width(width: int, max_rows: int, max_tokens: int) -> int:
    """Rows of every inference forward pass of this padded width: a function of the width and the settings
    alone, never of what else is being tagged. No token budget (max_tokens <= 0): max_rows whatever the width."""
    by_tokens = max_tokens // width if max_tokens > 0 else max_rows
    return max(1, min(max_rows, by_tokens))


def fixed_shape_batches(widths: list[int], max_rows: int, max_tokens: int) -> list[tuple[list[int], int]]:
    """Inference batches whose shape is a function of each window alone: (indices, rows) per batch.

    Windows of the same padded width share batches, and every batch of width W is to run with exactly
    rows_for_width(W) rows: the last batch of a width comes short and the caller fills it (encode.py's
    fixed_shape_plan). CPU kernels (oneDNN GEMMs, bf16 above all) pick their blocking, so their summation
    order, by the operands' shape, so a window's logits change with its batch's rows and width; with the
    shape fixed they are bit-identical whatever the neighbours hold (docs/performance.md).
    Widest first, in input order within a width: sorted, deterministic, each index in exactly one batch."""
    widths_array = np.asarray(widths, dtype=np.int64)
    batches: list[tuple[list[int], int]] = []
    for width in sorted(set(widths_array.tolist()), reverse=True):
        members = np.flatnonzero(widths_array == width).tolist()
        rows = rows_for_width(width, max_rows, max_tokens)
        batches.extend((members[i:i + rows], rows) for i in range(0, len(members), rows))
    return batches
