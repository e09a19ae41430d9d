"""Tags -> entities: the reader is ner.metrics.get_entities, in the shared leaf beside the scores that count the
entities (a shared leaf cannot import data, and scoring through seqeval.metrics imports scikit-learn). This module
only keeps the name for ner/inference/tagger.py, whose import moves to ner.metrics with its next change."""

from __future__ import annotations

from ner.metrics import get_entities  # noqa: F401 (re-exported for ner/inference/tagger.py)
