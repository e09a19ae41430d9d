"""Data: reading and writing examples, tag schemes, raw text and spans, subword encoding and batching. Imports
no other group (tests/test_layout.py): training, inference, serving and corpus tagging all build on it.

    examples.py   Example, what every reader gives, and Columns, where its words and tags live in records
    text_files.py UTF-8 text files read with errors a user can act on, and written whole
    conll.py      CoNLL files and the predictions file: reading and writing
    jsonl.py      JSON lines, and examples as records in them: reading and writing
    hf_datasets.py examples from a `datasets` dataset
    tags.py       the tag parser, tag schemes (IOB1 / IOB2 / IOBES found and converted), the label list
    formats.py    which reader a file needs (read_examples, load_splits): the one place that knows every format
    spans.py      character spans <-> words with tags: the alignment, and tags back to spans
    span_files.py reading annotation tools' span files (doccano, Prodigy, Label Studio, spaCy) as span records
    text.py       raw text -> words with character offsets
    tokenizer.py  the one tokenizer loader, for training's encoder and for an export
    encode.py     words -> subword windows with context, the tokenization cache, the way back to words
    batching.py   length-aware training batches and the fixed-shape inference plan
"""
