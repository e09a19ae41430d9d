"""Wiring of one training run on one process: data -> model -> prepare -> fit -> export.

`run(cfg, backend)` is what every process executes, whichever backend launched it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from ner.backends import ACCELERATE, Backend
from ner.backends.trackers import TrackerClaim
from ner.data.batching import TokenBudgetBatchSampler
from ner.data.conll import write_predictions
from ner.data.encode import cached_encode, collate_tensors, collate_to_bucket, drop_casing, padded_lengths
from ner.data.examples import Columns, has_documents
from ner.data.formats import Splits, load_splits
from ner.data.tags import build_label_list, check_known_labels
from ner.errors import UserError
from ner.inference.analysis import entity_errors, format_errors
from ner.inference.decode import Decoder
from ner.metrics import entity_scores, format_scores
from ner.process import log_to_stderr
from ner.training import checkpoint as ckpt
from ner.training.auto import resolve_auto, resolve_casing, resolve_context, resolve_mixed_precision
from ner.training.config import TrainConfig, runtimes_to_export, tokenization_cache_dir, with_sample_data
from ner.training.evaluation import EvalSet, build_eval_set, predict_tags
from ner.training.export import export_checkpoint, export_fast_runtimes
from ner.training.hooks import RunHooks
from ner.training.loop import TrainState, fit, loss_and_logits, updates_in_epoch
from ner.training.model import (
    build_model,
    build_optimizer,
    build_scheduler,
    compile_loss,
    encoder_hidden_size,
    encoder_tokenizer,
    lowercases,
    takes_token_types,
)
from ner.training.output_dir import claim_output_dir
from ner.training.run_files import FINAL_DIR, PREDICTIONS_DIR, VALIDATION_PREDICTIONS

log = logging.getLogger("ner")


def setup_logging(is_main: bool) -> None:
    log_to_stderr(logging.INFO if is_main else logging.WARNING)
    for noisy in ("transformers", "accelerate", "datasets", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" / "Writing shards" bars


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(local_world_size: int) -> None:
    """Split the cores between the processes on this machine, unless the user already chose."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world_size, 1)))


@dataclass
class Prepared:
    splits: Splits
    label_list: list[str]
    tokenizer: object
    train_features: list
    eval_features: dict[str, list]  # validation / test, encoded
    decoder: Decoder
    eval_sets: dict[str, EvalSet] = field(default_factory=dict)  # batched once the batch size is resolved


def read_data(cfg: TrainConfig) -> Splits:
    return load_splits(cfg.train_file, cfg.validation_file, cfg.test_file, cfg.dataset, cfg.tag_scheme,
                       cfg.convert_tags_to, Columns(cfg.tokens_column, cfg.tags_column, cfg.document_column),
                       cfg.data_format, cfg.span_alignment)


def prepare_data(cfg: TrainConfig, splits: Splits, tokenizer) -> Prepared:
    """Check and encode every input before anything is written (bad input leaves no trace)."""
    label_list = build_label_list(splits.train)
    label2id = {label: i for i, label in enumerate(label_list)}
    for examples in (splits.validation, splits.test):
        if examples is not None:
            check_known_labels(examples, label2id)
    limit = getattr(tokenizer, "model_max_length", 512) or 512
    if cfg.max_seq_length > min(limit, 100_000):
        raise UserError(f"--max-seq-length {cfg.max_seq_length} exceeds what {cfg.model} supports ({limit})")
    encode = partial(cached_encode, tokenizer=tokenizer, label2id=label2id, max_seq_length=cfg.max_seq_length,
                     stride_words=cfg.window_stride_words, label_all_subwords=cfg.label_all_subwords,
                     context=cfg.context == "document", context_tokens=cfg.context_tokens,
                     casing=cfg.casing == "types",
                     cache_dir=tokenization_cache_dir(cfg.tokenization_cache))
    eval_features = {name: encode(examples) for name, examples in (("validation", splits.validation),
                                                                    ("test", splits.test)) if examples is not None}
    log.info("data: %d train sentences, tag scheme %s, %d labels: %s", len(splits.train), splits.scheme,
             len(label_list), " ".join(label_list))
    decoder = Decoder(tuple(label_list), splits.scheme, cfg.decode)
    train_features = drop_casing(encode(splits.train), cfg.casing_dropout, cfg.seed)
    if cfg.casing == "types" and cfg.casing_dropout:
        log.info("--casing-dropout %g: %d of %d training windows without case", cfg.casing_dropout,
                 sum(not any(f.token_type_ids) for f in train_features), len(train_features))
    return Prepared(splits, label_list, tokenizer, train_features, eval_features, decoder)


def batch_eval_sets(cfg: TrainConfig, data: Prepared) -> dict[str, EvalSet]:
    examples = {"validation": data.splits.validation, "test": data.splits.test}
    return {name: build_eval_set(examples[name], features, cfg.batch_size, cfg.max_tokens, cfg.pad_to_multiple_of)
            for name, features in data.eval_features.items()}


def updates_per_epoch(sampler: TokenBudgetBatchSampler, epoch: int, cfg: TrainConfig, world_size: int) -> int:
    return updates_in_epoch(len(sampler.plan(epoch)) // world_size, cfg.gradient_accumulation_steps)


def train_sampler(cfg: TrainConfig, data: Prepared, world_size: int, batch_size: int | None = None,
                  max_tokens: int | None = None):
    return TokenBudgetBatchSampler(padded_lengths(data.train_features, cfg.pad_to_multiple_of),
                                   batch_size or cfg.batch_size, cfg.max_tokens if max_tokens is None else max_tokens,
                                   cfg.seed, shuffle=True, num_replicas=world_size,
                                   pad_to_multiple_of=cfg.pad_to_multiple_of)


def train_collate(cfg: TrainConfig, sampler: TokenBudgetBatchSampler, pad_token_id: int):
    """Under a token budget, batches padded to their width bucket (a few shapes an epoch); else to the longest
    window, rounded to --pad-to-multiple-of."""
    if cfg.max_tokens > 0:
        return partial(collate_to_bucket, pad_token_id=pad_token_id, widths=sampler.widths)
    return partial(collate_tensors, pad_token_id=pad_token_id, pad_to_multiple_of=cfg.pad_to_multiple_of)


def plan_epochs(sampler: TokenBudgetBatchSampler, cfg: TrainConfig, world_size: int) -> tuple[int, int | None]:
    """(total updates, epoch limit): the schedule must know its length before the first step."""
    if cfg.max_steps > 0:
        return cfg.max_steps, None
    return sum(updates_per_epoch(sampler, e, cfg, world_size) for e in range(cfg.num_epochs)), cfg.num_epochs


def run(cfg: TrainConfig, backend: Backend, trackers: TrackerClaim) -> dict:
    """Train, evaluate, export; returns the final metrics (on every rank). `trackers`: the run's claim on trackers/,
    which its caller releases once the backend ended."""
    setup_logging(backend.is_main_process)
    cfg = with_sample_data(cfg)
    set_threads(int(os.environ.get("LOCAL_WORLD_SIZE", backend.num_processes)))
    seed_everything(cfg.seed)
    splits = read_data(cfg)
    cfg = resolve_context(cfg, has_documents(splits.train))
    tokenizer = encoder_tokenizer(cfg.model, cfg.trust_remote_code)
    cfg = resolve_casing(cfg, lowercases(tokenizer), takes_token_types(cfg.model, tokenizer, cfg.trust_remote_code))
    data = prepare_data(cfg, splits, tokenizer)
    if cfg.early_stopping_patience and "validation" not in data.eval_features:
        raise UserError("--early-stopping-patience needs validation data: pass --validation-file (or a --dataset "
                        "with a validation split)")
    resume_from = ckpt.resolve_resume(cfg.resume, cfg.output_path)
    world = backend.num_processes
    cfg = resolve_auto(cfg, hidden_size=encoder_hidden_size(cfg.model, cfg.trust_remote_code),
                       sentences_per_window=len(data.splits.train) / max(len(data.train_features), 1),
                       updates_per_epoch=lambda size, tokens: updates_per_epoch(
                           train_sampler(cfg, data, world, size, tokens), 0, cfg, world),
                       device_type=backend.device.type)
    cfg = resolve_mixed_precision(cfg, backend.mixed_precision, backend.device.type)
    sampler = train_sampler(cfg, data, world)
    data.eval_sets = batch_eval_sets(cfg, data)
    model = build_model(cfg.model, data.label_list, cfg.trust_remote_code, cfg.attn_implementation,
                        casing_types=cfg.casing == "types")
    model.to(backend.device)
    max_shapes = 2 * (cfg.max_seq_length // cfg.pad_to_multiple_of + 1)  # a full and a short row count a width
    loss = partial(loss_and_logits, label_smoothing=cfg.label_smoothing)
    compute = compile_loss(loss, backend.device.type, max_shapes) if cfg.compile == "on" else loss
    optimizer = build_optimizer(model, cfg.learning_rate, cfg.weight_decay, cfg.optimizer_impl)
    # A private generator: creating a DataLoader iterator draws a seed from it, and drawing from
    # the global RNG instead would shift dropout masks after a mid-epoch resume.
    loader = DataLoader(data.train_features, batch_sampler=sampler, generator=torch.Generator(),
                        collate_fn=train_collate(cfg, sampler, data.tokenizer.pad_token_id))
    model, optimizer, loader = backend.prepare(model, optimizer, loader)
    total_steps, num_epochs = plan_epochs(sampler, cfg, backend.num_processes)
    scheduler = build_scheduler(optimizer, cfg.lr_scheduler, total_steps, cfg.warmup_ratio)
    state = TrainState()
    if resume_from is not None:
        saved = ckpt.read_state(resume_from)
        ckpt.check_compatible(saved, cfg.to_dict(), data.label_list, backend.num_processes, resume_from)
        state = TrainState(**ckpt.load_checkpoint(backend, resume_from, model, optimizer, scheduler)["train_state"])
        log.info("resumed from %s (step %d, epoch %d, batch %d)", resume_from, state.global_step, state.epoch,
                 state.batches_done)
    claim_output_dir(cfg, backend, trackers, resume_from)
    if cfg.report_to != "none" and cfg.backend != ACCELERATE:
        log.warning("--report-to %s works through Accelerate's trackers; with --%s only metrics.jsonl is written",
                    cfg.report_to, cfg.backend)
    hooks = RunHooks(cfg, backend, model, optimizer, scheduler, data, state, total_steps, trackers)
    fit(model, optimizer, scheduler, loader, backend, state, total_steps, num_epochs,
        cfg.gradient_accumulation_steps, cfg.max_grad_norm, hooks, compute)
    hooks.close()
    hooks.on_train_end(state, f"reached --max-steps {total_steps}" if num_epochs is None
                       else f"completed {num_epochs} epochs ({state.global_step} updates)")
    return finish(cfg, backend, model, data, state, hooks)


def write_validation_predictions(cfg: TrainConfig, backend: Backend, model: torch.nn.Module, data: Prepared,
                                 hooks: RunHooks) -> list[list[str]] | None:
    """word / gold / predicted per line, for the confusion matrix and for people to grep; the predicted tags."""
    validation = data.eval_sets.get("validation")
    if validation is None or cfg.no_eval:
        return None
    predicted = hooks.best_predictions
    if predicted is None:  # the best evaluation happened before a resume: predict with the loaded best model
        predicted = predict_tags(model, validation, backend, data.tokenizer.pad_token_id, data.decoder)
    if backend.is_main_process:
        write_predictions(cfg.output_path / PREDICTIONS_DIR / VALIDATION_PREDICTIONS,
                          [e.words for e in validation.examples], [e.tags for e in validation.examples], predicted)
    return predicted


def finish(cfg: TrainConfig, backend: Backend, model: torch.nn.Module, data: Prepared, state: TrainState,
           hooks: RunHooks) -> dict:
    """Final checkpoint, best weights back in, test score, export to OUTPUT_DIR/final."""
    if not state.eval_history or state.eval_history[-1]["step"] != state.global_step:
        hooks.evaluate(state, can_stop=False)  # --max-steps can stop between scheduled evaluations
    metrics, source, sealed_here = score_final_model(cfg, backend, model, data, state, hooks)
    final = cfg.output_path / FINAL_DIR
    if backend.is_main_process:
        # update: on resume final/ holds the export of the run's earlier end, which the new one replaces
        # (claim_output_dir refused anything else there that the new export would replace)
        export_checkpoint(source, final, metrics, update=True, sealed_here=sealed_here)
        log.info("exported %s", final)
    backend.wait_for_everyone()
    if backend.is_main_process:
        # after the barrier, so no rank waits through calibration; after the plain export, so a gate that refuses a
        # file leaves final/ whole without it, and the run ends as finished (the report names the refusal)
        runtimes = runtimes_to_export(cfg.export_int8, cfg.export_runtime)
        fast_runtimes = export_fast_runtimes(final, final, data.splits.train, runtimes=runtimes) if runtimes else None
        print(json.dumps({k: (v["f1"] if isinstance(v, dict) else v) for k, v in metrics.items()
                          if k != "errors" and (not isinstance(v, dict) or "f1" in v)}))
        if fast_runtimes is not None:
            print(fast_runtimes)
        print(next_steps(final, metrics, cfg.test_file), flush=True)
    return metrics


def score_final_model(cfg: TrainConfig, backend: Backend, model: torch.nn.Module, data: Prepared,
                      state: TrainState, hooks: RunHooks) -> tuple[dict, Path, bool]:
    """The final checkpoint, the best weights loaded back, the test score and the validation predictions file:
    (final metrics, the checkpoint to export, whether that is the one just saved)."""
    last = hooks.save(state)
    best = ckpt.checkpoint_root(cfg.output_path) / f"step_{state.best_step}"
    source = best if state.best_step is not None and best.is_dir() else last
    if source != last:
        ckpt.load_weights(backend, source, model)
        log.info("best validation F1 %.2f at step %d: exporting that model", state.best_f1 * 100, state.best_step)
    metrics = {"validation": hooks.best_scores(), "best_step": state.best_step, "global_step": state.global_step,
               "train_loss_last": state.step_losses[-1] if state.step_losses else None,
               "stop_reason": state.stop_reason}
    if "test" in data.eval_sets:
        test_set = data.eval_sets["test"]
        predicted = predict_tags(model, test_set, backend, data.tokenizer.pad_token_id, data.decoder)
        metrics["test"] = entity_scores([e.tags for e in test_set.examples], predicted, data.decoder.scheme)
        log.info("test: %s", format_scores(metrics["test"]))
        metrics["errors"] = {"test": entity_errors([e.tags for e in test_set.examples], predicted)}
    validation_predicted = write_validation_predictions(cfg, backend, model, data, hooks)
    if validation_predicted is not None:
        gold = [e.tags for e in data.eval_sets["validation"].examples]
        metrics["errors"] = {"validation": entity_errors(gold, validation_predicted), **metrics.get("errors", {})}
    for split, errors in metrics.get("errors", {}).items():
        log.info("%s, by kind of error:\n%s", split, format_errors(errors))
    return metrics, source, source == last


def next_steps(final_dir, metrics: dict, test_file: str | None = None) -> str:
    """What a newcomer reads last: where the model is, how good it is, and the commands that use it."""
    scores = ", ".join(f"{split} F1 {metrics[split]['f1'] * 100:.2f}" for split in ("validation", "test")
                       if isinstance(metrics.get(split), dict) and "f1" in metrics[split])
    model = shlex.quote(str(final_dir))
    commands = [
        (f"echo 'Angela Merkel met Emmanuel Macron in Paris.' | python -m ner.predict {model}", "tag a sentence"),
        (f"python -m ner.predict {model} texts.txt", "raw text, one text a line -> JSON lines"),
        (f"python -m ner.serve {model}", "HTTP API and a page at http://127.0.0.1:8000/"),
        (f"python -m ner.evaluate {model} {shlex.quote(test_file or 'test.conll')}", "report, worst sentences"),
        (f"python -m ner.plot {shlex.quote(str(Path(final_dir).parent))}", "loss, F1 and confusion plots"),
    ]
    width = max(len(command) for command, _ in commands)
    lines = ["", f"Model ready: {final_dir}" + (f" ({scores})" if scores else ""), "Use it:"]
    return "\n".join(lines + [f"  {command:<{width}}  # {why}" for command, why in commands])
