"""Plots of a training run, written as PNG files into its output folder."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ner.data.conll import read_predictions
from ner.errors import UserError
from ner.files import staged_file
from ner.inference.analysis import NO_ENTITY, OVERALL, confusion_counts  # noqa: F401 (NO_ENTITY: for callers of ner.plot)
from ner.metrics import best_evaluation

log = logging.getLogger("ner")

FIGSIZE = (8.0, 5.0)
DPI = 120
METRIC_COLORS = {"precision": "#4C72B0", "recall": "#DD8452", "f1": "#55A868"}


# ----------------------------------------------------------------------------- reading

@dataclass
class RunMetrics:
    logs: list[dict]  # training records (loss, lr, tokens), by step
    evals: list[dict]  # validation records, by step
    epoch_ends: dict[int, int]  # epochs completed -> the step that completed it


def read_metrics(path: Path) -> RunMetrics:
    """metrics.jsonl, by step; a live run's half-written line is skipped.

    A resumed run logs some steps twice; the later record (the resumed run's) wins.
    """
    logs: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    epoch_ends: dict[int, int] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            if isinstance(record.get("eval"), dict):
                evals[record["step"]] = record
            elif "loss" in record:
                logs[record["step"]] = record
            elif isinstance(record.get("epoch_end"), int):
                epoch_ends[record["epoch_end"]] = record["step"]
    return RunMetrics([logs[s] for s in sorted(logs)], [evals[s] for s in sorted(evals)], epoch_ends)


# ----------------------------------------------------------------------------- figures

def _save(figure: Figure, path: Path) -> Path:
    """Written beside its name and renamed, so a viewer of a live run never reads half a PNG."""
    figure.tight_layout()
    with staged_file(path) as tmp:
        figure.savefig(tmp, dpi=DPI)
    return path


def _percent_plot(figure: Figure, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """The finish of a plot whose y axis is a percentage: labels, grid, the legend right of the axes, saved."""
    ax.set_ylim(0, 102)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9, frameon=False)
    return _save(figure, path)


def _step_axis(ax, steps: list[int]) -> None:
    """Whole steps only, and some room around a single point."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
    if len(set(steps)) == 1:
        ax.set_xlim(steps[0] - 1, steps[0] + 1)


def plot_loss_lr(logs: list[dict], epoch_ends: dict[int, int], path: Path) -> Path:
    steps = [r["step"] for r in logs]
    figure = Figure(figsize=FIGSIZE)
    loss_ax, lr_ax = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    loss_ax.plot(steps, [r["loss"] for r in logs], color="#C44E52", marker="." if len(steps) < 60 else None)
    loss_ax.set_ylabel("training loss\n(mean per token)")
    loss_ax.set_title(f"Training loss and learning rate ({steps[-1]} steps)")
    lr_ax.plot(steps, [r.get("lr", np.nan) for r in logs], color="#4C72B0")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("optimizer step")
    _step_axis(lr_ax, steps)
    lr_ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    shown = {epoch: step for epoch, step in epoch_ends.items() if step < steps[-1]}  # not the run's own end
    for ax in (loss_ax, lr_ax):
        ax.grid(alpha=0.3)
        for step in shown.values():
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    for epoch, step in shown.items():
        loss_ax.annotate(f"end of epoch {epoch}", (step, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                         textcoords="offset points", fontsize=8, color="grey")
    return _save(figure, path)


def plot_validation_f1(evals: list[dict], path: Path) -> Path:
    steps = [r["step"] for r in evals]
    figure = Figure(figsize=FIGSIZE)
    ax = figure.subplots()
    types = sorted({kind for r in evals for kind in r["eval"].get("per_type", {})})
    marker = "o" if len(steps) < 40 else None
    for kind in types:
        values = [r["eval"]["per_type"].get(kind, {}).get("f1", np.nan) * 100 for r in evals]
        ax.plot(steps, values, marker=marker, markersize=3, linewidth=1.2, alpha=0.8, label=kind)
    ax.plot(steps, [r["eval"]["f1"] * 100 for r in evals], color="black", marker=marker, linewidth=2.5,
            label="overall (micro)")
    best = best_evaluation(evals, "eval")
    ax.plot([best["step"]], [best["eval"]["f1"] * 100], marker="*", markersize=16, color="gold",
            markeredgecolor="black", linestyle="none", label=f"best: {best['eval']['f1'] * 100:.2f} "
            f"at step {best['step']}")
    _step_axis(ax, steps)
    return _percent_plot(figure, ax, "optimizer step", "entity F1 (%)", "Validation F1 (entity-level, seqeval)", path)


def plot_per_type(record: dict, path: Path) -> Path:
    scores = record["eval"]
    rows = sorted(scores.get("per_type", {}).items()) + [("overall", scores)]
    crowded = len(rows) > 9
    figure = Figure(figsize=(min(16.0, max(FIGSIZE[0], 0.75 * len(rows) + 2)), FIGSIZE[1] + (1 if crowded else 0)))
    ax = figure.subplots()
    x = np.arange(len(rows))
    width = 0.27
    for i, metric in enumerate(("precision", "recall", "f1")):
        values = [row[metric] * 100 for _, row in rows]
        bars = ax.bar(x + (i - 1) * width, values, width, label=metric if metric != "f1" else "F1",
                      color=METRIC_COLORS[metric])
        if metric == "f1":
            ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2, rotation=90 if crowded else 0)
    labels = [f"{name} (n={row['support']})" if crowded else f"{name}\n(n={row['support']})" for name, row in rows]
    ax.set_xticks(x, labels, rotation=40 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.axvline(len(rows) - 1.5, color="grey", linestyle="--", linewidth=1)  # types | overall
    ax.set_ylim(0, 122)  # headroom for the legend above the 100 line
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("score (%)")
    ax.set_title(f"Validation scores per entity type at step {record['step']} (best F1)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", ncol=3, fontsize=9)
    return _save(figure, path)


def plot_confusion(counts: dict[str, dict[str, int]], path: Path, on: str = "validation") -> Path:
    keys = list(counts)
    matrix = np.array([[counts[row][column] for column in keys] for row in keys], dtype=float)
    # Colour is the share of the row, so rare types read as clearly as common ones; cells show counts.
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    shares[-1, -1] = np.nan  # nothing in gold, nothing predicted: not counted
    size = len(keys)
    figure = Figure(figsize=(max(FIGSIZE[0], 0.6 * size + 3), max(FIGSIZE[1], 0.45 * size + 2)))
    ax = figure.subplots()
    image = ax.imshow(np.ma.masked_invalid(shares), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(size):
        for j in range(size):
            if i == size - 1 and j == size - 1:
                continue
            value = int(matrix[i, j])
            color = "white" if shares[i, j] > 0.6 else ("black" if value else "#AAAAAA")
            ax.text(j, i, str(value), ha="center", va="center", fontsize=10, color=color,
                    fontweight="bold" if i == j and value else "normal")
    ax.set_xticks(range(size), [*keys[:-1], "none\n(missed)"])
    ax.set_yticks(range(size), [f"{key}\n(n={int(matrix[i].sum())})" for i, key in enumerate(keys[:-1])]
                  + ["none\n(spurious)"])
    ax.set_xlabel("predicted type")
    ax.set_ylabel("gold type")
    ax.set_title(f"Entity confusion on {on} (exact spans; colour: share of the row)")
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="share of gold row")
    return _save(figure, path)


def plot_precision_recall(thresholds: dict, path: Path, target_precision: float | None = None) -> Path:
    """One curve per type (and overall): each point keeps the entities scored at least some threshold."""
    figure = Figure(figsize=FIGSIZE)
    ax = figure.subplots()
    for kind, row in thresholds.items():
        curve = row["curve"]
        if not curve:
            continue
        overall = kind == OVERALL
        ax.plot([p["recall"] * 100 for p in curve], [p["precision"] * 100 for p in curve], drawstyle="steps-post",
                color="black" if overall else None, linewidth=2.5 if overall else 1.2,
                label=f"{kind} (n={row['support']})")
        marks = [p for p in row["table"] if p["kept"] and p["threshold"] in (0.5, 0.9)]
        ax.plot([p["recall"] * 100 for p in marks], [p["precision"] * 100 for p in marks], "o", markersize=4,
                color=ax.lines[-1].get_color())
    if target_precision is not None:
        ax.axhline(target_precision * 100, color="grey", linestyle="--", linewidth=1,
                   label=f"target precision {target_precision:g}")
    ax.set_xlim(0, 102)
    return _percent_plot(figure, ax, "recall (%)", "precision (%)",
                         "Precision against recall over entity score thresholds (dots: 0.5 and 0.9)", path)


def plot_reliability(calibration: dict, path: Path) -> Path:
    """Share correct against mean score per bin (on the diagonal: calibrated), entities per bin below."""
    bins = calibration["bins"]
    figure = Figure(figsize=(FIGSIZE[1] + 1, FIGSIZE[1] + 1))
    share_ax, count_ax = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    width = bins[0]["high"] - bins[0]["low"]
    centres = [(b["low"] + b["high"]) / 2 for b in bins]
    filled = [b for b in bins if b["count"]]
    share_ax.bar([(b["low"] + b["high"]) / 2 for b in filled], [b["share_correct"] for b in filled], width * 0.9,
                 color="#4C72B0", label="share correct")
    share_ax.plot([b["mean_score"] for b in filled], [b["share_correct"] for b in filled], "o", color="#C44E52",
                  markersize=4, label="at the bin's mean score")
    share_ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    share_ax.set_ylim(0, 1.02)
    share_ax.set_ylabel("share of entities correct")
    share_ax.set_title(f"Reliability of entity scores (ECE {calibration['ece']:.4f}, "
                       f"{calibration['entities']} entities)")
    share_ax.legend(loc="upper left", fontsize=9)
    share_ax.grid(alpha=0.3)
    count_ax.bar(centres, [b["count"] for b in bins], width * 0.9, color="#8C8C8C")
    count_ax.set_xlim(0, 1)
    count_ax.set_xlabel("entity score (mean probability of its tags)")
    count_ax.set_ylabel("entities")
    return _save(figure, path)


def write_evaluation_plots(report: dict, plots_dir: Path, on: str) -> list[Path]:
    """ner.evaluate --plots: confusion.png, precision_recall.png, reliability.png (each skipped without entities)."""
    written = []
    if len(report["confusion"]) > 1:
        written.append(plot_confusion(report["confusion"], plots_dir / "confusion.png", on=on))
    if report["calibration"]["entities"]:
        written.append(plot_precision_recall(report["thresholds"], plots_dir / "precision_recall.png",
                                             report["target_precision"]))
        written.append(plot_reliability(report["calibration"], plots_dir / "reliability.png"))
    else:
        log.info("plot: no predicted entities: precision_recall.png and reliability.png skipped")
    return written


# ----------------------------------------------------------------------------- entry points

def write_plots(output_dir: Path) -> list[Path]:
    """Every plot the run's files allow; the others are skipped with a note in the log."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise UserError(f"{output_dir}: not a folder (expected the --output-dir of a training run)")
    written: list[Path] = []
    metrics_path = output_dir / "metrics.jsonl"
    run = read_metrics(metrics_path) if metrics_path.is_file() else RunMetrics([], [], {})
    logs, evals = run.logs, run.evals
    if logs:
        written.append(plot_loss_lr(logs, run.epoch_ends, output_dir / "loss_lr.png"))
    else:
        log.info("plot: no logged training steps in %s yet: loss_lr.png skipped", metrics_path)
    if evals:
        written.append(plot_validation_f1(evals, output_dir / "validation_f1.png"))
        written.append(plot_per_type(best_evaluation(evals, "eval"), output_dir / "per_type_f1.png"))
    else:
        log.info("plot: no validation in %s: validation_f1.png and per_type_f1.png skipped", metrics_path)
    predictions = output_dir / "predictions" / "validation.conll"
    if predictions.is_file():
        counts = confusion_counts(*read_predictions(predictions))
        if len(counts) > 1:
            written.append(plot_confusion(counts, output_dir / "confusion.png"))
        else:
            log.info("plot: no entities in %s: confusion.png skipped", predictions)
    else:
        log.info("plot: no %s (written at the end of training): confusion.png skipped", predictions)
    return written
