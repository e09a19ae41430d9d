"""`ner.formats`, the one module path from before the grouping that the README documented. It warns and gives
ner.data.formats' names; import `ner.data.formats` instead."""

import warnings

from ner.data import formats as _formats

warnings.warn("ner.formats moved to ner.data.formats: import it from there", DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    return getattr(_formats, name)
