"""The benchmark's report: bench.json (every number) rendered as bench.md (the tables), merged across runs.

    from benchmarks.report import load_report, save_report
    report = load_report(out / "bench.json")   # sections of earlier runs in the same folder are kept
    report["inference"] = {...}
    save_report(report, out)                   # writes bench.json and bench.md

Sections, each optional: `peak` (matmul peak), `main` (baseline vs ours), `ablations`, `inference`,
`scaling`, `full_memory`. A run is a dict of measurements (see benchmarks/training_speed.py's run_project).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.measure import contention

REFERENCE_ABLATION = "default, warm tokenisation cache"
REFERENCE_INFERENCE = "one sentence at a time (HF model, fp32)"


def ratio(new: float | None, old: float | None) -> float | None:
    return new / old if new and old else None


def process_seconds(run: dict) -> float | None:
    """Subprocess wall time, plus the evaluation the bench had to add when the run skipped it."""
    return run["wall_s"] + run.get("eval_added_s", 0.0) if "wall_s" in run else None


def fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:{spec}}{suffix}"


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


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


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
    reference = (ablations or {}).get(REFERENCE_ABLATION)
    if fp32 and reference and "f1" in fp32 and "f1" in reference:
        gap = (reference["f1"] - fp32["f1"]) * 100
        rows.append(["bf16 F1 within 0.5 of fp32", f"{gap:+.2f} points", verdict(abs(gap) <= 0.5)])
    return rows


def ablation_table(ablations: dict) -> str:
    reference = ablations.get(REFERENCE_ABLATION, {})
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
    reference = inference.get(REFERENCE_INFERENCE, {}).get("sentences_per_s")
    rows = [[name, fmt(r.get("seconds"), ".2f"), fmt(r.get("sentences_per_s"), ",.1f"),
             fmt(ratio(r.get("sentences_per_s"), reference), ".2f", 1, "x"), fmt(r.get("f1"), ".2f", 100)]
            for name, r in inference.items()]
    return markdown_table(["path", "seconds", "sentences/s", "vs one at a time", "val F1"], rows)


def peak_part(peak: dict) -> list[str]:
    rows = [[dtype, peak[f"{dtype}_flops_per_s"] / 1e12, peak.get(f"{dtype}_wall_flops_per_s", 0.0) / 1e12]
            for dtype in ("fp32", "bf16") if f"{dtype}_flops_per_s" in peak]  # bf16: only where it is native
    return ["## Matmul peak (the MFU denominator: one core's rate in thread CPU time x threads)",
            markdown_table(["dtype", "peak TFLOP/s", "wall-clock TFLOP/s, all threads"], rows)]


def main_part(main: dict, ablations: dict | None) -> list[str]:
    return [f"## One epoch, {main['train_sentences']} train sentences, F1 on {main['valid_sentences']} "
            "validation sentences", main_table(main["runs"]),
            markdown_table(["ratio", "value"], [[k, fmt(v, ".2f")] for k, v in main["ratios"].items()]),
            "### Targets", markdown_table(["target", "measured", "result"], targets(main, ablations)),
            "### Settings", markdown_table(["setting", "baseline", "ours"], main["settings"])]


def all_runs(report: dict) -> list[dict]:
    runs = list(report.get("main", {}).get("runs", {}).values())
    runs += list(report.get("ablations", {}).values()) + list(report.get("scaling", {}).values())
    return runs + ([report["full_memory"]] if "full_memory" in report else [])


def notes_part(report: dict) -> list[str]:
    parts = []
    if any(r.get("eval_added_s") for r in all_runs(report)):
        parts.append("\\* The run wrote no validation score (no evaluation after its last update), so the bench "
                     "scored its export with the trainer's evaluation batch rule and added that time to `process s`.")
    busy = [r for r in all_runs(report) if contention(r) > 0.05]
    if busy:
        parts.append(f"**Warning:** other processes used more than 5% of the CPUs during {len(busy)} run(s) "
                     "(`other load`); with 2 threads per process an oversubscribed CPU slows PyTorch by several "
                     "times, so those timings are not comparable. Rerun on an idle machine.")
    parts.append("`process s`: the whole subprocess, what a user pays. `loop s`: end of update 1 to end of the "
                 "last update. MFU on computed (padded) tokens vs the matmul peak of the run's dtype; "
                 "`MFU (real)` counts only real tokens' FLOPs. CPU s: user + system time of the process tree.")
    return parts


def render_report(report: dict) -> str:
    parts = [f"# Benchmark ({report.get('device', '?')}, torch {report.get('torch', '?')}, "
             f"{report.get('threads', '?')} threads)"]
    if "peak" in report:
        parts += peak_part(report["peak"])
    if "main" in report:
        parts += main_part(report["main"], report.get("ablations"))
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
    return "\n\n".join(parts + notes_part(report)) + "\n"


def load_report(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(render_report(report), encoding="utf-8")
