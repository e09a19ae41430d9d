"""Case as token types (--casing): what each word gets, when auto turns it on, that training starts from the
encoder as it was, that every inference path passes the types the model was trained with, and that exports
from before type 0 meant "unknown" are still read (and trained from) in their own scheme."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import python_module, run_cli, tiny_args

from ner.backends import NO_MIXED_PRECISION
from ner.data.encode import (
    CASING_SCHEME,
    CASING_TYPES,
    UNKNOWN_CASE,
    casing_type,
    collate,
    encode_examples,
)
from ner.data.examples import Example
from ner.data.tokenizer import load_tokenizer
from ner.errors import UserError
from ner.training.auto import resolve_casing
from ner.training.config import TrainConfig
from ner.training.model import build_model, lowercases, takes_token_types, widen_token_types


@pytest.mark.parametrize("word, expected", [
    ("paris", 1), ("2-1", 1), (",", 1), ("iPhone", 1), ("Paris", 2), ("A", 2), ("McDonald", 2), ("(Reuters", 2),
    ("École", 2), ("EU", 3), ("U.S.", 3), ("ÉCOLE", 3), ("NATO-led", 2)])
def test_casing_type_of_a_word(word, expected):
    assert casing_type(word) == expected


def test_every_subword_carries_its_words_type_and_specials_carry_none(tiny_bert):
    tokenizer = load_tokenizer(str(tiny_bert))
    words = ["Ada", "QWERTZ", "visited", "Zyxx", "london", "."]  # two words the vocabulary splits
    example = Example(words, ["O"] * len(words), "t")
    [feature] = encode_examples([example], tokenizer, {"O": 0}, 32, casing=True)
    pieces = [len(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in words]
    assert feature.token_type_ids == [0] + [t for w, n in zip(words, pieces) for t in [casing_type(w)] * n] + [0]
    assert UNKNOWN_CASE == 0 and UNKNOWN_CASE not in feature.token_type_ids[1:-1]  # every word's case is known
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
    widen_token_types(model, CASING_TYPES)
    assert torch.equal(torch.get_rng_state(), rng)
    table = model.base_model.embeddings.token_type_embeddings.weight
    assert table.shape[0] == CASING_TYPES == 4 and model.config.type_vocab_size == 4
    assert all(torch.equal(table[i], table[0]) for i in range(4))  # each new type starts as type 0
    assert torch.equal(model(**inputs, token_type_ids=torch.zeros(1, 5, dtype=torch.long)).logits, before)


@pytest.fixture(scope="module")
def cased_run(tiny_bert, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("casing") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--num-epochs", "3",
                                                           "--learning-rate", "3e-3")))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--casing auto: types" in result.stderr
    assert "--casing-dropout 0.5: " in result.stderr and "training windows without case" in result.stderr
    return out / "final"


def test_the_export_records_casing_and_inference_passes_the_types(cased_run):
    from transformers import AutoModelForTokenClassification

    from ner.inference.tagger import Tagger

    args = json.loads((cased_run / "training_args.json").read_text())
    assert args["casing"] == "types" and args["casing_scheme"] == CASING_SCHEME
    assert json.loads((cased_run / "config.json").read_text())["type_vocab_size"] == 4
    assert AutoModelForTokenClassification.from_pretrained(cased_run) is not None  # still a plain HF model
    examples = [Example("Ada Lovelace visited London with IBM .".split(), ["O"] * 7, "t")]
    tagger = Tagger(cased_run, precision=NO_MIXED_PRECISION)
    _, with_types = tagger.tag(examples)
    tagger.settings = dataclasses.replace(tagger.settings, casing="none")
    _, without = tagger.tag(examples)
    assert not all((a == b).all() for a, b in zip(with_types, without))  # the types reach the model


def test_casing_dropout_blanks_a_seeded_share_of_windows_and_nothing_else(tiny_bert):
    from ner.data.encode import drop_casing

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


def test_dropped_windows_get_the_unknown_type_that_a_plain_consumer_passes(tiny_bert):
    from ner.data.encode import drop_casing

    tokenizer = load_tokenizer(str(tiny_bert))
    examples = [Example(["ada", "met", "BOB", "in", "Rome", str(i)], ["O"] * 6, "t") for i in range(50)]
    features = encode_examples(examples, tokenizer, {"O": 0}, 32, casing=True)
    dropped = drop_casing(features, 0.5, seed=3)
    changed = [d for d, f in zip(dropped, features) if d.token_type_ids != f.token_type_ids]
    assert changed and all(d.token_type_ids == [UNKNOWN_CASE] * len(d.input_ids) for d in changed)
    plain = tokenizer([e.words for e in examples[:1]], is_split_into_words=True)  # what transformers passes
    assert set(plain["token_type_ids"][0]) == {UNKNOWN_CASE}


def test_an_unknown_recorded_scheme_is_refused(cased_run, tmp_path):
    import shutil

    from ner.inference.model_folder import ModelSettings

    shutil.copytree(cased_run, tmp_path / "future")
    args = json.loads((tmp_path / "future" / "training_args.json").read_text())
    (tmp_path / "future" / "training_args.json").write_text(json.dumps({**args, "casing_scheme": "five-types"}))
    with pytest.raises(UserError, match="casing_scheme 'five-types' is not one this version"):
        ModelSettings.of(tmp_path / "future")


def test_the_model_cards_plain_transformers_lines_pass_the_types_the_tools_pass(cased_run):
    """The card's snippet for plain transformers users runs on the export, its case_type is ner's casing_type, and
    the tags it prints are those of the same windows with the types the tools compute (argmax, one sentence)."""
    import re

    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    card = (cased_run / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(import torch\n.*?)```", card, re.DOTALL).group(1)
    namespace: dict = {}
    exec(code.replace("PATH/TO/THIS/FOLDER", str(cased_run)), namespace)  # noqa: S102 (our own card)
    for word in ["Angela", "EU", "U.S.", "paris", "2024", ".", "A", "McDonald", "IBM's", "É"]:
        assert namespace["case_type"](word) == casing_type(word), word
    words = "Angela Merkel visited Paris .".split()
    tokenizer = AutoTokenizer.from_pretrained(cased_run)
    model = AutoModelForTokenClassification.from_pretrained(cased_run)
    batch = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    batch["token_type_ids"] = torch.tensor([[0 if w is None else casing_type(words[w]) for w in batch.word_ids()]])
    expected = model(**batch).logits.argmax(-1)[0].tolist()
    assert namespace["tags"] == [model.config.id2label[i] for i in expected]


def test_a_checkpoint_from_before_the_unknown_type_does_not_resume(cased_run, tiny_bert, tiny_data, tmp_path,
                                                                   capsys):
    """Its type rows mean other cases (0 was "no capital"): continuing it in the new scheme would train the rows
    on the wrong words, so resume refuses and names the setting."""
    import shutil

    from ner import train as train_cli
    from ner.files import file_entry, read_record, write_record
    from ner.training.checkpoint import CHECKPOINT_TOOL, MANIFEST, STATE, list_checkpoints

    old = tmp_path / "old"
    shutil.copytree(list_checkpoints(cased_run.parent)[-1], old)
    state = json.loads((old / STATE).read_text())
    del state["config"]["casing_scheme"]  # what a checkpoint written before the scheme was recorded holds
    (old / STATE).write_text(json.dumps(state))
    manifest = read_record(old, CHECKPOINT_TOOL, MANIFEST)  # sealed as such a checkpoint was
    write_record(old, CHECKPOINT_TOOL, {**manifest, STATE: file_entry(old / STATE)}, MANIFEST)
    code = train_cli.main(tiny_args(tiny_bert, tiny_data, tmp_path / "out", "--num-epochs", "3",
                                    "--learning-rate", "3e-3", "--resume", str(old)))
    err = capsys.readouterr().err
    assert code == 2 and "cannot resume" in err
    assert f"casing_scheme: checkpoint None, now {CASING_SCHEME!r}" in err
