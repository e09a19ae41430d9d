"""ner.train with the training batch plan before the width buckets (d174501): an ablation, not a product path.

    python -m benchmarks.seeds --trainer benchmarks.batch_plan_before_buckets --seeds 1 2 3 --out OUT -- FLAGS

The plan of d174501: the epoch's shuffled order cut into groups of about BUCKET_BATCHES batches, each group
sorted by length (longest first) and cut greedily by the token budget, then the batches shuffled. Widths are
whatever a batch's longest window needs (rounded by --pad-to-multiple-of), so shapes are unbounded; today's
plan pads every window to one of a few widths instead (ner/data/batching.py). Everything else is ner.train's.
"""

from __future__ import annotations

import sys
from functools import partial

import numpy as np

from ner.data import batching
from ner.training import run

BUCKET_BATCHES = 50  # a group holds about this many batches' worth of windows (d174501)


def sorted_groups(self: batching.TokenBudgetBatchSampler, order: np.ndarray) -> list[list[int]]:
    group_size = self.max_sentences * BUCKET_BATCHES
    batches: list[list[int]] = []
    for start in range(0, len(order), group_size):
        group = order[start:start + group_size]
        group = group[np.argsort(-self.lengths[group], kind="stable")]
        batches.extend(batching.cut_by_budget(group, self.lengths, self.max_sentences, self.max_tokens))
    return batches


def collate_to_longest(cfg, sampler, pad_token_id: int):
    """d174501's collate: each batch padded to its longest window, rounded up to --pad-to-multiple-of."""
    return partial(run.collate_tensors, pad_token_id=pad_token_id, pad_to_multiple_of=cfg.pad_to_multiple_of)


def main(argv: list[str] | None = None) -> int:
    batching.TokenBudgetBatchSampler._bucketed = sorted_groups
    run.train_collate = collate_to_longest
    from ner import train
    return train.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
