"""Entities and entity-level scores: the (type, first word, last word) chunks a sentence's tags spell, and
precision, recall and F1 overall and per type, as plain JSON-safe dicts. Both equal seqeval's (tests/test_decode.py,
tests/test_report.py: random sequences) without importing seqeval.metrics, which imports scikit-learn, scipy and
pandas for one warning class: an import every process that tags or scores would pay (docs/performance.md,
"Start-up and tear-down")."""

from __future__ import annotations


def get_entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity in one sentence's tags, read exactly as seqeval's
    `get_entities` reads them (its default, lenient reading of IOB1/IOB2/IOBES)."""
    chunks: list[tuple[str, int, int]] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, label in enumerate([*tags, "O"]):
        tag, kind = label[0], label[1:].split("-", maxsplit=1)[-1] or "_"
        if _chunk_ends(prev_tag, tag, prev_type, kind):
            chunks.append((prev_type, begin, i - 1))
        if _chunk_starts(prev_tag, tag, prev_type, kind):
            begin = i
        prev_tag, prev_type = tag, kind
    return chunks


def _chunk_ends(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag not in ("O", ".") and prev_type != kind))


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and prev_type != kind))


def seqeval_kwargs(scheme: str) -> dict:
    """IOBES is scored strictly: seqeval's default (conlleval) mode misreads E-/S- boundaries."""
    from seqeval.scheme import IOBES

    return {"mode": "strict", "scheme": IOBES} if scheme == "iobes" else {}


def entity_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str = "iob2") -> dict:
    """{"precision", "recall", "f1", "support", "per_type": {TYPE: {...}}}, micro-averaged overall: the numbers of
    seqeval's classification_report(..., zero_division=0, **seqeval_kwargs(scheme)).

    IOB1/IOB2 are read as seqeval's default (conlleval-compatible) mode reads them; IOBES is read strictly,
    since the default mode does not understand E-/S- boundaries the same way.
    """
    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted, strict=True)):
        raise ValueError("gold and predicted tags differ in number of sentences or of words")
    gold_entities, predicted_entities = entity_set(gold, scheme), entity_set(predicted, scheme)
    per_type = {kind: _scores(gold_entities, predicted_entities, kind)
                for kind in sorted({entity[0] for entity in gold_entities | predicted_entities})}
    overall = _scores(gold_entities, predicted_entities)
    return {**overall, "per_type": per_type}


def entity_set(sentences: list[list[str]], scheme: str) -> set[tuple]:
    """Every entity of the sentences, (type, ...) with where it is: seqeval's reading of a list of sentences."""
    if scheme == "iobes":
        from seqeval.scheme import IOBES, Entities  # the strict reader; seqeval.scheme imports no scikit-learn

        read = Entities(sentences, IOBES).entities
        return {(e.tag, e.sent_id, e.start, e.end) for sentence in read for e in sentence}
    flat = [tag for tags in sentences for tag in [*tags, "O"]]  # as seqeval joins sentences before it reads them
    return set(get_entities(flat))


def _scores(gold: set[tuple], predicted: set[tuple], kind: str | None = None) -> dict:
    """One row, computed as seqeval computes it (0 where a denominator is 0)."""
    if kind is not None:
        gold, predicted = {e for e in gold if e[0] == kind}, {e for e in predicted if e[0] == kind}
    correct = len(gold & predicted)
    precision = correct / len(predicted) if predicted else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": len(gold)}


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
