"""Pre-split words get the pieces they get in running text, in training, inference and the export: a byte-level
BPE tokenizer (RoBERTa, ModernBERT) loaded as is would drop each word's leading space (`Ġ`)."""

from __future__ import annotations

import pytest
from conftest import make_sentences, tiny_args

from ner import train as train_cli
from ner.data.tokenizer import load_tokenizer, splits_words_as_running_text
from ner.data.tokenizer import load_tokenizer as export_tokenizer

SENTENCES = [" ".join(word for word, _ in sentence) for sentence in make_sentences(300, seed=4, long_every=7)]


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    """A tiny random RoBERTa with a byte-level BPE tokenizer trained here on the test sentences."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_roberta")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tokenizer.save_pretrained(folder)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, type_vocab_size=1,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(folder)
    return folder


def test_byte_level_bpe_as_saved_drops_the_space_the_loader_restores(tiny_roberta):
    from transformers import AutoTokenizer

    assert not splits_words_as_running_text(AutoTokenizer.from_pretrained(tiny_roberta))  # the fault, as saved
    tokenizer = load_tokenizer(str(tiny_roberta))
    words = SENTENCES[0].split()
    split = tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    assert split == [i for word in words for i in tokenizer(" " + word, add_special_tokens=False)["input_ids"]]


def test_an_exports_tokenizer_is_loaded_as_saved(tiny_roberta):
    """Inference takes an export's tokenizer as its model was trained with it, even one without the space (an
    export from before the loader added it): only training's encoder is loaded again with it."""
    assert not splits_words_as_running_text(load_tokenizer(tiny_roberta, as_saved=True))
    assert splits_words_as_running_text(load_tokenizer(tiny_roberta))


def test_the_export_tokenizer_keeps_the_running_text_pieces(tiny_roberta, tiny_data, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    assert train_cli.main(tiny_args(tiny_roberta, tiny_data, out, "--max-steps", "2", "--no-eval")) == 0
    for tokenizer in (AutoTokenizer.from_pretrained(out / "final"), export_tokenizer(out / "final")):
        assert splits_words_as_running_text(tokenizer), type(tokenizer).__name__
