"""--min-score: entities scored below a threshold (overall or per type) are dropped, the same way in Tagger,
ner.predict, ner.serve and corpus tagging, and stored in the export when given at training."""

from __future__ import annotations

import json

import pytest
from conftest import SERVE_PACKAGES, needs, tiny_args

from ner import train as train_cli
from ner.backends import NO_MIXED_PRECISION
from ner.errors import UserError
from ner.inference.options import parse_min_score
from ner.inference.tagger import Tagger
from ner.predict import main as predict_main

TEXTS = ["Ada Lovelace visited London on Monday.", "Shares of Acme Corp rose in Paris after Alan Turing spoke.",
         "Grace Hopper met Alan Turing in Berlin and Paris."]


@pytest.mark.parametrize(("spec", "expected"), [
    (None, {}), ("0.5", {"": 0.5}), ("0.5,PER=0.8", {"": 0.5, "PER": 0.8}), (["0.5", "LOC=0"], {"": 0.5, "LOC": 0.0}),
    (["PER=1"], {"PER": 1.0})])
def test_thresholds_read_overall_and_per_type(spec, expected):
    assert parse_min_score(spec) == expected


@pytest.mark.parametrize("spec", ["1.5", "PER=high", "-0.1", "PER=0.5=0.6", "PER="])
def test_a_bad_threshold_is_one_line_naming_it(spec):
    with pytest.raises(UserError, match="--min-score .*expected a score in"):
        parse_min_score(spec)


def scored(results: list[dict]) -> list[list[tuple[str, int, int, float]]]:
    return [[(e["type"], e["start"], e["end"], e["score"]) for e in r["entities"]] for r in results]


@pytest.fixture(scope="module")
def unfiltered(random_model):
    found = scored(Tagger(random_model, precision=NO_MIXED_PRECISION).predict(TEXTS))
    scores = sorted(score for text in found for *_, score in text)
    assert len(scores) >= 3, "the random model finds too few entities for these tests"
    return found, scores


def test_entities_below_the_threshold_are_dropped_and_the_rest_kept_as_they_were(random_model, unfiltered):
    found, scores = unfiltered
    threshold = scores[len(scores) // 2]
    kept = scored(Tagger(random_model, precision=NO_MIXED_PRECISION, min_score=str(threshold)).predict(TEXTS))
    assert kept == [[e for e in text if e[3] >= threshold] for text in found]
    assert 0 < sum(map(len, kept)) < sum(map(len, found))


def test_a_type_threshold_overrides_the_overall_one(random_model, unfiltered):
    found, _ = unfiltered
    kind = found[0][0][0] if found[0] else next(e[0] for text in found for e in text)
    kept = scored(Tagger(random_model, precision=NO_MIXED_PRECISION, min_score=["1", f"{kind}=0"]).predict(TEXTS))
    assert kept == [[e for e in text if e[0] == kind] for text in found]


@needs(*SERVE_PACKAGES)
def test_training_stores_it_and_every_path_applies_it(tiny_bert, tiny_data, tmp_path, unfiltered):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ner.serving.app import create_app
    from ner.serving.requests import Limits

    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, out, "--max-steps", "2", "--no-eval",
                                    "--min-score", "0.3,PER=0.9")) == 0
    model = out / "final"
    assert json.loads((model / "training_args.json").read_text())["min_score"] == "0.3,PER=0.9"
    tagger = Tagger(model, precision=NO_MIXED_PRECISION)
    assert tagger.min_score == {"": 0.3, "PER": 0.9}
    expected = tagger.predict(TEXTS)
    assert all(e["score"] >= (0.9 if e["type"] == "PER" else 0.3) for r in expected for e in r["entities"])
    # the flag overrides the export's
    assert Tagger(model, precision=NO_MIXED_PRECISION, min_score="0").min_score == {"": 0.0}
    with TestClient(create_app(tagger, model, Limits())) as client:
        assert client.post("/predict", json={"texts": TEXTS}).json() == {"results": expected}
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    tagged = tmp_path / "tagged"
    assert predict_main([str(model), str(texts), "--output-dir", str(tagged), "--quiet", "--mixed-precision",
                         "no"]) == 0
    lines = [json.loads(line) for part in sorted(tagged.glob("part-*.jsonl")) for line in part.open()]
    assert [line["entities"] for line in lines] == [r["entities"] for r in expected]
    manifest = json.loads((tagged / "manifest.json").read_text())
    assert manifest["computation"]["min_score"] == {"": 0.3, "PER": 0.9}


def test_predict_and_a_corpus_resume_use_the_flag(random_model, unfiltered, tmp_path, capsys):
    _, scores = unfiltered
    threshold = scores[len(scores) // 2]
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert predict_main([str(random_model), str(texts), "--quiet", "--mixed-precision", NO_MIXED_PRECISION,
                         "--min-score", str(threshold)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tagger = Tagger(random_model, precision=NO_MIXED_PRECISION, min_score=str(threshold))
    assert scored(printed) == scored(tagger.predict(TEXTS))
    tagged = tmp_path / "tagged"
    common = [str(random_model), str(texts), "--output-dir", str(tagged), "--quiet",
              "--mixed-precision", NO_MIXED_PRECISION]
    assert predict_main([*common, "--min-score", str(threshold)]) == 0
    assert predict_main([*common, "--min-score", "0.99"]) != 0  # a resume that would tag otherwise
    assert "min_score" in capsys.readouterr().err
