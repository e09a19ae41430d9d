"""Per-word label scores -> tags: argmax, or Viterbi restricted to sequences the tag scheme allows.

Argmax can emit `O I-PER` or `B-PER I-LOC`, which no scheme allows. Viterbi picks the most
probable sequence among the valid ones (Lester et al., 2020: as good as a CRF, at no training
cost). It only masks transitions, so wherever argmax is already valid the two agree.

    IOB2   I-X only after B-X or I-X.
    IOB1   B-X only after B-X or I-X (it separates two adjacent entities of one type); I-X anywhere.
    IOBES  B-X and I-X go on to I-X or E-X; E-X, S-X and O go on to O, B-* or S-*; a sentence
           starts with O, B-* or S-* and ends with O, E-* or S-*.
    IOB    IOB1 or IOB2, not known which (a model folder without training_args.json whose labels fit
           both, see data.tags.scheme_of_labels): every sequence is allowed, so Viterbi is argmax.

A label set can leave no valid sequence at all (an IOBES set without O whose type lacks E-/S-, an
IOB1 set of B- labels only): such sentences are tagged by argmax, logged once per call, and counted
in `Decoder.fallback_sentences`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ner.data.tags import split_tag

log = logging.getLogger("ner")

DECODERS = ("viterbi", "argmax")


def _allowed(previous: str | None, label: str, scheme: str) -> bool:
    """May `label` follow `previous` (None: the sentence start)?"""
    prefix, kind = split_tag(label)
    before, before_kind = split_tag(previous) if previous is not None else ("O", "")
    if scheme == "iob":
        return True
    if scheme == "iob2":
        return prefix != "I" or (before in "BI" and before_kind == kind and previous is not None)
    if scheme == "iob1":
        return prefix != "B" or (before in "BI" and before_kind == kind and previous is not None)
    inside = before in "BI" and previous is not None  # iobes: inside an entity that must go on
    if inside:
        return prefix in "IE" and kind == before_kind
    return prefix in "OBS"


def transition_masks(labels: list[str], scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, transition [previous, next], end) masks of allowed label ids."""
    start = np.array([_allowed(None, label, scheme) for label in labels])
    pairs = np.array([[_allowed(before, label, scheme) for label in labels] for before in labels])
    end = np.array([scheme != "iobes" or split_tag(label)[0] in "OES" for label in labels])
    return start, pairs, end


def viterbi(log_probs: np.ndarray, masks: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray | None:
    """The most probable allowed label sequence of one sentence (words x labels log-probabilities);
    None where the masks allow no sequence of this length."""
    return viterbi_many([log_probs], masks)[0]


VITERBI_GROUP = 256  # sentences decoded together: similar lengths after sorting, and a bounded back-pointer table


def viterbi_many(log_probs: list[np.ndarray], masks: tuple[np.ndarray, np.ndarray, np.ndarray]
                 ) -> list[np.ndarray | None]:
    """viterbi of each sentence, the recurrence run over groups of sentences of similar length at once (one numpy
    step per word position, not per word): the same operations on the same numbers per sentence, so the same
    paths as one sentence at a time."""
    paths: list[np.ndarray | None] = [None] * len(log_probs)
    by_length = sorted(range(len(log_probs)), key=lambda i: -len(log_probs[i]))
    for group_start in range(0, len(by_length), VITERBI_GROUP):
        group = by_length[group_start:group_start + VITERBI_GROUP]
        for i, path in zip(group, _viterbi_group([log_probs[i] for i in group], masks)):
            paths[i] = path
    return paths


def _viterbi_group(log_probs: list[np.ndarray], masks: tuple[np.ndarray, np.ndarray, np.ndarray]
                   ) -> list[np.ndarray | None]:
    """viterbi of sentences sorted by length, longest first: at position i the sentences that have one are a
    prefix of the group."""
    start, pairs, end = masks
    lengths = np.array([len(lp) for lp in log_probs])
    if lengths[0] == 0:
        return [np.zeros(0, dtype=np.int64) for _ in log_probs]
    labels = len(start)
    padded = np.zeros((len(log_probs), lengths[0], labels), dtype=np.result_type(*log_probs))
    for row, lp in enumerate(log_probs):
        padded[row, :len(lp)] = lp
    transition = np.where(pairs, 0.0, -np.inf)
    # float64 from the first step on, as one sentence's recurrence promotes it (float32 scores + float64 masks)
    score = np.where(start, padded[:, 0], -np.inf).astype(np.result_type(padded, transition))
    back = np.zeros(padded.shape, dtype=np.int64)
    for i in range(1, lengths[0]):
        n = int((lengths > i).sum())  # sentences with a word at position i
        candidates = score[:n, :, None] + transition  # sentence x previous x next
        back[:n, i] = candidates.argmax(axis=1)
        score[:n] = candidates.max(axis=1) + padded[:n, i]
    final = np.where(end, score, -np.inf)
    best = np.zeros(padded.shape[:2], dtype=np.int64)
    current = final.argmax(axis=1)
    best[np.arange(len(lengths)), np.maximum(lengths - 1, 0)] = current
    for i in range(lengths[0] - 1, 0, -1):
        n = int((lengths > i).sum())
        current[:n] = back[np.arange(n), i, current[:n]]
        best[:n, i - 1] = current[:n]
    found = np.isfinite(final).any(axis=1)
    return [(best[row, :length] if found[row] else None) if length else np.zeros(0, dtype=np.int64)
            for row, length in enumerate(lengths)]


@dataclass
class Decoder:
    labels: tuple[str, ...]  # by label id
    scheme: str  # iob1 | iob2 | iobes | iob (either IOB; see data.tags.scheme_of_labels)
    method: str = "viterbi"  # or argmax
    # sentences tagged by argmax because the labels allow no valid sequence, over this decoder's life
    fallback_sentences: int = field(default=0, init=False, compare=False)

    def __call__(self, log_probs: list[np.ndarray]) -> tuple[list[list[str]], list[np.ndarray]]:
        """(tags, probability of each chosen tag) per sentence, from words x labels log-probabilities."""
        if self.method == "argmax":
            ids = [lp.argmax(axis=-1) for lp in log_probs]
        else:
            ids = self._viterbi(log_probs)
        names = np.array(self.labels, dtype=object)
        tags = [names[i].tolist() for i in ids]
        probs = [np.exp(lp[np.arange(len(i)), i]).astype(np.float32) for lp, i in zip(log_probs, ids)]
        return tags, probs

    def _viterbi(self, log_probs: list[np.ndarray]) -> list[np.ndarray]:
        masks = transition_masks(list(self.labels), self.scheme)
        paths = viterbi_many(log_probs, masks)
        fallbacks = sum(path is None for path in paths)
        if fallbacks:  # one line per call, however many sentences: a label-set problem, not a per-word one
            self.fallback_sentences += fallbacks
            log.warning("%d of %d sentences: the labels (%s) allow no %s tag sequence of their length; "
                        "tagged by argmax instead", fallbacks, len(paths), ", ".join(self.labels), self.scheme)
        return [lp.argmax(axis=-1) if path is None else path for lp, path in zip(log_probs, paths)]
