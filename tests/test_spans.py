"""Span data from annotation tools (span JSONL, Label Studio, spaCy) to words and IOB2 tags, and back."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from conftest import SHARED_CONLL, needs, python_module, run_cli, tiny_args

from ner.data.conll import read_conll
from ner.data.examples import SAMPLE_DIR
from ner.data.formats import detect_format, read_examples
from ner.data.jsonl import write_jsonl
from ner.data.spans import span_record
from ner.errors import UserError

LABEL_STUDIO = Path(__file__).parent / "data" / "label_studio_ner.json"


def write_spans(path: Path, *records: dict) -> Path:
    return write_jsonl(path, records)


def tagged(examples) -> list[list[tuple[str, str]]]:
    return [list(zip(e.words, e.tags)) for e in examples]


def test_offsets_count_characters_through_accents_emoji_and_crlf(tmp_path):
    text = "Café 😀 in Zürich\r\nÁngel Niño 👩‍👩‍👧 met Łódź."
    spans = [[text.index(s), text.index(s) + len(s), kind]
             for s, kind in (("Zürich", "LOC"), ("Ángel Niño", "PER"), ("Łódź", "LOC"))]
    examples = read_examples(write_spans(tmp_path / "a.jsonl", {"text": text, "entities": spans}))
    assert tagged(examples) == [
        [("Café", "O"), ("😀", "O"), ("in", "O"), ("Zürich", "B-LOC")],
        [("Ángel", "B-PER"), ("Niño", "I-PER"), ("👩\u200d👩\u200d👧", "O"), ("met", "O"), ("Łódź", "B-LOC"),
         (".", "O")]]
    assert examples[0].document == examples[1].document  # one text, one document, cut at the line break


def test_offsets_counted_in_utf16_or_with_crlf_as_one_are_reread_by_the_span_text(tmp_path, caplog):
    text = "😀😀 Marie Curie\r\nsaw Paris"
    utf16 = len("😀😀 ".encode("utf-16-le")) // 2
    crlf = text.replace("\r\n", "\n").index("Paris")
    record = {"text": text, "entities": [{"start": utf16, "end": utf16 + 11, "label": "PER", "text": "Marie Curie"},
                                         {"start": crlf, "end": crlf + 5, "label": "LOC", "text": "Paris"}]}
    with caplog.at_level(logging.INFO, logger="ner"):
        examples = read_examples(write_spans(tmp_path / "a.jsonl", record))
    assert [e.tags for e in examples] == [["O", "O", "B-PER", "I-PER"], ["O", "B-LOC"]]
    assert "1 offsets re-read as UTF-16 code units" in caplog.text
    assert "1 offsets re-read as CRLF as one character" in caplog.text
    wrong = {"text": text, "entities": [{"start": 0, "end": 2, "label": "PER", "text": "Marie"}]}
    with pytest.raises(UserError, match=r"a.jsonl:1: span \[0, 2, 'PER'\] covers '😀😀' but says it is 'Marie'"):
        read_examples(write_spans(tmp_path / "a.jsonl", wrong))


def test_rereading_a_texts_offsets_reads_the_text_once_per_unit(tmp_path, caplog, monkeypatch):
    # 400 spans in UTF-16 units after astral characters, 400 with CRLF as one character: each way of counting
    # is tabled once for the text (the cost is linear), and every span lands on its words.
    from ner.data import spans

    built = []
    for name in ("_utf16_table", "_crlf_table"):
        table = getattr(spans, name)
        monkeypatch.setattr(spans, name, lambda text, name=name, table=table: built.append(name) or table(text))
    names = [(f"Marie Curie{i}", "PER", f"Paris{i}", "LOC") for i in range(200)]  # unique: no offset hits by chance
    emoji_text = "".join(f"😀 {person} met 👩\u200d👩\u200d👧 in {place}. " for person, _, place, _ in names)
    crlf_text = "".join(f"{person}\r\nin {place}.\r\n" for person, _, place, _ in names)
    records = []
    for text, offset in ((emoji_text, lambda before: len(before.encode("utf-16-le")) // 2),
                         (crlf_text, lambda before: len(before.replace("\r\n", "\n")))):
        entities, at = [], 0
        for name, label in [(n[i], n[i + 1]) for n in names for i in (0, 2)]:
            at = text.index(name, at)
            start = offset(text[:at])
            entities.append({"start": start, "end": start + len(name), "label": label, "text": name})
            at += len(name)
        records.append({"text": text, "entities": entities})
    with caplog.at_level(logging.INFO, logger="ner"):
        examples = read_examples(write_spans(tmp_path / "a.jsonl", *records))
    assert [t for e in examples for t in e.tags if t != "O"] == ["B-PER", "I-PER", "B-LOC"] * 400
    assert "400 offsets re-read as UTF-16 code units" in caplog.text
    assert "399 offsets re-read as CRLF as one character" in caplog.text  # the first span is before any CRLF
    assert sorted(built) == ["_crlf_table", "_utf16_table", "_utf16_table"]  # the CRLF text tried UTF-16 first


TEXT = "Angela Merkel met Bre-X in Berlin."  # words: Angela Merkel met Bre-X in Berlin .
NO = "O"  # outside any entity
# case: (span, what strict says, tags under expand, tags under contract)
CASES = {
    "cuts a word at its end": ([0, 10, "PER"], "'Angela Mer' cuts the word 'Merkel'",
                               ["B-PER", "I-PER", NO, NO, NO, NO, NO], ["B-PER", NO, NO, NO, NO, NO, NO]),
    "cuts a word at its start": ([2, 13, "PER"], "'gela Merkel' cuts the word 'Angela'",
                                 ["B-PER", "I-PER", NO, NO, NO, NO, NO], [NO, "B-PER", NO, NO, NO, NO, NO]),
    "inside one word": ([18, 21, "ORG"], "'Bre' cuts the word 'Bre-X'",
                        [NO, NO, NO, "B-ORG", NO, NO, NO], [NO] * 7),
    "outside the text": ([27, 99, "LOC"], "lies outside the text (34 characters)",  # clipped: "Berlin."
                         [NO, NO, NO, NO, NO, "B-LOC", "I-LOC"], [NO, NO, NO, NO, NO, "B-LOC", "I-LOC"]),
    "empty": ([27, 27, "LOC"], "is empty (start >= end)", [NO] * 7, [NO] * 7),
    "wholly past the end": ([40, 45, "LOC"], "lies outside the text (34 characters)", [NO] * 7, [NO] * 7),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("alignment", ["strict", "expand", "contract"])
def test_each_misaligned_span_under_each_alignment(tmp_path, case, alignment, caplog):
    span, message, expanded, contracted = CASES[case]
    path = write_spans(tmp_path / "a.jsonl", {"text": "Hello."}, {"text": TEXT, "entities": [span]})
    if alignment == "strict":
        with pytest.raises(UserError) as error:
            read_examples(path)
        assert str(error.value).startswith(f"{path}:2: span [{span[0]}, {span[1]}, '{span[2]}']")
        assert message in str(error.value) and "--span-alignment expand" in str(error.value)
        return
    with caplog.at_level(logging.INFO, logger="ner"):
        tags = read_examples(path, span_alignment=alignment)[1].tags
    assert tags == (expanded if alignment == "expand" else contracted)
    assert "2 texts, 1 spans (1 " in caplog.text  # what happened to the span is counted


def test_overlapping_spans_keep_the_longer_or_refuse(tmp_path, caplog):
    spans = [[0, 13, "PER"], [7, 13, "LOC"], [18, 33, "ORG"], [18, 33, "ORG"], [27, 33, "LOC"]]
    path = write_spans(tmp_path / "a.jsonl", {"text": TEXT, "entities": spans})
    with pytest.raises(UserError, match=r"a.jsonl:1: span \[7, 13, 'LOC'\] 'Merkel' overlaps span "
                                        r"\[0, 13, 'PER'\] 'Angela Merkel'.*\(1 more span problem in this file\)"):
        read_examples(path)
    with caplog.at_level(logging.INFO, logger="ner"):
        tags = read_examples(path, span_alignment="expand")[0].tags
    assert tags == ["B-PER", "I-PER", NO, "B-ORG", "I-ORG", "I-ORG", NO]
    assert "2 dropped: overlaps a longer span, 1 duplicates merged" in caplog.text


def test_empty_text_and_text_without_entities(tmp_path, caplog):
    path = write_spans(tmp_path / "a.jsonl", {"text": ""}, {"text": "Nothing here.", "entities": []},
                       {"text": "  \n ", "label": []}, {"text": "Paris.", "labels": [[0, 5, "LOC"]]})
    with caplog.at_level(logging.INFO, logger="ner"):
        examples = read_examples(path)
    assert tagged(examples) == [[("Nothing", "O"), ("here", "O"), (".", "O")], [("Paris", "B-LOC"), (".", "O")]]
    assert "2 empty texts skipped" in caplog.text
    with pytest.raises(UserError, match="no words in any text"):
        read_examples(write_spans(tmp_path / "b.jsonl", {"text": ""}))


def test_a_line_break_inside_an_entity_does_not_cut_the_sentence(tmp_path):
    text = "Bank of\nEngland rose."
    examples = read_examples(write_spans(tmp_path / "a.jsonl", {"text": text, "entities": [[0, 15, "ORG"]]}))
    assert tagged(examples) == [[("Bank", "B-ORG"), ("of", "I-ORG"), ("England", "I-ORG"), ("rose", "O"),
                                 (".", "O")]]


def test_doccano_prodigy_and_object_spans_and_the_document_field(tmp_path, caplog):
    path = write_spans(tmp_path / "a.jsonl",
                       {"id": 1, "text": "Paris is big.", "label": [[0, 5, "LOC"]], "document": "d1"},
                       {"text": "Rome too.", "spans": [{"start": 0, "end": 4, "label": "LOC", "token_start": 0}],
                        "answer": "accept", "document": "d1"},
                       {"text": "Oslo.", "spans": [{"start": 0, "end": 4, "label": "LOC"}], "answer": "reject"},
                       {"text": "Kim left.", "labels": [{"start": 0, "end": 3, "labels": ["PER"]}]},
                       {"id": 9, "text": "Acme won.", "relations": [],  # doccano 1.x
                        "entities": [{"id": 3, "label": "ORG", "start_offset": 0, "end_offset": 4}]})
    with caplog.at_level(logging.INFO, logger="ner"):
        examples = read_examples(path)
    assert [e.tags[0] for e in examples] == ["B-LOC", "B-LOC", "B-PER", "B-ORG"]
    assert [e.document for e in examples] == ["d1", "d1", "line 4", "line 5"]
    assert "skipped 1 texts the annotator rejected" in caplog.text


@pytest.mark.parametrize("line, message", [
    ('{"words": ["a"]}', ':1: no "text" string'),
    ('{"text": "a b", "entities": [[0, "1", "X"]]}', ":1: span [0, '1', 'X'] needs integer start and end"),
    ('{"text": "a b", "entities": [[0, 1, "New York"]]}', "has label 'New York'; a label is one word"),
    ('{"text": "a b", "entities": {"x": 1}}', ":1: the spans must be a list"),
    ('{"text": "a b", "entities": [[0, 1]]}', ":1: span [0, 1] is not [start, end, label]"),
    ('{"text": "a", "document": [1]}', '"document" must be a string or an integer'),
])
def test_malformed_span_records_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="a.jsonl:2" + "|" + "a.jsonl:1"):
        read_examples(path, data_format="spans")
    with pytest.raises(UserError) as error:
        read_examples(path, data_format="spans")
    assert message.replace(":1:", ":2:") in str(error.value)


def test_a_line_separator_inside_a_json_string_does_not_end_the_record(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": "Paris\u2028Rome", "entities": [[6, 10, "LOC"]]}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    assert read_examples(path)[0].tags == ["O", "B-LOC"]


def test_formats_are_found_by_content_whatever_the_name(tmp_path):
    spans = write_spans(tmp_path / "spans.txt", {"text": "Paris.", "entities": [[0, 5, "LOC"]]})
    words = write_spans(tmp_path / "words.data", {"tokens": ["Paris"], "tags": ["B-LOC"]})
    studio = tmp_path / "export"
    studio.write_bytes(LABEL_STUDIO.read_bytes())
    conll = tmp_path / "a.json.conll"
    conll.write_text("[ O\n{ O\nParis B-LOC\n", encoding="utf-8")
    assert [detect_format(p) for p in (spans, words, studio, conll)] == ["spans", "jsonl", "label-studio", "conll"]
    assert read_examples(conll)[0].words == ["[", "{", "Paris"]
    with pytest.raises(UserError, match="spans.txt:1: .* is not a valid tag"):
        read_examples(spans, data_format="conll")


def test_label_studio_export_takes_the_latest_annotation_and_says_which(caplog):
    with caplog.at_level(logging.INFO, logger="ner"):
        examples = read_examples(LABEL_STUDIO)
    by_task = {}
    for example in examples:
        by_task.setdefault(example.document, []).extend(zip(example.words, example.tags))
    assert ("Paris", "B-LOC") in by_task[102]  # annotation 7 (updated last) fixed annotation 2's ORG
    assert by_task[104][1:3] == [("Marie", "B-PER"), ("Curie", "I-PER")]  # UTF-16 offsets after an emoji
    assert by_task[107][0] == ("Stark", "B-ORG")  # the cancelled annotation was skipped
    assert 108 not in by_task and 105 in by_task  # predictions are not annotations; no entities is fine
    assert [e.document for e in examples].count(106) == 2  # CRLF: two sentences, one document
    assert "task 102: annotation 7 (updated 2026-11-22T08:30:00.000000Z) of 2" in caplog.text
    assert "skipped 1 tasks without an annotation" in caplog.text
    assert "ignored results that are not text spans: {'choices': 1}" in caplog.text


def test_label_studio_errors(tmp_path):
    path = tmp_path / "export.json"
    path.write_text('[{"id": 4, "data": {"title": "a", "body": "b"}, "annotations": [{"id": 1, "result": []}]}]')
    with pytest.raises(UserError, match=r"export.json: task 1 \(id 4\): which field of \"data\" holds the text"):
        read_examples(path)
    path.write_text('[{"text": "a"}]')
    with pytest.raises(UserError, match="task 1 has no \"data\" object"):
        read_examples(path)
    path.write_text('[{"data": {"text": "a"},\n "annotations": [}]')
    with pytest.raises(UserError, match="export.json:2: not valid JSON"):
        read_examples(path)


@needs("spacy")
def test_spacy_docbin(tmp_path):
    import spacy  # in the test extra: this check runs wherever the tests do
    from spacy.tokens import DocBin

    nlp = spacy.blank("en")
    doc = nlp("Ada Lovelace visited London.\nThen Paris.")
    doc.ents = [doc.char_span(0, 12, "PER"), doc.char_span(21, 27, "LOC"), doc.char_span(34, 39, "LOC")]
    path = tmp_path / "train.spacy"
    DocBin(docs=[doc, nlp("Nothing.")]).to_disk(path)
    renamed = tmp_path / "train.bin"
    renamed.write_bytes(path.read_bytes())
    assert detect_format(renamed) == "spacy"
    assert tagged(read_examples(renamed)) == [
        [("Ada", "B-PER"), ("Lovelace", "I-PER"), ("visited", "O"), ("London", "B-LOC"), (".", "O")],
        [("Then", "O"), ("Paris", "B-LOC"), (".", "O")], [("Nothing", "O"), (".", "O")]]


def test_spacy_docbin_without_spacy_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy now raises ImportError
    path = tmp_path / "train.spacy"
    path.write_bytes(b"\x78\x9c")
    with pytest.raises(UserError, match=r"train.spacy: reading a spaCy DocBin needs spaCy: "
                                        r'pip install -e "\.\[spacy\]"'):
        read_examples(path)


def test_conll_to_spans_and_back_gives_the_same_sentences_and_tags(tmp_path):
    from seqeval.metrics.sequence_labeling import get_entities

    sentences = read_conll(SAMPLE_DIR / "valid.conll")
    documents = [sentences[i:i + 10] for i in range(0, len(sentences), 10)]
    original = [s for d in documents for s in d]
    with_tokens = write_jsonl(tmp_path / "a.jsonl", [span_record(((s.words, s.tags) for s in d), tokens=True)
                                                     for d in documents])
    back = read_examples(with_tokens)
    assert [(e.words, e.tags) for e in back] == [(e.words, e.tags) for e in original]
    assert len({e.document for e in back}) == len(documents) > 1
    record = json.loads(with_tokens.read_text(encoding="utf-8").splitlines()[0])
    expected = [(" ".join(s.words[a:b + 1]), kind) for s in documents[0] for kind, a, b in get_entities(s.tags)]
    assert [(record["text"][start:end], kind) for start, end, kind in record["entities"]] == expected
    # Without the words, the splitter reads the text: the same entities, and the same words where it agrees.
    plain = write_jsonl(tmp_path / "b.jsonl", [span_record((s.words, s.tags) for s in d) for d in documents])
    split = read_examples(plain)
    same = [a.words == b.words for a, b in zip(original, split)]
    assert sum(same) >= 0.95 * len(original) and all(a.tags == b.tags for a, b, s in zip(original, split, same) if s)
    assert [(kind, "".join(e.words[a:b + 1])) for e in split for kind, a, b in get_entities(e.tags)] == \
        [(kind, "".join(e.words[a:b + 1])) for e in original for kind, a, b in get_entities(e.tags)]


def test_prodigy_tokens_must_lie_on_the_text(tmp_path):
    good = {"text": "Paris is big", "tokens": [{"text": "Paris", "start": 0, "end": 5}, {"start": 6, "end": 12}],
            "spans": [{"start": 0, "end": 5, "label": "LOC"}]}
    assert tagged(read_examples(write_spans(tmp_path / "a.jsonl", good))) == [[("Paris", "B-LOC"), ("is big", "O")]]
    for tokens in ([{"text": "Pari", "start": 0, "end": 5}], [{"start": 6, "end": 8}, {"start": 0, "end": 5}]):
        bad = {"text": "Paris is big", "tokens": tokens}
        with pytest.raises(UserError, match=r'a.jsonl:1: token .* is not \{"text", "start", "end"\} over the text'):
            read_examples(write_spans(tmp_path / "a.jsonl", bad))


def test_conll2003_to_spans_script_round_trip(tmp_path):
    if not (SHARED_CONLL / "valid.txt").is_file():
        pytest.skip(f"CoNLL-2003 not found at {SHARED_CONLL}")
    out = tmp_path / "valid.jsonl"
    result = run_cli([sys.executable, "scripts/conll_to_spans.py", str(SHARED_CONLL / "valid.txt"), str(out),
                      "--documents", "40", "--conll-subset", str(tmp_path / "valid.conll")])
    assert result.returncode == 0, result.stderr
    assert "0 entities differ" in result.stdout
    assert len(read_conll(tmp_path / "valid.conll")) == len(read_examples(out))


def test_predict_writes_spans_that_train_reads_back(random_model, tiny_data, tmp_path):
    texts = tmp_path / "texts.jsonl"
    write_jsonl(texts, [{"id": 7, "text": "Ada Lovelace visited\nLondon.", "label": [[0, 3, "PER"]]},
                        {"id": 8, "text": "Nothing happened today ."}])
    result = run_cli(python_module("ner.predict", str(random_model), str(texts), "--jsonl", "--format", "spans",
                                   "--quiet"))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == [7, 8] and all("label" not in r for r in records)
    assert records[0]["text"] == "Ada Lovelace visited\nLondon."
    for record in records:
        for start, end, kind in record["entities"]:
            assert record["text"][start:end] == record["text"][start:end].strip() and kind in {"PER", "LOC", "ORG"}
    (tmp_path / "predicted.jsonl").write_text(result.stdout, encoding="utf-8")
    assert len(read_examples(tmp_path / "predicted.jsonl")) == 3  # two lines of text 7, one of text 8
    studio = run_cli(python_module("ner.predict", str(random_model), str(texts), "--jsonl", "--format",
                                   "label-studio", "--quiet"))
    assert studio.returncode == 0, studio.stderr
    tasks = json.loads(studio.stdout)
    assert [t["data"]["id"] for t in tasks] == [7, 8] and "label" not in tasks[0]["data"]
    from ner.inference.model_folder import model_version  # the one name ner.serve gives the same model

    assert {t["predictions"][0]["model_version"] for t in tasks} == {model_version(random_model)}
    predicted = [r["value"] for t in tasks for r in t["predictions"][0]["result"]]
    assert predicted and all(t["data"]["text"][v["start"]:v["end"]] == v["text"] for t in tasks
                             for v in (r["value"] for r in t["predictions"][0]["result"]))
    for task in tasks:  # accepted in Label Studio, a prediction becomes an annotation: read back as such
        task["annotations"] = task.pop("predictions")
    (tmp_path / "accepted.json").write_text(json.dumps(tasks), encoding="utf-8")
    assert sum(t != "O" for e in read_examples(tmp_path / "accepted.json") for t in e.tags) >= len(predicted)
    conll = run_cli(python_module("ner.predict", str(random_model), str(tiny_data["test"]), "--conll",
                                  "--format", "spans", "--quiet"))
    assert conll.returncode == 0, conll.stderr
    first = json.loads(conll.stdout.splitlines()[0])
    assert first["text"] == " ".join(read_conll(tiny_data["test"])[0].words)


def test_label_studio_export_trains_and_evaluates(tiny_bert, tmp_path):
    """Fitted to its own 9 sentences (F1 0.88 measured; 0 after tiny_args' 2 epochs at 1e-3), then
    scored again by ner.evaluate from the export: the same file read the same way gives the same F1."""
    data = {"train": LABEL_STUDIO, "validation": LABEL_STUDIO, "test": LABEL_STUDIO}
    out = tmp_path / "run"
    args = tiny_args(tiny_bert, data, out, "--learning-rate", "5e-3", "--num-epochs", "8")
    result = run_cli(python_module("ner.train", *args))
    assert result.returncode == 0, result.stderr
    assert "took the latest of each: task 102: annotation 7" in result.stderr
    metrics = json.loads((out / "final" / "metrics.json").read_text())
    assert metrics["validation"]["f1"] > 0.5 and metrics["test"]["support"] == 18
    assert metrics["test"]["f1"] == metrics["validation"]["f1"]  # the same file, the same (best) model
    report = run_cli(python_module("ner.evaluate", str(out / "final"), str(LABEL_STUDIO),
                                   "--json", str(tmp_path / "report.json")))
    assert report.returncode == 0, report.stderr
    assert f"{LABEL_STUDIO}: 9 sentences" in report.stdout
    scores = json.loads((tmp_path / "report.json").read_text())
    assert (scores["f1"], scores["support"]) == pytest.approx((metrics["test"]["f1"], 18), abs=1e-9)


def test_train_refuses_misaligned_spans_with_file_record_and_span(tiny_bert, tmp_path):
    path = write_spans(tmp_path / "train.jsonl", {"text": TEXT, "entities": [[0, 10, "PER"]]})
    data = {"train": path, "validation": path, "test": path}
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, data, tmp_path / "run")))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {path}:1: span [0, 10, 'PER'] 'Angela Mer'")
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
