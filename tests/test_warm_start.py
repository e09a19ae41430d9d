"""Starting from a model that already has a head: a public NER checkpoint with labels of its own, or one of
our exports (which also carries the casing token types)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_args

from ner import train as train_cli
from ner.data.encode import CASING_TYPES
from ner.training.model import build_model, head_layer

CHECKPOINT_LABELS = ["O", "B-PER", "I-PER", "B-MISC", "I-MISC"]
DATA_LABELS = ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]  # the tiny data's, in build order


def save_token_classifier(encoder, folder, labels, type_rows: int | None = None):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    torch.manual_seed(5)
    model = AutoModelForTokenClassification.from_pretrained(
        encoder, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)})
    with torch.no_grad():
        head = head_layer(model, len(labels))
        head.weight.normal_()
        head.bias.normal_()
    if type_rows:  # as an export trained with casing types: rows that differ from each other
        embeddings = model.base_model.embeddings
        embeddings.token_type_embeddings = torch.nn.Embedding(type_rows, embeddings.token_type_embeddings.embedding_dim)
        model.config.type_vocab_size = type_rows
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    return folder, model


def test_a_checkpoint_with_other_labels_keeps_the_rows_of_the_labels_it_shares(tiny_bert, tmp_path, caplog):
    folder, original = save_token_classifier(tiny_bert, tmp_path / "ner_model", CHECKPOINT_LABELS)
    with caplog.at_level("INFO"):
        model = build_model(str(folder), DATA_LABELS)
    old, new = head_layer(original, len(CHECKPOINT_LABELS)), head_layer(model, len(DATA_LABELS))
    for label in ("O", "B-PER", "I-PER"):
        i, j = CHECKPOINT_LABELS.index(label), DATA_LABELS.index(label)
        assert torch.equal(new.weight[j], old.weight[i]) and torch.equal(new.bias[j], old.bias[i]), label
    assert not any(torch.equal(new.weight[DATA_LABELS.index("B-LOC")], row) for row in old.weight)
    assert "kept the rows of 3 of 7 labels; new: B-LOC, I-LOC, B-ORG, I-ORG; its labels not in the data: " \
           "B-MISC, I-MISC" in caplog.text


# DATA_LABELS with PER -> PERSON and ORG -> COMPANY, in build order: as many labels, two types under other names
RENAMED_LABELS = ["O", "B-COMPANY", "I-COMPANY", "B-LOC", "I-LOC", "B-PERSON", "I-PERSON"]


@pytest.mark.parametrize("checkpoint_labels", [DATA_LABELS, CHECKPOINT_LABELS], ids=["as-many-labels", "fewer"])
def test_labels_under_new_names_start_as_a_fresh_heads_rows(tiny_bert, tmp_path, caplog, checkpoint_labels):
    """As many labels as the checkpoint's is no size mismatch, so its whole head loads: each label the checkpoint
    does not know by name must still start from a fresh head's row (the same draw, under the same seed), not from
    the trained row of the label that had its index."""
    folder, original = save_token_classifier(tiny_bert, tmp_path / "ner_model", checkpoint_labels)
    torch.manual_seed(11)
    fresh = head_layer(build_model(tiny_bert, RENAMED_LABELS), len(RENAMED_LABELS))
    torch.manual_seed(11)
    with caplog.at_level("INFO"):
        new = head_layer(build_model(str(folder), RENAMED_LABELS), len(RENAMED_LABELS))
    old = head_layer(original, len(checkpoint_labels))
    for j, label in enumerate(RENAMED_LABELS):
        start = (old, checkpoint_labels.index(label)) if label in checkpoint_labels else (fresh, j)
        assert torch.equal(new.weight[j], start[0].weight[start[1]]), label
        assert torch.equal(new.bias[j], start[0].bias[start[1]]), label
    kept = [label for label in RENAMED_LABELS if label in checkpoint_labels]
    assert f"kept the rows of {len(kept)} of 7 labels; new: " + ", ".join(
        label for label in RENAMED_LABELS if label not in kept) in caplog.text


def test_same_labels_in_another_order_keep_the_whole_head(tiny_bert, tmp_path):
    folder, original = save_token_classifier(tiny_bert, tmp_path / "ner_model", list(reversed(DATA_LABELS)))
    model = build_model(str(folder), DATA_LABELS)
    old, new = head_layer(original, len(DATA_LABELS)), head_layer(model, len(DATA_LABELS))
    assert torch.equal(new.weight, old.weight.flip(0)) and torch.equal(new.bias, old.bias.flip(0))


def test_an_export_keeps_its_casing_token_type_rows(tiny_bert, tmp_path):
    folder, original = save_token_classifier(tiny_bert, tmp_path / "export", DATA_LABELS, type_rows=CASING_TYPES)
    model = build_model(str(folder), DATA_LABELS, casing_types=True)
    kept = model.base_model.embeddings.token_type_embeddings.weight
    assert torch.equal(kept, original.base_model.embeddings.token_type_embeddings.weight)
    assert not torch.equal(kept[1], kept[0])


@pytest.mark.parametrize("labels", [CHECKPOINT_LABELS, DATA_LABELS])
def test_training_starts_from_a_fine_tuned_checkpoint(tiny_bert, tiny_data, tmp_path, labels):
    folder, _ = save_token_classifier(tiny_bert, tmp_path / "ner_model", labels)
    out = tmp_path / "run"
    args = tiny_args(tiny_bert, tiny_data, out, "--max-steps", "2", "--no-eval")
    args[args.index("--model") + 1] = str(folder)
    assert train_cli.main(args) == 0
    assert (out / "final" / "config.json").is_file()
    # the export names the checkpoint it started from, for its users and for a rerun

    assert json.loads((out / "final" / "training_args.json").read_text())["model"] == str(folder)
    assert f"fine-tuned from `{folder}`" in (out / "final" / "README.md").read_text()
