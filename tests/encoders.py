"""Tiny random encoders of each family the tool supports, built offline: a tokenizer of the family's kind
(WordPiece, byte-level BPE, Unigram) trained with the `tokenizers` library on the test sentences, and a model
of two layers and width 32 from the family's config. For tests/test_encoders.py.

    folder = build_encoder("deberta-v2", tmp_path / "deberta")     # AutoModel / AutoTokenizer load it
"""

from __future__ import annotations

from pathlib import Path

from conftest import make_sentences

SENTENCES = [" ".join(word for word, _ in sentence) for sentence in make_sentences(300, seed=4, long_every=7)]
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
FAMILIES = ("bert-cased", "distilbert", "electra", "roberta", "xlm-roberta", "deberta-v2", "modernbert")


def wordpiece(lowercase: bool):
    from tokenizers import BertWordPieceTokenizer

    trained = BertWordPieceTokenizer(lowercase=lowercase)
    trained.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1)
    return trained._tokenizer


def byte_level_bpe():
    from tokenizers import ByteLevelBPETokenizer

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return trained._tokenizer


def unigram(specials: list[str]):
    from tokenizers import SentencePieceUnigramTokenizer

    trained = SentencePieceUnigramTokenizer()
    trained.train_from_iterator(SENTENCES, vocab_size=400, special_tokens=specials, unk_token="<unk>")
    return trained._tokenizer


def tokenizer_of(family: str):
    import transformers as t

    bert_special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}
    roberta_special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                       "mask_token": "<mask>", "sep_token": "</s>", "cls_token": "<s>"}
    if family in ("bert-cased", "distilbert", "electra"):
        kind = {"bert-cased": t.BertTokenizerFast, "distilbert": t.DistilBertTokenizerFast,
                "electra": t.ElectraTokenizerFast}[family]
        return kind(tokenizer_object=wordpiece(lowercase=family != "bert-cased"), **bert_special,
                    do_lower_case=family != "bert-cased")
    if family in ("roberta", "modernbert"):
        kind = t.RobertaTokenizerFast if family == "roberta" else t.PreTrainedTokenizerFast
        return kind(tokenizer_object=byte_level_bpe(), **roberta_special)
    if family == "xlm-roberta":
        return t.XLMRobertaTokenizerFast(tokenizer_object=unigram(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]),
                                         **roberta_special)
    if family == "deberta-v2":
        return t.DebertaV2TokenizerFast(tokenizer_object=unigram(["[PAD]", "[CLS]", "[SEP]", "<unk>", "[MASK]"]),
                                        unk_token="<unk>", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                                        mask_token="[MASK]")
    raise ValueError(family)


def config_of(family: str, tokenizer):
    import transformers as t

    common = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, "max_position_embeddings": 130}
    if family == "bert-cased":
        return t.BertConfig(**SMALL, **common)
    if family == "distilbert":
        return t.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, **common)
    if family == "electra":
        return t.ElectraConfig(embedding_size=32, **SMALL, **common)
    if family in ("roberta", "xlm-roberta"):
        kind = t.RobertaConfig if family == "roberta" else t.XLMRobertaConfig
        return kind(**SMALL, **common, type_vocab_size=1, bos_token_id=tokenizer.cls_token_id,
                    eos_token_id=tokenizer.sep_token_id)
    if family == "deberta-v2":
        return t.DebertaV2Config(**SMALL, **common, type_vocab_size=0, relative_attention=True,
                                 position_buckets=32, pos_att_type=["p2c", "c2p"], position_biased_input=False)
    if family == "modernbert":
        return t.ModernBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                                  cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                                  max_position_embeddings=128, global_attn_every_n_layers=1, local_attention=16)
    raise ValueError(family)


def build_encoder(family: str, folder: Path) -> Path:
    """A tiny random encoder of `family` with its tokenizer, saved in `folder` as a hub model folder would be."""
    import torch
    from transformers import AutoModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_of(family)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    AutoModel.from_config(config_of(family, tokenizer)).save_pretrained(folder)
    return folder
