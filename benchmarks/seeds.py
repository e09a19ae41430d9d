"""One training config over several seeds: mean ± std of validation and test F1, overall and per type.

    python -m benchmarks.seeds --seeds 1 2 3 --out seeds_out/conll-default -- --config scripts/conll2003.yaml
    python -m benchmarks.seeds --seeds 1 --out OUT ... ; python -m benchmarks.seeds --seeds 1 2 --reuse --out OUT ...
    python -m benchmarks.seeds --seeds 1 2 3 --out seeds_out/conll-sentence --rescore argmax \\
        -- --config scripts/conll2003.yaml --context none

Everything after `--` goes to `python -m ner.train`, or to `--trainer MODULE` (each seed adds `--seed S
--output-dir OUT/seed_S`).
Each run's own scores come from its export's metrics.json (the decoding it was trained with);
`--rescore argmax|viterbi` also scores every export's validation and test files with that decoding
through `ner.evaluate` (same weights, so it isolates the decoder). Per run it records wall time,
training seconds per epoch (metrics.jsonl's `epoch_train_s`) and peak RSS.
Writes OUT/seeds.json and OUT/seeds.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.measure import contention, run_measured

ROOT = Path(__file__).resolve().parents[1]


def train_seed(seed: int, out: Path, train_args: list[str], reuse: bool, trainer: str = "ner.train") -> dict:
    run_dir = out / f"seed_{seed}"
    if reuse and (run_dir / "run.json").is_file():
        return json.loads((run_dir / "run.json").read_text())
    argv = [sys.executable, "-m", trainer, *train_args, "--seed", str(seed), "--output-dir", str(run_dir),
            "--overwrite-output-dir", "--quiet"]
    measured = run_measured(argv, out / "logs" / f"seed_{seed}.log", cwd=ROOT)
    metrics = json.loads((run_dir / "final" / "metrics.json").read_text())
    run = {"seed": seed, "wall_s": measured["wall_s"], "peak_rss_gb": measured["peak_rss_bytes"] / 1e9,
           "epoch_s": seconds_per_epoch(run_dir / "metrics.jsonl"), "other_load": contention(measured),
           "scores": {split: metrics.get(split) for split in ("validation", "test")}}
    (run_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    return run


def seconds_per_epoch(metrics_path: Path) -> float | None:
    """Median training seconds of an epoch, as training logged them (evaluation and saving excluded)."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    spans = [r["epoch_train_s"] for r in records if "epoch_train_s" in r]
    return statistics.median(spans) if spans else None


def rescore(run_dir: Path, decode: str) -> dict:
    """The export scored again with another decoding, on the files it was trained with."""
    args = json.loads((run_dir / "final" / "training_args.json").read_text())
    scores = {}
    for split, key in (("validation", "validation_file"), ("test", "test_file")):
        if args.get(key):
            report = run_dir / f"{split}.{decode}.json"
            subprocess.run([sys.executable, "-m", "ner.evaluate", str(run_dir / "final"), args[key], "--decode",
                            decode, "--worst", "0", "--json", str(report)], cwd=ROOT, check=True,
                           capture_output=True)
            scores[split] = json.loads(report.read_text())
    return scores


def mean_std(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def summarise(runs: list[dict], key: str = "scores") -> dict:
    """mean ± std of overall and per-type F1 for each split, over the runs that have it."""
    summary = {}
    for split in ("validation", "test"):
        scored = [r[key][split] for r in runs if r[key].get(split)]
        if not scored:
            continue
        # seqeval reports a type that is in the gold tags or in the predictions, so a type no run's gold holds
        # appears only in the runs that predicted it: each type over the runs that report it (n says how many)
        types = sorted(set().union(*(s["per_type"] for s in scored)))
        summary[split] = {"f1": mean_std([s["f1"] * 100 for s in scored]),
                          "per_type": {t: mean_std([s["per_type"][t]["f1"] * 100 for s in scored
                                                    if t in s["per_type"]]) for t in types}}
    return summary


def fmt(stat: dict | None) -> str:
    return "-" if not stat else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def markdown(report: dict) -> str:
    lines = [f"`{report['command']}`", "", "| decoding | split | F1 | " + " | ".join(report["types"]) + " |",
             "|---|---|---:|" + "---:|" * len(report["types"])]
    for decoding, summary in report["summaries"].items():
        for split, stats in summary.items():
            per_type = " | ".join(fmt(stats["per_type"].get(t)) for t in report["types"])
            lines.append(f"| {decoding} | {split} | {fmt(stats['f1'])} | {per_type} |")
    costs = report["costs"]
    lines += ["", f"Over {len(report['runs'])} seeds: wall {fmt(costs['wall_s'])} s, training "
              f"{fmt(costs['epoch_s'])} s an epoch, peak RSS {fmt(costs['peak_rss_gb'])} GB."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds (default: 1 2 3)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs, seeds.json and seeds.md")
    parser.add_argument("--rescore", choices=("argmax", "viterbi"), help="also score each export with this decoding")
    parser.add_argument("--reuse", action="store_true", help="keep seeds already trained in OUT (seed_S/run.json)")
    parser.add_argument("--trainer", default="ner.train",
                        help="module run as `python -m TRAINER` (default ner.train; an ablation such as "
                             "benchmarks.batch_plan_before_buckets takes the same flags)")
    args = parser.parse_args(ours)
    out = args.out.resolve()
    runs = []
    for seed in args.seeds:
        print(f"seed {seed} ...", flush=True)
        runs.append(train_seed(seed, out, train_args, args.reuse, args.trainer))
        if args.rescore and "rescored" not in runs[-1]:
            runs[-1]["rescored"] = rescore(out / f"seed_{seed}", args.rescore)
            (out / f"seed_{seed}" / "run.json").write_text(json.dumps(runs[-1], indent=2) + "\n")
    trained_with = json.loads((out / f"seed_{args.seeds[0]}" / "final" / "training_args.json").read_text())["decode"]
    summaries = {trained_with: summarise(runs)}
    if args.rescore:
        summaries[args.rescore] = summarise(runs, "rescored")
    report = {"command": "python -m benchmarks.seeds " + " ".join(argv), "runs": runs, "summaries": summaries,
              "types": sorted(runs[0]["scores"]["test"]["per_type"]) if runs[0]["scores"].get("test") else [],
              "costs": {k: mean_std([r[k] for r in runs if r[k] is not None]) for k in ("wall_s", "epoch_s",
                                                                                        "peak_rss_gb")}}
    (out / "seeds.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "seeds.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
