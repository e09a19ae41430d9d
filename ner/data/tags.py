"""Tags -> entities: the (type, first word, last word) chunks a sentence's tags spell, in any tag scheme."""

from __future__ import annotations


def get_entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity in one sentence's tags, read exactly as seqeval's
    `get_entities` reads them (its default, lenient reading of IOB1/IOB2/IOBES; tests/test_decode.py checks
    equality on random tag sequences). Here because importing seqeval.metrics imports scikit-learn, about 1.8 s
    of every ner.predict and ner.serve process start for a reading of tags that takes a loop."""
    chunks: list[tuple[str, int, int]] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, label in enumerate([*tags, "O"]):
        tag, kind = label[0], label[1:].split("-", maxsplit=1)[-1] or "_"
        if _chunk_ends(prev_tag, tag, prev_type, kind):
            chunks.append((prev_type, begin, i - 1))
        if _chunk_starts(prev_tag, tag, prev_type, kind):
            begin = i
        prev_tag, prev_type = tag, kind
    return chunks


def _chunk_ends(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag not in ("O", ".") and prev_type != kind))


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    return (tag in ("B", "S") or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and prev_type != kind))
