"""Corpus tagging: `python -m ner.predict MODEL INPUT... --output-dir OUT` and Ray Data's RayTagger. Streamed,
in chunks, resumable, in input order, over any number of processes. Imports inference and data, never training.

    tagging.py  inputs, the manifest, the chunk plan, tagging and merging the parts, RayTagger

    from ner.corpus import RayTagger
"""

from ner.corpus.tagging import RayTagger, add_corpus_arguments, tag_corpus

__all__ = ["RayTagger", "add_corpus_arguments", "tag_corpus"]
