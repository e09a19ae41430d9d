"""Labels saved: simulated annotation on a CoNLL corpus, the gold tags as the annotator, ner.select against random.

    python -m benchmarks.active_learning --out bench_out/al --seeds 1 2 3 \\
        --ceiling seeds_out/conll-default/seeds.json        # the full-data F1 of the same recipe (benchmarks.seeds)
    python -m benchmarks.active_learning --out bench_out/al-sample --train ner/sample_data/train.conll \\
        --validation ner/sample_data/valid.conll --test ner/sample_data/test.conll --round-words 400 --rounds 2

Each seed starts from the same random seed set (about --seed-share of the training words, whole sentences) for
every strategy; then each round adds --round-words words, chosen by `python -m ner.select ... --conll --words N
--labelled LABELLED` (strategy `select`) or at random (`random`), and retrains with the project's defaults
(`python -m ner.train`, nothing but the files, --seed and --model): from the encoder (--start encoder) or from the
last round's model (--start warm). Test F1 after every round. A round's folder keeps round.json, so an interrupted
run continues where it stopped (the same --out and flags). Writes OUT/active_learning.json, .md and .png: test F1
against words annotated, and the words each strategy needs to reach 95% and 99% of the ceiling.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.measure import run_measured

ROOT = Path(__file__).resolve().parents[1]
CONLL = ROOT.parent / "shared" / "data" / "conll2003"
STRATEGIES = ("select", "random")
TARGETS = (0.95, 0.99)


def read_pool(path: Path) -> list[dict]:
    """Sentences with their document number, in file order: what the annotator labels, one sentence at a time."""
    from ner.data.conll import read_conll

    return [{"words": e.words, "tags": e.tags, "document": e.document} for e in read_conll(path)]


def write_labelled(pool: list[dict], chosen: set[int], path: Path) -> Path:
    """The labelled sentences as CoNLL, in pool order, a -DOCSTART- wherever the document changes."""
    lines, document = [], object()
    for index in sorted(chosen):
        sentence = pool[index]
        if sentence["document"] != document:
            lines.append("-DOCSTART- -X- -X- O\n\n")
            document = sentence["document"]
        lines.append("".join(f"{w} {t}\n" for w, t in zip(sentence["words"], sentence["tags"])) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def random_words(pool: list[dict], chosen: set[int], words: int, rng: random.Random) -> set[int]:
    """Sentences drawn at random from the unlabelled ones until they hold `words` words (the last may overshoot by
    one sentence, as a seed set's does)."""
    left = [i for i in range(len(pool)) if i not in chosen]
    rng.shuffle(left)
    picked, total = set(), 0
    for index in left:
        if total >= words:
            break
        picked.add(index)
        total += len(pool[index]["words"])
    return picked


def selected_words(model: Path, args, labelled: Path, words: int, out: Path) -> set[int]:
    """What ner.select picks from the training file, as sentence indices (its `_source` is FILE#N, N from 1)."""
    picks = out / "picks.jsonl"
    argv = [sys.executable, "-m", "ner.select", str(model), str(args.train), "--conll", "--words", str(words),
            "--labelled", str(labelled), "--format", "spans", "--output", str(picks), "--overwrite", "--quiet"]
    run_measured(argv, out / "select.log", cwd=ROOT)
    return {int(json.loads(line)["_source"].rsplit("#", 1)[1]) - 1 for line in picks.read_text().splitlines()}


def train_round(args, labelled: Path, seed: int, start_model: str | None, out: Path) -> dict:
    argv = [sys.executable, "-m", "ner.train", "--train-file", str(labelled), "--validation-file",
            str(args.validation), "--test-file", str(args.test), "--seed", str(seed), "--output-dir", str(out / "run"),
            "--overwrite-output-dir", "--quiet", *(["--model", start_model] if start_model else [])]
    measured = run_measured(argv, out / "train.log", cwd=ROOT)
    metrics = json.loads((out / "run" / "final" / "metrics.json").read_text())
    return {"train_s": measured["wall_s"], "test_f1": metrics["test"]["f1"] * 100,
            "validation_f1": metrics["validation"]["f1"] * 100}


def run_strategy(args, pool: list[dict], strategy: str, seed: int) -> list[dict]:
    """Every round of one strategy and seed (rounds already in OUT are read back)."""
    seed_words = round(args.seed_share * sum(len(s["words"]) for s in pool))
    chosen = random_words(pool, set(), seed_words, random.Random(seed))  # the same seed set for every strategy
    rounds, model = [], None
    for number in range(args.rounds + 1):
        out = args.out / strategy / f"seed_{seed}" / f"round_{number:02d}"
        done = out / "round.json"
        labelled = write_labelled(pool, chosen, out / "labelled.conll")
        if done.is_file():
            record = json.loads(done.read_text())
        else:
            start = str(model) if args.start == "warm" and model is not None else None
            record = {"round": number, "sentences": len(chosen), "words": sum(len(pool[i]["words"]) for i in chosen),
                      **train_round(args, labelled, seed, start, out)}
        model = out / "run" / "final"
        if number < args.rounds and "next" not in record:
            began = time.perf_counter()
            added = (selected_words(model, args, labelled, args.round_words, out) if strategy == "select"
                     else random_words(pool, chosen, args.round_words, random.Random(f"{seed}-{number}")))
            record["select_s"], record["next"] = time.perf_counter() - began, sorted(added)
        done.write_text(json.dumps(record, indent=1) + "\n")
        rounds.append(record)
        chosen |= set(record.get("next", []))
    return rounds


def curve(runs: list[list[dict]]) -> list[dict]:
    """Per round, over the seeds: words annotated and test F1 (mean ± std)."""
    rows = []
    for records in zip(*runs):
        f1 = [r["test_f1"] for r in records]
        rows.append({"round": records[0]["round"], "words": statistics.mean(r["words"] for r in records),
                     "f1": statistics.mean(f1), "f1_std": statistics.stdev(f1) if len(f1) > 1 else 0.0,
                     "train_s": statistics.mean(r["train_s"] for r in records),
                     "select_s": statistics.mean(r.get("select_s", 0.0) for r in records)})
    return rows


def words_to_reach(rows: list[dict], f1: float) -> float | None:
    return next((row["words"] for row in rows if row["f1"] >= f1), None)


def report(curves: dict[str, list[dict]], ceiling: float | None, total_words: int, args) -> str:
    lines = [f"`python -m benchmarks.active_learning {' '.join(args.argv)}`", "",
             "| strategy | round | words | share of the pool | test F1 | train s | select s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for strategy, rows in curves.items():
        lines += [f"| {strategy} | {r['round']} | {r['words']:.0f} | {100 * r['words'] / total_words:.1f}% | "
                  f"{r['f1']:.2f} ± {r['f1_std']:.2f} | {r['train_s']:.0f} | {r['select_s']:.0f} |" for r in rows]
    if ceiling is not None:
        lines += ["", f"Ceiling (all {total_words} words, same recipe): {ceiling:.2f} test F1.", "",
                  "| strategy | " + " | ".join(f"words to {t:.0%} of the ceiling" for t in TARGETS) + " |",
                  "|---|" + "---:|" * len(TARGETS)]
        for strategy, rows in curves.items():
            reached = [words_to_reach(rows, t * ceiling) for t in TARGETS]
            cells = ["not reached" if w is None else f"{w:.0f} ({100 * w / total_words:.1f}%)" for w in reached]
            lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, list[dict]], ceiling: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for strategy, rows in curves.items():
        axes.errorbar([r["words"] for r in rows], [r["f1"] for r in rows], yerr=[r["f1_std"] for r in rows],
                      marker="o", capsize=3, label=strategy)
    if ceiling is not None:
        for target in TARGETS:
            axes.axhline(target * ceiling, linestyle="--", linewidth=0.8, color="grey")
    axes.set_xlabel("words annotated")
    axes.set_ylabel("test F1")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=Path, default=CONLL / "train.txt")
    parser.add_argument("--validation", type=Path, default=CONLL / "valid.txt")
    parser.add_argument("--test", type=Path, default=CONLL / "test.txt")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--seed-share", type=float, default=0.01, help="the random seed set's share of the words")
    parser.add_argument("--round-words", type=int, default=4000, help="words annotated a round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds after the seed set")
    parser.add_argument("--start", choices=("encoder", "warm"), default="encoder",
                        help="each round trains from the encoder, or from the last round's model")
    parser.add_argument("--ceiling", type=Path, help="benchmarks.seeds' seeds.json of the full training file")
    args = parser.parse_args(argv)
    args.argv, args.out = argv, args.out.resolve()
    pool = read_pool(args.train)
    curves = {s: curve([run_strategy(args, pool, s, seed) for seed in args.seeds]) for s in args.strategies}
    ceiling = None
    if args.ceiling:
        summaries = json.loads(args.ceiling.read_text())["summaries"]
        ceiling = next(iter(summaries.values()))["test"]["f1"]["mean"]
    total_words = sum(len(s["words"]) for s in pool)
    (args.out / "active_learning.json").write_text(json.dumps({"curves": curves, "ceiling": ceiling,
                                                               "pool_words": total_words}, indent=1) + "\n")
    text = report(curves, ceiling, total_words, args)
    (args.out / "active_learning.md").write_text(text, encoding="utf-8")
    plot(curves, ceiling, args.out / "active_learning.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
