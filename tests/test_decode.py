"""Viterbi decoding: never an invalid tag sequence, equal to argmax wherever argmax is valid, optimal."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ner.data import to_iob2, to_iobes
from ner.decode import Decoder, transition_masks, viterbi

LABELS = {
    "iob2": ("O", "B-LOC", "I-LOC", "B-PER", "I-PER"),
    "iob1": ("O", "B-LOC", "I-LOC", "B-PER", "I-PER"),
    "iobes": ("O", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-PER", "I-PER", "E-PER", "S-PER"),
}


def is_valid(tags: list[str], scheme: str) -> bool:
    """Checked through the tag converters, not through the decoder's own rules."""
    if scheme == "iob2":
        return to_iob2(tags) == tags
    if scheme == "iobes":
        return to_iobes(tags) == tags
    previous = ["O", *tags]  # iob1: B-X separates two entities of type X, so only follows X
    return all(not t.startswith("B-") or p[2:] == t[2:] for p, t in zip(previous, tags))


def scores(n_labels: int):
    return arrays(np.float32, st.tuples(st.integers(0, 12), st.just(n_labels)),
                  elements=st.floats(-8, 0, width=32))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), scheme=st.sampled_from(sorted(LABELS)))
def test_viterbi_is_always_valid_and_equals_argmax_where_argmax_is_valid(data, scheme):
    labels = LABELS[scheme]
    log_probs = data.draw(scores(len(labels)))
    (viterbi_tags,), _ = Decoder(labels, scheme, "viterbi")([log_probs])
    (argmax_tags,), _ = Decoder(labels, scheme, "argmax")([log_probs])
    assert is_valid(viterbi_tags, scheme), viterbi_tags
    if is_valid(argmax_tags, scheme):
        assert viterbi_tags == argmax_tags


@settings(max_examples=60, deadline=None)
@given(data=st.data(), scheme=st.sampled_from(sorted(LABELS)))
def test_viterbi_finds_the_most_probable_valid_sequence(data, scheme):
    labels = LABELS[scheme][:5]  # short enough to enumerate every sequence
    if scheme == "iobes":
        labels = ("O", "B-LOC", "I-LOC", "E-LOC", "S-LOC")
    log_probs = data.draw(arrays(np.float64, st.tuples(st.integers(1, 4), st.just(len(labels))),
                                 elements=st.floats(-8, 0)))
    best = max((seq for seq in itertools.product(range(len(labels)), repeat=len(log_probs))
                if is_valid([labels[i] for i in seq], scheme)),
               key=lambda seq: sum(log_probs[i, j] for i, j in enumerate(seq)))
    found = viterbi(log_probs, transition_masks(list(labels), scheme))
    assert np.isclose(sum(log_probs[i, j] for i, j in enumerate(found)),
                      sum(log_probs[i, j] for i, j in enumerate(best)))


def test_the_decoder_fixes_what_argmax_gets_wrong():
    labels = LABELS["iob2"]
    log_probs = np.log(np.array([[0.1, 0.05, 0.0, 0.25, 0.6],  # argmax: I-PER at the start
                                 [0.1, 0.0, 0.0, 0.1, 0.8]]) + 1e-9)
    (tags,), (probs,) = Decoder(labels, "iob2", "viterbi")([log_probs])
    assert tags == ["B-PER", "I-PER"]
    assert np.allclose(probs, [0.25, 0.8], atol=1e-6)
    assert Decoder(labels, "iob2", "argmax")([log_probs])[0] == [["I-PER", "I-PER"]]
