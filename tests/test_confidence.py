"""A confidence for every text (entities.text_confidence), in every output that carries predictions: ner.predict's
formats, Tagger.predict, POST /predict, corpus tagging and Label Studio's predictions, texts with no entity included."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import needs

from ner.data.conll import read_conll
from ner.inference.entities import text_confidence
from ner.inference.runtimes import TORCH
from ner.inference.tagger import Tagger
from ner.predict import main as predict_main

TEXTS = ["Ada Lovelace visited London in 1842 .", "", "nothing to see here", "Paris"]


def test_confidence_is_the_geometric_mean_of_the_words_tag_probabilities():
    assert text_confidence(np.array([0.9, 0.5], dtype=np.float32)) == round(math.sqrt(0.45), 4)
    assert text_confidence(np.zeros(0, dtype=np.float32)) == 1.0  # no word: nothing to be unsure of
    assert text_confidence(np.ones(7, dtype=np.float32)) == 1.0
    assert text_confidence(np.array([0.0, 1.0], dtype=np.float32)) == 0.0  # a zero does not raise
    sure, one_word_less = np.full(10, 0.99, dtype=np.float32), np.full(10, 0.99, dtype=np.float32)
    one_word_less[3] = 0.4
    assert text_confidence(one_word_less) < text_confidence(sure)
    # normalised by length: ten words as sure as one are as confident as that one word
    assert text_confidence(np.full(10, 0.8, dtype=np.float32)) == text_confidence(np.array([0.8], dtype=np.float32))


@pytest.fixture(scope="module")
def tagger(random_model):
    return Tagger(random_model, runtime=TORCH)


def test_every_raw_text_result_has_a_confidence_with_or_without_entities(tagger):
    results = tagger.predict(TEXTS)
    assert [sorted(r) for r in results] == [["confidence", "entities"]] * len(TEXTS)
    assert all(0 < r["confidence"] <= 1 for r in results)
    assert results[1]["confidence"] == 1.0  # the empty text
    # the confidence of the words' decoded tags, as tag() gives their probabilities
    _, probs = tagger.tag(tagger_examples(tagger, TEXTS[2:3]))
    assert results[2]["confidence"] == text_confidence(probs[0])


def tagger_examples(tagger, texts):
    from ner.data.examples import Example
    from ner.data.text import split_words

    return [Example([w for w, _, _ in split_words(t)], ["O"] * len(split_words(t)), "<text>", document=i)
            for i, t in enumerate(texts)]


def lines_of(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_every_predict_format_carries_the_confidence(random_model, tagger, tiny_data, tmp_path, capsys):
    expected = [r["confidence"] for r in tagger.predict(TEXTS)]
    raw = tmp_path / "texts.txt"
    raw.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    records = tmp_path / "texts.jsonl"
    records.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    common = [str(random_model), "--runtime", TORCH, "--quiet"]

    assert predict_main([*common[:1], str(raw), *common[1:]]) == 0
    assert [r["confidence"] for r in lines_of(capsys)] == expected
    assert predict_main([*common[:1], str(records), "--jsonl", "--format", "spans", *common[1:]]) == 0
    assert [(r["id"], r["confidence"]) for r in lines_of(capsys)] == list(enumerate(expected))
    assert predict_main([*common[:1], str(records), "--jsonl", "--format", "label-studio", *common[1:]]) == 0
    tasks = json.loads(capsys.readouterr().out)
    assert [t["predictions"][0]["score"] for t in tasks] == expected  # a task without entities is scored too

    sentences = read_conll(tiny_data["test"])
    _, probs = tagger.tag(sentences)
    by_sentence = [text_confidence(p) for p in probs]
    assert predict_main([*common[:1], str(tiny_data["test"]), "--conll", *common[1:]]) == 0
    assert [r["confidence"] for r in lines_of(capsys)] == by_sentence
    assert predict_main([*common[:1], str(tiny_data["test"]), "--conll", "--format", "spans", *common[1:]]) == 0
    assert [r["confidence"] for r in lines_of(capsys)] == by_sentence


def test_corpus_parts_carry_the_confidence(random_model, tagger, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "tagged"
    assert predict_main([str(random_model), str(corpus), "--output-dir", str(out), "--runtime", TORCH,
                         "--quiet"]) == 0
    lines = [json.loads(line) for part in sorted(out.glob("part-*.jsonl")) for line in part.read_text().splitlines()]
    assert [r["confidence"] for r in lines] == [r["confidence"] for r in tagger.predict(TEXTS)]


@needs("fastapi", "httpx")
def test_the_http_api_answers_the_confidence_as_its_schema_says(random_model, tagger):
    from fastapi.testclient import TestClient

    from ner.serving.app import create_app

    with TestClient(create_app(tagger, random_model)) as client:
        many = client.post("/predict", json={"texts": TEXTS}).json()["results"]
        one = client.post("/predict", json={"text": ""}).json()
        schema = client.get("/openapi.json").json()["components"]["schemas"]["Entities"]
    assert [r["confidence"] for r in many] == [r["confidence"] for r in tagger.predict(TEXTS)]
    assert one == {"entities": [], "confidence": 1.0}
    assert "confidence" in schema["properties"] and "confidence" in schema.get("required", [])
