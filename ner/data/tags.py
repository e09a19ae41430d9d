"""Tags and tag schemes: the one tag parser, IOB1 / IOB2 / IOBES found and converted, and the label list a model
is built with. Turning tags into entities is ner.metrics' (a shared leaf every group reads)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ner.data.examples import Example
from ner.errors import at

TAG_PATTERN = re.compile(r"^(O|[BIES]-\S+)$")
TAG_HELP = "expected O, or B-TYPE / I-TYPE / E-TYPE / S-TYPE such as B-PER"


def split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type): ("B", "PER") for B-PER, ("O", "") for O. The one tag parser."""
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def entity_types(labels: Iterable[str]) -> list[str]:
    """The entity types a label list names, sorted: PER for B-PER, I-PER, ..."""
    return sorted({split_tag(label)[1] for label in labels} - {""})


def detect_scheme(examples: list[Example]) -> str:
    """IOBES if E-/S- occur; IOB1 if an I- tag starts an entity; otherwise IOB2."""
    if scheme_of_labels({tag for example in examples for tag in example.tags}) == "iobes":
        return "iobes"
    for example in examples:
        previous_kind = ""
        for tag in example.tags:
            prefix, kind = split_tag(tag)
            if prefix == "I" and previous_kind != kind:
                return "iob1"
            previous_kind = kind
    return "iob2"


def scheme_of_labels(labels: Iterable[str]) -> str:
    """A model's tag scheme from its label list alone, for exports that do not record it.

    E-/S- labels: iobes. A type with I- but no B- can only be IOB1 (IOB2 starts every entity with
    B-); one with B- but no I- only IOB2 (IOB1 starts an entity with I- unless it follows one of
    its type). Otherwise the two schemes have the same labels and nothing tells them apart:
    "iob", which the decoder reads as either (no transition is forbidden, so Viterbi is argmax)
    and seqeval reads leniently, as it reads IOB1 and IOB2.
    """
    parts = {split_tag(label) for label in labels}
    if any(prefix in "ES" for prefix, _ in parts):
        return "iobes"
    kinds = {kind for _, kind in parts} - {""}
    if any(("I", kind) in parts and ("B", kind) not in parts for kind in kinds):
        return "iob1"
    if any(("B", kind) in parts and ("I", kind) not in parts for kind in kinds):
        return "iob2"
    return "iob" if kinds else "iob2"


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1 or IOBES -> IOB2: every entity starts with B-."""
    out = []
    previous_kind = ""
    for tag in tags:
        prefix, kind = split_tag(tag)
        if prefix in "BS" or (prefix in "IE" and kind != previous_kind):
            out.append(f"B-{kind}")
        elif prefix in "IE":
            out.append(f"I-{kind}")
        else:
            out.append("O")
        previous_kind = "" if prefix in "OES" else kind
    return out


def to_iobes(tags: list[str]) -> list[str]:
    iob2 = to_iob2(tags)
    out = []
    for i, tag in enumerate(iob2):
        prefix, kind = split_tag(tag)
        continues = i + 1 < len(iob2) and iob2[i + 1] == f"I-{kind}"
        if prefix == "B":
            out.append(f"B-{kind}" if continues else f"S-{kind}")
        elif prefix == "I":
            out.append(f"I-{kind}" if continues else f"E-{kind}")
        else:
            out.append("O")
    return out


def convert_scheme(examples: list[Example], target: str) -> list[Example]:
    if target == "none":
        return examples
    convert = to_iob2 if target == "iob2" else to_iobes
    return [Example(e.words, convert(e.tags), e.source, e.lines, e.document) for e in examples]


_PREFIX_ORDER = {"B": 0, "I": 1, "E": 2, "S": 3}


def build_label_list(examples: list[Example]) -> list[str]:
    """Stable order whatever the data order: O, then each type's B, I, E, S."""
    seen = {tag for example in examples for tag in example.tags}
    entity_tags = sorted(seen - {"O"}, key=lambda t: (t[2:], _PREFIX_ORDER[t[0]]))
    return ["O", *entity_tags]


def check_known_labels(examples: list[Example], label2id: dict[str, int]) -> None:
    """A tag the model has no output for would be scored as always wrong: refuse it."""
    for example in examples:
        for i, tag in enumerate(example.tags):
            if tag not in label2id:
                source, line = example.where(i)
                known = ", ".join(label2id)
                raise at(source, line, f"tag {tag!r} never appears in the training data "
                         f"(the model knows: {known}); fix the tag or add it to the training data")
