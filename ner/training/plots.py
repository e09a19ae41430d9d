"""Plots of a training run, written as PNG files into its output folder under the names training/run_files.py
declares (an evaluation's: analysis_plots.py)."""

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
from ner.inference.analysis import confusion_counts
from ner.inference.analysis_plots import FIGSIZE, finish_percent_plot, plot_confusion, save_figure
from ner.metrics import best_evaluation
from ner.training.run_files import (
    CONFUSION_PLOT,
    LOSS_LR_PLOT,
    METRICS_FILE,
    PER_TYPE_PLOT,
    PREDICTIONS_DIR,
    VALIDATION_F1_PLOT,
    VALIDATION_PREDICTIONS,
)

log = logging.getLogger("ner")

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
    return save_figure(figure, path)


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
    return finish_percent_plot(figure, ax, "optimizer step", "entity F1 (%)", "Validation F1 (entity-level, seqeval)",
                               path)


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
    return save_figure(figure, path)


# ----------------------------------------------------------------------------- entry points

def write_plots(output_dir: Path) -> list[Path]:
    """Every plot the run's files allow; the others are skipped with a note in the log."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise UserError(f"{output_dir}: not a folder (expected the --output-dir of a training run)")
    written: list[Path] = []
    metrics_path = output_dir / METRICS_FILE
    run = read_metrics(metrics_path) if metrics_path.is_file() else RunMetrics([], [], {})
    logs, evals = run.logs, run.evals
    if logs:
        written.append(plot_loss_lr(logs, run.epoch_ends, output_dir / LOSS_LR_PLOT))
    else:
        log.info("plot: no logged training steps in %s yet: %s skipped", metrics_path, LOSS_LR_PLOT)
    if evals:
        written.append(plot_validation_f1(evals, output_dir / VALIDATION_F1_PLOT))
        written.append(plot_per_type(best_evaluation(evals, "eval"), output_dir / PER_TYPE_PLOT))
    else:
        log.info("plot: no validation in %s: %s and %s skipped", metrics_path, VALIDATION_F1_PLOT, PER_TYPE_PLOT)
    predictions = output_dir / PREDICTIONS_DIR / VALIDATION_PREDICTIONS
    if predictions.is_file():
        counts = confusion_counts(*read_predictions(predictions))
        if len(counts) > 1:
            written.append(plot_confusion(counts, output_dir / CONFUSION_PLOT))
        else:
            log.info("plot: no entities in %s: %s skipped", predictions, CONFUSION_PLOT)
    else:
        log.info("plot: no %s (written at the end of training): %s skipped", predictions, CONFUSION_PLOT)
    return written
