"""Cost of new batch shapes on CPU: train updates over random widths, twice, exact vs rounded widths.

    python -m benchmarks.shapes --multiples 1,4,8

CPU kernels (oneDNN) are created and cached per tensor shape, so the first update at a new width
pays a warm-up and keeps memory. Each multiple runs in its own subprocess (peak RSS is per process):
the same 120 widths (12-60 subwords, 32 rows: short-sentence NER batches) in two passes, the first
meeting each shape for the first time, the second with every shape cached. Reports real tokens per
second of both passes, padding efficiency and peak RSS. The packaged MiniLM, bf16 autocast where
supported, fused AdamW: the training path's defaults.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks.shapes` finds the package


def one_update(model, optimizer, width: int, rows: int, autocast) -> float:
    import torch

    input_ids = torch.randint(1000, 30000, (rows, width))
    labels = torch.randint(0, 3, (rows, width))
    start = time.perf_counter()
    with autocast():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(multiple: int, updates: int, rows: int, seed: int) -> dict:
    import torch
    import transformers

    from ner.backends import autocast_for, resolve_precision
    from ner.data.encode import padded_length
    from ner.training.model import build_model, build_optimizer

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = build_model("sentence-transformers/all-MiniLM-L6-v2", ["O", "B-X", "I-X"], attn_implementation="eager")
    optimizer = build_optimizer(model, 2e-4, 0.01, "fused")
    precision = resolve_precision("auto", torch.device("cpu"))
    autocast = functools.partial(autocast_for, torch.device("cpu"), precision)
    rng = random.Random(seed)
    widths = [rng.randint(12, 60) for _ in range(updates)]
    one_update(model, optimizer, 8, rows, autocast)  # optimizer state and thread pools, outside the timing
    result = {"multiple": multiple, "precision": precision,
              "padding_efficiency": sum(widths) / sum(padded_length(w, multiple) for w in widths)}
    for name in ("first pass", "second pass"):
        seconds = sum(one_update(model, optimizer, padded_length(w, multiple), rows, autocast) for w in widths)
        result[name] = {"seconds": seconds, "real_tokens_per_s": sum(widths) * rows / seconds}
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multiples", default="1,4,8", help="comma-separated --pad-to-multiple-of values")
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure one multiple, print JSON
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.updates, args.rows, args.seed)))
        return 0
    print("| widths padded to a multiple of | padding eff. | first pass tok/s | second pass tok/s | peak RSS GB |")
    print("|---:|---:|---:|---:|---:|")
    for multiple in (int(m) for m in args.multiples.split(",")):
        command = [sys.executable, "-m", "benchmarks.shapes", "--one", str(multiple), "--updates", str(args.updates),
                   "--rows", str(args.rows), "--seed", str(args.seed)]
        done = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.splitlines()[-1])
        print(f"| {multiple} | {r['padding_efficiency']:.1%} | {r['first pass']['real_tokens_per_s']:,.0f} | "
              f"{r['second pass']['real_tokens_per_s']:,.0f} | {r['peak_rss_gb']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
