"""Document context end to end: auto-detected from -DOCSTART-, recorded in the export, used by
ner.predict / ner.evaluate by default, refused on resume when changed, exact on 2 processes."""

from __future__ import annotations

import json

import pytest
from conftest import make_sentences, python_module, read_state, run_cli, tiny_args

from ner.backends import NO_MIXED_PRECISION
from ner.data.conll import read_conll
from ner.training.checkpoint import list_checkpoints


def write_documents(path, sentences, per_document: int):
    """CoNLL with a -DOCSTART- line before every `per_document` sentences; no final newline."""
    blocks = []
    for i, sentence in enumerate(sentences):
        if i % per_document == 0:
            blocks.append("-DOCSTART- -X- -X- O")
        blocks.append("\n".join(f"{w} NN O {t}" for w, t in sentence))
    path.write_text("\n\n".join(blocks), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def doc_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("doc_data")
    return {"train": write_documents(folder / "train.conll", make_sentences(48, seed=1, long_every=12), 5),
            # 13 sentences in documents of 4: neither divides by 2 processes
            "validation": write_documents(folder / "valid.conll", make_sentences(13, seed=2, long_every=6), 4),
            "test": write_documents(folder / "test.conll", make_sentences(11, seed=3), 3)}


@pytest.fixture(scope="module")
def doc_run(tiny_bert, doc_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("doc_run") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, doc_data, out, "--num-epochs", "3",
                                                           "--learning-rate", "3e-3")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--context auto: document (the training data has two or more documents)" in result.stderr
    return out


def test_the_export_records_how_it_was_trained(doc_run):
    args = json.loads((doc_run / "final" / "training_args.json").read_text())
    assert (args["context"], args["context_tokens"], args["max_seq_length"], args["decode"]) == \
        ("document", 4, 32, "viterbi")
    assert "viterbi" in (doc_run / "final" / "README.md").read_text()


def test_predict_and_evaluate_use_the_trained_context_by_default(doc_run, doc_data):
    from ner.inference.tagger import Tagger

    examples = read_conll(doc_data["test"])
    tagger = Tagger(doc_run / "final", precision=NO_MIXED_PRECISION)
    assert tagger.max_seq_length == 32 and tagger.uses_context(examples)
    with_context, _ = tagger.tag(examples)
    without, _ = Tagger(doc_run / "final", precision=NO_MIXED_PRECISION, context="none").tag(examples)
    assert with_context != without  # the context changes what the model sees
    metrics = json.loads((doc_run / "final" / "metrics.json").read_text())
    result = run_cli(python_module("ner.evaluate", str(doc_run / "final"), str(doc_data["test"]), "--json",
                                   str(doc_run / "eval.json"), "--mixed-precision", NO_MIXED_PRECISION))
    assert result.returncode == 0, result.stderr
    assert json.loads((doc_run / "eval.json").read_text())["f1"] == pytest.approx(metrics["test"]["f1"])


def test_resume_refuses_a_change_of_context(doc_run, tiny_bert, doc_data, tmp_path):
    checkpoint = list_checkpoints(doc_run)[-1]
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, doc_data, tmp_path / "out", "--num-epochs",
                                                           "3", "--learning-rate", "3e-3", "--context", "none",
                                                           "--resume", str(checkpoint))))
    assert result.returncode == 2
    assert "context: checkpoint 'document', now 'none'" in result.stderr


def test_two_processes_score_every_sentence_once_with_context(tiny_bert_no_dropout, doc_data, tmp_path):
    """13 validation sentences in documents of 4, over 2 ranks: support counts each gold entity once."""
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert_no_dropout, doc_data, tmp_path / "two",
                                                           "--raw-ddp", "--nproc", "2", "--max-steps", "6")))
    assert result.returncode == 0, result.stderr[-3000:]
    evaluation = read_state(list_checkpoints(tmp_path / "two")[-1])["eval_history"][-1]
    gold = sum(t.startswith("B-") for e in read_conll(doc_data["validation"]) for t in e.tags)
    assert evaluation["scores"]["support"] == gold
