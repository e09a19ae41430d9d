"""The `auto` options, resolved once the data, the encoder and the device are known: batch size, epochs, learning
rate, attention, document context and casing. Each rule was chosen by measurement (docs/defaults.md)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

from ner.data.encode import CASING_SCHEME
from ner.errors import UserError
from ner.inference.options import AUTO_SENTENCES_PER_BATCH
from ner.training.config import TrainConfig

log = logging.getLogger("ner")

AUTO_TARGET_UPDATES, AUTO_MIN_EPOCHS, AUTO_MAX_EPOCHS = 1500, 3, 10


def auto_batch_size(sentences_per_window: float) -> int:
    """Windows per micro-batch holding about 32 sentences: at sentence level 32; a document window
    holds several sentences, so fewer windows keep each update's data, and the learning rate tuned
    for it, the same (docs/defaults.md)."""
    return max(1, round(AUTO_SENTENCES_PER_BATCH / max(sentences_per_window, 1.0)))


def auto_num_epochs(updates_per_epoch: int) -> int:
    """Small data needs more passes to get enough updates; large data is done in 3 (docs/defaults.md)."""
    return min(max(math.ceil(AUTO_TARGET_UPDATES / max(updates_per_epoch, 1)), AUTO_MIN_EPOCHS), AUTO_MAX_EPOCHS)


def auto_learning_rate(hidden_size: int) -> float:
    """Small encoders want a larger step (measured, docs/defaults.md); BERT-base and up the usual 5e-5."""
    return 2e-4 if hidden_size <= 512 else 5e-5


def auto_attention(device_type: str) -> str:
    """SDPA's fused kernels pay off on GPUs; on CPU, for NER's short rows, eager measured faster."""
    return "eager" if device_type == "cpu" else "sdpa"


def auto_compile(device_type: str) -> str:
    """torch.compile where it was measured faster over a whole run, compile time included, F1 no worse: nowhere
    yet. On a 2-core CPU compiling cost 9x a 3,000-sentence epoch and the compiled steps ran no faster; GPUs are
    not measured yet (docs/performance.md, "Compiled steps")."""
    return "off"


def resolve_auto(cfg: TrainConfig, *, hidden_size: int, sentences_per_window: float,
                 updates_per_epoch: Callable[[int], int], device_type: str) -> TrainConfig:
    """A new config with every auto value decided, each choice logged once; `cfg` is left as it was.

    `updates_per_epoch(batch_size)` counts an epoch's updates at that batch size.
    """
    chosen: dict[str, Any] = {}
    batch_size = cfg.batch_size or auto_batch_size(sentences_per_window)
    if cfg.batch_size == 0:
        chosen["batch_size"] = batch_size
        log.info("--batch-size auto: %d (%.1f sentences a window)", batch_size, sentences_per_window)
    if cfg.learning_rate == 0:
        chosen["learning_rate"] = auto_learning_rate(hidden_size)
        log.info("--learning-rate auto: %g (hidden size %d)", chosen["learning_rate"], hidden_size)
    if cfg.num_epochs == 0 and cfg.max_steps <= 0:
        per_epoch = updates_per_epoch(batch_size)
        chosen["num_epochs"] = auto_num_epochs(per_epoch)
        log.info("--num-epochs auto: %d (%d updates an epoch)", chosen["num_epochs"], per_epoch)
    if cfg.attn_implementation == "auto":
        chosen["attn_implementation"] = auto_attention(device_type)
        log.info("--attn-implementation auto: %s (on %s)", chosen["attn_implementation"], device_type)
    if cfg.compile == "auto":
        chosen["compile"] = auto_compile(device_type)
        log.info("--compile auto: %s (on %s)", chosen["compile"], device_type)
    return dataclasses.replace(cfg, **chosen)


def resolve_context(cfg: TrainConfig, train_has_documents: bool) -> TrainConfig:
    """--context auto -> document or none, by what the training data holds; said in the log."""
    chosen = cfg.context
    if chosen == "auto":
        chosen = "document" if train_has_documents else "none"
        why = "has two or more documents" if train_has_documents else "has fewer than two documents"
        log.info("--context auto: %s (the training data %s)", chosen, why)
    tokens = cfg.context_tokens or cfg.max_seq_length // 8 if chosen == "document" else cfg.context_tokens
    return dataclasses.replace(cfg, context=chosen, context_tokens=tokens)


def resolve_casing(cfg: TrainConfig, lowercases: bool, takes_token_types: bool) -> TrainConfig:
    """--casing auto -> types where the encoder cannot see case but takes token types; said in the log."""
    chosen = cfg.casing
    if chosen == "auto":
        chosen = "types" if lowercases and takes_token_types else "none"
        why = ("lower-cases its input" if lowercases else "sees case itself") + (
            "" if takes_token_types or not lowercases else " but takes no token types")
        log.info("--casing auto: %s (%s %s)", chosen, cfg.model, why)
    elif chosen == "types" and not takes_token_types:
        raise UserError(f"--casing types: {cfg.model} takes no token types (token_type_ids); use --casing none")
    return dataclasses.replace(cfg, casing=chosen, casing_scheme=CASING_SCHEME if chosen == "types" else None)
