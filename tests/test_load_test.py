"""The pure parts of scripts/load_test.py's overload mode and scripts/serve_with_fault.py, on made-up results."""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytest.importorskip("httpx")

from conftest import ROOT  # noqa: E402


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


load_test = load_script("load_test")
Outcome = load_test.Outcome


def test_statuses_are_counted_with_503_split_by_retry_after_and_latency_only_over_the_accepted():
    outcomes = ([Outcome(200, False, s) for s in (1.0, 2.0, 3.0, 4.0, 100.0)]
                + [Outcome(503, True, 0.01)] * 3 + [Outcome(503, False, 0.01), Outcome(504, False, 30.0)]
                + [Outcome(500, False, 5.0), Outcome(502, False, 0.1), Outcome(None, False, 0.0),
                   Outcome(413, False, 0.0)])
    row = load_test.summarize(outcomes, seconds=12.34)
    assert row["requests"] == 14 and row["seconds"] == 12.3
    assert row["statuses"] == {"200": 5, "413": 1, "500": 1, "502": 1, "503": 1, "503 + Retry-After": 3,
                               "504": 1, "no answer": 1}
    assert row["errors_5xx"] == 2  # 500 and 502; shedding (503) and timeouts (504) are counted apart
    assert (row["p50_s"], row["p95_s"], row["p99_s"], row["max_s"]) == (3.0, 80.8, 96.16, 100.0)  # numpy's linear


def test_no_accepted_request_has_no_percentiles():
    row = load_test.summarize([Outcome(503, True, 0.01)], seconds=1)
    assert row["p50_s"] is None and row["max_s"] is None and row["errors_5xx"] == 0
    assert "| 0 | None / None / None / None |" in load_test.overload_table(
        {"clients": 1, "requests_per_client": 1, "texts_per_request": 1, "words_per_text": 300, **row})


def test_texts_join_consecutive_sentences_up_to_the_word_count_and_cycle():
    sentences = ["a b c", "d e", "f", "g h i j"]
    assert load_test.build_texts(sentences, words_per_text=4, count=3) == ["a b c d e", "f g h i j", "a b c d e"]
    assert load_test.build_texts(sentences, words_per_text=1, count=5) == sentences + ["a b c"]


def test_sentences_come_from_a_conll_file_or_a_text_file(tmp_path):
    conll = tmp_path / "train.txt"
    conll.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("First sentence.\n\n  Second one.  \n")
    assert load_test.read_sentences(conll, None) == ["EU rejects", "Peter"]
    assert load_test.read_sentences(None, lines) == ["First sentence.", "Second one."]
    assert load_test.read_sentences(None, None) == load_test.TEXTS


def test_the_injected_fault_fails_only_batches_that_hold_the_marker():
    fault = load_script("serve_with_fault")
    predict = fault.failing_on("XFAULTX", lambda self, texts, words=None: [{"entities": [], "n": len(texts)}])
    assert predict(None, ["fine", "also fine"], words=[["fine"], ["also", "fine"]]) == [{"entities": [], "n": 2}]
    with pytest.raises(RuntimeError, match="injected failure"):
        predict(None, ["fine", "XFAULTX here"])
