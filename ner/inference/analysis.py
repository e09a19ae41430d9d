"""Where a model's entities go wrong, and how far their scores can be trusted; ner.evaluate prints it.

    python -m ner.evaluate runs/ner/final test.conll --plots out/ --target-precision 0.95

Kinds of error (SemEval-2013 task 9.1, MUC): each gold and each predicted entity of a sentence is in
exactly one match: `correct` (same span, same type), `wrong_type` (same span), `boundary` (overlapping
span, same type), `boundary_and_type` (overlapping span, other type), `missed` (gold, nothing overlaps)
or `spurious` (predicted, nothing overlaps). Same spans pair first; then each remaining prediction,
left to right, takes the unpaired overlapping gold entity of its own type with the closest boundaries,
else the first unpaired overlapping one (nervaluate's rule). From those matches come the four schemas of
nervaluate: strict, exact (span only), partial (span overlap counts half) and type (overlap, same type).
Per type, a schema scores that type alone (the spans of other types removed), as nervaluate 1.x does.

Scores of predicted entities: the mean probability of their tags (ner.inference.entities.entities). Precision and
recall per type at score thresholds, the lowest threshold that reaches a target precision, and the
expected calibration error (ECE) of those scores against exact-span correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ner.inference.entities import entities, word_positions
from ner.metrics import get_entities

Span = tuple[str, int, int]  # (type, first word, last word), as seqeval's get_entities

KINDS = ("correct", "wrong_type", "boundary", "boundary_and_type", "missed", "spurious")
SCHEMAS = ("strict", "exact", "partial", "type")
# What each kind of match counts as under each schema (the SemEval-2013 table nervaluate implements).
OUTCOME = {
    "strict": {"correct": "correct", "wrong_type": "incorrect", "boundary": "incorrect",
               "boundary_and_type": "incorrect"},
    "exact": {"correct": "correct", "wrong_type": "correct", "boundary": "incorrect",
              "boundary_and_type": "incorrect"},
    "partial": {"correct": "correct", "wrong_type": "correct", "boundary": "partial",
                "boundary_and_type": "partial"},
    "type": {"correct": "correct", "wrong_type": "incorrect", "boundary": "correct",
             "boundary_and_type": "incorrect"},
}
NO_ENTITY = "(none)"  # confusion row: predicted where gold has nothing (spurious); column: gold not predicted (missed)
THRESHOLDS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
CALIBRATION_BINS = 10
OVERALL = "overall"


@dataclass(frozen=True)
class Match:
    """One gold entity, one predicted one, or a pair of them, and what kind of match it is."""

    kind: str
    gold: Span | None
    predicted: Span | None

    @property
    def type(self) -> str:
        """The type it is counted under: the gold entity's, or the predicted one's where there is no gold."""
        return (self.gold or self.predicted)[0]


def _overlaps(a: Span, b: Span) -> bool:
    return a[1] <= b[2] and b[1] <= a[2]


def _pair_kind(gold: Span, predicted: Span) -> str:
    if gold[1:] == predicted[1:]:
        return "correct" if gold[0] == predicted[0] else "wrong_type"
    return "boundary" if gold[0] == predicted[0] else "boundary_and_type"


def match_entities(gold: list[Span], predicted: list[Span]) -> list[Match]:
    """Every entity of one sentence in exactly one Match; spans in sentence order (as get_entities)."""
    gold_by_span = {span[1:]: span for span in gold}
    paired: set[Span] = set()
    pairs: list[tuple[Span, Span]] = []
    unmatched: list[Span] = []
    for pred in predicted:
        same = gold_by_span.get(pred[1:])
        if same is not None:
            paired.add(same)
            pairs.append((same, pred))
        else:
            unmatched.append(pred)
    matches = []
    for pred in unmatched:
        candidates = [g for g in gold if g not in paired and _overlaps(g, pred)]
        own_type = [g for g in candidates if g[0] == pred[0]]
        if own_type:
            chosen = min(own_type, key=lambda g: abs(g[1] - pred[1]) + abs(g[2] - pred[2]))
        elif candidates:
            chosen = candidates[0]
        else:
            matches.append(Match("spurious", None, pred))
            continue
        paired.add(chosen)
        pairs.append((chosen, pred))
    matches += [Match(_pair_kind(g, p), g, p) for g, p in pairs]
    matches += [Match("missed", g, None) for g in gold if g not in paired]
    return sorted(matches, key=lambda m: min(s[1] for s in (m.gold, m.predicted) if s is not None))


def sentence_spans(tags: list[list[str]]) -> list[list[Span]]:
    return [get_entities(sentence) for sentence in tags]


def error_kinds(matches: list[Match]) -> dict:
    """{"overall": {kind: count}, "per_type": {TYPE: {kind: count}}}: pairs by gold type, spurious by predicted."""
    overall = dict.fromkeys(KINDS, 0)
    per_type: dict[str, dict[str, int]] = {}
    for match in matches:
        overall[match.kind] += 1
        per_type.setdefault(match.type, dict.fromkeys(KINDS, 0))[match.kind] += 1
    return {OVERALL: overall, "per_type": dict(sorted(per_type.items()))}


def schema_score(matches: list[Match], schema: str) -> dict:
    """nervaluate's counts and scores under one schema: partial matches (and only they) count half."""
    counts = dict.fromkeys(("correct", "incorrect", "partial", "missed", "spurious"), 0)
    for match in matches:
        counts[OUTCOME[schema].get(match.kind, match.kind)] += 1
    actual = counts["correct"] + counts["incorrect"] + counts["partial"] + counts["spurious"]
    possible = counts["correct"] + counts["incorrect"] + counts["partial"] + counts["missed"]
    hits = counts["correct"] + 0.5 * counts["partial"]
    precision = hits / actual if actual else 0.0
    recall = hits / possible if possible else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {**counts, "actual": actual, "possible": possible, "precision": precision, "recall": recall, "f1": f1}


def macro_f1(per_type: dict[str, dict]) -> float:
    """Mean F1 of the types (seqeval's macro avg when given its per-type scores)."""
    return float(np.mean([row["f1"] for row in per_type.values()])) if per_type else 0.0


def schema_scores(gold: list[list[Span]], predicted: list[list[Span]]) -> dict:
    """{schema: {counts, precision, recall, f1, macro_f1, per_type: {TYPE: {...}}}} over all sentences."""
    matches = [m for g, p in zip(gold, predicted, strict=True) for m in match_entities(g, p)]
    types = sorted({span[0] for spans in (*gold, *predicted) for span in spans})
    only = {kind: [m for g, p in zip(gold, predicted) for m in match_entities(
        [s for s in g if s[0] == kind], [s for s in p if s[0] == kind])] for kind in types}
    scores = {}
    for schema in SCHEMAS:
        per_type = {kind: schema_score(only[kind], schema) for kind in types}
        scores[schema] = {**schema_score(matches, schema), "macro_f1": macro_f1(per_type), "per_type": per_type}
    return scores


def confusion_counts(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> dict[str, dict[str, int]]:
    """counts[gold type][predicted type] over entities matched by exact span, sentence by sentence.

    A span in both with different types is a confusion; a gold span nobody predicted is counted
    in column NO_ENTITY (missed); a predicted span not in gold is counted in row NO_ENTITY
    (spurious). So, as in seqeval, a boundary error counts once missed and once spurious, and per
    type: true positives = counts[T][T], support = sum of row T, predictions = sum of column T.
    Every type seen and NO_ENTITY are keys of every row; counts[NO_ENTITY][NO_ENTITY] stays 0.
    """
    if len(gold_tags) != len(pred_tags):
        raise ValueError(f"{len(gold_tags)} gold sentences but {len(pred_tags)} predicted")
    pairs: list[tuple[str, str]] = []
    for gold, pred in zip(gold_tags, pred_tags, strict=True):
        if len(gold) != len(pred):
            raise ValueError(f"sentence of {len(gold)} gold tags but {len(pred)} predicted")
        gold_spans = {(start, end): kind for kind, start, end in get_entities(gold)}
        pred_spans = {(start, end): kind for kind, start, end in get_entities(pred)}
        for span, kind in gold_spans.items():
            pairs.append((kind, pred_spans.get(span, NO_ENTITY)))
        pairs += [(NO_ENTITY, kind) for span, kind in pred_spans.items() if span not in gold_spans]
    types = sorted({kind for pair in pairs for kind in pair} - {NO_ENTITY})
    keys = [*types, NO_ENTITY]
    counts = {row: dict.fromkeys(keys, 0) for row in keys}
    for row, column in pairs:
        counts[row][column] += 1
    return counts


# ----------------------------------------------------------------------------- scores of predicted entities

@dataclass(frozen=True)
class Scored:
    """A predicted entity's type, its score (mean probability of its tags) and whether gold has it exactly."""

    type: str
    score: float
    correct: bool


def scored_entities(gold_tags: list[list[str]], pred_tags: list[list[str]], probs: list[np.ndarray]) -> list[Scored]:
    """Each predicted entity as ner.inference.entities.entities reads and scores it, marked right or wrong."""
    scored = []
    for gold, tags, tag_probs in zip(gold_tags, pred_tags, probs, strict=True):
        gold_spans = set(get_entities(gold))
        for entity in entities(tags, tag_probs, word_positions(tags)):
            span = (entity["type"], entity["start"], entity["end"] - 1)
            scored.append(Scored(entity["type"], entity["score"], span in gold_spans))
    return scored


def precision_recall_curve(scored: list[Scored], support: int) -> list[dict]:
    """{"threshold", "kept", "precision", "recall"} at each distinct score, highest first (keeping score >= it)."""
    if not scored:
        return []
    order = sorted(scored, key=lambda s: -s.score)
    scores = np.array([s.score for s in order])
    hits = np.cumsum([s.correct for s in order])
    last = np.flatnonzero(np.append(scores[1:] != scores[:-1], True))  # last index of each distinct score
    return [{"threshold": float(scores[i]), "kept": int(i + 1), "precision": float(hits[i] / (i + 1)),
             "recall": float(hits[i] / support) if support else 0.0} for i in last]


def at_threshold(curve: list[dict], threshold: float, support: int) -> dict:
    """The curve's point for keeping entities scored `threshold` or more (nothing kept: precision 0)."""
    kept = [point for point in curve if point["threshold"] >= threshold]
    if kept:
        return {**kept[-1], "threshold": threshold}
    return {"threshold": threshold, "kept": 0, "precision": 0.0, "recall": 0.0}


def lowest_threshold(curve: list[dict], target_precision: float) -> dict | None:
    """The point of lowest threshold (most recall) whose precision reaches the target; None if none does."""
    reached = [point for point in curve if point["precision"] >= target_precision]
    return min(reached, key=lambda point: point["threshold"]) if reached else None


def gold_support(gold_tags: list[list[str]]) -> dict[str, int]:
    support: dict[str, int] = {}
    for tags in gold_tags:
        for kind, _, _ in get_entities(tags):
            support[kind] = support.get(kind, 0) + 1
    return support


def threshold_report(scored: list[Scored], support: dict[str, int], target_precision: float | None) -> dict:
    """Per type and overall: the curve, the fixed THRESHOLDS table and, if asked, the lowest threshold."""
    groups = {kind: [s for s in scored if s.type == kind] for kind in sorted(set(support) | {s.type for s in scored})}
    groups[OVERALL] = scored
    totals = {**support, OVERALL: sum(support.values())}
    report = {}
    for kind, group in groups.items():
        curve = precision_recall_curve(group, totals.get(kind, 0))
        row = {"support": totals.get(kind, 0), "curve": curve,
               "table": [at_threshold(curve, t, totals.get(kind, 0)) for t in THRESHOLDS]}
        if target_precision is not None:
            row["target"] = lowest_threshold(curve, target_precision)
        report[kind] = row
    return report


def calibration(scored: list[Scored], bins: int = CALIBRATION_BINS) -> dict:
    """Expected calibration error: sum over equal-width score bins of share of entities x |share correct - mean
    score|; and the bins, for a reliability plot."""
    scores = np.array([s.score for s in scored], dtype=float)
    correct = np.array([s.correct for s in scored], dtype=float)
    index = np.minimum((scores * bins).astype(int), bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        inside = index == b
        count = int(inside.sum())
        row = {"low": b / bins, "high": (b + 1) / bins, "count": count, "mean_score": None, "share_correct": None}
        if count:
            row["mean_score"] = float(scores[inside].mean())
            row["share_correct"] = float(correct[inside].mean())
            ece += count / len(scored) * abs(row["share_correct"] - row["mean_score"])
        rows.append(row)
    return {"ece": ece, "entities": len(scored), "bins": rows}


# ----------------------------------------------------------------------------- the whole analysis

def entity_errors(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> dict:
    """The kinds of error of a whole set (error_kinds over every sentence): what training reports at its end."""
    gold, predicted = sentence_spans(gold_tags), sentence_spans(pred_tags)
    return error_kinds([m for g, p in zip(gold, predicted, strict=True) for m in match_entities(g, p)])


def format_errors_markdown(errors: dict) -> str:
    """The kinds-of-error table for a model card."""
    header = "| type | correct | wrong type | boundary | boundary + type | missed | spurious |\n|---|" + "---:|" * 6
    rows = [f"| {kind} | " + " | ".join(str(counts[k]) for k in KINDS) + " |"
            for kind, counts in [*errors["per_type"].items(), (f"**{OVERALL}**", errors[OVERALL])]]
    return "\n".join([header, *rows])


def analyse(gold_tags: list[list[str]], pred_tags: list[list[str]], probs: list[np.ndarray],
            seqeval_scores: dict, target_precision: float | None = None) -> dict:
    """JSON-safe: error kinds, schema scores beside seqeval's, confusion, thresholds, calibration."""
    gold, predicted = sentence_spans(gold_tags), sentence_spans(pred_tags)
    matches = [m for g, p in zip(gold, predicted, strict=True) for m in match_entities(g, p)]
    scored = scored_entities(gold_tags, pred_tags, probs)
    return {"errors": error_kinds(matches),
            "schemas": {"seqeval": {**seqeval_scores, "macro_f1": macro_f1(seqeval_scores["per_type"])},
                        **schema_scores(gold, predicted)},
            "confusion": confusion_counts(gold_tags, pred_tags),
            "target_precision": target_precision,
            "thresholds": threshold_report(scored, gold_support(gold_tags), target_precision),
            "calibration": calibration(scored)}


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned numbers."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i])
                               for i, cell in enumerate(row)).rstrip() for row in [header, *rows])


def format_errors(errors: dict) -> str:
    rows = [[kind, *(str(counts[k]) for k in KINDS)] for kind, counts in
            [*errors["per_type"].items(), (OVERALL, errors[OVERALL])]]
    header = ["type", "correct", "wrong type", "boundary", "boundary+type", "missed", "spurious"]
    return ("== kinds of error (each entity once: pairs under the gold type, spurious under the predicted) ==\n"
            + _table(header, rows))


def format_schemas(schemas: dict) -> str:
    names = list(schemas)
    overall = [[name, *(f"{schemas[name][k]:.4f}" for k in ("precision", "recall", "f1", "macro_f1"))]
               for name in names]
    types = sorted({kind for name in names for kind in schemas[name]["per_type"]})
    per_type = [[kind, *(f"{schemas[name]['per_type'][kind]['f1']:.4f}" if kind in schemas[name]["per_type"]
                         else "-" for name in names)] for kind in types]
    return ("== scores by schema (seqeval: micro, exact spans; strict/exact/partial/type: SemEval-2013 as "
            "nervaluate; macro: mean over types) ==\n"
            + _table(["schema", "precision", "recall", "f1", "macro f1"], overall)
            + "\n\nF1 per type\n" + _table(["type", *names], per_type))


def format_confusion(counts: dict[str, dict[str, int]]) -> str:
    keys = list(counts)
    names = [*keys[:-1], "missed"]
    rows = [[row if row != NO_ENTITY else "spurious", *(str(counts[row][col]) if (row, col) != (NO_ENTITY, NO_ENTITY)
                                                         else "" for col in keys)] for row in keys]
    return "== confusion (exact spans: gold type by row, predicted type by column) ==\n" + _table(
        ["gold \\ predicted", *names], rows)


def format_thresholds(thresholds: dict, target_precision: float | None) -> str:
    kinds = list(thresholds)
    rows = [[f"{t:.2f}", *(f"{thresholds[k]['table'][i]['precision']:.3f} / {thresholds[k]['table'][i]['recall']:.3f}"
                           for k in kinds)] for i, t in enumerate(THRESHOLDS)]
    text = ("== precision / recall when keeping entities scored at least the threshold (score: mean probability of "
            "its tags) ==\n" + _table(["threshold", *kinds], rows))
    if target_precision is not None:
        lines = []
        for kind, row in thresholds.items():
            point = row["target"]
            lines.append(f"  {kind}: none reaches it" if point is None else
                         f"  {kind}: {point['threshold']:.4f} (precision {point['precision']:.3f}, "
                         f"recall {point['recall']:.3f}, {point['kept']} kept)")
        text += f"\n\nlowest threshold reaching precision {target_precision}:\n" + "\n".join(lines)
    return text


def format_calibration(result: dict) -> str:
    rows = [[f"{b['low']:.1f}-{b['high']:.1f}", str(b["count"]),
             "-" if b["mean_score"] is None else f"{b['mean_score']:.3f}",
             "-" if b["share_correct"] is None else f"{b['share_correct']:.3f}"] for b in result["bins"]]
    return (f"== calibration: expected calibration error {result['ece']:.4f} over {result['entities']} predicted "
            "entities (correct: exact span and type) ==\n"
            + _table(["score", "entities", "mean score", "share correct"], rows))


def format_analysis(report: dict) -> str:
    return "\n\n".join([format_errors(report["errors"]), format_schemas(report["schemas"]),
                        format_confusion(report["confusion"]),
                        format_thresholds(report["thresholds"], report["target_precision"]),
                        format_calibration(report["calibration"])])
