"""Raw text -> words with character offsets, split the way CoNLL-2003 was tokenised.

    from ner.text import split_words
    split_words("O'Neill's U.S. trip.")  # [("O'Neill", 0, 7), ("'s", 7, 9), ("U.S.", 10, 14), ...]

Punctuation is split off words, while abbreviations ("U.S."), names with an apostrophe ("O'Neill"),
numbers ("3.5", "3,000", "1996-12-06", "2-1"), hyphenated words, URLs, e-mail addresses and emoji
(joined, skin-toned or flags) stay whole; clitics are split as in the Penn Treebank ("Japan's" ->
"Japan" "'s", "don't" -> "do" "n't"), and one already split off ("Japan 's", CoNLL's own text) stays so.
The choice of this splitter over simpler ones was measured: docs/raw_text.md.
Every offset slices the original string: `text[start:end] == word`, whatever the text holds.
"""

from __future__ import annotations

import re
import unicodedata

Word = tuple[str, int, int]  # (word, start, end): text[start:end] == word, end exclusive

_TITLES = ("Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|Gen|Gov|Sen|Rep|Lt|Col|Capt|Sgt|Rev|Mt|Ft|Inc|Corp|Ltd|Co|Bros|vs|No|"
           "Jan|Feb|Mar|Apr|Aug|Sep|Sept|Oct|Nov|Dec")
# Order matters: the first alternative that matches at a position wins.
CONLL_PATTERN = re.compile(rf"""
      (?:https?://|www\.)[^\s<>"]*[^\s<>"'.,;:!?)\]}}]      # URL, trailing punctuation left off
    | [\w.+-]+@\w[\w-]*(?:\.\w[\w-]*)+                       # e-mail address
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
WHITESPACE_PUNCT_PATTERN = re.compile(r"\w+|[^\w\s]")  # BERT's basic tokenizer, for comparison


def _invisible(word: str) -> bool:
    """Control and format characters (zero-width space, BOM, bidi marks) separate words, never make one."""
    return all(unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp") for c in word)


def split_words(text: str) -> list[Word]:
    """CoNLL-style words with character offsets."""
    words = []
    for match in CONLL_PATTERN.finditer(text):
        word, start = match.group(), match.start()
        if _invisible(word):
            continue
        if words and words[-1][2] == start and all(unicodedata.category(c)[0] == "M" for c in word):
            words[-1] = (words[-1][0] + word, words[-1][1], match.end())  # a combining accent joins its letter
            continue
        clitic = _CLITIC.search(word) if not word[0].isdigit() else None
        if clitic and clitic.start() > 0:
            words.append((word[:clitic.start()], start, start + clitic.start()))
            words.append((clitic.group(), start + clitic.start(), match.end()))
        else:
            words.append((word, start, match.end()))
    return words


def split_whitespace_punct(text: str) -> list[Word]:
    """Every run of letters/digits is a word and every other mark its own (the baseline in docs/raw_text.md)."""
    return [(m.group(), m.start(), m.end()) for m in WHITESPACE_PUNCT_PATTERN.finditer(text)
            if not _invisible(m.group())]


def split_whitespace(text: str) -> list[Word]:
    """Words are what lies between whitespace (what `--pretokenized` does)."""
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text) if not _invisible(m.group())]


SPLITTERS = {"conll": split_words, "whitespace_punct": split_whitespace_punct, "whitespace": split_whitespace}
