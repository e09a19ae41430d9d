"""Throughput benchmark: the canonical `run_ner_no_trainer.py` loop vs this project's default path.

    python -m benchmarks.training_speed --sentences 3000 --out bench_out/              # baseline vs ours, ~3 min
    python -m benchmarks.training_speed --sentences 3000 --out bench_out/ --inference  # + evaluate / predict speed
    python -m benchmarks.training_speed --sentences 3000 --out bench_out/ --ablations  # + one technique changed
    python -m benchmarks.training_speed --sentences 3000 --out bench_out/ --ablations --ablations-matching compile
    python -m benchmarks.training_speed --sentences 3000 --out bench_out/ --scaling    # + 1 x 2 threads vs 2 gloo x 1
    python -m benchmarks.training_speed --out bench_out/ --no-main --full-memory       # peak RSS, full train set
    python -m benchmarks.training_speed --sentences 3000 --out bench_out/ --threads 1  # steadier on shared CPUs
    python -m benchmarks.training_speed --sentences 200 --valid-sentences 100 --out /tmp/bench_smoke  # smoke test

One process run trains one epoch over the first `--sentences` sentences of CoNLL-2003 train with the
packaged MiniLM, twice, each in its own subprocess (same threads, slice and seed):
(a) baseline, benchmarks/baseline.py, written the way transformers' run_ner_no_trainer.py does it:
    random shuffle, DataCollatorForTokenClassification padding per batch of 32 sentences, fp32,
    torch.optim.AdamW lr 5e-5 (no-decay groups, weight decay 0.0), linear schedule without warmup;
(b) `python -m ner.train ... --num-epochs 1` with the project's defaults (read back from
    OUTPUT_DIR/final/training_args.json), plus `--logging-steps 1` so every update is timestamped
    and its micro-batch shapes (rows, padded width, real tokens, every rank) are in metrics.jsonl.
Both are scored with seqeval on the first `--valid-sentences` validation sentences.

Times: "process s" is the whole subprocess (startup, tokenisation, training, evaluation, saving), what
a user pays; "loop s" is the training loop from the end of update 1 to the end of the last update
(update 1 holds one-off warm-up costs), measured identically in both runs from per-update timestamps.
Peak RSS is the kernel's high-water mark of the largest process (wait4); "all procs" polls their sum
(benchmarks/measure.py). Model FLOPs per sentence of width S: 6 x P x S + 12 x layers x hidden x S^2
(P: parameters in matmuls; embeddings excluded, they are lookups); MFU is on *computed* (padded) tokens
against the matmul peak of the run's dtype (on CPU: one core's rate in thread CPU time x threads, so
shared CPUs do not lower it; benchmarks/measure.py). "other load" is the share of the machine's CPU
time other processes took during a run: above a few percent, timings are not comparable (2-thread
PyTorch slows down several times on oversubscribed cores).
Writes OUT/bench.json (every number) and OUT/bench.md (the tables, benchmarks/report.py); sections
from earlier runs in the same OUT are kept, so `--no-main --inference` adds to a previous run's report.
OUT must be new, empty or one the benchmark wrote before; it replaces only folders it made and marked
(runs/NAME, cache: a `.made-by-benchmarks` file in each), so a folder of the user's is refused, never emptied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from functools import partial
from pathlib import Path

from benchmarks.eval_speed import measure_inference, score_export
from benchmarks.measure import (
    measure_peak_flops,
    model_shape,
    peak_for,
    run_measured,
    summarise_loop,
    updates_from_records,
)
from benchmarks.report import REFERENCE_ABLATION, load_report, ratio_rows, save_report
from ner.data.batching import NO_TOKEN_BUDGET
from ner.data.conll import read_conll, write_conll
from ner.data.tags import build_label_list
from ner.errors import UserError, cli

ROOT = Path(__file__).resolve().parents[1]
CONLL_DIR = ROOT.parent / "shared" / "data" / "conll2003"
MARKER = ".made-by-benchmarks"  # in every folder this benchmark made: the only folders it empties or replaces
ABLATIONS = {  # name -> flags that change one technique (run (b) again with them)
    REFERENCE_ABLATION: [],
    "no tokenisation cache": ["--tokenization-cache", "none"],
    f"no length batching (--max-tokens {NO_TOKEN_BUDGET})": ["--max-tokens", str(NO_TOKEN_BUDGET)],
    "widths not rounded (--pad-to-multiple-of 1)": ["--pad-to-multiple-of", "1"],
    "fp32 (--mixed-precision no)": ["--mixed-precision", "no"],
    "for-loop AdamW": ["--optimizer-impl", "for-loop"],
    "foreach AdamW": ["--optimizer-impl", "foreach"],
    "SDPA attention": ["--attn-implementation", "sdpa"],
    "batches of 16 sentences (the earlier default)": ["--batch-size", "16"],
    "compiled step (--compile on)": ["--compile", "on"],
}


def mark(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("made by python -m benchmarks.training_speed; its next run may replace this folder\n")
    return folder


def claim_out(out: Path) -> Path:
    """--out: a new or empty folder, or one this benchmark wrote before; a folder of the user's is refused."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out is a file (choose a folder)")
    ours = (out / MARKER).is_file() or (out / "bench.json").is_file()  # bench.json: written before markers
    if out.exists() and any(out.iterdir()) and not ours:
        raise UserError(f"{out}: --out holds files this benchmark did not write (choose a new or empty folder)")
    return mark(out)


def fresh_dir(folder: Path) -> Path:
    """An empty, marked folder; replaces only a folder an earlier run made and marked, never one of the user's."""
    if folder.exists():
        if not (folder / MARKER).is_file():
            raise UserError(f"{folder}: was not made by this benchmark, so it is not replaced (move it away, "
                            "or choose another --out)")
        shutil.rmtree(folder)
    return mark(folder)


def prepare_slices(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The first --sentences train and --valid-sentences validation sentences, as CoNLL files in `work`."""
    train = write_conll(work / "train.conll", read_conll(args.conll_dir / "train.txt")[:args.sentences])
    valid = write_conll(work / "valid.conll", read_conll(args.conll_dir / "valid.txt")[:args.valid_sentences])
    return train, valid


# --------------------------------------------------------------------------- (a) the baseline


def run_baseline(args: argparse.Namespace, work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    """benchmarks.baseline in its own process, measured, and summarised like the project's runs."""
    result_path = fresh_dir(work / "runs" / "baseline") / "result.json"
    argv = [sys.executable, "-m", "benchmarks.baseline", "--train-file", str(train),
            "--validation-file", str(valid), "--result", str(result_path), "--model", args.model]
    measured = run_measured(argv, work / "logs" / "baseline.log", cwd=ROOT)
    inner = json.loads(result_path.read_text())
    loop = summarise_loop(inner["steps"], inner["step_times"], shape, peaks["fp32_flops_per_s"])
    return {**measured, **loop, "f1": inner["f1"], "precision": "fp32", "command": " ".join(argv),
            "process_real_tokens_per_s": loop["real_tokens_epoch"] / measured["wall_s"],
            "before_loop_s": inner["step_times"][0] - measured["start_time"],
            **{k: inner[k] for k in ("eval_s", "truncated_valid_sentences", "attn_implementation", "threads",
                                     "optimizer_foreach", "optimizer_fused", "device")}}


# --------------------------------------------------------------------------- (b) the project's path


def ner_train_argv(train: Path, valid: Path | None, out_dir: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "ner.train", "--train-file", str(train), "--output-dir", str(out_dir),
            "--quiet", "--logging-steps", "1", *extra]
    return argv + (["--validation-file", str(valid)] if valid else [])


def read_records(metrics_path: Path) -> list[dict]:
    return [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]


def run_project(name: str, train: Path, valid: Path | None, work: Path, extra: list[str], shape: dict,
                peaks: dict, launcher: list[str] | None = None, env: dict | None = None) -> dict:
    """Train with `python -m ner.train` (or `launcher`), then summarise from the run's own files."""
    from ner.backends import default_device, resolve_precision

    out_dir = fresh_dir(work / "runs" / name)
    argv = ner_train_argv(train, valid, out_dir, *extra)
    if launcher:
        argv = [*launcher, "ner/train.py", *argv[3:]]
    measured = run_measured(argv, work / "logs" / f"{name}.log", cwd=ROOT, env=env)
    training_args = json.loads((out_dir / "final" / "training_args.json").read_text())
    metrics = json.loads((out_dir / "final" / "metrics.json").read_text())
    precision = resolve_precision(training_args["mixed_precision"], default_device())
    step_times, steps = updates_from_records(read_records(out_dir / "metrics.jsonl"))
    loop = summarise_loop(steps, step_times, shape, peak_for(peaks, precision))
    validation = metrics.get("validation") or {}
    if not validation and valid is not None:
        validation = score_export(out_dir / "final", read_conll(valid))
    process_s = measured["wall_s"] + validation.get("eval_added_s", 0.0)
    return {**measured, **loop, "f1": validation.get("f1"), "precision": precision, "command": " ".join(argv),
            "eval_added_s": validation.get("eval_added_s", 0.0),
            "process_real_tokens_per_s": loop["real_tokens_epoch"] / process_s,
            "before_loop_s": step_times[0] - measured["start_time"] if step_times else None,
            "training_args": {k: training_args[k] for k in sorted(training_args) if k != "versions"}}


# --------------------------------------------------------------------------- sections


def main_section(args: argparse.Namespace, work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    baseline = run_baseline(args, work, train, valid, shape, peaks)
    fresh_dir(work / "cache")  # the default run starts cold, as a first run does
    ours = run_project("ours", train, valid, work, ["--num-epochs", "1", "--tokenization-cache", str(work / "cache")],
                       shape, peaks)
    settings = settings_rows(baseline, ours["training_args"], ours["precision"])
    return {"train_sentences": args.sentences, "valid_sentences": args.valid_sentences,
            "runs": {"baseline": baseline, "ours (default)": ours}, "ratios": ratio_rows(ours, baseline),
            "settings": settings}


def settings_rows(baseline: dict, training_args: dict, precision: str) -> list[list[str]]:
    t = training_args
    optimizer = "foreach" if baseline.get("optimizer_foreach") else "fused" if baseline.get("optimizer_fused") else \
        "torch default (for-loop on CPU)"
    return [["batching", "shuffle, 32 sentences, pad to longest", f"token budget {t['max_tokens']} "
             f"(<= {t['batch_size']} sentences), length-bucketed, widths padded to a multiple of "
             f"{t.get('pad_to_multiple_of', 1)}"],
            ["precision", "fp32", precision], ["learning rate", "5e-05", str(t["learning_rate"])],
            ["warmup", "0", f"{t['warmup_ratio']} of updates"], ["schedule", "linear", t["lr_scheduler"]],
            ["weight decay", "0.0 (no-decay groups)", f"{t['weight_decay']} (no-decay groups)"],
            ["grad clipping", "none", str(t["max_grad_norm"])], ["AdamW", optimizer, t["optimizer_impl"]],
            ["attention", baseline.get("attn_implementation", "?"), t["attn_implementation"]],
            ["long sentences", "truncated at 128 subwords", f"windows of {t['max_seq_length']}"],
            ["seed", "42", str(t["seed"])], ["threads", str(baseline.get("threads")), "torch default"]]


def ablation_section(work: Path, train: Path, valid: Path, shape: dict, peaks: dict, matching: str = "") -> dict:
    """The reference, then each ablation whose name contains `matching` (all by default)."""
    results = {}
    for index, (name, flags) in enumerate(ABLATIONS.items()):
        if matching not in name and name != REFERENCE_ABLATION:
            continue
        cache = [] if "--tokenization-cache" in flags else ["--tokenization-cache", str(work / "cache")]
        results[name] = run_project(f"ablation_{index}", train, valid, work, ["--num-epochs", "1", *cache, *flags],
                                    shape, peaks)
        print(f"  {name}: {results[name]['wall_s']:.1f} s, F1 {results[name]['f1']}", flush=True)
    return results


def scaling_section(work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    from ner.backends import default_device, resolve_precision

    precision = resolve_precision("auto", default_device())
    # Explicit precision: cpu_ddp.yaml sets mixed_precision "no", which `auto` would otherwise follow.
    common = ["--num-epochs", "1", "--tokenization-cache", str(work / "cache"), "--mixed-precision", precision]
    one = run_project("scaling_1x2", train, valid, work, common, shape, peaks, env={"OMP_NUM_THREADS": "2"})
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "accelerate_configs" / "cpu_ddp.yaml")]
    two = run_project("scaling_2x1", train, valid, work, common, shape, peaks, launcher=launcher,
                      env={"OMP_NUM_THREADS": "1"})
    return {"1 process x 2 threads": one, "2 gloo processes x 1 thread": two}


def full_memory_section(args: argparse.Namespace, work: Path, shape: dict, peaks: dict) -> dict:
    steps = args.full_memory_steps
    budget = ["--max-steps", str(steps), "--eval-steps", str(steps)] if steps > 0 else ["--num-epochs", "1"]
    result = run_project("full_memory", args.conll_dir / "train.txt", args.conll_dir / "valid.txt", work,
                         [*budget, "--tokenization-cache", str(work / "cache")], shape, peaks)
    what = f"{steps} updates" if steps > 0 else "One epoch"
    result["note"] = (f"{what} on the full train set, then an evaluation of the full validation set, "
                      "checkpoint and export. Every sentence is read, tokenised and held; model, optimizer state "
                      "and one token-budget batch's activations are resident. A step-limited run undercounts: "
                      "RSS keeps growing while new batch shapes appear (allocator and kernel caches).")
    return result


def inference_section(work: Path, valid: Path) -> dict:
    return measure_inference(work / "runs" / "ours" / "final", read_conll(valid))


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=3000, help="train sentences in the slice (default: 3000)")
    parser.add_argument("--valid-sentences", type=int, default=1000, help="validation sentences scored (default: 1000)")
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="folder for bench.json / bench.md")
    parser.add_argument("--conll-dir", type=Path, default=CONLL_DIR, help="folder with train.txt and valid.txt")
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="encoder (packaged MiniLM)")
    parser.add_argument("--no-main", action="store_true", help="skip baseline vs default; reuse OUT's earlier run")
    parser.add_argument("--inference", action="store_true", help="sentences/s of evaluation and ner.predict")
    parser.add_argument("--ablations", action="store_true", help="rerun the default, one setting changed each time")
    parser.add_argument("--ablations-matching", default="", metavar="TEXT",
                        help="with --ablations, only those whose name contains TEXT (and the reference), "
                             "e.g. compile")
    parser.add_argument("--scaling", action="store_true", help="1 process x 2 threads vs 2 gloo processes x 1 thread")
    parser.add_argument("--full-memory", action="store_true", help="peak RSS with the full CoNLL train set")
    parser.add_argument("--full-memory-steps", type=int, default=0,
                        help="updates of the --full-memory run (default 0: one whole epoch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS for every run (default 0: torch's default, one per core); "
                             "1 keeps timings stable when other jobs share the CPUs")
    return parser


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = claim_out(args.out.resolve())
    if not (work / "cache").exists():
        mark(work / "cache")  # the tokenisation cache every run shares; main_section empties it
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch starts; inherited by every run
    import torch

    from ner.backends import default_device
    from ner.training.model import resolve_model_path

    report = load_report(work / "bench.json")
    device = default_device()
    report.update(device=str(device), torch=torch.__version__, threads=torch.get_num_threads())
    print("measuring matmul peak ...", flush=True)
    peaks = report["peak"] = measure_peak_flops(device, torch.get_num_threads())
    train, valid = prepare_slices(args, work)
    shape = model_shape(resolve_model_path(args.model), len(build_label_list(read_conll(train))))
    ablations = partial(ablation_section, work, train, valid, shape, peaks, args.ablations_matching)
    sections = [("main", not args.no_main, lambda: main_section(args, work, train, valid, shape, peaks)),
                ("ablations", args.ablations, ablations),
                ("inference", args.inference, lambda: inference_section(work, valid)),
                ("scaling", args.scaling, lambda: scaling_section(work, train, valid, shape, peaks)),
                ("full_memory", args.full_memory, lambda: full_memory_section(args, work, shape, peaks))]
    for key, wanted, build in sections:
        if wanted:
            print(f"{key} ...", flush=True)
            report[key] = build()
            save_report(report, work)  # after each section, so a later failure keeps what was measured
    save_report(report, work)
    print((work / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
