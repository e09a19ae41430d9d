"""What to annotate next: ner.inference.selection (budget, order, spread) and the ner.select command (every pool
format, picks that join back to their source, what is left out, one-line errors)."""

from __future__ import annotations

import json
import random
from contextlib import nullcontext

import pytest

from ner.data.conll import read_conll
from ner.inference.runtimes import TORCH
from ner.inference.selection import Pick, pool_clusters, select, text_vectors
from ner.inference.tagger import Tagger
from ner.select import main as select_main

FAMILY = [f"the bank of {place} raised its rate again today" for place in
          ("leeds", "york", "bath", "hull", "ely", "derby", "luton", "wells", "ripon", "truro")]
OTHERS = ["rain fell hard over the northern hills", "a striker scored twice before half time",
          "shares of the miner slid on weak copper demand", "the minister flew to a summit in asia",
          "voters queued for hours at polling stations", "the orchestra played a new symphony"]


def family_pool():
    """Ten near-duplicates, less confident than six unlike sentences."""
    words = [t.split() for t in FAMILY + OTHERS]
    confidence = [0.50 + 0.001 * i for i in range(len(FAMILY))] + [0.60 + 0.001 * i for i in range(len(OTHERS))]
    return words, confidence


def test_a_budget_of_words_or_texts_is_never_exceeded_and_empty_texts_are_never_picked():
    rng = random.Random(3)
    words = [[f"t{i}w{j}" for j in range(rng.randint(0, 30))] for i in range(200)]  # no two alike
    confidence = [rng.random() for _ in words]
    for budget in (1, 17, 250, 10_000):
        picks = select(confidence, words, words=budget)
        assert sum(len(words[p.index]) for p in picks) <= budget
        assert all(words[p.index] for p in picks) and len({p.index for p in picks}) == len(picks)
    assert len(select(confidence, words, texts=12)) == 12
    everything = select(confidence, words, words=10_000)
    assert {p.index for p in everything} == {i for i, w in enumerate(words) if w}  # a budget over the pool: all
    with pytest.raises(ValueError):
        select(confidence, words)


def test_without_spread_the_least_confident_come_first():
    words, confidence = family_pool()
    picks = select(confidence, words, texts=5, diverse=False)
    assert [p.index for p in picks] == [0, 1, 2, 3, 4]


def test_near_duplicates_do_not_fill_the_batch():
    words, confidence = family_pool()
    picks = select(confidence, words, texts=5)
    from_family = [p.index for p in picks if p.index < len(FAMILY)]
    assert picks[0] == Pick(0, 0)  # the least confident text still leads
    assert from_family == [0], picks  # any two of the family share 8 of their 10 distinct words
    assert len(picks) == 5  # filled from the unlike sentences instead


def test_the_picks_do_not_depend_on_the_pools_order():
    words, confidence = family_pool()
    expected = {" ".join(words[p.index]) for p in select(confidence, words, words=40)}
    order = list(range(len(words)))
    random.Random(5).shuffle(order)
    shuffled = select([confidence[i] for i in order], [words[i] for i in order], words=40)
    assert {" ".join(words[order[p.index]]) for p in shuffled} == expected


def test_text_vectors_see_near_duplicates_as_near():
    vectors = text_vectors([FAMILY[0].split(), FAMILY[1].split(), OTHERS[0].split(), []])
    assert vectors[0] @ vectors[1] > 0.5 > vectors[0] @ vectors[2]
    assert not vectors[3].any()  # an empty text: a zero vector, no division by zero
    assert len(set(pool_clusters([w.split() for w in FAMILY + OTHERS], clusters=4).tolist())) == 4


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def tagger(random_model):
    return Tagger(random_model, runtime=TORCH)


def run_select(capsys, *args: str) -> tuple[int, str, str]:
    code = select_main([*args, "--runtime", TORCH])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_conll_pool_gives_label_studio_tasks_that_join_back_to_their_sentences(random_model, tagger, tiny_data,
                                                                                  capsys):
    sentences = read_conll(tiny_data["train"])
    code, out, err = run_select(capsys, str(random_model), str(tiny_data["train"]), "--conll", "--words", "60")
    assert code == 0, err
    tasks = json.loads(out)
    assert tasks and "picked" in err
    total = 0
    for task in tasks:
        path, number = task["data"]["_source"].rsplit("#", 1)
        assert path == str(tiny_data["train"])
        words = sentences[int(number) - 1].words
        assert task["data"]["text"] == " ".join(words)
        total += len(words)
        prediction = task["predictions"][0]
        assert 0 < prediction["score"] <= 1 and isinstance(prediction["cluster"], int)
        for region in prediction["result"]:
            value = region["value"]
            assert task["data"]["text"][value["start"]:value["end"]] == value["text"]
    assert total <= 60
    _, probs = tagger.tag(sentences)
    from ner.inference.entities import text_confidence

    least = min(range(len(sentences)), key=lambda i: (text_confidence(probs[i]), i))
    assert tasks[0]["data"]["_source"] == f"{tiny_data['train']}#{least + 1}"  # the least confident leads


def test_raw_text_leaves_out_repeats_and_labelled_texts(random_model, tiny_data, tmp_path, capsys):
    labelled_sentence = read_conll(tiny_data["test"])[0].words
    lines = ["Ada Lovelace visited London .", "ada lovelace visited london .", "", " ".join(labelled_sentence),
             "The committee met in Geneva on Tuesday ."]
    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run_select(capsys, str(random_model), str(pool), "--texts", "10", "--format", "spans",
                                "--labelled", str(tiny_data["test"]))
    assert code == 0, err
    picks = [json.loads(line) for line in out.splitlines()]
    assert sorted(p["_source"] for p in picks) == [f"{pool}:1", f"{pool}:5"]
    for pick in picks:
        assert pick["text"] == lines[int(pick["_source"].rsplit(":", 1)[1]) - 1]
        assert set(pick) >= {"entities", "confidence", "cluster"}
    assert "left out 1 labelled already and 1 repeats" in err


def test_a_label_studio_export_offers_its_unannotated_tasks_with_their_data(random_model, tmp_path, capsys):
    tasks = [{"id": 11, "data": {"text": "Ada Lovelace visited London .", "batch": "a"}, "annotations": []},
             {"id": 12, "data": {"text": "The committee met in Geneva ."},
              "annotations": [{"id": 1, "result": [], "was_cancelled": False}]},
             {"id": 13, "data": {"text": "Paris is large ."}, "annotations": [{"id": 2, "was_cancelled": True}]}]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks), encoding="utf-8")
    out_file = tmp_path / "next.json"
    code, _, err = run_select(capsys, str(random_model), str(export), "--texts", "5", "--output", str(out_file))
    assert code == 0, err
    picked = json.loads(out_file.read_text(encoding="utf-8"))
    assert sorted(t["data"]["_source"] for t in picked) == [f"{export}: task 11", f"{export}: task 13"]
    assert next(t for t in picked if t["data"]["_source"].endswith("11"))["data"]["batch"] == "a"


@pytest.mark.parametrize("case", ["missing pool", "zero budget", "existing output", "bad json line",
                                  "no budget"])
def test_bad_input_gets_one_line_and_exit_2_and_writes_nothing(case, random_model, tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"text": "Ada Lovelace ."}\n{"text": \n', encoding="utf-8")
    existing = tmp_path / "next.json"
    existing.write_text("mine\n", encoding="utf-8")
    args = {"missing pool": [str(tmp_path / "nope.txt"), "--words", "10"],
            "zero budget": [str(pool), "--jsonl", "--words", "0"],
            "existing output": [str(pool), "--jsonl", "--words", "10", "--output", str(existing)],
            "bad json line": [str(pool), "--jsonl", "--words", "10", "--output", str(tmp_path / "out.json")],
            "no budget": [str(pool), "--jsonl"]}[case]
    with pytest.raises(SystemExit) if case == "no budget" else nullcontext():  # argparse's own usage error
        code, out, err = run_select(capsys, str(random_model), *args)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert existing.read_text(encoding="utf-8") == "mine\n"
    assert not (tmp_path / "out.json").exists()
    if case == "bad json line":
        assert f"{pool}:2" in err


def test_the_shipped_sample_runs(random_model, capsys):
    from ner.data.examples import SAMPLE_DIR

    code, out, err = run_select(capsys, str(random_model), str(SAMPLE_DIR / "train.conll"), "--conll",
                                "--texts", "3", "--quiet")
    assert code == 0, err
    assert len(json.loads(out)) == 3
