"""Loading a tokenizer, the one way for training's encoder and for an export: a fast tokenizer (word ids align the
labels), loaded without importing torch where the folder names its class, and giving words split beforehand the
pieces they get in running text."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ner.errors import UserError

log = logging.getLogger("ner")


def load_tokenizer(source: str | Path, trust_remote_code: bool = False, name: str | None = None,
                   as_saved: bool = False):
    """The tokenizer of `source` (a folder or a hub id). Byte-level BPE (RoBERTa, ModernBERT, GPT-2 style) loads
    without a space before each word unless asked, and the encoder then sees word-initial pieces it never saw in
    pretraining: such a tokenizer is loaded again with the space, and the export saves the setting. `as_saved`:
    an export's tokenizer, kept as its model was trained with it. `name`: how messages call it (--model NAME);
    default: `source`."""
    name = name or str(source)
    tokenizer = _from_pretrained(source, trust_remote_code)
    if not as_saved and not splits_words_as_running_text(tokenizer):
        tokenizer = _from_pretrained(source, trust_remote_code, add_prefix_space=True)
        if not splits_words_as_running_text(tokenizer):  # a class that ignores the argument (ModernBERT's)
            add_prefix_space(tokenizer)
        if splits_words_as_running_text(tokenizer):
            log.info("%s: tokenizer loaded with add_prefix_space=True, so each word gets the pieces it has in "
                     "running text", name)
        else:
            log.warning("%s: its tokenizer gives words split beforehand other pieces than in running text; "
                        "accuracy may suffer", name)
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{name}: needs a fast tokenizer (word ids are used to align labels)")
    return tokenizer


def _from_pretrained(source: str | Path, trust_remote_code: bool, **options):
    """By the class tokenizer_config.json names (the fast one where transformers 4 has both). Not AutoTokenizer
    where that works: it imports AutoConfig, and so torch, in transformers 5; the tokenizer classes do not. A hub
    id, a class transformers does not have (custom code) or none named: AutoTokenizer."""
    import transformers

    config_file = Path(source) / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    named = config.get("tokenizer_class")
    found = [getattr(transformers, f"{named}Fast", None), getattr(transformers, named, None)] if named else []
    for cls in found:
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase):
            tokenizer = cls.from_pretrained(source, **options)
            if tokenizer.is_fast:
                return tokenizer
    return transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **options)


def add_prefix_space(tokenizer) -> None:
    """Turn on the byte-level pre-tokenizer's add_prefix_space in the tokenizer itself (its tokenizer.json), for
    tokenizer classes that do not take the argument: the export then carries the setting to every loader."""
    import json

    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.pre_tokenizer is None:
        return
    state = json.loads(backend.to_str())

    def turn_on(node) -> None:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel" and "add_prefix_space" in node:
                node["add_prefix_space"] = True
            for value in node.values():
                turn_on(value)
        elif isinstance(node, list):
            for value in node:
                turn_on(value)

    turn_on(state["pre_tokenizer"])
    backend.pre_tokenizer = Tokenizer.from_str(json.dumps(state)).pre_tokenizer


PROBE_WORDS = ("Angela", "Merkel", "visited", "Paris", "2024", "U.S.")


def splits_words_as_running_text(tokenizer, words: tuple[str, ...] = PROBE_WORDS) -> bool:
    """Whether `words` split beforehand (is_split_into_words) get the pieces of each `" " + word` in running text."""
    split = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False)["input_ids"]
    running = [i for word in words for i in tokenizer(" " + word, add_special_tokens=False)["input_ids"]]
    return split == running
