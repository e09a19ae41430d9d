"""Raw text -> words with character offsets, split the way CoNLL-2003 was tokenised.

    from ner.data.text import split_words
    split_words("O'Neill's U.S. trip.")  # [("O'Neill", 0, 7), ("'s", 7, 9), ("U.S.", 10, 14), ...]

Punctuation is split off words, while abbreviations ("U.S."), names with an apostrophe ("O'Neill"),
numbers ("3.5", "3,000", "1996-12-06", "2-1"), hyphenated words, URLs, e-mail addresses and emoji
(joined, skin-toned or flags) stay whole; clitics are split as in the Penn Treebank ("Japan's" ->
"Japan" "'s", "don't" -> "do" "n't"), and one already split off ("Japan 's", CoNLL's own text) stays so.
The choice of this splitter over simpler ones was measured: docs/raw_text.md.
Every offset slices the original string: `text[start:end] == word`, whatever the text holds.

Decomposed (NFD) text splits as its composed form does, without being normalised: a combining mark
(Unicode category M: accents, vowel signs, variation selectors) belongs to the character before it,
unless that is a space or an invisible character (then the mark stands alone), and a soft hyphen,
zero-width joiner or non-joiner between two letters or digits stays inside the word
("Mu\u0308nchen", "co\u00adoperate" are one word each). The rules above never see these characters.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Callable

Word = tuple[str, int, int]  # (word, start, end): text[start:end] == word, end exclusive

_TITLES = ("Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|Gen|Gov|Sen|Rep|Lt|Col|Capt|Sgt|Rev|Mt|Ft|Inc|Corp|Ltd|Co|Bros|vs|No|"
           "Jan|Feb|Mar|Apr|Aug|Sep|Sept|Oct|Nov|Dec")
# Order matters: the first alternative that matches at a position wins.
CONLL_PATTERN = re.compile(rf"""
      (?:https?://|www\.)[^\s<>"]*[^\s<>"'.,;:!?)\]}}]      # URL, trailing punctuation left off
    | (?<![\w.+-])[\w.+-]+@\w[\w-]*(?:\.\w[\w-]*)+            # e-mail address, from where its run starts
    | (?:[^\W\d_]\.){{2,}}                                   # U.S., U.N., a.m.
    | (?:{_TITLES})\.(?=\s+\w)                                # St. Louis, Mr. Smith
    | [A-Z]\.(?=\s+[A-Z])                                     # an initial: M. Schumacher
    | (?<![\w.])\d{{1,2}}\.(?=\s+[^\W\d_])                      # a list number: "1. Japan"
    | [+-]?(?<!\w)\.?\d+(?:[.,:/-]\d+)*(?:-?[^\W\d_]+)*        # 3.5 3,000 1996-12-06 2-1 1/2 .500 88th 15-year
    | \w+(?:[-'’&]\w+)*                                      # words, O'Neill, Bre-X, AT&T
    | (?<=[)\]}}"])['’](?:s|S|re|ve|ll|d|m)\b                   # a clitic after a bracket: (Tokyo)'s
    | (?<!\S)['’](?i:s|re|ve|ll|d|m)(?![\w'’])                  # a clitic already split off: Japan 's
    | [\U0001F1E6-\U0001F1FF]{{2}}                                # a flag: two regional indicators
    | [^\w\s](?:[\ufe0f\U0001F3FB-\U0001F3FF]|\u200d[^\w\s])+     # an emoji with a skin tone, or joined (ZWJ)
    | \.\.\.|--|[^\w\s]                                       # punctuation, one mark at a time
""", re.VERBOSE)
_CLITIC = re.compile(r"(?i)(?<=\w)(n['’]t|['’](?:s|re|ve|ll|d|m))$")
_NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]")
_WORD_CHAR = re.compile(r"\w")
_IN_WORD_FORMAT = "\u00ad\u200c\u200d"  # soft hyphen, zero-width non-joiner, zero-width joiner
WHITESPACE_PUNCT_PATTERN = re.compile(r"\w+|[^\w\s]")  # BERT's basic tokenizer, for comparison


def _invisible(word: str) -> bool:
    """Control and format characters (zero-width space, BOM, bidi marks) separate words, never make one."""
    if word.isprintable() and not word.isspace():  # holds a character of none of those categories: most words
        return False
    return all(unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp") for c in word)


def _attached(text: str) -> list[int]:
    """Indices, ascending, of the characters that belong to the one before them (see the module docstring)."""
    attached: list[int] = []
    base = -1  # the character the current run of attached ones belongs to
    run_end = 0  # the first character after the run of marks and joiners that holds the latest joiner
    for match in _NOT_WORD_OR_SPACE.finditer(text):  # marks and joiners are never \w or \s
        i = match.start()
        if not (attached and attached[-1] == i - 1):
            base = i - 1
        if unicodedata.category(text[i])[0] == "M":
            if base >= 0 and not text[base].isspace() and not _invisible(text[base]):
                attached.append(i)
        elif text[i] in _IN_WORD_FORMAT and base >= 0 and _WORD_CHAR.match(text[base]):
            if run_end <= i:
                run_end = _run_end(text, i)
            if run_end < len(text) and _WORD_CHAR.match(text[run_end]):
                attached.append(i)
    return attached


def _run_end(text: str, i: int) -> int:
    while i < len(text) and (text[i] in _IN_WORD_FORMAT or unicodedata.category(text[i])[0] == "M"):
        i += 1
    return i


def split_words(text: str) -> list[Word]:
    """CoNLL-style words with character offsets."""
    attached = _attached(text)
    if not attached:
        return _split_bare(text, text, lambda offset: offset)
    # The rules run on the text without its attached characters; an offset k there is k plus the number of
    # attached characters up to it in the original (each sits at original index `position - rank` there).
    bare_positions = [position - rank for rank, position in enumerate(attached)]
    kept = "".join(text[start + 1:end] for start, end in zip([-1, *attached], [*attached, len(text)]))
    return _split_bare(kept, text, lambda offset: offset + bisect.bisect_right(bare_positions, offset))


def _split_bare(bare: str, text: str, to_original: Callable[[int], int]) -> list[Word]:
    """The CONLL_PATTERN words of `bare` (`text` less its attached characters), offsets mapped back to `text`."""
    words: list[Word] = []

    def add(start: int, end: int) -> None:
        start, end = to_original(start), to_original(end)
        words.append((text[start:end], start, end))

    for match in CONLL_PATTERN.finditer(bare):
        word, start = match.group(), match.start()
        if _invisible(word):
            continue
        clitic = _CLITIC.search(word) if not word[0].isdigit() else None
        if clitic and clitic.start() > 0:
            add(start, start + clitic.start())
            add(start + clitic.start(), match.end())
        else:
            add(start, match.end())
    return words


def split_whitespace_punct(text: str) -> list[Word]:
    """Every run of letters/digits is a word and every other mark its own (the baseline in docs/raw_text.md)."""
    return [(m.group(), m.start(), m.end()) for m in WHITESPACE_PUNCT_PATTERN.finditer(text)
            if not _invisible(m.group())]


def split_whitespace(text: str) -> list[Word]:
    """Words are what lies between whitespace (any Unicode space: tab, no-break, em; as str.split()), less
    words of invisible characters only (a stray zero-width space or BOM): what `--pretokenized` does."""
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text) if not _invisible(m.group())]


SPLITTERS = {"conll": split_words, "whitespace_punct": split_whitespace_punct, "whitespace": split_whitespace}
