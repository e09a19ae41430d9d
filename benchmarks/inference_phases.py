"""Where raw-text tagging time goes, per runtime: each phase of Tagger.predict timed on its own.

    python -m benchmarks.inference_phases EXPORT ../shared/data/conll2003/train.txt --limit 3000
    python -m benchmarks.inference_phases EXPORT train.txt --limit 3000 --runtimes onnx-int8 --profile 25

Each runtime runs in its own process (imports, loading, a warm-up on the first 32 texts), then tags the texts
phase by phase, calling what Tagger.predict calls: split (raw text -> words), encode (tokenise, cut windows),
plan (fixed-shape batches), passes (collate, forward, owned positions and log-softmax: predict_word_scores),
merge, decode (Viterbi) and entities. "forward only" runs the same collated batches through the runtime again
(runtime.map, as many passes at once as predict_word_scores runs), so "passes - forward" is the Python around
the forwards that the forwards do not hide. The answers are checked against Tagger.predict's. `--profile N`:
cProfile's top N functions of one Tagger.predict call (the main thread only: passes on a pool show as waits).
Beside the wall seconds, each phase's CPU seconds on the main thread (time.thread_time), which other processes
on a shared machine cannot inflate: the Python share, measured.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.inference import sentence_texts
from benchmarks.measure import cpu_description

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("split", "encode", "plan", "passes", "merge", "decode", "entities")


def timed_predict(tagger, texts: list[str]) -> tuple[dict[str, float], list[dict]]:
    """(seconds per phase, results) of Tagger.predict's steps on `texts`, one after the other."""
    from ner.data.encode import fixed_shape_plan, merge_predictions
    from ner.data.examples import Example
    from ner.data.text import split_words
    from ner.inference.entities import text_result
    from ner.inference.options import inference_budget
    from ner.inference.tagger import predict_word_scores

    seconds, clock, cpu = {}, time.perf_counter(), time.thread_time()

    def lap(name: str) -> None:
        nonlocal clock, cpu
        now, cpu_now = time.perf_counter(), time.thread_time()
        seconds[name], seconds[f"{name} cpu"], clock, cpu = now - clock, cpu_now - cpu, now, cpu_now

    split = [split_words(text) for text in texts]
    examples = [Example([w for w, _, _ in words], ["O"] * len(words), "<text>", document=i)
                for i, words in enumerate(split)]
    lap("split")
    features = tagger.encode(examples)
    lap("encode")
    rows, tokens = inference_budget(tagger.runtime.device_type)
    features, batches = fixed_shape_plan(features, tagger.pad_to_multiple_of, rows, tokens)
    lap("plan")
    word_ids, scores = predict_word_scores(tagger.runtime, features, batches, tagger.tokenizer.pad_token_id,
                                           pad_to_multiple_of=tagger.pad_to_multiple_of)
    lap("passes")
    merged = merge_predictions(examples, word_ids, scores)
    lap("merge")
    tags, probs = tagger.decoder(merged)
    lap("decode")
    results = [text_result(t, p, w, text) for text, w, t, p in zip(texts, split, tags, probs)]
    lap("entities")
    seconds["forward only"] = forward_only(tagger, features, batches)
    seconds["windows"], seconds["forwards"] = len(features), len(batches)
    return seconds, results


def forward_only(tagger, features, batches) -> float:
    """Seconds of the runtime's passes alone over the same batches, collated beforehand."""
    from ner.data.encode import collate

    collated = [collate([features[i] for i in indices], tagger.tokenizer.pad_token_id, tagger.pad_to_multiple_of)
                for indices in batches]
    start = time.perf_counter()
    for _ in tagger.runtime.map(iter(collated)):
        pass
    return time.perf_counter() - start


def child(runtime: str, model_dir: Path, conll: Path, limit: int | None, profile: int) -> dict:
    from ner.inference.tagger import Tagger

    texts = sentence_texts(conll, limit)[0]
    tagger = Tagger(model_dir, runtime=runtime)
    tagger.predict(texts[:32])
    start = time.perf_counter()
    expected = tagger.predict(texts)
    whole = time.perf_counter() - start
    seconds, results = timed_predict(tagger, texts)
    if results != expected:
        raise SystemExit(f"{runtime}: the phases gave other answers than Tagger.predict")
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        tagger.predict(texts)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
    return {"runtime": runtime, "precision": tagger.precision, "texts": len(texts), "predict": whole, **seconds}


def print_table(rows: list[dict]) -> None:
    print(f"CPU: {cpu_description()}; {rows[0]['texts']:,} texts; seconds (share of the phases' sum)\n")
    print("Main thread's CPU seconds per phase (thread_time: what other processes on the machine cannot inflate; "
          "the passes' own threads are not in it)\n")
    print("| runtime | " + " | ".join(PHASES) + " |\n|---|" + "---:|" * len(PHASES))
    for r in rows:
        print(f"| {r['runtime']} | " + " | ".join(f"{r[p + ' cpu']:.2f}" for p in PHASES) + " |")
    print("\nWall seconds per phase\n")
    print("| runtime | precision | Tagger.predict s | " + " | ".join(PHASES) + " | forward only | "
          "Python around the forwards | windows / forwards |")
    print("|---|---|---:|" + "---:|" * (len(PHASES) + 3))
    for r in rows:
        total = sum(r[p] for p in PHASES)
        python = total - r["forward only"]
        cells = " | ".join(f"{r[p]:.2f} ({r[p] / total:.0%})" for p in PHASES)
        print(f"| {r['runtime']} | {r['precision']} | {r['predict']:.2f} | {cells} | {r['forward only']:.2f} "
              f"({r['forward only'] / total:.0%}) | {python:.2f} ({python / total:.0%}) | "
              f"{r['windows']:,} / {r['forwards']:,} |")


def main(argv: list[str] | None = None) -> int:
    from ner.inference.runtimes import RUNTIMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported folder with the runtimes' files")
    parser.add_argument("conll", type=Path, help="CoNLL file: each sentence detokenised into one text")
    parser.add_argument("--limit", type=int, default=3000, help="first N sentences")
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions (stderr)")
    parser.add_argument("--child", choices=RUNTIMES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model_dir, args.conll, args.limit, args.profile)))
        return 0
    rows = []
    for runtime in args.runtimes:
        command = [sys.executable, "-m", "benchmarks.inference_phases", str(args.model_dir.resolve()),
                   str(args.conll.resolve()), "--limit", str(args.limit), "--child", runtime,
                   "--profile", str(args.profile)]
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
