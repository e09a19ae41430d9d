"""What fixed-shape inference batches cost, and whether a text's answer depends on its batch neighbours.

    python -m benchmarks.batch_independence /work/runs/conll2/final ../shared/data/conll2003/train.txt --limit 2000

Every CoNLL sentence is detokenised into one text (benchmarks.inference's sentence_texts). For each precision
and each plan, Tagger.predict tags: the whole corpus in one call (throughput), single texts (the latency of a
lone request), 16 random texts at a time (a server micro-batch), and each text of a sample alone, compared
byte for byte (entities and scores) with its answer inside the corpus call. Plans: "sorted" is the plan
before fixed shapes (global length sort cut by the budget: a window's rows and width depend on its
neighbours); the others are fixed_shape_plan with R(W) = clamp(TOKENS // W, 1, ROWS) rows per forward
of width W. `--passes`: "one thread each" is what TorchRuntime does on a CPU (one pass per thread, each on one
thread: inference/torch_runtime.py); "all threads" runs one pass at a time on every thread, as before, for comparison.
Results: docs/performance.md, "Batch independence".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

from benchmarks.inference import sentence_texts
from ner.inference.runtimes import RUNTIMES, TORCH

PLANS = {"sorted 64x8192": (64, 8192), "fixed 1 row": (1, 0), "fixed 64x128": (64, 128),
         "fixed 64x512": (64, 512), "fixed 64x8192": (64, 8192)}


PASSES = ("one thread each", "all threads")


def plan_limits(plan: str) -> tuple[int, int]:
    """(rows, tokens) of a named plan, or of any "fixed RxT" (GPU budgets: "fixed 2048x16384")."""
    if plan in PLANS:
        return PLANS[plan]
    kind, _, size = plan.partition(" ")
    rows, _, tokens = size.partition("x")
    if kind != "fixed" or not (rows.isdigit() and tokens.isdigit()):
        raise SystemExit(f"--plans {plan!r}: expected one of {', '.join(PLANS)} or 'fixed ROWSxTOKENS'")
    return int(rows), int(tokens)


def sorted_plan(features, pad_to_multiple_of, max_rows, max_tokens):
    """The plan before fixed shapes, for comparison."""
    from ner.data.batching import inference_batches
    from ner.data.encode import padded_lengths

    return features, inference_batches(padded_lengths(features, pad_to_multiple_of), max_rows, max_tokens)


def timed_calls(call, inputs: list) -> tuple[list, float]:
    """(answers, median seconds per call)."""
    answers, times = [], []
    for item in inputs:
        start = time.perf_counter()
        answers.append(call(item))
        times.append(time.perf_counter() - start)
    return answers, statistics.median(times)


def measure(tagger, plan: str, texts: list[str], words: int, sample: int) -> dict:
    rows, tokens = plan_limits(plan)
    predict = lambda batch: tagger.predict(batch, rows, tokens)  # noqa: E731
    baseline = plan.startswith("sorted")
    with mock.patch("ner.inference.tagger.fixed_shape_plan", sorted_plan) if baseline else contextlib.nullcontext():
        predict(texts[:64])  # kernels for the common shapes, thread pools
        start = time.perf_counter()
        together = predict(texts)
        corpus_s = time.perf_counter() - start
        rng = random.Random(0)
        picks = rng.sample(range(len(texts)), sample)
        alone, lone_s = timed_calls(lambda i: predict([texts[i]])[0], picks)
        mixes = [[texts[i] for i in rng.sample(range(len(texts)), 16)] for _ in range(10)]
        mix_s = timed_calls(predict, mixes)[1]
    differ = sum(json.dumps(a) != json.dumps(together[i]) for a, i in zip(alone, picks))
    spans = lambda result: [(e["start"], e["end"], e["type"]) for e in result["entities"]]  # noqa: E731
    entities_differ = sum(spans(a) != spans(together[i]) for a, i in zip(alone, picks))
    return {"plan": plan, "words_per_s": words / corpus_s, "corpus_s": corpus_s, "lone_ms": lone_s * 1000,
            "mix16_ms": mix_s * 1000, "differ": differ, "entities_differ": entities_differ, "sample": sample}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("conll", type=Path, help="CoNLL file: each sentence becomes one raw text")
    parser.add_argument("--limit", type=int, default=2000, help="first N sentences only")
    parser.add_argument("--sample", type=int, default=300, help="texts also tagged alone")
    parser.add_argument("--precisions", nargs="+", default=["bf16", "no"])
    parser.add_argument("--plans", nargs="+", default=list(PLANS), help=f"{', '.join(PLANS)} or 'fixed RxT'")
    parser.add_argument("--runtime", default=TORCH, choices=RUNTIMES, help="ner.predict's --runtime")
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES,
                        help="CPU torch passes: one thread each (the default), or one pass at a time on all threads")
    parser.add_argument("--json", type=Path, help="also write every row as JSON")
    args = parser.parse_args(argv)
    for plan in args.plans:
        plan_limits(plan)
    from ner.inference.tagger import Tagger

    texts, _, words = sentence_texts(args.conll, args.limit)
    print("| precision | passes | plan (rows x tokens) | corpus words/s | 1 text (ms, median) | "
          "16 texts (ms, median) | "
          f"texts differing alone vs in corpus (of {args.sample}): output / entities |\n"
          "|---|---|---|---:|---:|---:|---:|")
    rows = []
    for precision in args.precisions:
        tagger = Tagger(args.model_dir, precision=precision, runtime=args.runtime)
        threads_per_forward = getattr(tagger.runtime, "threads_per_forward", None)
        for plan, passes in ((plan, passes) for plan in args.plans for passes in args.passes):
            tagger.runtime.threads_per_forward = threads_per_forward if passes == PASSES[0] else None
            r = measure(tagger, plan, texts, words, args.sample)
            rows.append({**r, "precision": precision, "passes": passes, "runtime": args.runtime,
                         "texts": len(texts), "texts_per_s": len(texts) / r["corpus_s"]})
            print(f"| {precision} | {passes} | {plan} | {r['words_per_s']:.0f} | {r['lone_ms']:.1f} | "
                  f"{r['mix16_ms']:.1f} | {r['differ']} / {r['entities_differ']} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
