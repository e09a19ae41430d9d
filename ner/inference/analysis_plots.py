"""The plots of an evaluation (ner.evaluate --plots, and the confusion of a training run's validation): PNG files
drawn from ner/inference/analysis.py's report."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ner.files import staged_file
from ner.inference.analysis import OVERALL

log = logging.getLogger("ner")

FIGSIZE = (8.0, 5.0)
DPI = 120


def save_figure(figure: Figure, path: Path) -> Path:
    """Written beside its name and renamed, so a viewer of a live run never reads half a PNG."""
    figure.tight_layout()
    with staged_file(path) as tmp:
        figure.savefig(tmp, dpi=DPI)
    return path


def finish_percent_plot(figure: Figure, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """The finish of a plot whose y axis is a percentage: labels, grid, the legend right of the axes, saved."""
    ax.set_ylim(0, 102)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9, frameon=False)
    return save_figure(figure, path)


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
    return save_figure(figure, path)


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
    return finish_percent_plot(figure, ax, "recall (%)", "precision (%)",
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
    return save_figure(figure, path)


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
