"""Throughput benchmark: the canonical `run_ner_no_trainer.py` loop vs this project's default path.

    python scripts/bench.py --sentences 3000 --out bench_out/                 # baseline vs default (~3 min, idle)
    python scripts/bench.py --sentences 3000 --out bench_out/ --inference     # + sentences/s of evaluate / predict
    python scripts/bench.py --sentences 3000 --out bench_out/ --ablations     # + one technique changed at a time
    python scripts/bench.py --sentences 3000 --out bench_out/ --scaling       # + 1 proc x 2 threads vs 2 gloo x 1
    python scripts/bench.py --out bench_out/ --no-main --full-memory          # peak RSS, one full-train-set epoch
    python scripts/bench.py --sentences 3000 --out bench_out/ --threads 1     # steadier when the CPUs are shared
    python scripts/bench.py --sentences 200 --valid-sentences 100 --out /tmp/bench_smoke   # smoke test

One process run trains one epoch over the first `--sentences` sentences of CoNLL-2003 train with the
packaged MiniLM, twice, each in its own subprocess (same threads, slice and seed):
(a) baseline, written here the way transformers' run_ner_no_trainer.py does it: random shuffle,
    DataCollatorForTokenClassification padding per batch of 32 sentences, fp32, torch.optim.AdamW
    lr 5e-5 (no-decay groups, weight decay 0.0), linear schedule without warmup;
(b) `python -m ner.train ... --num-epochs 1` with the project's defaults (read back from
    OUTPUT_DIR/final/training_args.json), plus `--logging-steps 1` so every update is timestamped.
Both are scored with seqeval on the first `--valid-sentences` validation sentences.

Times: "process s" is the whole subprocess (startup, tokenisation, training, evaluation, saving), what
a user pays; "loop s" is the training loop from the end of update 1 to the end of the last update
(update 1 holds one-off warm-up costs), measured identically in both runs from per-update timestamps.
Peak RSS is the kernel's high-water mark of the largest process (wait4); "all procs" polls their sum.
Model FLOPs per sentence of width S: 6 x P x S + 12 x layers x hidden x S^2 (P: parameters in matmuls;
embeddings excluded, they are lookups); MFU is on *computed* (padded) tokens against the matmul peak of
the run's dtype (on CPU: one core's rate in thread CPU time x threads, so shared CPUs do not lower it).
"other load" is the share of the machine's CPU time other processes took during a run: above a few
percent, timings are not comparable (2-thread PyTorch slows down several times on oversubscribed cores).
Writes OUT/bench.json (every number) and OUT/bench.md (the tables); sections from earlier runs in the
same OUT are kept, so `--no-main --inference` adds to a previous run's report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONLL_DIR = ROOT.parent / "shared" / "data" / "conll2003"
IGNORE_INDEX = -100
ABLATIONS = {  # name -> flags that change one technique (run (b) again with them)
    "default, warm tokenisation cache": [],
    "no tokenisation cache": ["--tokenization-cache", "none"],
    "no length batching (--max-tokens 0)": ["--max-tokens", "0"],
    "widths not rounded (--pad-to-multiple-of 1)": ["--pad-to-multiple-of", "1"],
    "fp32 (--mixed-precision no)": ["--mixed-precision", "no"],
    "for-loop AdamW": ["--optimizer-impl", "for-loop"],
    "foreach AdamW": ["--optimizer-impl", "foreach"],
    "SDPA attention": ["--attn-implementation", "sdpa"],
    "batches of 16 sentences (the earlier default)": ["--batch-size", "16"],
}

# --------------------------------------------------------------------------- data slices


def read_conll_sentences(path: Path, limit: int | None = None) -> list[list[tuple[str, str]]]:
    """(word, tag) sentences of a CoNLL file (word first, tag last), -DOCSTART- skipped."""
    sentences: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            columns = line.split()
            if not columns:
                if current:
                    sentences.append(current)
                    current = []
                    if limit is not None and len(sentences) >= limit:
                        return sentences
                continue
            if columns[0] != "-DOCSTART-":
                current.append((columns[0], columns[-1]))
    if current and (limit is None or len(sentences) < limit):
        sentences.append(current)
    return sentences


def write_conll(sentences: list[list[tuple[str, str]]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in sentences) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- arithmetic


def matmul_params(hidden: int, layers: int, intermediate: int, num_labels: int) -> int:
    """Weights that take part in matmuls per token: Q, K, V, O, the two FFN ones, and the head."""
    return layers * (4 * hidden * hidden + 2 * hidden * intermediate) + hidden * num_labels


def train_flops(widths: list[int], rows: list[int], params: int, layers: int, hidden: int) -> float:
    """Forward + backward FLOPs of batches of rows x width tokens: 6PT plus attention 12 L d S^2 per row."""
    return float(sum(r * (6 * params * w + 12 * layers * hidden * w * w) for w, r in zip(widths, rows, strict=True)))


def padding_efficiency(real_tokens: int, computed_tokens: int) -> float:
    return real_tokens / computed_tokens if computed_tokens else 0.0


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    return flops / seconds / peak_flops_per_s if seconds > 0 and peak_flops_per_s > 0 else 0.0


def loop_window(step_times: list[float]) -> tuple[int, int, float]:
    """(first, last) update index (0-based, inclusive) and seconds of the timed loop: updates 2..N."""
    if len(step_times) < 2:
        return 0, len(step_times) - 1, 0.0
    return 1, len(step_times) - 1, step_times[-1] - step_times[0]


def group_steps(batches: list[dict], per_update: int) -> list[list[dict]]:
    """Consecutive micro-batches of the global plan that make one update (world size x accumulation)."""
    return [batches[i:i + per_update] for i in range(0, len(batches), per_update)]


def summarise_loop(steps: list[list[dict]], step_times: list[float], model_shape: dict, peak: float) -> dict:
    """Tokens, padding and FLOPs of the timed updates (2..N); each batch dict has rows, width, lengths."""
    first, last, seconds = loop_window(step_times)
    timed = [b for step in steps[first:last + 1] for b in step]
    every = [b for step in steps for b in step]
    real = sum(sum(b["lengths"]) for b in timed)
    computed = sum(b["rows"] * b["width"] for b in timed)
    p, layers, hidden = model_shape["matmul_params"], model_shape["layers"], model_shape["hidden"]
    flops_computed = train_flops([b["width"] for b in timed], [b["rows"] for b in timed], p, layers, hidden)
    flops_real = sum(train_flops(b["lengths"], [1] * len(b["lengths"]), p, layers, hidden) for b in timed)
    return {
        "steps": len(steps), "timed_steps": max(last - first + 1, 0), "loop_s": seconds,
        "real_tokens_epoch": sum(sum(b["lengths"]) for b in every),
        "computed_tokens_epoch": sum(b["rows"] * b["width"] for b in every),
        "padding_efficiency": padding_efficiency(sum(sum(b["lengths"]) for b in every),
                                                 sum(b["rows"] * b["width"] for b in every)),
        "loop_real_tokens_per_s": real / seconds if seconds else 0.0,
        "loop_computed_tokens_per_s": computed / seconds if seconds else 0.0,
        "mfu_computed": mfu(flops_computed, seconds, peak), "mfu_real": mfu(flops_real, seconds, peak),
        "model_tflops_per_s": flops_computed / seconds / 1e12 if seconds else 0.0,
    }


def ratio(new: float | None, old: float | None) -> float | None:
    return new / old if new and old else None


# --------------------------------------------------------------------------- rendering


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """Pipe table; numbers right-aligned, text left-aligned (decided by the first row)."""
    def cell(value) -> str:
        if value is None:
            return "-"
        return f"{value:,.2f}" if isinstance(value, float) else str(value)

    sample = [cell(v).rstrip("%x").replace(",", "") for v in (rows[0] if rows else [""] * len(headers))]
    align = ["---:" if v.replace(".", "", 1).lstrip("+-").isdigit() else "---" for v in sample]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


def main_table(runs: dict[str, dict]) -> str:
    headers = ["run", "process s", "process CPU s", "loop s (upd. 2..N)", "loop real tok/s", "process real tok/s",
               "padding eff.", "updates", "peak RSS GB", "all procs RSS GB", "val F1", "MFU (computed)", "MFU (real)",
               "precision", "other load"]
    rows = []
    for name, r in runs.items():
        star = "*" if r.get("eval_added_s") else ""
        rows.append([name + star, fmt(process_seconds(r), ".1f"), fmt(r.get("cpu_s"), ".1f"),
                     fmt(r.get("loop_s"), ".1f"),
                     fmt(r.get("loop_real_tokens_per_s"), ",.0f"), fmt(r.get("process_real_tokens_per_s"), ",.0f"),
                     fmt(r.get("padding_efficiency"), ".1f", 100, "%"), str(r.get("steps", "-")),
                     fmt(r.get("peak_rss_bytes"), ".2f", 1e-9), fmt(r.get("peak_tree_rss_bytes"), ".2f", 1e-9),
                     fmt(r.get("f1"), ".2f", 100),
                     fmt(r.get("mfu_computed"), ".1f", 100, "%"), fmt(r.get("mfu_real"), ".1f", 100, "%"),
                     r.get("precision", "-"), fmt(contention(r), ".0f", 100, "%")])
    return markdown_table(headers, rows)


def ratio_rows(ours: dict, base: dict) -> dict:
    return {"process speed-up (baseline s / ours s)": ratio(process_seconds(base), process_seconds(ours)),
            "process CPU-time ratio (baseline / ours)": ratio(base.get("cpu_s"), ours.get("cpu_s")),
            "loop speed-up (baseline s / ours s)": ratio(base.get("loop_s"), ours.get("loop_s")),
            "loop real tokens/s ratio": ratio(ours.get("loop_real_tokens_per_s"), base.get("loop_real_tokens_per_s")),
            "process real tokens/s ratio": ratio(ours.get("process_real_tokens_per_s"),
                                                 base.get("process_real_tokens_per_s")),
            "peak RSS ratio": ratio(ours.get("peak_rss_bytes"), base.get("peak_rss_bytes")),
            "F1 difference (points)": (ours["f1"] - base["f1"]) * 100 if "f1" in ours and "f1" in base else None}


def targets(main: dict, ablations: dict | None) -> list[list[str]]:
    ratios, ours, base = main["ratios"], main["runs"]["ours (default)"], main["runs"]["baseline"]
    rows = []
    for key in ("process speed-up (baseline s / ours s)", "loop speed-up (baseline s / ours s)"):
        value = ratios.get(key)
        rows.append([f"{key} >= 3x", fmt(value, ".2f", suffix="x"), verdict(value is not None and value >= 3)])
    diff = ratios.get("F1 difference (points)")
    measured = f"{fmt(ours.get('f1'), '.2f', 100)} vs {fmt(base.get('f1'), '.2f', 100)}"
    rows.append(["ours F1 >= baseline F1 - 0.5", measured, verdict(diff is not None and diff >= -0.5)])
    fp32 = (ablations or {}).get("fp32 (--mixed-precision no)")
    reference = (ablations or {}).get("default, warm tokenisation cache")
    if fp32 and reference and "f1" in fp32 and "f1" in reference:
        gap = (reference["f1"] - fp32["f1"]) * 100
        rows.append(["bf16 F1 within 0.5 of fp32", f"{gap:+.2f} points", verdict(abs(gap) <= 0.5)])
    return rows


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render_report(report: dict) -> str:
    parts = [f"# Benchmark ({report.get('device', '?')}, torch {report.get('torch', '?')}, "
             f"{report.get('threads', '?')} threads)"]
    if "peak" in report:
        peak = report["peak"]
        rows = [[dtype, peak[f"{dtype}_flops_per_s"] / 1e12, peak.get(f"{dtype}_wall_flops_per_s", 0.0) / 1e12]
                for dtype in ("fp32", "bf16")]
        parts += ["## Matmul peak (the MFU denominator: one core's rate in thread CPU time x threads)",
                  markdown_table(["dtype", "peak TFLOP/s", "wall-clock TFLOP/s, all threads"], rows)]
    if "main" in report:
        main = report["main"]
        parts += [f"## One epoch, {main['train_sentences']} train sentences, F1 on {main['valid_sentences']} "
                  "validation sentences", main_table(main["runs"]),
                  markdown_table(["ratio", "value"], [[k, fmt(v, ".2f")] for k, v in main["ratios"].items()]),
                  "### Targets", markdown_table(["target", "measured", "result"],
                                                targets(main, report.get("ablations"))),
                  "### Settings", markdown_table(["setting", "baseline", "ours"], main["settings"])]
    if "ablations" in report:
        parts += ["## Ablations (run (b) again with one setting changed)", ablation_table(report["ablations"])]
    if "inference" in report:
        parts += ["## Inference, sentences/s", inference_table(report["inference"])]
    if "scaling" in report:
        parts += ["## Scaling on this machine", main_table(report["scaling"]),
                  "Both with the same explicit `--mixed-precision` (accelerate_configs/cpu_ddp.yaml says \"no\", "
                  "which `auto` would follow). Two ranks take one micro-batch each per update, so the 2-process "
                  "run makes half the updates (global batch 2x): its F1 is not a like-for-like comparison."]
    if "full_memory" in report:
        parts += ["## Full train set, memory", main_table({"full train set": report["full_memory"]}),
                  report["full_memory"].get("note", "")]
    if any(r.get("eval_added_s") for r in all_runs(report)):
        parts.append("\\* The run wrote no validation score (no evaluation after its last update), so the bench "
                     "scored its export with the trainer's evaluation code and added that time to `process s`.")
    busy = [r for r in all_runs(report) if contention(r) > 0.05]
    if busy:
        parts.append(f"**Warning:** other processes used more than 5% of the CPUs during {len(busy)} run(s) "
                     "(`other load`); with 2 threads per process an oversubscribed CPU slows PyTorch by several "
                     "times, so those timings are not comparable. Rerun on an idle machine.")
    parts.append("`process s`: the whole subprocess, what a user pays. `loop s`: end of update 1 to end of the "
                 "last update. MFU on computed (padded) tokens vs the matmul peak of the run's dtype; "
                 "`MFU (real)` counts only real tokens' FLOPs. CPU s: user + system time of the process tree.")
    return "\n\n".join(parts) + "\n"


def all_runs(report: dict) -> list[dict]:
    runs = list(report.get("main", {}).get("runs", {}).values())
    runs += list(report.get("ablations", {}).values()) + list(report.get("scaling", {}).values())
    return runs + ([report["full_memory"]] if "full_memory" in report else [])


def ablation_table(ablations: dict) -> str:
    reference = ablations.get("default, warm tokenisation cache", {})
    rows = []
    for name, r in ablations.items():
        speed = ratio(r.get("loop_real_tokens_per_s"), reference.get("loop_real_tokens_per_s"))
        star = "*" if r.get("eval_added_s") else ""
        rows.append([name + star, fmt(process_seconds(r), ".1f"), fmt(r.get("loop_s"), ".1f"),
                     fmt(r.get("loop_real_tokens_per_s"), ",.0f"), fmt(speed, ".2f", 1, "x"),
                     fmt(ratio(process_seconds(r), process_seconds(reference)), ".2f", 1, "x"),
                     fmt(ratio(r.get("cpu_s"), reference.get("cpu_s")), ".2f", 1, "x"),
                     fmt(r.get("padding_efficiency"), ".1f", 100, "%"), str(r.get("steps", "-")),
                     fmt(r.get("f1"), ".2f", 100), fmt(r.get("mfu_computed"), ".1f", 100, "%"),
                     fmt(contention(r), ".0f", 100, "%")])
    return markdown_table(["run", "process s", "loop s", "loop real tok/s", "loop tok/s vs default",
                           "process s vs default", "CPU s vs default", "padding eff.", "updates", "val F1", "MFU",
                           "other load"], rows)


def inference_table(inference: dict) -> str:
    reference = inference.get("one sentence at a time (HF model, fp32)", {}).get("sentences_per_s")
    rows = [[name, fmt(r.get("seconds"), ".2f"), fmt(r.get("sentences_per_s"), ",.1f"),
             fmt(ratio(r.get("sentences_per_s"), reference), ".2f", 1, "x"), fmt(r.get("f1"), ".2f", 100)]
            for name, r in inference.items()]
    return markdown_table(["path", "seconds", "sentences/s", "vs one at a time", "val F1"], rows)


# --------------------------------------------------------------------------- measurement


def measure_peak_flops(device, threads: int, size: int = 4096, reps: int = 3) -> dict:
    """Matmul FLOP/s in fp32 and bf16: `<dtype>_flops_per_s` is the peak MFU is measured against.

    On CPU that peak is one core's rate, timed in thread CPU time (so other jobs sharing the
    machine do not lower it), times `threads`; the wall-clock rate with `threads` is kept beside it.
    """
    import torch

    result = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        wall = best_matmul_time(device, dtype, size, reps, time.perf_counter)
        result[f"{name}_wall_flops_per_s"] = 2 * size ** 3 / wall
        if device.type == "cpu":
            previous = torch.get_num_threads()
            torch.set_num_threads(1)
            per_core = 2 * (size // 2) ** 3 / best_matmul_time(device, dtype, size // 2, reps, time.thread_time)
            torch.set_num_threads(previous)
            result[f"{name}_flops_per_s"] = per_core * threads
        else:
            result[f"{name}_flops_per_s"] = result[f"{name}_wall_flops_per_s"]
    return result


def best_matmul_time(device, dtype, size: int, reps: int, clock) -> float:
    """Best of `reps` timings of one size^3 matmul by `clock`, after one warm-up."""
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for rep in range(reps + 1):
        synchronize(device)
        start = clock()
        torch.mm(a, b)
        synchronize(device)
        if rep:
            best = min(best, clock() - start)
    return best


def synchronize(device) -> None:
    import torch

    if device.type != "cpu":
        torch.accelerator.synchronize()


def pick_device():
    import torch

    return torch.accelerator.current_accelerator() or torch.device("cpu")


class PeakTreeRss:
    """Polls the summed RSS of a process and its descendants (for multi-process runs)."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s, self.peak = pid, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                total = 0
                for proc in procs:
                    try:
                        total += proc.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_measured(argv: list[str], log_path: Path, env: dict | None = None) -> dict:
    """Run a command; wall seconds, exit code, peak RSS of its largest process, polled tree peak."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    busy_before = busy_cpu_seconds()
    with open(log_path, "w", encoding="utf-8") as log:
        start_time, start = time.time(), time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        poller = PeakTreeRss(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    tree_peak = poller.stop()
    cpu_s = usage.ru_utime + usage.ru_stime
    result = {"wall_s": wall, "returncode": proc.returncode, "start_time": start_time, "cpu_s": cpu_s,
              "other_cpu_s": max(busy_cpu_seconds() - busy_before - cpu_s, 0.0),
              "peak_rss_bytes": usage.ru_maxrss * 1024, "peak_tree_rss_bytes": max(tree_peak, usage.ru_maxrss * 1024)}
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}); end of {log_path}:\n{tail}")
    return result


def busy_cpu_seconds() -> float:
    """CPU seconds this machine has spent busy (all processes): to see what else ran during a run."""
    import psutil

    times = psutil.cpu_times()
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


def contention(run: dict) -> float:
    """Share of the machine's CPU time (cores x wall) taken by *other* processes during a run."""
    return run.get("other_cpu_s", 0.0) / ((os.cpu_count() or 1) * run["wall_s"]) if run.get("wall_s") else 0.0


def model_shape(model_dir: str, num_labels: int) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    return {"hidden": hidden, "layers": layers,
            "matmul_params": matmul_params(hidden, layers, config["intermediate_size"], num_labels)}


# --------------------------------------------------------------------------- (a) baseline, in its own process


def baseline_features(tokenizer, sentences, label2id: dict[str, int], max_length: int) -> list[dict]:
    """run_ner_no_trainer's tokenize_and_align_labels: first subword labelled, -100 elsewhere."""
    encoded = tokenizer([[w for w, _ in s] for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    features = []
    for i, sentence in enumerate(sentences):
        labels, previous = [], None
        for word_id in encoded.word_ids(i):
            labels.append(IGNORE_INDEX if word_id is None or word_id == previous else label2id[sentence[word_id][1]])
            previous = word_id
        features.append({**{k: encoded[k][i] for k in encoded.keys()}, "labels": labels})
    return features


def baseline_train(model, loader, optimizer, scheduler, device) -> tuple[list[float], list[dict]]:
    """The canonical loop; returns each update's end time and its batch shape."""
    model.train()
    step_times, batches = [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        synchronize(device)
        step_times.append(time.time())
        mask = batch["attention_mask"]
        batches.append({"rows": int(mask.shape[0]), "width": int(mask.shape[1]), "lengths": mask.sum(1).tolist()})
    return step_times, batches


def baseline_evaluate(model, tokenizer, sentences, label2id: dict[str, int], device, batch_size: int = 8) -> dict:
    """run_ner_no_trainer's evaluation (batches of 8, collator); words lost to truncation count as O."""
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForTokenClassification

    from ner.metrics import entity_scores

    id2label = {i: label for label, i in label2id.items()}
    features = baseline_features(tokenizer, sentences, label2id, 128)
    loader = DataLoader(features, batch_size=batch_size, collate_fn=DataCollatorForTokenClassification(tokenizer))
    model.eval()
    predicted = []
    start = time.perf_counter()
    with torch.no_grad():
        for batch in loader:
            logits = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"}).logits
            for row_pred, row_gold in zip(logits.argmax(-1).tolist(), batch["labels"].tolist(), strict=True):
                predicted.append([id2label[p] for p, g in zip(row_pred, row_gold, strict=True) if g != IGNORE_INDEX])
    seconds = time.perf_counter() - start
    gold = [[t for _, t in s] for s in sentences]
    padded = [p + ["O"] * (len(g) - len(p)) for p, g in zip(predicted, gold, strict=True)]
    truncated = sum(len(p) < len(g) for p, g in zip(predicted, gold, strict=True))
    return {"scores": entity_scores(gold, padded), "eval_s": seconds, "truncated_sentences": truncated}


def run_baseline(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import DataLoader
    from transformers import (
        AutoConfig,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        get_scheduler,
        set_seed,
    )

    from ner.model import resolve_model_path

    set_seed(args.seed)
    device = pick_device()
    path = resolve_model_path(args.model)
    start = time.perf_counter()
    train = read_conll_sentences(args.train_file)
    valid = read_conll_sentences(args.validation_file)
    label_list = sorted({t for s in train for _, t in s})
    label2id = {label: i for i, label in enumerate(label_list)}
    tokenizer = AutoTokenizer.from_pretrained(path)
    features = baseline_features(tokenizer, train, label2id, 128)
    config = AutoConfig.from_pretrained(path, num_labels=len(label_list), id2label=dict(enumerate(label_list)),
                                        label2id=label2id)
    model = AutoModelForTokenClassification.from_pretrained(path, config=config).to(device)
    loader = DataLoader(features, shuffle=True, collate_fn=DataCollatorForTokenClassification(tokenizer),
                        batch_size=args.batch_size)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": args.weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=len(loader))
    prep_s = time.perf_counter() - start
    step_times, batches = baseline_train(model, loader, optimizer, scheduler, device)
    evaluation = baseline_evaluate(model, tokenizer, valid, label2id, device)
    model.save_pretrained(args.result.parent / "baseline_model")
    tokenizer.save_pretrained(args.result.parent / "baseline_model")
    result = {"step_times": step_times, "batches": batches, "prep_s": prep_s, "f1": evaluation["scores"]["f1"],
              "scores": evaluation["scores"], "eval_s": evaluation["eval_s"], "threads": torch.get_num_threads(),
              "truncated_valid_sentences": evaluation["truncated_sentences"], "label_list": label_list,
              "attn_implementation": model.config._attn_implementation, "device": str(device),
              "optimizer_foreach": optimizer.defaults.get("foreach"),
              "optimizer_fused": optimizer.defaults.get("fused")}
    args.result.write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- (b) the project's path


def ner_train_argv(train: Path, valid: Path | None, out_dir: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "ner.train", "--train-file", str(train), "--output-dir", str(out_dir),
            "--quiet", "--logging-steps", "1", *extra]
    return argv + (["--validation-file", str(valid)] if valid else [])


def project_plan(train_file: Path, training_args: dict, world_size: int) -> list[list[dict]]:
    """The project's epoch-0 plan, rebuilt with its own encoder and sampler: updates of batch shapes."""
    from ner.batching import TokenBudgetBatchSampler
    from ner.data import build_label_list, read_conll
    from ner.encode import encode_examples, padded_lengths
    from ner.model import load_tokenizer

    examples = read_conll(train_file)
    label_list = build_label_list(examples)
    label2id = {t: i for i, t in enumerate(label_list)}
    features = encode_examples(examples, load_tokenizer(training_args["model"]), label2id,
                               training_args["max_seq_length"], training_args["window_stride_words"],
                               training_args["label_all_subwords"])
    lengths = [len(f.input_ids) for f in features]
    multiple = training_args.get("pad_to_multiple_of", 1)
    widths = padded_lengths(features, multiple)  # what collate pads each batch to
    sampler = TokenBudgetBatchSampler(widths, training_args["batch_size"], training_args["max_tokens"],
                                      training_args["seed"], shuffle=True, num_replicas=world_size)
    batches = [{"rows": len(b), "width": max(widths[i] for i in b), "lengths": [lengths[i] for i in b]}
               for b in sampler.plan(0)]
    return group_steps(batches, world_size * training_args["gradient_accumulation_steps"])


def read_step_times(metrics_path: Path) -> list[float]:
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return [r["time"] for r in records if "loss" in r]


def run_project(name: str, train: Path, valid: Path | None, work: Path, extra: list[str], shape: dict,
                peaks: dict, launcher: list[str] | None = None, env: dict | None = None,
                world_size: int = 1) -> dict:
    """Train with `python -m ner.train` (or `launcher`), then summarise from its own files."""
    from ner.backends import resolve_precision

    out_dir = work / "runs" / name
    shutil.rmtree(out_dir, ignore_errors=True)
    argv = ner_train_argv(train, valid, out_dir, *extra)
    if launcher:
        argv = [*launcher, "ner/train.py", *argv[3:]]
    measured = run_measured(argv, work / "logs" / f"{name}.log", env)
    training_args = json.loads((out_dir / "final" / "training_args.json").read_text())
    metrics = json.loads((out_dir / "final" / "metrics.json").read_text())
    precision = resolve_precision(training_args["mixed_precision"], pick_device())
    steps = project_plan(train, training_args, world_size)[:metrics["global_step"]]
    step_times = read_step_times(out_dir / "metrics.jsonl")
    loop = summarise_loop(steps, step_times, shape, peak_for(peaks, precision))
    validation = metrics.get("validation") or {}
    if not validation and valid is not None:
        validation = score_export(out_dir / "final", valid)
    return {**measured, **loop, "f1": validation.get("f1"), "precision": precision, "command": " ".join(argv),
            "eval_added_s": validation.get("eval_added_s", 0.0),
            "process_real_tokens_per_s": loop["real_tokens_epoch"] / (measured["wall_s"] +
                                                                     validation.get("eval_added_s", 0.0)),
            "before_loop_s": step_times[0] - measured["start_time"] if step_times else None,
            "training_args": {k: training_args[k] for k in sorted(training_args) if k != "versions"}}


def score_export(model_dir: Path, valid: Path) -> dict:
    """The run wrote no validation score: score its export with the trainer's own evaluation code."""
    from ner.data import read_conll
    from ner.predict import Tagger

    start = time.perf_counter()
    result = timed_evaluate(Tagger(model_dir), read_conll(valid))
    return {"f1": result["f1"], "eval_added_s": time.perf_counter() - start}


def process_seconds(run: dict) -> float | None:
    """Subprocess wall time, plus the evaluation the bench had to add when the run skipped it."""
    return run["wall_s"] + run.get("eval_added_s", 0.0) if "wall_s" in run else None


def peak_for(peaks: dict, precision: str) -> float:
    return peaks["bf16_flops_per_s"] if precision == "bf16" else peaks["fp32_flops_per_s"]


# --------------------------------------------------------------------------- sections


def prepare_slices(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    train = write_conll(read_conll_sentences(args.conll_dir / "train.txt", args.sentences), work / "train.conll")
    valid = write_conll(read_conll_sentences(args.conll_dir / "valid.txt", args.valid_sentences), work / "valid.conll")
    return train, valid


def main_section(args: argparse.Namespace, work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    result_path = work / "runs" / "baseline" / "result.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--run-baseline", "--train-file", str(train),
            "--validation-file", str(valid), "--result", str(result_path), "--model", args.model]
    measured = run_measured(argv, work / "logs" / "baseline.log")
    inner = json.loads(result_path.read_text())
    steps = [[b] for b in inner["batches"]]
    loop = summarise_loop(steps, inner["step_times"], shape, peaks["fp32_flops_per_s"])
    baseline = {**measured, **loop, "f1": inner["f1"], "precision": "fp32", "command": " ".join(argv),
                "process_real_tokens_per_s": loop["real_tokens_epoch"] / measured["wall_s"],
                "before_loop_s": inner["step_times"][0] - measured["start_time"],
                **{k: inner[k] for k in ("eval_s", "truncated_valid_sentences", "attn_implementation", "threads",
                                         "optimizer_foreach", "optimizer_fused", "device")}}
    shutil.rmtree(work / "cache", ignore_errors=True)  # the default run starts cold, as a first run does
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


def ablation_section(work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    results = {}
    for index, (name, flags) in enumerate(ABLATIONS.items()):
        cache = [] if "--tokenization-cache" in flags else ["--tokenization-cache", str(work / "cache")]
        results[name] = run_project(f"ablation_{index}", train, valid, work, ["--num-epochs", "1", *cache, *flags],
                                    shape, peaks)
        print(f"  {name}: {results[name]['wall_s']:.1f} s, F1 {results[name]['f1']}", flush=True)
    return results


def scaling_section(work: Path, train: Path, valid: Path, shape: dict, peaks: dict) -> dict:
    from ner.backends import resolve_precision

    precision = resolve_precision("auto", pick_device())
    # Explicit precision: cpu_ddp.yaml sets mixed_precision "no", which `auto` would otherwise follow.
    common = ["--num-epochs", "1", "--tokenization-cache", str(work / "cache"), "--mixed-precision", precision]
    one = run_project("scaling_1x2", train, valid, work, common, shape, peaks, env={"OMP_NUM_THREADS": "2"})
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "accelerate_configs" / "cpu_ddp.yaml")]
    two = run_project("scaling_2x1", train, valid, work, common, shape, peaks, launcher=launcher,
                      env={"OMP_NUM_THREADS": "1"}, world_size=2)
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
    from ner.data import read_conll
    from ner.predict import Tagger

    model_dir = work / "runs" / "ours" / "final"
    examples = read_conll(valid)
    results = {"one sentence at a time (HF model, fp32)": one_at_a_time_hf(model_dir, examples)}
    for precision in ("auto", "no"):
        tagger = Tagger(model_dir, precision=precision)
        label = f"ner.predict Tagger.tag, length-batched ({tagger.precision})"
        tagger.tag(examples[:64])
        results[label] = timed_tags(lambda t=tagger: t.tag(examples)[0], examples)
    tagger = Tagger(model_dir)
    results[f"ner.predict Tagger.tag, one sentence per call ({tagger.precision})"] = timed_tags(
        lambda: [tagger.tag([e])[0][0] for e in examples], examples)
    results[f"evaluation (ner.loop.evaluate, {tagger.precision})"] = timed_evaluate(tagger, examples)
    return results


def timed_tags(tag_all, examples) -> dict:
    from ner.metrics import entity_scores

    start = time.perf_counter()
    tags = tag_all()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences_per_s": len(examples) / seconds,
            "f1": entity_scores([e.tags for e in examples], tags)["f1"]}


def one_at_a_time_hf(model_dir: Path, examples) -> dict:
    """The usual hand loop: tokenise one sentence, forward in fp32, first subword's argmax."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval().to(pick_device())
    id2label = {int(k): v for k, v in model.config.id2label.items()}

    @torch.no_grad()
    def tag_all() -> list[list[str]]:
        out = []
        for example in examples:
            encoded = tokenizer(example.words, is_split_into_words=True, truncation=True, max_length=128,
                                return_tensors="pt")
            predicted = model(**encoded.to(model.device)).logits.argmax(-1)[0].tolist()
            tags, previous = ["O"] * len(example.words), None
            for position, word_id in enumerate(encoded.word_ids(0)):
                if word_id is not None and word_id != previous:
                    tags[word_id] = id2label[predicted[position]]
                previous = word_id
            out.append(tags)
        return out

    return timed_tags(tag_all, examples)


class _OneProcess:
    """The slice of the Backend protocol that ner.loop.evaluate uses, for one process."""

    num_processes, process_index = 1, 0

    def __init__(self, device, precision: str) -> None:
        from ner.backends import autocast_for

        self.device, self._autocast = device, lambda: autocast_for(device, precision)

    def autocast(self):
        return self._autocast()

    def unwrap_model(self, model):
        return model

    def gather_object(self, obj):
        return [obj]


def timed_evaluate(tagger, examples) -> dict:
    """The evaluation the trainer runs (batches of 2 x batch size / 2 x max tokens, as ner.run builds them)."""
    from ner.batching import inference_batches
    from ner.config import TrainConfig
    from ner.encode import encode_examples
    from ner.loop import EvalSet, evaluate

    defaults = TrainConfig()
    start = time.perf_counter()
    features = encode_examples(examples, tagger.tokenizer, tagger.label2id, defaults.max_seq_length)
    batches = inference_batches([len(f.input_ids) for f in features], defaults.batch_size * 2, defaults.max_tokens * 2)
    scores = evaluate(tagger.model, EvalSet(examples, features, batches), _OneProcess(tagger.device, tagger.precision),
                      tagger.tokenizer.pad_token_id, tagger.id2label, "iob2")
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences_per_s": len(examples) / seconds, "f1": scores["f1"]}


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
    parser.add_argument("--scaling", action="store_true", help="1 process x 2 threads vs 2 gloo processes x 1 thread")
    parser.add_argument("--full-memory", action="store_true", help="peak RSS with the full CoNLL train set")
    parser.add_argument("--full-memory-steps", type=int, default=0,
                        help="updates of the --full-memory run (default 0: one whole epoch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS for every run (default 0: torch's default, one per core); "
                             "1 keeps timings stable when other jobs share the CPUs")
    internal = parser.add_argument_group("internal (the baseline subprocess)")
    internal.add_argument("--run-baseline", action="store_true", help=argparse.SUPPRESS)
    internal.add_argument("--train-file", type=Path, help=argparse.SUPPRESS)
    internal.add_argument("--validation-file", type=Path, help=argparse.SUPPRESS)
    internal.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    internal.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    internal.add_argument("--batch-size", type=int, default=32, help=argparse.SUPPRESS)
    internal.add_argument("--learning-rate", type=float, default=5e-5, help=argparse.SUPPRESS)
    internal.add_argument("--weight-decay", type=float, default=0.0, help=argparse.SUPPRESS)
    return parser


def load_report(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(render_report(report), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run_baseline:
        return run_baseline(args)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch starts; inherited by every run
    import torch

    from ner.model import resolve_model_path

    work = args.out.resolve()
    report = load_report(work / "bench.json")
    device = pick_device()
    report.update(device=str(device), torch=torch.__version__, threads=torch.get_num_threads())
    print("measuring matmul peak ...", flush=True)
    peaks = report["peak"] = measure_peak_flops(device, torch.get_num_threads())
    train, valid = prepare_slices(args, work)
    num_labels = len({t for s in read_conll_sentences(train) for _, t in s})
    shape = model_shape(resolve_model_path(args.model), num_labels)
    if not args.no_main:
        print("baseline and default runs ...", flush=True)
        report["main"] = main_section(args, work, train, valid, shape, peaks)
        save_report(report, work)
    sections = [("ablations", args.ablations, lambda: ablation_section(work, train, valid, shape, peaks)),
                ("inference", args.inference, lambda: inference_section(work, valid)),
                ("scaling", args.scaling, lambda: scaling_section(work, train, valid, shape, peaks)),
                ("full_memory", args.full_memory, lambda: full_memory_section(args, work, shape, peaks))]
    for key, wanted, build in sections:
        if wanted:
            print(f"{key} ...", flush=True)
            report[key] = build()
            save_report(report, work)
    save_report(report, work)
    print((work / "bench.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
