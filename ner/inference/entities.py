"""Tagged words -> entities with scores: the one tags -> entities step of inference (ner.predict, ner.serve,
corpus tagging, the analysis), the --min-score filter that drops the entities scored below a threshold, and a
text's confidence in its whole tag sequence (what ner.select and Label Studio's uncertainty sampling rank by)."""

from __future__ import annotations

import numpy as np

from ner.data.text import Word
from ner.metrics import get_entities


def drop_below(tags: list[str], probs: np.ndarray, min_score: dict[str, float]) -> list[str]:
    """The tags with every entity whose score (entity_score, as `entities` reports it) is
    below its type's threshold (else the overall one, key "") turned into O."""
    kept = list(tags)
    for kind, first, last in get_entities(tags):
        threshold = min_score.get(kind, min_score.get("", 0.0))
        if entity_score(probs, first, last) < threshold:
            kept[first:last + 1] = ["O"] * (last + 1 - first)
    return kept


def entities(tags: list[str], probs: np.ndarray, words: list[Word], text: str | None = None) -> list[dict]:
    """Word-level entities (seqeval's reading of the tags), each {"text", "type", "start", "end", "score"}:
    `start` of its first word, `end` of its last, `score` the mean probability of its tags.

    Raw text: `words` as split from `text` (character offsets), and "text" is `text[start:end]`.
    Words given (no `text`): `words` as `(word, i, i + 1)`, so start/end are word indices, and "text"
    is the entity's words joined by spaces.
    """
    found = []
    for kind, first, last in get_entities(tags):
        start, end = words[first][1], words[last][2]
        span = text[start:end] if text is not None else " ".join(word for word, _, _ in words[first:last + 1])
        found.append({"text": span, "type": kind, "start": start, "end": end,
                      "score": entity_score(probs, first, last)})
    return found


def text_result(tags: list[str], probs: np.ndarray, words: list[Word], text: str) -> dict:
    """A raw text's answer, as Tagger.predict gives it: {"entities" (character offsets), "confidence"}."""
    return {"entities": entities(tags, probs, words, text), "confidence": text_confidence(probs)}


def entity_score(probs: np.ndarray, first: int, last: int) -> float:
    """The score of the entity on words first..last: the mean probability of its tags, to 4 places (what a user
    reads, so --min-score compares against the same number)."""
    return round(float(probs[first:last + 1].mean()), 4)


def text_confidence(probs: np.ndarray) -> float:
    """How sure the model is of a text's whole decoded tag sequence, entities or none: the geometric mean of its
    words' tag probabilities, exp of the path's length-normalised log-probability (MNLP, Shen et al. 2017), to 4
    places; 1.0 for a text without words. Low means unsure. Normalised by length, so a long text is not unsure
    for being long: ner.select's budget counts words. docs/active_learning.md measures it against the least
    confident word."""
    if len(probs) == 0:
        return 1.0
    log_probs = np.log(np.maximum(probs.astype(np.float64), np.finfo(np.float32).tiny))
    return round(float(np.exp(log_probs.mean())), 4)


def word_positions(words: list[str]) -> list[Word]:
    """Words with their indices as positions, for `entities` over words given without a text."""
    return [(word, i, i + 1) for i, word in enumerate(words)]
