"""Raw text in, character offsets out: the CoNLL-style splitter, Tagger.predict and `ner.predict` on raw text."""

from __future__ import annotations

import json
import sys
import unicodedata

import pytest
from conftest import ROOT, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ner.data import Example, read_conll_documents
from ner.text import split_whitespace, split_whitespace_punct, split_words

# (text, its words): accents composed and decomposed, curly quotes, emoji, CJK, odd spaces, invisible characters.
TRICKY_WORDS = [
    ("", []),
    ("Angela Merkel met Emmanuel Macron in Paris.", ["Angela", "Merkel", "met", "Emmanuel", "Macron", "in", "Paris",
                                                     "."]),
    ("Café Société in Zürich; naïve façade — Ærø, Øresund, São Paulo, Kraków.",
     ["Café", "Société", "in", "Zürich", ";", "naïve", "façade", "—", "Ærø", ",", "Øresund", ",", "São", "Paulo", ",",
      "Kraków", "."]),
    ("\u201cCurly quotes,\u201d she said. \u2018Single\u2019 too, and O\u2019Neill\u2019s dog.",
     ["\u201c", "Curly", "quotes", ",", "\u201d", "she", "said", ".", "\u2018", "Single", "\u2019", "too", ",", "and",
      "O\u2019Neill", "\u2019s", "dog", "."]),
    ("Emoji \U0001F600\U0001F1EB\U0001F1F7 family \U0001F468\u200d\U0001F469\u200d\U0001F467 done\U0001F44D\U0001F3FD.",
     ["Emoji", "\U0001F600", "\U0001F1EB\U0001F1F7", "family", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "done",
      "\U0001F44D\U0001F3FD", "."]),
    ("北京市 is in 中国 and 東京 is in 日本; 서울 too.",
     ["北京市", "is", "in", "中国", "and", "東京", "is", "in", "日本", ";", "서울", "too", "."]),
    ("tabs\tand\t\truns   of     spaces\u00a0and\u2003em space",
     ["tabs", "and", "runs", "of", "spaces", "and", "em", "space"]),
    ("zero\u200bwidth\u200c\u200dmarks\ufeff and \x00control\x07chars\x1b[31m and \u202eRTL\u202c",
     ["zero", "width\u200c\u200dmarks", "and", "control", "chars", "[", "31m", "and", "RTL"]),  # ZW(N)J inside a word
    ("e\u0301 combining accents: Mu\u0308nchen", ["e\u0301", "combining", "accents", ":", "Mu\u0308nchen"]),
    ("Mari\u0301a Lo\u0301pez visited Mu\u0308nchen.", ["Mari\u0301a", "Lo\u0301pez", "visited", "Mu\u0308nchen", "."]),
    ("co\u00adoperate, co\u00ad operate", ["co\u00adoperate", ",", "co", "operate"]),  # a soft hyphen inside a word
    ("नमस्ते दुनिया, ภาษาไทย", ["नमस्ते", "दुनिया", ",", "ภาษาไทย"]),  # vowel signs are marks (Mc, Mn)
    ("\u0301Mu\u0308nchen.\u0301 Jose\u0301's U\u0308.S. a\u200b\u0301b", ["\u0301", "Mu\u0308nchen", ".\u0301",
     "Jose\u0301", "'s", "U\u0308.S.", "a", "\u0301", "b"]),  # a mark with no visible character before it: alone
    ("3\ufe0f\u20e3 \u2764\ufe0f\u200d\U0001F525 \u845b\U000E0100\u57ce",
     ["3\ufe0f\u20e3", "\u2764\ufe0f\u200d\U0001F525", "\u845b\U000E0100\u57ce"]),  # keycap, variation selectors
    ("x" * 20000, ["x" * 20000]),
    ("Visit https://example.com/a?b=1, mail ada@example.co.uk, pay $3.5 on 1996-12-06.",
     ["Visit", "https://example.com/a?b=1", ",", "mail", "ada@example.co.uk", ",", "pay", "$", "3.5", "on",
      "1996-12-06", "."]),
    ("\r\n\u2028line\u2029separators\x0b\x0c", ["line", "separators"]),
]
TRICKY = [text for text, _ in TRICKY_WORDS]


@pytest.fixture(scope="module")
def tagger(random_model):
    from ner import Tagger  # the public name

    return Tagger(random_model, precision="no", max_seq_length=32)


def assert_words_slice(text: str, words) -> None:
    previous_end = 0
    for word, start, end in words:
        assert text[start:end] == word and word.strip(), (word, start, end)
        assert previous_end <= start < end  # in order, never overlapping
        previous_end = end


def assert_entities_slice(text: str, entities: list[dict]) -> None:
    previous_end = 0
    for entity in entities:
        assert set(entity) == {"text", "type", "start", "end", "score"}
        assert text[entity["start"]:entity["end"]] == entity["text"] and entity["text"].strip()
        assert previous_end <= entity["start"] < entity["end"] <= len(text)
        assert 0.0 <= entity["score"] <= 1.0
        previous_end = entity["end"]


@pytest.mark.parametrize(("text", "expected"), [
    ("O'Neill's U.S. trip cost $3.5 million on 1996-12-06, didn't it?",
     ["O'Neill", "'s", "U.S.", "trip", "cost", "$", "3.5", "million", "on", "1996-12-06", ",", "did", "n't", "it",
      "?"]),
    ("Japan won 2-1 (3,000 fans) at St. Louis.", ["Japan", "won", "2-1", "(", "3,000", "fans", ")", "at", "St.",
                                                    "Louis", "."]),
    ("See https://example.com/a?b=1. Mail ada@example.co.uk!", ["See", "https://example.com/a?b=1", ".", "Mail",
                                                                "ada@example.co.uk", "!"]),
    ("1. Japan 2. China in the U.S..", ["1.", "Japan", "2.", "China", "in", "the", "U.S.", "."]),
    ("Emoji \U0001F600\U0001F1EB\U0001F1F7 family \U0001F468\u200d\U0001F469\u200d\U0001F467 "
     "done\U0001F44D\U0001F3FD...",
     ["Emoji", "\U0001F600", "\U0001F1EB\U0001F1F7", "family", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "done",
      "\U0001F44D\U0001F3FD", "..."]),  # one emoji one word, however many code points it takes
])
def test_conll_style_words(text, expected):
    words = split_words(text)
    assert [w for w, _, _ in words] == expected
    assert_words_slice(text, words)


def test_the_splitter_is_not_the_naive_one():
    # What the CoNLL rules add over "runs of letters, every other mark alone" (the measured baseline).
    text = "U.S. O'Neill 3.5 1996-12-06"
    assert len(split_words(text)) == 4 and len(split_whitespace_punct(text)) > 10


@pytest.mark.parametrize(("text", "expected"), TRICKY_WORDS, ids=range(len(TRICKY_WORDS)))
def test_tricky_text_words(text, expected):
    words = split_words(text)
    assert [w for w, _, _ in words] == expected
    assert_words_slice(text, words)
    assert not any(c in w for w, _, _ in words for c in "\u200b\ufeff\x00\u202e")  # invisible: separators


def test_tricky_texts_tag_and_slice(tagger):
    results = tagger.predict(TRICKY)
    assert len(results) == len(TRICKY) and results[0] == {"entities": []}
    assert sum(len(r["entities"]) for r in results) > 10  # an untrained head finds plenty to check
    for text, result in zip(TRICKY, results):
        assert_entities_slice(text, result["entities"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_any_text_words_slice(text):
    assert_words_slice(text, split_words(text))


MARKS = "\u0301\u0308\u0327\u093f\u20e3\ufe0f"  # acute, diaeresis, cedilla, a vowel sign (Mc), keycap (Me), VS-16


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters=MARKS), max_size=200), st.data())
def test_combining_marks_after_letters_never_change_the_words(text, data):
    # Decomposed text splits as the text without its marks does: each mark stays inside its letter's word.
    marked = "".join(c + (data.draw(st.text(alphabet=MARKS, max_size=2)) if unicodedata.category(c)[0] == "L" else "")
                     for c in text)
    words = split_words(marked)
    assert_words_slice(marked, words)
    assert [w.translate({ord(m): None for m in MARKS}) for w, _, _ in words] == [w for w, _, _ in split_words(text)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=80), min_size=1, max_size=4))
def test_any_text_entities_slice(tagger, texts):
    for text, result in zip(texts, tagger.predict(texts)):
        assert_entities_slice(text, result["entities"])


def test_long_article_is_tagged_whole(tagger):
    # 10,000 words through 32-token windows: entities reach the end, and every word got a tag.
    article = " ".join(["Ada Lovelace visited London on Monday."] * 1430)
    words = [w for w, _, _ in split_words(article)]
    assert len(words) == 10010
    tags, _ = tagger.tag([Example(words, ["O"] * len(words), "<article>")])
    assert len(tags[0]) == len(words)
    entities = tagger.predict([article])[0]["entities"]
    assert_entities_slice(article, entities)
    assert entities[-1]["end"] > len(article) * 0.99


def test_predict_cli_raw_text(random_model, tmp_path):
    lines = ["Angela Merkel met Emmanuel Macron in Paris.", "", "Café \U0001F600 北京 a\u200bb\tc"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli([sys.executable, "-m", "ner.predict", str(random_model), str(source), "--quiet"])
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 3 and records[1] == {"entities": []}  # one answer per line, the empty one too
    assert all(set(r) == {"entities"} for r in records)
    for line, record in zip(lines, records):
        assert_entities_slice(line, record["entities"])
    assert any(r["entities"] for r in records)
    wrong = run_cli([sys.executable, "-m", "ner.predict", str(random_model), str(source), "--format", "conll"])
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: ") and "Traceback" not in wrong.stderr


def test_pretokenized_lines_split_on_any_whitespace_as_split_whitespace_does():
    from ner.predict import read_plain

    lines = ["Ada\tLovelace\u00a0visited  London\u2003.", "", " \t\u200b ", "10,000 fans \u200b cheered"]
    examples = read_plain(lines, "<stdin>")
    assert [e.words for e in examples] == [["Ada", "Lovelace", "visited", "London", "."],
                                           ["10,000", "fans", "cheered"]]  # lines without words are skipped
    split = [[w for w, _, _ in split_whitespace(line)] for line in lines]
    assert [e.words for e in examples] == [words for words in split if words]  # the splitter docs/raw_text.md names
    assert all(e.tags == ["O"] * len(e.words) for e in examples)


def test_help_says_what_the_keys_mean_in_each_mode():
    from ner.predict import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "raw text (default): `start`/`end` are character offsets" in text
    assert "--pretokenized and --conll: one JSON line per sentence" in text and "word indices" in text


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_detokenised_conll_keeps_gold_spans_and_reads_naturally():
    raw = load_script("raw_text_f1")
    words = ["Japan", "(", "Tokyo", ")", "'s", "U.S.", "deal", ",", "said", "O'Neill", "."]
    tags = ["B-LOC", "O", "B-LOC", "O", "O", "B-LOC", "O", "O", "O", "B-PER", "O"]
    text, spans, entities = raw.detokenize([Example(words, tags, "t"), Example(["Next", "."], ["O", "O"], "t")])
    assert text == "Japan (Tokyo)'s U.S. deal, said O'Neill. Next."
    assert [text[s:e] for s, e in spans] == words + ["Next", "."]
    assert [(text[s:e], kind) for s, e, kind in entities] == [("Japan", "LOC"), ("Tokyo", "LOC"), ("U.S.", "LOC"),
                                                               ("O'Neill", "PER")]
    assert [w for w, _, _ in split_words(text)] == words + ["Next", "."]  # the splitter gives the tokens back


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "conll2003" / "test.txt").is_file(),
                    reason="needs CoNLL-2003 in ../shared/data/conll2003")
def test_splitter_reproduces_conll_test_tokens():
    raw = load_script("raw_text_f1")
    documents = read_conll_documents(ROOT.parent / "shared" / "data" / "conll2003" / "test.txt")
    stats = raw.splitter_stats([raw.detokenize(d) for d in documents])
    assert len(documents) == 231
    assert stats["conll"]["tokens_reproduced"] > 0.995 and stats["conll"]["entities_on_boundaries"] > 0.999
    assert stats["whitespace_punct"]["tokens_reproduced"] < 0.95  # the baseline really is worse


@pytest.mark.parametrize("unit", ["+.", "x@", "x.-@", "a.", "www.,", "1.", "a'", "http://"])
def test_adversarial_text_costs_what_its_length_costs(unit):
    """No rule rescans the rest of the text at each start (the e-mail rule did: "+." * 50,000 took 20 s, 350x
    prose of that length). Compared with punctuation of the same length in the same run, best of 3, with a wide
    margin: linear splitting is within 2x of it, the quadratic rule was 40x at this length."""
    import time

    def seconds(text: str) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            split_words(text)
            times.append(time.perf_counter() - start)
        return min(times)

    length = 60_000
    adversarial = (unit * (length // len(unit) + 1))[:length]
    assert seconds(adversarial) < 8 * seconds("+ " * (length // 2))
