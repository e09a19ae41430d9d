"""Case as token types (--casing): what each word gets, when auto turns it on, that training starts from the
encoder as it was, and that every inference path passes the types the model was trained with."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import python_module, run_cli, tiny_args

from ner.config import TrainConfig, resolve_casing
from ner.data import Example
from ner.encode import casing_type, collate, encode_examples
from ner.errors import UserError
from ner.model import build_model, load_tokenizer, lowercases, takes_token_types, widen_token_types


@pytest.mark.parametrize("word, expected", [
    ("paris", 0), ("2-1", 0), (",", 0), ("iPhone", 0), ("Paris", 1), ("A", 1), ("McDonald", 1), ("(Reuters", 1),
    ("École", 1), ("EU", 2), ("U.S.", 2), ("ÉCOLE", 2), ("NATO-led", 1)])
def test_casing_type_of_a_word(word, expected):
    assert casing_type(word) == expected


def test_every_subword_carries_its_words_type_and_specials_carry_none(tiny_bert):
    tokenizer = load_tokenizer(str(tiny_bert))
    words = ["Ada", "QWERTZ", "visited", "Zyxx", "london", "."]  # two words the vocabulary splits
    example = Example(words, ["O"] * len(words), "t")
    [feature] = encode_examples([example], tokenizer, {"O": 0}, 32, casing=True)
    pieces = [len(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in words]
    assert feature.token_type_ids == [0] + [t for w, n in zip(words, pieces) for t in [casing_type(w)] * n] + [0]
    assert max(pieces) > 1  # some word is split, so the test covers continuations
    assert "token_type_ids" in collate([feature], 0)
    [plain] = encode_examples([example], tokenizer, {"O": 0}, 32)
    assert plain.token_type_ids is None and "token_type_ids" not in collate([plain], 0)


def test_auto_gives_types_only_to_an_encoder_that_lower_cases_and_takes_them(tiny_bert, tmp_path):
    from transformers import BertTokenizer

    uncased = load_tokenizer(str(tiny_bert))
    cased = BertTokenizer(vocab=str(tiny_bert / "vocab.txt"), do_lower_case=False)
    assert lowercases(uncased) and not lowercases(cased)
    assert takes_token_types(str(tiny_bert), uncased)
    cfg = TrainConfig(model=str(tiny_bert))
    assert resolve_casing(cfg, lowercases=True, takes_token_types=True).casing == "types"
    assert resolve_casing(cfg, lowercases=False, takes_token_types=True).casing == "none"
    assert resolve_casing(cfg, lowercases=True, takes_token_types=False).casing == "none"
    assert resolve_casing(dataclasses.replace(cfg, casing="none"), True, True).casing == "none"
    with pytest.raises(UserError, match="takes no token types"):
        resolve_casing(dataclasses.replace(cfg, casing="types"), lowercases=True, takes_token_types=False)


def test_widening_token_types_changes_nothing_for_type_zero_and_draws_no_random_numbers(tiny_bert):
    model = build_model(str(tiny_bert), ["O", "B-PER", "I-PER"]).eval()
    inputs = {"input_ids": torch.tensor([[2, 7, 8, 9, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    before = model(**inputs).logits
    rng = torch.get_rng_state()
    widen_token_types(model, 3)
    assert torch.equal(torch.get_rng_state(), rng)
    table = model.base_model.embeddings.token_type_embeddings.weight
    assert table.shape[0] == 3 and model.config.type_vocab_size == 3
    assert all(torch.equal(table[i], table[0]) for i in range(3))  # each new type starts as type 0
    assert torch.equal(model(**inputs, token_type_ids=torch.zeros(1, 5, dtype=torch.long)).logits, before)


@pytest.fixture(scope="module")
def cased_run(tiny_bert, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("casing") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "3",
                                                           "--learning-rate", "3e-3")))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--casing auto: types" in result.stderr
    assert "--casing-dropout 0.2: " in result.stderr and "training windows without case" in result.stderr
    return out / "final"


def test_the_export_records_casing_and_inference_passes_the_types(cased_run):
    from transformers import AutoModelForTokenClassification

    from ner.infer import Tagger

    assert json.loads((cased_run / "training_args.json").read_text())["casing"] == "types"
    assert json.loads((cased_run / "config.json").read_text())["type_vocab_size"] == 3
    assert AutoModelForTokenClassification.from_pretrained(cased_run) is not None  # still a plain HF model
    examples = [Example("Ada Lovelace visited London with IBM .".split(), ["O"] * 7, "t")]
    tagger = Tagger(cased_run, precision="no")
    _, with_types = tagger.tag(examples)
    tagger.settings = dataclasses.replace(tagger.settings, casing="none")
    _, without = tagger.tag(examples)
    assert not all((a == b).all() for a, b in zip(with_types, without))  # the types reach the model


def test_casing_dropout_blanks_a_seeded_share_of_windows_and_nothing_else(tiny_bert):
    from ner.encode import drop_casing

    tokenizer = load_tokenizer(str(tiny_bert))
    examples = [Example(["Ada", "met", "Bob", "in", "Rome", str(i)], ["O"] * 6, "t") for i in range(400)]
    features = encode_examples(examples, tokenizer, {"O": 0}, 32, casing=True)
    dropped = drop_casing(features, 0.2, seed=7)
    blank = [i for i, f in enumerate(dropped) if not any(f.token_type_ids)]
    assert 50 < len(blank) < 110  # about a fifth of 400
    assert all(dropped[i].token_type_ids == features[i].token_type_ids for i in range(400) if i not in blank)
    assert all(dropped[i].input_ids == features[i].input_ids for i in range(400))
    assert [f.token_type_ids for f in drop_casing(features, 0.2, seed=7)] == [f.token_type_ids for f in dropped]
    assert drop_casing(features, 0.0, seed=7) == features
    assert any(any(features[i].token_type_ids) for i in blank)  # they had case to lose
