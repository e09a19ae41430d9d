"""Raw text in, character offsets out: the CoNLL-style splitter, Tagger.predict and `ner.predict` on raw text."""

from __future__ import annotations

import json
import re
import sys
import unicodedata

import pytest
from conftest import ROOT, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ner.backends import NO_MIXED_PRECISION
from ner.data.conll import read_conll_documents
from ner.data.examples import Example
from ner.data.text import split_whitespace, split_whitespace_punct, split_words

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

    return Tagger(random_model, precision=NO_MIXED_PRECISION, max_seq_length=32)


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
    assert len(results) == len(TRICKY) and results[0] == {"entities": [], "confidence": 1.0}
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
    assert len(records) == 3 and records[1] == {"entities": [], "confidence": 1.0}  # one answer a line, the empty too
    assert all(set(r) == {"entities", "confidence"} for r in records)
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


# A rule that scans an unbounded run and may then fail costs the run's length at every position it can start
# from: quadratic ("+." * 50,000 took 20 s in the e-mail rule once). Each such scan must start only where its run
# starts: right after a lookbehind that refuses the run's characters, or after a character the run cannot hold.
# Timing is left to benchmarks/text_split.py (docs/raw_text.md); these checks read the patterns' structure.
SCANS_THAT_FAIL_ONLY_ONCE_PER_RUN = {
    "http://example.com": "the URL rule: its scan fails only over trailing punctuation, which cannot hold the "
                          "'http' or 'www.' that starts another attempt, so each character is scanned once",
}


def _regex_internals():
    try:
        from re import _compiler, _constants, _parser  # Python 3.11 and later
    except ImportError:  # Python 3.10
        import sre_compile as _compiler
        import sre_constants as _constants
        import sre_parse as _parser
    return _compiler, _constants, _parser


SAMPLE_CHARS = [chr(c) for c in [*range(0x3000), *range(0x1F1E6, 0x1F200), *range(0x1F300, 0x1F400)]]


def unguarded_failing_scans(pattern: re.Pattern) -> list[str]:
    """Each unbounded repeat of one character class that something mandatory follows (so it can fail after the
    scan), and that is not right after a lookbehind refusing its characters or a character outside them."""
    _compiler, c, _parser = _regex_internals()
    parsed = _parser.parse(pattern.pattern, pattern.flags)
    one_char = (c.IN, c.LITERAL, c.NOT_LITERAL, c.ANY, c.CATEGORY)

    def chars(item) -> set[str]:
        matcher = _compiler.compile(_parser.SubPattern(parsed.state, [item]), pattern.flags)
        return {ch for ch in SAMPLE_CHARS if matcher.fullmatch(ch)}

    def guarded(before: list, run: set[str]) -> bool:
        """`before`: the items before the scan, nearest first. Single characters the run could hold are passed
        over (the scan starts at a fixed offset from them) until a guard decides: a lookbehind refusing the run's
        characters, or one character the run cannot hold."""
        for op, av in before:
            if op == c.ASSERT_NOT and av[0] == -1:  # (?<![...]): no attempt starts inside a run
                return len(av[1].data) == 1 and run <= chars(av[1].data[0])
            if op not in one_char:
                return False
            if not run & chars((op, av)):
                return True
        return False

    problems: list[str] = []

    def walk(items: list, before: list, after_min: int) -> None:
        for i, (op, av) in enumerate(items):
            prev = items[:i][::-1] + before
            follows = _parser.SubPattern(parsed.state, items[i + 1:]).getwidth()[0] + after_min
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)) and av[1] == c.MAXREPEAT:
                body = list(av[2].data)
                if len(body) == 1 and body[0][0] in one_char:
                    if follows and not guarded(prev, chars(body[0])):
                        problems.append(f"{pattern.pattern!r}: a scan of {body[0]} can fail after it")
                else:
                    walk(body, [], follows)  # a repeated group: its scans can start after any iteration
            elif op == c.SUBPATTERN:
                walk(list(av[-1].data), prev, follows)
            elif op == c.BRANCH:
                for branch in av[1]:
                    walk(list(branch.data), prev, follows)
            elif op in (c.ASSERT, c.ASSERT_NOT) and av[0] == 1:  # a lookahead scans from where it stands
                walk(list(av[1].data), prev, 0)

    items = list(parsed.data)
    branches = [list(b.data) for b in items[0][1][1]] if len(items) == 1 and items[0][0] == c.BRANCH else [items]
    for branch in branches:
        matcher = _compiler.compile(_parser.SubPattern(parsed.state, branch), pattern.flags)
        if not any(matcher.fullmatch(sample) for sample in SCANS_THAT_FAIL_ONLY_ONCE_PER_RUN):
            walk(branch, [], 0)
    return problems


def test_no_splitting_rule_rescans_a_run_from_every_position():
    import ner.data.text

    patterns = [v for v in vars(ner.data.text).values() if isinstance(v, re.Pattern)]
    assert ner.data.text.CONLL_PATTERN in patterns and len(patterns) >= 4
    assert [p for pattern in patterns for p in unguarded_failing_scans(pattern)] == []


@pytest.mark.parametrize("rule", [
    r"[\w.+-]+@\w+",                # the e-mail rule as it was: every position of "+.+.+." starts a scan
    r"(?=\s+\w)",                    # a lookahead from anywhere in a run of spaces
    r"\w+(?:[-'’&]\w+)*x",           # a word rule that needs a mark after it
])
def test_the_structure_check_finds_a_scan_that_can_fail_from_anywhere(rule):
    assert unguarded_failing_scans(re.compile(rule)) != []


@pytest.mark.parametrize("rule", [r"(?<![\w.+-])[\w.+-]+@\w+", r"\.(?=\s+\w)", r"\w+(?:[-'’&]\w+)*"])
def test_the_structure_check_passes_a_guarded_scan_or_one_that_cannot_fail(rule):
    assert unguarded_failing_scans(re.compile(rule)) == []
