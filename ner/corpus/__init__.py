"""Corpus tagging: `python -m ner.predict MODEL INPUT... --output-dir OUT` and Ray Data's RayTagger. Streamed,
in chunks, resumable, in input order, over any number of processes. Imports inference and data, never training.

    tagging.py   the run in every process: backend, model copy, errors met together, progress, the flags
    inputs.py    INPUT files, globs and folders; raw text, JSONL, parquet, datasets; counting; parsing a text
    plan.py      chunk sizes, the plan dealt round-robin, part names, merging the parts
    manifest.py  OUT/manifest.json, the refusal of a differing resume, which files in OUT are ours
    ray_data.py  RayTagger, for Ray Data's map_batches

    from ner.corpus import RayTagger
"""

from ner.corpus.ray_data import RayTagger

__all__ = ["RayTagger"]
