"""The `auto` options, resolved once the data, the encoder and the device are known: batch size, token budget,
epochs, learning rate, attention, mixed precision, document context and casing. Each CPU rule was chosen by
measurement; the CUDA micro-batch and its learning rate are reasoned, not measured yet (docs/defaults.md, "On a
GPU")."""

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

# (sentences, padded tokens) per device per micro-batch by device type, where --batch-size / --max-tokens are auto,
# as INFERENCE_BUDGETS is for inference. 32 x 128 tokens: a micro-batch of full windows just fits the budget, so
# the sentence count decides. CPU: measured (docs/defaults.md). CUDA: reasoned, until a run on a GPU measures it: the
# H200's update is host-bound (the GPU mostly idle), so 4x the data per update costs about the same time per update
# and a quarter of the updates, in a few GB of activations for MiniLM and BERT-base (figures: docs/defaults.md, "On a
# GPU").
TRAINING_BUDGETS = {"cpu": (AUTO_SENTENCES_PER_BATCH, 4096), "cuda": (4 * AUTO_SENTENCES_PER_BATCH, 16384)}


def training_budget(device_type: str) -> tuple[int, int]:
    """(sentences, padded tokens) per micro-batch for the device type; the CPU's for any other type."""
    return TRAINING_BUDGETS.get(device_type, TRAINING_BUDGETS["cpu"])


def auto_batch_size(sentences_per_window: float, sentences_per_batch: int = AUTO_SENTENCES_PER_BATCH) -> int:
    """Windows per micro-batch holding about `sentences_per_batch` sentences: at sentence level that many; a
    document window holds several sentences, so fewer windows keep each update's data, and the learning rate
    tuned for it, the same (docs/defaults.md)."""
    return max(1, round(sentences_per_batch / max(sentences_per_window, 1.0)))


def auto_num_epochs(updates_per_epoch: int) -> int:
    """Small data needs more passes to get enough updates; large data is done in 3 (docs/defaults.md)."""
    return min(max(math.ceil(AUTO_TARGET_UPDATES / max(updates_per_epoch, 1)), AUTO_MIN_EPOCHS), AUTO_MAX_EPOCHS)


def auto_learning_rate(hidden_size: int, batch_scale: float = 1.0) -> float:
    """Small encoders want a larger step (measured, docs/defaults.md); BERT-base and up the usual 5e-5. Both were
    chosen for 32-sentence micro-batches; a micro-batch `batch_scale` times larger gets sqrt(batch_scale) times the
    step (square-root scaling: the same gradient noise per step; reasoned, not measured)."""
    return (2e-4 if hidden_size <= 512 else 5e-5) * math.sqrt(batch_scale)


def built_batch_scale(updates_per_epoch: Callable[[int, int], int], micro_batch: tuple[int, int],
                      cpu_micro_batch: tuple[int, int]) -> float:
    """How many times the windows of the CPU's auto micro-batch the micro-batches cut at `micro_batch` (batch
    size, token budget) hold on this data: the same epoch cut into k times fewer updates holds k times the data
    in each. A token budget that binds (long rows, or a --max-tokens below the sentences' budget) makes them
    smaller than the sentence count asks for, and the rate follows what is built, not what was asked."""
    if micro_batch == cpu_micro_batch:
        return 1.0
    return updates_per_epoch(*cpu_micro_batch) / max(updates_per_epoch(*micro_batch), 1)


def auto_attention(device_type: str) -> str:
    """SDPA's fused kernels pay off on GPUs; on CPU, for NER's short rows, eager measured faster."""
    return "eager" if device_type == "cpu" else "sdpa"


def auto_compile(device_type: str) -> str:
    """torch.compile where it was measured faster over a whole run, compile time included, F1 no worse: nowhere
    yet. On a 2-core CPU compiling cost many times a 3,000-sentence epoch and the compiled steps ran no faster;
    GPUs are not measured yet (docs/performance.md, "Compiled steps")."""
    return "off"


def resolve_auto(cfg: TrainConfig, *, hidden_size: int, sentences_per_window: float,
                 updates_per_epoch: Callable[[int, int], int], device_type: str) -> TrainConfig:
    """A new config with every auto value decided, each choice logged once; `cfg` is left as it was.

    `updates_per_epoch(batch_size, max_tokens)` counts an epoch's updates at that batch size and token budget.
    """
    chosen: dict[str, Any] = {}
    budget_sentences, budget_tokens = training_budget(device_type)
    batch_size = cfg.batch_size or auto_batch_size(sentences_per_window, budget_sentences)
    if cfg.batch_size == 0:
        chosen["batch_size"] = batch_size
        log.info("--batch-size auto: %d (%d sentences on %s, %.1f sentences a window)", batch_size,
                 budget_sentences, device_type, sentences_per_window)
    max_tokens = cfg.max_tokens or budget_tokens
    if cfg.max_tokens == 0:
        chosen["max_tokens"] = max_tokens
        log.info("--max-tokens auto: %d (on %s)", max_tokens, device_type)
    if cfg.learning_rate == 0:
        cpu_micro_batch = (auto_batch_size(sentences_per_window), training_budget("cpu")[1])
        batch_scale = built_batch_scale(updates_per_epoch, (batch_size, max_tokens), cpu_micro_batch) \
            if cfg.batch_size == 0 else 1.0
        chosen["learning_rate"] = auto_learning_rate(hidden_size, batch_scale)
        log.info("--learning-rate auto: %g (hidden size %d%s)", chosen["learning_rate"], hidden_size,
                 f", micro-batch {batch_scale:.3g}x the CPU's as built: x sqrt({batch_scale:.3g})"
                 if batch_scale != 1 else "")
    if cfg.num_epochs == 0 and cfg.max_steps <= 0:
        per_epoch = updates_per_epoch(batch_size, max_tokens)
        chosen["num_epochs"] = auto_num_epochs(per_epoch)
        log.info("--num-epochs auto: %d (%d updates an epoch)", chosen["num_epochs"], per_epoch)
    if cfg.attn_implementation == "auto":
        chosen["attn_implementation"] = auto_attention(device_type)
        log.info("--attn-implementation auto: %s (on %s)", chosen["attn_implementation"], device_type)
    if cfg.compile == "auto":
        chosen["compile"] = auto_compile(device_type)
        log.info("--compile auto: %s (on %s)", chosen["compile"], device_type)
    return dataclasses.replace(cfg, **chosen)


def resolve_mixed_precision(cfg: TrainConfig, running: str, device_type: str) -> TrainConfig:
    """--mixed-precision as the backend runs it (it decided `auto` when it started: bf16 where the device has it,
    else no, or an Accelerate launch config's): the checkpoint, the resume check and the model card say what ran."""
    if cfg.mixed_precision == "auto":
        log.info("--mixed-precision auto: %s (on %s)", running, device_type)
    return dataclasses.replace(cfg, mixed_precision=running)


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
