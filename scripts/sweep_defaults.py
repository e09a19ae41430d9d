"""Measure candidate default hyperparameters on more than one dataset; prints a markdown table.

    python scripts/sweep_defaults.py --out sweep.json
    python scripts/sweep_defaults.py --conll-dir ../shared/data/conll2003 --conll-sentences 1000

Datasets: the shipped sample (450 sentences) and a slice of CoNLL-2003 train (scored on the
first 1,000 validation sentences), when the corpus is there. Each cell is one full training run
of the packaged MiniLM with only the listed options changed from the defaults.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ner.data.conll import read_conll, write_conll

ROOT = Path(__file__).resolve().parents[1]


def slice_conll(src: Path, dst: Path, sentences: int) -> Path:
    """The first `sentences` sentences of a CoNLL file, as the benchmark slices them."""
    return write_conll(dst, read_conll(src)[:sentences])


def train_once(train: Path, valid: Path, options: dict, workdir: Path) -> dict:
    out_dir = Path(tempfile.mkdtemp(dir=workdir))
    argv = [sys.executable, "-m", "ner.train", "--train-file", str(train), "--validation-file", str(valid),
            "--output-dir", str(out_dir), "--quiet", "--save-total-limit", "1"]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = json.loads((out_dir / "final" / "metrics.json").read_text())
    return {"f1": metrics["validation"]["f1"], "seconds": time.perf_counter() - start, "steps": metrics["global_step"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conll-dir", type=Path, default=ROOT.parent / "shared" / "data" / "conll2003")
    parser.add_argument("--conll-sentences", type=int, default=1000)
    parser.add_argument("--learning-rates", default="5e-5,1e-4,2e-4,4e-4")
    parser.add_argument("--epochs", default="3,5")
    parser.add_argument("--batch-sizes", default="16,32")
    parser.add_argument("--seeds", default="42", help="one run per seed (noise check)")
    parser.add_argument("--datasets", default="sample,conll", help="which of sample, conll to run")
    parser.add_argument("--out", type=Path, default=Path("sweep.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ner-sweep-"))
    wanted = args.datasets.split(",")
    datasets = {}
    if "sample" in wanted:
        datasets["sample"] = (ROOT / "ner/sample_data/train.conll", ROOT / "ner/sample_data/valid.conll")
    if "conll" in wanted and (args.conll_dir / "train.txt").is_file():
        datasets[f"conll{args.conll_sentences}"] = (
            slice_conll(args.conll_dir / "train.txt", work / "train.conll", args.conll_sentences),
            slice_conll(args.conll_dir / "valid.txt", work / "valid.conll", 1000))
    grid = list(itertools.product(args.learning_rates.split(","), args.epochs.split(","),
                                  args.batch_sizes.split(","), args.seeds.split(",")))
    results = []
    for name, (train, valid) in datasets.items():
        for lr, epochs, batch, seed in grid:
            options = {"learning_rate": lr, "num_epochs": epochs, "batch_size": batch, "seed": seed}
            result = {"dataset": name, **options, **train_once(train, valid, options, work)}
            results.append(result)
            print(json.dumps(result), flush=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("| dataset | lr | epochs | batch | seed | val F1 | steps | seconds |\n|---|---|---|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['dataset']} | {r['learning_rate']} | {r['num_epochs']} | {r['batch_size']} | {r['seed']} | "
              f"{r['f1'] * 100:.2f} | {r['steps']} | {r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
