"""Examples from a `datasets` dataset: a hub dataset (where a hub is reachable) or a save_to_disk folder.
`datasets` is imported only when one is read (seconds on 2 cores)."""

from __future__ import annotations

from pathlib import Path

from ner.data.examples import Columns, Example
from ner.data.jsonl import example_from_record
from ner.errors import UserError


def read_hf_dataset(name_or_dir: str, split: str, columns: Columns = Columns()) -> list[Example]:
    """A hub dataset (where a hub is reachable) or a folder written by `save_to_disk`."""
    import datasets

    try:
        if Path(name_or_dir).is_dir():
            loaded = datasets.load_from_disk(name_or_dir)
        else:
            loaded = datasets.load_dataset(name_or_dir)
    except Exception as exc:  # datasets raises many types; the user needs the message, not the class
        raise UserError(f"{name_or_dir}: could not load dataset ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(f"{name_or_dir}: no '{split}' split (has {', '.join(loaded)})")
        loaded = loaded[split]
    tags_column = columns.tags
    if tags_column not in loaded.column_names and "ner_tags" in loaded.column_names:
        tags_column = "ner_tags"
    for column in (columns.tokens, tags_column):
        if column not in loaded.column_names:
            raise UserError(f"{name_or_dir}: no column '{column}' (has {', '.join(loaded.column_names)}); "
                            "set --tokens-column / --tags-column")
    names = getattr(getattr(loaded.features[tags_column], "feature", None), "names", None)
    with_documents = columns.document in loaded.column_names
    source = f"{name_or_dir}[{split}]"
    examples = []
    for row_no, row in enumerate(loaded):
        tags = [names[t] for t in row[tags_column]] if names else row[tags_column]
        record = {"tokens": row[columns.tokens], "tags": tags,
                  "document": row[columns.document] if with_documents else None}
        examples.append(example_from_record(record, source, row_no + 1, Columns()))
    return examples
