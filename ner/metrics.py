"""Entity-level scores with seqeval: overall and per type, as plain JSON-safe dicts."""

from __future__ import annotations


def seqeval_kwargs(scheme: str) -> dict:
    """IOBES is scored strictly: seqeval's default (conlleval) mode misreads E-/S- boundaries."""
    from seqeval.scheme import IOBES  # seqeval imports scikit-learn (~1.8 s): only where scores are computed

    return {"mode": "strict", "scheme": IOBES} if scheme == "iobes" else {}


def entity_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str = "iob2") -> dict:
    """{"precision", "recall", "f1", "support", "per_type": {TYPE: {...}}}, micro-averaged overall.

    IOB1/IOB2 use seqeval's default (conlleval-compatible) mode; IOBES is scored strictly,
    since the default mode does not understand E-/S- boundaries the same way.
    """
    from seqeval.metrics import classification_report

    report = classification_report(gold, predicted, output_dict=True, zero_division=0, **seqeval_kwargs(scheme))
    per_type = {name: _row(row) for name, row in report.items() if not name.endswith(" avg")}
    overall = _row(report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0}))
    return {**overall, "per_type": per_type}


def _row(row: dict) -> dict:
    return {"precision": float(row["precision"]), "recall": float(row["recall"]),
            "f1": float(row["f1-score"]), "support": int(row["support"])}


def best_evaluation(evaluations: list[dict], scores_key: str = "scores") -> dict | None:
    """The evaluation training keeps and exports: highest overall F1, the earliest on ties.

    `evaluations` are records with a "step" and their scores under `scores_key` (trainer state:
    "scores"; metrics.jsonl: "eval").
    """
    if not evaluations:
        return None
    return max(evaluations, key=lambda record: (record[scores_key]["f1"], -record["step"]))


def format_scores(scores: dict) -> str:
    """One line: overall F1 then each type's F1, for logs."""
    per_type = " ".join(f"{name}={row['f1'] * 100:.1f}" for name, row in sorted(scores["per_type"].items()))
    return (f"F1 {scores['f1'] * 100:.2f} (P {scores['precision'] * 100:.2f} R {scores['recall'] * 100:.2f})"
            f"  {per_type}")


def format_table(scores: dict) -> str:
    """Markdown table: one row per type, then overall."""
    lines = ["| type | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
    rows = sorted(scores["per_type"].items()) + [("**overall**", scores)]
    for name, row in rows:
        lines.append(f"| {name} | {row['precision'] * 100:.2f} | {row['recall'] * 100:.2f} | "
                     f"{row['f1'] * 100:.2f} | {row['support']} |")
    return "\n".join(lines)
