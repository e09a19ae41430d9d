"""Kinds of error, nervaluate's schemas, confusion, score thresholds and calibration (ner/inference/analysis.py), and
ner.evaluate's report of them; offline, on hand-made tags and the tiny random model."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from seqeval.metrics import classification_report

from ner.backends import NO_MIXED_PRECISION
from ner.data.conll import read_conll
from ner.evaluate import main as evaluate_main
from ner.inference.analysis import (
    KINDS,
    NO_ENTITY,
    SCHEMAS,
    Match,
    Scored,
    calibration,
    confusion_counts,
    error_kinds,
    lowest_threshold,
    macro_f1,
    match_entities,
    precision_recall_curve,
    schema_scores,
    sentence_spans,
)
from ner.metrics import entity_scores

nervaluate = pytest.importorskip("nervaluate")  # the test extra; the package itself does not need it

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NERVALUATE_NAME = {"strict": "strict", "exact": "exact", "partial": "partial", "type": "ent_type"}
COUNTS = ("correct", "incorrect", "partial", "missed", "spurious")

# Every kind of error, each named where it happens.
GOLD = [["B-PER", "I-PER", "O", "B-LOC"],
        ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER", "I-PER", "O"],
        ["B-MISC", "O", "O"],
        ["B-LOC", "O", "B-LOC"],
        ["O", "O"],
        ["O"]]
PRED = [["B-PER", "I-PER", "O", "B-ORG"],                    # PER correct; LOC -> ORG: wrong type
        ["B-ORG", "I-ORG", "O", "O", "O", "B-LOC", "I-LOC"],  # ORG cut short: boundary; PER -> LOC shifted: both
        ["O", "O", "B-PER"],                                  # MISC missed; PER spurious
        ["B-LOC", "I-LOC", "I-LOC"],                          # one LOC over two: boundary + the second missed
        ["B-EVENT", "I-EVENT"],                               # spurious, of a type gold never has
        ["O"]]


def nervaluate_results(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> dict:
    def as_dicts(spans):
        return [[{"label": kind, "start": start, "end": end} for kind, start, end in sentence] for sentence in spans]

    gold, pred = sentence_spans(gold_tags), sentence_spans(pred_tags)
    types = sorted({span[0] for sentence in gold + pred for span in sentence})
    return nervaluate.Evaluator(as_dicts(gold), as_dicts(pred), tags=types, loader="dict").evaluate()


def assert_equal_to_nervaluate(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> None:
    ours = schema_scores(sentence_spans(gold_tags), sentence_spans(pred_tags))
    theirs = nervaluate_results(gold_tags, pred_tags)
    for schema in SCHEMAS:
        name = NERVALUATE_NAME[schema]
        rows = [(ours[schema], theirs["overall"][name])]
        assert set(ours[schema]["per_type"]) == set(theirs["entities"])
        rows += [(ours[schema]["per_type"][kind], theirs["entities"][kind][name]) for kind in theirs["entities"]]
        for got, expected in rows:
            assert [got[k] for k in COUNTS] == [getattr(expected, k) for k in COUNTS], schema
            assert (got["precision"], got["recall"], got["f1"]) == pytest.approx(
                (expected.precision, expected.recall, expected.f1)), schema


def random_tags(rng: random.Random, length: int, types: str = "ABC") -> list[str]:
    tags, previous = [], "O"
    for _ in range(length):
        draw = rng.random()
        tag = "O" if draw < 0.5 else f"I-{previous[2:]}" if draw < 0.75 and previous != "O" else \
            f"B-{rng.choice(types)}"
        tags.append(tag)
        previous = tag
    return tags


def one_prediction_over_two_gold(gold_tags: list[str], pred_tags: list[str]) -> bool:
    """Where nervaluate's schemas choose different partners (see docs/evaluation.md)."""
    gold = sentence_spans([gold_tags])[0]
    return any(sum(g[1] <= p[2] and p[1] <= g[2] for g in gold) > 1 for p in sentence_spans([pred_tags])[0])


# ----------------------------------------------------------------------------- kinds of error

def test_every_kind_of_error_is_counted_once_per_entity():
    matches = [match_entities(g, p) for g, p in zip(sentence_spans(GOLD), sentence_spans(PRED))]
    assert matches[0] == [Match("correct", ("PER", 0, 1), ("PER", 0, 1)),
                          Match("wrong_type", ("LOC", 3, 3), ("ORG", 3, 3))]
    assert matches[1] == [Match("boundary", ("ORG", 0, 2), ("ORG", 0, 1)),
                          Match("boundary_and_type", ("PER", 4, 5), ("LOC", 5, 6))]
    assert matches[2] == [Match("missed", ("MISC", 0, 0), None), Match("spurious", None, ("PER", 2, 2))]
    assert matches[3] == [Match("boundary", ("LOC", 0, 0), ("LOC", 0, 2)), Match("missed", ("LOC", 2, 2), None)]
    assert matches[4] == [Match("spurious", None, ("EVENT", 0, 1))]
    assert matches[5] == []

    errors = error_kinds([m for sentence in matches for m in sentence])
    assert errors["overall"] == {"correct": 1, "wrong_type": 1, "boundary": 2, "boundary_and_type": 1,
                                 "missed": 2, "spurious": 2}
    assert set(KINDS) == set(errors["overall"])
    by_type = {kind: {k: n for k, n in row.items() if n} for kind, row in errors["per_type"].items()}
    assert by_type == {"EVENT": {"spurious": 1}, "LOC": {"wrong_type": 1, "boundary": 1, "missed": 1},
                       "MISC": {"missed": 1}, "ORG": {"boundary": 1},
                       "PER": {"correct": 1, "boundary_and_type": 1, "spurious": 1}}


def test_schemas_equal_nervaluate_on_every_kind_of_error():
    assert_equal_to_nervaluate(GOLD, PRED)
    strict = schema_scores(sentence_spans(GOLD), sentence_spans(PRED))["strict"]
    assert (strict["correct"], strict["incorrect"], strict["missed"], strict["spurious"]) == (1, 4, 2, 2)
    assert strict["precision"] == pytest.approx(1 / 7)


def test_schemas_equal_nervaluate_on_random_sentences():
    rng = random.Random(0)
    gold, pred = [], []
    while len(gold) < 400:
        gold_tags = random_tags(rng, rng.randint(1, 20))
        pred_tags = random_tags(rng, len(gold_tags))
        if not one_prediction_over_two_gold(gold_tags, pred_tags):
            gold.append(gold_tags)
            pred.append(pred_tags)
    assert sum(len(s) for s in sentence_spans(gold)) > 1000
    assert_equal_to_nervaluate(gold, pred)


def test_a_prediction_over_two_gold_types_pairs_with_its_own_type():
    """nervaluate's strict/exact/partial pair it with the first gold entity, its type schema with the one of
    the same type; every schema here uses the latter, so the kinds of error add up (documented)."""
    gold = [["B-A", "B-C", "I-C", "I-C"]]
    pred = [["B-C", "I-C", "B-A", "O"]]
    assert [m.kind for m in match_entities(*sentence_spans(gold), *sentence_spans(pred))] == [
        "boundary", "missed", "spurious"]
    ours = schema_scores(sentence_spans(gold), sentence_spans(pred))
    theirs = nervaluate_results(gold, pred)["overall"]
    assert (ours["type"]["correct"], ours["type"]["missed"]) == (theirs["ent_type"].correct,
                                                                 theirs["ent_type"].missed)
    assert (ours["strict"]["incorrect"], theirs["strict"].incorrect) == (1, 2)


def test_macro_f1_is_seqevals_macro_average():
    scores = entity_scores(GOLD, PRED)
    report = classification_report(GOLD, PRED, output_dict=True, zero_division=0)
    assert macro_f1(scores["per_type"]) == pytest.approx(report["macro avg"]["f1-score"])


# ----------------------------------------------------------------------------- thresholds and calibration

def test_precision_recall_curve_and_lowest_threshold():
    scored = [Scored("A", 0.9, True), Scored("A", 0.8, True), Scored("A", 0.8, False), Scored("A", 0.6, True),
              Scored("A", 0.3, False)]
    curve = precision_recall_curve(scored, support=5)
    assert [(p["threshold"], p["kept"]) for p in curve] == [(0.9, 1), (0.8, 3), (0.6, 4), (0.3, 5)]
    assert [p["precision"] for p in curve] == pytest.approx([1, 2 / 3, 3 / 4, 3 / 5])
    assert [p["recall"] for p in curve] == pytest.approx([0.2, 0.4, 0.6, 0.6])
    assert lowest_threshold(curve, 0.7)["threshold"] == 0.6  # precision is not monotone: 0.8 falls short
    assert lowest_threshold(curve, 1.0)["threshold"] == 0.9
    assert lowest_threshold(curve[1:], 0.8) is None


def test_expected_calibration_error():
    scored = [Scored("A", 0.95, True), Scored("A", 0.91, False), Scored("A", 0.55, True), Scored("A", 0.05, False)]
    result = calibration(scored)
    top = result["bins"][9]
    assert (top["count"], top["mean_score"], top["share_correct"]) == (2, pytest.approx(0.93), 0.5)
    expected = (2 * abs(0.5 - 0.93) + abs(1 - 0.55) + abs(0 - 0.05)) / 4
    assert result["ece"] == pytest.approx(expected)
    assert sum(b["count"] for b in result["bins"]) == 4 and result["bins"][1]["mean_score"] is None


# ----------------------------------------------------------------------------- ner.evaluate

def test_evaluate_reports_matrix_thresholds_and_plots(random_model, tiny_data, tmp_path, capsys):
    out, plots = tmp_path / "report.json", tmp_path / "plots"
    code = evaluate_main([str(random_model), str(tiny_data["test"]), "--json", str(out), "--plots", str(plots),
                          "--target-precision", "0.95", "--mixed-precision", NO_MIXED_PRECISION, "--worst", "0"])
    assert code == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    examples = read_conll(tiny_data["test"])
    gold = [e.tags for e in examples]
    from ner.inference.tagger import Tagger

    predicted, _ = Tagger(random_model, precision=NO_MIXED_PRECISION).tag(examples)

    # the counts themselves: test_evaluate_counts_a_known_tagging_as_worked_out_by_hand (same function here)
    assert report["confusion"] == confusion_counts(gold, predicted)
    assert report["errors"]["overall"]["missed"] + report["errors"]["overall"]["spurious"] > 0
    assert report["schemas"]["seqeval"]["f1"] == report["f1"]
    everything = report["thresholds"]["overall"]["table"][0]  # threshold 0 keeps every entity: seqeval's numbers
    assert (everything["precision"], everything["recall"]) == pytest.approx((report["precision"], report["recall"]))
    assert set(report["thresholds"]) >= set(report["per_type"]) | {"overall"}
    assert all("target" in row for row in report["thresholds"].values())
    assert report["calibration"]["entities"] == sum(report["confusion"][row][col] for row in report["confusion"]
                                                    for col in report["confusion"] if col != NO_ENTITY)
    for name in ("confusion.png", "precision_recall.png", "reliability.png"):
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, name
    for heading in ("kinds of error", "scores by schema", "gold \\ predicted", "lowest threshold reaching "
                    "precision 0.95", "expected calibration error"):
        assert heading in printed
    assert np.isfinite(report["calibration"]["ece"])


# A fixed tagging whose confusion is worked out by hand: (words, gold tags, predicted tags).
KNOWN_TAGGING = [
    ("Anna Berg visited Paris", "B-PER I-PER O B-LOC", "B-PER I-PER O B-ORG"),  # PER right; LOC read as ORG
    ("Acme hired Bob", "B-ORG O B-PER", "O O B-PER"),  # ORG missed; PER right
    ("Bob left Rome today", "B-PER O B-LOC O", "B-PER O B-LOC I-LOC"),  # PER right; LOC too long: missed + spurious
    ("It rained", "O O", "B-ORG O"),  # spurious ORG
]
KNOWN_CONFUSION = {  # gold type (row) -> predicted type (column): exact spans, as in seqeval
    "LOC": {"LOC": 0, "ORG": 1, "PER": 0, NO_ENTITY: 1},
    "ORG": {"LOC": 0, "ORG": 0, "PER": 0, NO_ENTITY: 1},
    "PER": {"LOC": 0, "ORG": 0, "PER": 3, NO_ENTITY: 0},
    NO_ENTITY: {"LOC": 1, "ORG": 1, "PER": 0, NO_ENTITY: 0},
}


def test_evaluate_counts_a_known_tagging_as_worked_out_by_hand(random_model, tmp_path, monkeypatch):
    """The model's tags are replaced by fixed ones, so the expected counts do not come from the code under test."""
    from ner.inference.tagger import Tagger

    gold_file, out = tmp_path / "gold.conll", tmp_path / "report.json"
    gold_file.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(words.split(), gold.split()))
                                     for words, gold, _ in KNOWN_TAGGING) + "\n", encoding="utf-8")
    predicted = [pred.split() for _, _, pred in KNOWN_TAGGING]
    monkeypatch.setattr(Tagger, "tag", lambda self, examples, *args, **kwargs: (
        predicted, [np.full(len(tags), 0.9) for tags in predicted]))
    assert evaluate_main([str(random_model), str(gold_file), "--json", str(out), "--worst", "0"]) == 0
    report = json.loads(out.read_text())
    assert report["confusion"] == KNOWN_CONFUSION
    assert report["support"] == 6 and report["calibration"]["entities"] == 6  # gold entities; predicted entities


@pytest.mark.parametrize("flags, named", [(["--target-precision", "1.5"], "--target-precision"),
                                          (["--plots", "no/such/folder"], "--plots")])
def test_evaluate_refuses_bad_flags_in_one_line(random_model, tiny_data, tmp_path, monkeypatch, capsys, flags,
                                                named):
    monkeypatch.chdir(tmp_path)
    assert evaluate_main([str(random_model), str(tiny_data["test"]), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith("error:")


def test_training_reports_the_final_models_kinds_of_error_in_metrics_and_the_card(tiny_bert, tiny_data, tmp_path):
    """The end of training: validation's and test's kinds of error in metrics.json (and the log) and the model
    card; correct entities are seqeval's true positives, and every gold entity is counted once."""
    from conftest import tiny_args

    from ner import train as train_cli

    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "6")) == 0
    metrics = json.loads((out / "final" / "metrics.json").read_text())
    assert set(metrics["errors"]) == {"validation", "test"}
    for split in ("validation", "test"):
        overall, scores = metrics["errors"][split]["overall"], metrics[split]
        gold_entities = sum(row["support"] for row in scores["per_type"].values())
        assert overall["correct"] == round(scores["recall"] * gold_entities)
        assert sum(overall[k] for k in ("correct", "wrong_type", "boundary", "boundary_and_type", "missed")) == \
            gold_entities
    card = (out / "final" / "README.md").read_text()
    assert "### Kinds of error" in card and "| **overall** | " + str(metrics["errors"]["test"]["overall"]["correct"]) \
        in card
