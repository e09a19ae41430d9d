"""Data: reading and writing examples, tag schemes, raw text and spans, subword encoding and batching. Imports
no other group (tests/test_layout.py): training, inference, serving and corpus tagging all build on it.

    examples.py   Example, CoNLL / JSON lines / `datasets` readers and writers, tag schemes, label lists
    formats.py    which reader a file needs (read_examples, load_splits): the one place that knows every format
    spans.py      character spans <-> words with tags: the alignment, and tags back to spans
    span_files.py reading annotation tools' span files (doccano, Prodigy, Label Studio, spaCy) as span records
    text.py       raw text -> words with character offsets
    tokenizer.py  the one tokenizer loader, for training's encoder and for an export
    encode.py     words -> subword windows with context, the tokenization cache, the way back to words
    batching.py   length-aware training batches and the fixed-shape inference plan
"""
