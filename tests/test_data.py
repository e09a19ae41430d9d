"""Readers, tag schemes and the label list: values, and the errors a user sees."""

from __future__ import annotations

import json

import pytest

from ner.data.conll import read_conll
from ner.data.examples import Example
from ner.data.formats import read_examples
from ner.data.jsonl import read_jsonl
from ner.data.tags import build_label_list, check_known_labels, detect_scheme, to_iob2, to_iobes
from ner.errors import UserError


def test_conll_tolerates_crlf_bom_tabs_docstart_and_missing_final_newline(tmp_path):
    path = tmp_path / "a.conll"
    text = "\ufeff-DOCSTART- -X- -X- O\r\n\r\nEU\tNNP\tB-ORG\r\nrejects VBZ O\r\n\r\n\r\nPeter NNP B-PER\r\nBlack I-PER"
    path.write_bytes(text.encode("utf-8"))
    examples = read_conll(path)
    assert [e.words for e in examples] == [["EU", "rejects"], ["Peter", "Black"]]
    assert [e.tags for e in examples] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    assert examples[1].lines == [7, 8]


@pytest.mark.parametrize("content, expected", [
    (b"EU B-ORG\nrejects\n", ":2: expected 'word ... TAG'"),
    (b"EU B-ORG\nrejects X-FOO\n", ":2: 'X-FOO' is not a valid tag"),
    (b"", ": file is empty"),
    (b"\n\n  \n", ": file is empty"),
    (b"EU B-ORG\nna\xefve O\n", ":2: not UTF-8"),
    (b"\x00\x01\x02binary", ": looks like a binary file"),
    (b"-DOCSTART- O\n\n", ": no sentences found"),
])
def test_conll_errors_name_file_and_line(tmp_path, content, expected):
    path = tmp_path / "a.conll"
    path.write_bytes(content)
    with pytest.raises(UserError) as info:
        read_conll(path)
    assert str(info.value).startswith(f"{path}{expected}")


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        read_examples(tmp_path / "nope.conll")


def test_jsonl_reader_and_errors(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"tokens": ["Ada", "wins"], "tags": ["B-PER", "O"]}) + "\n\n")
    assert read_examples(good)[0].tags == ["B-PER", "O"]
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"tokens": ["Ada"], "tags": ["B-PER", "O"]}) + "\n")
    with pytest.raises(UserError, match=r"b.jsonl:1: expected"):
        read_jsonl(bad)


def test_datasets_save_to_disk_folder_with_class_labels(tmp_path):
    import datasets

    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"]))})
    split = datasets.Dataset.from_dict({"tokens": [["Ada", "Lovelace", "wins"]], "ner_tags": [[1, 2, 0]]},
                                       features=features)
    datasets.DatasetDict({"train": split, "validation": split}).save_to_disk(tmp_path / "ds")
    examples = read_examples(tmp_path / "ds", split="validation")
    assert examples[0].tags == ["B-PER", "I-PER", "O"]


def test_scheme_detection_and_conversion():
    iob1 = [Example(["a", "b", "c", "d"], ["I-PER", "I-PER", "O", "I-LOC"], "x")]
    assert detect_scheme(iob1) == "iob1"
    assert detect_scheme([Example(["a"], ["S-PER"], "x")]) == "iobes"
    assert detect_scheme([Example(["a", "b"], ["B-PER", "I-PER"], "x")]) == "iob2"
    assert to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]
    assert to_iobes(["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]) == ["B-PER", "E-PER", "O", "S-LOC", "S-LOC"]
    assert to_iob2(["B-PER", "E-PER", "S-LOC"]) == ["B-PER", "I-PER", "B-LOC"]


def test_label_list_is_stable_whatever_the_order():
    a = [Example(["x"] * 4, ["B-PER", "I-PER", "B-LOC", "O"], "x")]
    b = [Example(["x"] * 4, ["O", "B-LOC", "I-PER", "B-PER"], "x")]
    assert build_label_list(a) == build_label_list(b) == ["O", "B-LOC", "B-PER", "I-PER"]


def test_unknown_validation_label_names_file_and_line(tmp_path):
    path = tmp_path / "valid.conll"
    path.write_text("Ada B-PER\n\nParis B-LOC\n")
    with pytest.raises(UserError, match=r"valid.conll:3: tag 'B-LOC' never appears in the training data"):
        check_known_labels(read_conll(path), {"O": 0, "B-PER": 1})
