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

`from ner.data import read_conll` (the module path before the grouping) reads from examples.py.
"""

from ner.data.examples import (  # noqa: F401 (re-exported: ner.data was this module before the grouping)
    CONLL_HELP,
    DOCSTART,
    SAMPLE_DIR,
    TAG_HELP,
    TAG_PATTERN,
    Columns,
    Example,
    build_label_list,
    check_known_labels,
    conll_blocks,
    convert_scheme,
    detect_scheme,
    entity_types,
    has_documents,
    jsonl_records,
    parse_jsonl,
    read_conll,
    read_conll_documents,
    read_hf_dataset,
    read_jsonl,
    read_predictions,
    read_utf8,
    scheme_of_labels,
    split_tag,
    to_iob2,
    to_iobes,
    write_columns,
    write_conll,
    write_jsonl,
    write_lines,
    write_predictions,
)
