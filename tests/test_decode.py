"""Viterbi decoding: never an invalid tag sequence, as probable as the best valid one, and argmax's equal
wherever argmax is valid; the fallback where no valid sequence exists; the scheme of a label list.

Scores are compared, not sequences: two sequences can be equally probable (ties, or float rounding as
in [-2.2e-22, 0.0, ...] where -1 - 2.2e-22 == -1), and then any of them is a right answer.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ner.backends import NO_MIXED_PRECISION
from ner.data.tags import scheme_of_labels, to_iob2, to_iobes
from ner.inference.decode import Decoder

LABELS = {
    "iob2": ("O", "B-LOC", "I-LOC", "B-PER", "I-PER"),
    "iob1": ("O", "B-LOC", "I-LOC", "B-PER", "I-PER"),
    "iobes": ("O", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-PER", "I-PER", "E-PER", "S-PER"),
}
TOLERANCE = 1e-4  # float32 scores of 12 words at most, summed: far below any real difference drawn here


def is_valid(tags: list[str], scheme: str) -> bool:
    """Checked through the tag converters, not through the decoder's own rules."""
    if scheme == "iob2":
        return to_iob2(tags) == tags
    if scheme == "iobes":
        return to_iobes(tags) == tags
    previous = ["O", *tags]  # iob1: B-X separates two entities of type X, so only follows X
    return all(not t.startswith("B-") or p[2:] == t[2:] for p, t in zip(previous, tags))


def scores(n_labels: int, max_words: int):
    """float32 log-probabilities as the model gives them, with ties drawn on purpose (exact repeats, 0 vs -0)."""
    elements = st.one_of(st.floats(-8, 0, width=32), st.sampled_from([0.0, -0.0, -1.0, -2.2e-22]))
    return arrays(np.float32, st.tuples(st.integers(0, max_words), st.just(n_labels)), elements=elements)


def total(log_probs: np.ndarray, tags: list[str], labels: tuple[str, ...]) -> float:
    """A sequence's score, summed in float64."""
    return float(sum(np.float64(log_probs[i, labels.index(tag)]) for i, tag in enumerate(tags)))


def decode(labels: tuple[str, ...], scheme: str, method: str, log_probs: np.ndarray) -> list[str]:
    (tags,), _ = Decoder(labels, scheme, method)([log_probs])
    return tags


@settings(max_examples=150, deadline=None)
@given(data=st.data(), scheme=st.sampled_from(sorted(LABELS)))
def test_viterbi_is_always_valid_and_as_probable_as_argmax_where_argmax_is_valid(data, scheme):
    labels = LABELS[scheme]
    log_probs = data.draw(scores(len(labels), max_words=12))
    viterbi_tags = decode(labels, scheme, "viterbi", log_probs)
    argmax_tags = decode(labels, scheme, "argmax", log_probs)
    assert len(viterbi_tags) == len(log_probs) and is_valid(viterbi_tags, scheme), viterbi_tags
    assert total(log_probs, viterbi_tags, labels) <= total(log_probs, argmax_tags, labels) + TOLERANCE
    if is_valid(argmax_tags, scheme):  # argmax is then a best valid sequence: Viterbi must score the same
        assert total(log_probs, viterbi_tags, labels) == pytest.approx(total(log_probs, argmax_tags, labels),
                                                                        abs=TOLERANCE)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), scheme=st.sampled_from(sorted(LABELS)))
def test_viterbi_finds_the_most_probable_valid_sequence(data, scheme):
    """Against every valid sequence, enumerated (up to 4 words: 9**4 sequences for IOBES)."""
    labels = LABELS[scheme]
    log_probs = data.draw(scores(len(labels), max_words=4))
    best = max(total(log_probs, list(tags), labels) for tags in itertools.product(labels, repeat=len(log_probs))
               if is_valid(list(tags), scheme))
    viterbi_tags = decode(labels, scheme, "viterbi", log_probs)
    assert is_valid(viterbi_tags, scheme)
    assert total(log_probs, viterbi_tags, labels) == pytest.approx(best, abs=TOLERANCE)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), scheme=st.sampled_from(sorted(LABELS)), group=st.integers(1, 4))
def test_sentences_decoded_together_get_the_tags_and_probabilities_each_gets_alone(data, scheme, group):
    """The recurrence runs over many sentences at once (decode.viterbi_many, in groups of similar length): each
    sentence's answer must be the one it gets alone, bit for bit, whatever its neighbours' lengths (empty ones too)."""
    from ner.inference import decode as decode_module

    labels = LABELS[scheme]
    sentences = data.draw(st.lists(scores(len(labels), max_words=9), min_size=1, max_size=9))
    alone = [Decoder(labels, scheme, "viterbi")([lp]) for lp in sentences]
    previous, decode_module.VITERBI_GROUP = decode_module.VITERBI_GROUP, group  # several groups, ragged ones
    try:
        tags, probs = Decoder(labels, scheme, "viterbi")(sentences)
    finally:
        decode_module.VITERBI_GROUP = previous
    assert tags == [t for (t,), _ in alone]
    assert all(p.tobytes() == q.tobytes() for p, ((q,),) in zip(probs, (a[1:] for a in alone)))


def test_the_decoder_fixes_what_argmax_gets_wrong():
    labels = LABELS["iob2"]
    log_probs = np.log(np.array([[0.1, 0.05, 0.0, 0.25, 0.6],  # argmax: I-PER at the start
                                 [0.1, 0.0, 0.0, 0.1, 0.8]]) + 1e-9)
    (tags,), (probs,) = Decoder(labels, "iob2", "viterbi")([log_probs])
    assert tags == ["B-PER", "I-PER"]
    assert np.allclose(probs, [0.25, 0.8], atol=1e-6)
    assert Decoder(labels, "iob2", "argmax")([log_probs])[0] == [["I-PER", "I-PER"]]


@pytest.mark.parametrize(("labels", "scheme"), [(("B-LOC", "I-LOC"), "iobes"),  # no O: nothing may end a sentence
                                                (("B-LOC",), "iob1")])  # B- may not start an entity
def test_with_no_valid_sequence_the_decoder_falls_back_to_argmax_and_says_so_once(labels, scheme, caplog):
    rng = np.random.default_rng(0)
    sentences = [np.log(rng.dirichlet(np.ones(len(labels)), size=n)).astype(np.float32) for n in (3, 1, 5)]
    decoder = Decoder(labels, scheme, "viterbi")
    with caplog.at_level(logging.WARNING, logger="ner"):
        tags, probs = decoder(sentences)
    assert tags == Decoder(labels, scheme, "argmax")(sentences)[0]
    assert all(np.allclose(p, np.exp(lp.max(axis=-1))) for p, lp in zip(probs, sentences))
    assert decoder.fallback_sentences == 3
    (record,) = [r for r in caplog.records if "tagged by argmax" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.getMessage().startswith("3 of 3 sentences")
    decoder(sentences[:1])
    assert decoder.fallback_sentences == 4


def test_a_decoder_that_finds_valid_sequences_counts_no_fallback(caplog):
    rng = np.random.default_rng(1)
    sentences = [np.log(rng.dirichlet(np.ones(9), size=n)).astype(np.float32) for n in (4, 7)]
    decoder = Decoder(LABELS["iobes"], "iobes", "viterbi")
    with caplog.at_level(logging.WARNING, logger="ner"):
        decoder(sentences)
    assert decoder.fallback_sentences == 0 and not caplog.records


@pytest.mark.parametrize(("labels", "scheme"), [
    (["O", "B-PER", "I-PER", "E-PER", "S-PER"], "iobes"),
    (["O", "I-PER", "I-LOC", "B-LOC"], "iob1"),  # I-PER without B-PER: no IOB2 data makes that
    (["O", "B-PER", "B-LOC", "I-LOC"], "iob2"),  # B-PER without I-PER: IOB1 would start a PER with I-PER
    (["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], "iob"),  # IOB1 and IOB2 use the same labels: either
    (["O"], "iob2"),
])
def test_the_scheme_of_a_label_list(labels, scheme):
    assert scheme_of_labels(labels) == scheme


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_either_iob_scheme_is_decoded_as_well_as_argmax(data):
    """IOB1 and IOB2 forbid opposite starts (B-X after O; I-X after O): a rule that accepts both forbids nothing,
    so no sequence beats argmax's (where argmax and Viterbi break a tie differently, both are right)."""
    labels = LABELS["iob2"]
    log_probs = data.draw(scores(len(labels), max_words=12))
    viterbi_tags, argmax_tags = (decode(labels, "iob", method, log_probs) for method in ("viterbi", "argmax"))
    assert total(log_probs, viterbi_tags, labels) == pytest.approx(total(log_probs, argmax_tags, labels),
                                                                    abs=TOLERANCE)


def test_an_iob1_model_folder_without_training_args_is_decoded_under_iob1(random_model, tmp_path, caplog):
    """The labels decide where they can; where they cannot, no scheme's rule is imposed, and a warning says so."""
    import json
    import shutil

    from ner.inference.tagger import Tagger

    assert not (random_model / "training_args.json").exists()
    with caplog.at_level(logging.WARNING, logger="ner"):
        either = Tagger(random_model, device="cpu", precision=NO_MIXED_PRECISION)
    assert either.decoder.scheme == "iob" and "IOB1 and IOB2 alike" in caplog.text
    iob1 = tmp_path / "iob1"
    shutil.copytree(random_model, iob1)
    config = json.loads((iob1 / "config.json").read_text())
    iob1_labels = ["O", *(f"I-T{j}" for j in range(len(config["id2label"]) - 2)), "B-T0"]  # B- only for one type
    config["id2label"] = dict(enumerate(iob1_labels))
    config["label2id"] = {label: i for i, label in enumerate(iob1_labels)}
    (iob1 / "config.json").write_text(json.dumps(config))
    assert Tagger(iob1, device="cpu", precision=NO_MIXED_PRECISION).decoder.scheme == "iob1"


def test_tags_to_entities_by_characters_or_by_word_indices():
    """The one tags -> entities step (infer.entities): raw text gets character offsets, given words get indices."""
    from ner.data.text import split_words
    from ner.inference.entities import entities, word_positions

    text = "Ada  Lovelace met Grace Hopper."
    tags = ["B-PER", "I-PER", "O", "I-PER", "B-PER", "O"]  # seqeval's reading: I- after O starts an entity
    probs = np.array([0.9, 0.7, 1.0, 0.5, 0.6, 1.0], dtype=np.float32)
    words = split_words(text)
    assert entities(tags, probs, words, text) == [
        {"text": "Ada  Lovelace", "type": "PER", "start": 0, "end": 13, "score": 0.8},
        {"text": "Grace", "type": "PER", "start": 18, "end": 23, "score": 0.5},
        {"text": "Hopper", "type": "PER", "start": 24, "end": 30, "score": 0.6}]
    assert entities(tags, probs, word_positions([w for w, _, _ in words])) == [
        {"text": "Ada Lovelace", "type": "PER", "start": 0, "end": 2, "score": 0.8},
        {"text": "Grace", "type": "PER", "start": 3, "end": 4, "score": 0.5},
        {"text": "Hopper", "type": "PER", "start": 4, "end": 5, "score": 0.6}]


def test_entity_types_of_a_label_list():
    from ner.data.tags import entity_types

    assert entity_types(["O", "B-PER", "I-PER", "S-LOC", "E-MISC", "B-ORG-X"]) == ["LOC", "MISC", "ORG-X", "PER"]
    assert entity_types(["O"]) == []


ODD_TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "I-MISC", "B-A-B", "I-A-B",
          "B", "I", "E", "S", ".", "B-", "I-"]


@given(st.lists(st.sampled_from(ODD_TAGS), max_size=12))
@settings(max_examples=400, derandomize=True, deadline=None, database=None)
def test_entities_are_read_from_tags_exactly_as_seqeval_reads_them(tags):
    """ner.metrics.get_entities (no scikit-learn import) against seqeval's, on any sequence of these labels."""
    import warnings

    from seqeval.metrics.sequence_labeling import get_entities as seqeval_entities

    from ner.metrics import get_entities

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns about the non-NE labels drawn here
        expected = seqeval_entities(list(tags))
    assert get_entities(list(tags)) == expected


def test_reading_tags_and_scoring_them_import_no_scikit_learn():
    import subprocess
    import sys

    code = ("import sys; import ner.predict, ner.serve, ner.inference.tagger; "
            "from ner.metrics import entity_scores, get_entities; get_entities(['B-PER']); "
            "entity_scores([['B-PER', 'E-PER']], [['S-PER', 'O']], 'iobes'); entity_scores([['B-PER']], [['I-PER']]); "
            "print('sklearn' in sys.modules, 'seqeval.metrics' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["False", "False"]
