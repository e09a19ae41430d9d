"""Subword alignment, windows for long sentences, batching plans; with a hypothesis property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ner.data.batching import NO_TOKEN_BUDGET, TokenBudgetBatchSampler, inference_batches
from ner.data.encode import (
    IGNORE_INDEX,
    cached_encode,
    collate,
    encode_examples,
    merge_predictions,
    owned_positions,
    plan_context_windows,
    plan_windows,
)
from ner.data.examples import Example

LABELS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
LABEL2ID = {label: i for i, label in enumerate(LABELS)}
ID2LABEL = dict(enumerate(LABELS))


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def roundtrip(examples, tokenizer, max_seq_length, label_all=False, context=False, context_tokens=0):
    """Gold labels through features and back, as if the model predicted them perfectly."""
    features = encode_examples(examples, tokenizer, LABEL2ID, max_seq_length, label_all_subwords=label_all,
                               context=context, context_tokens=context_tokens)
    if not features:  # nothing but empty sentences
        return features, [[] for _ in examples]
    batch = collate(features, tokenizer.pad_token_id)
    (rows, cols), word_ids = owned_positions(batch["word_index"])
    merged = merge_predictions(examples, word_ids, batch["labels"][rows, cols])
    return features, [[ID2LABEL[int(i)] for i in sentence] for sentence in merged]


def test_first_subword_labelled_rest_ignored(tokenizer):
    example = Example(["Lovelace", "xyzzy"], ["B-PER", "O"], "t")
    features, _ = roundtrip([example], tokenizer, 32)
    (feature,) = features
    pieces = tokenizer(["xyzzy"], is_split_into_words=True, add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1  # the made-up word splits into several subwords
    assert feature.labels == [IGNORE_INDEX, LABEL2ID["B-PER"], LABEL2ID["O"]] + [IGNORE_INDEX] * (len(pieces) - 1) \
        + [IGNORE_INDEX]
    assert feature.input_ids[0] == tokenizer.cls_token_id and feature.input_ids[-1] == tokenizer.sep_token_id


def test_label_all_subwords_continues_b_as_i(tokenizer):
    example = Example(["Lovelacezz"], ["B-PER"], "t")
    features, tags = roundtrip([example], tokenizer, 32, label_all=True)
    inner = features[0].labels[1:-1]
    assert inner[0] == LABEL2ID["B-PER"] and set(inner[1:]) == {LABEL2ID["I-PER"]}
    assert tags == [["B-PER"]]


def test_long_sentence_becomes_windows_and_every_word_comes_back_once(tokenizer):
    words = [f"w{i}" for i in range(90)]
    tags = ["B-PER" if i % 7 == 0 else ("I-PER" if i % 7 == 1 else "O") for i in range(90)]
    features, merged = roundtrip([Example(words, tags, "t")], tokenizer, 24)
    assert len(features) > 3
    assert all(len(f.input_ids) <= 24 for f in features)
    owned = [w for f in features for w in f.word_index if w >= 0]
    assert sorted(owned) == list(range(90))  # each word owned by exactly one window
    assert merged == [tags]


def test_window_plan_overlaps_and_owns_each_word_once():
    windows = plan_windows([1] * 20, budget=8, stride_words=2)
    assert windows[0][0] == 0 and windows[-1][1] == 20
    for (_, e1, _, oe1), (s2, _, os2, _) in zip(windows, windows[1:]):
        assert s2 < e1  # consecutive windows overlap
        assert oe1 == os2  # ownership hands over at one point
    assert sum(oe - os for _, _, os, oe in windows) == 20


tag_strategy = st.sampled_from(LABELS)
word_strategy = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Cc", "Zl", "Zp")),
                        min_size=1, max_size=12).filter(lambda w: w.split() == [w])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(word_strategy, tag_strategy), min_size=1, max_size=70), min_size=1, max_size=4),
       st.integers(min_value=8, max_value=40))
def test_property_tags_to_subwords_and_back_is_identity(tokenizer, sentences, max_seq_length):
    examples = [Example([w for w, _ in s], [t for _, t in s], "h") for s in sentences]
    _, merged = roundtrip(examples, tokenizer, max_seq_length)
    assert merged == [e.tags for e in examples]


def test_token_budget_batches_respect_budget_and_cover_everything():
    lengths = list(np.random.default_rng(0).integers(5, 60, size=500))
    sampler = TokenBudgetBatchSampler(lengths, max_sentences=32, max_tokens=512, seed=3)
    plan = sampler.plan(0)
    assert sorted(i for batch in plan for i in batch) == list(range(500))
    assert all(len(b) <= 32 and max(lengths[i] for i in b) * len(b) <= 512 for b in plan)
    assert plan != sampler.plan(1)  # reshuffled every epoch
    assert plan == TokenBudgetBatchSampler(lengths, 32, 512, seed=3).plan(0)  # a pure function of (seed, epoch)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in plan)
    assert sum(lengths) / padded > 0.9  # length grouping keeps padding low


def test_plan_is_padded_to_a_multiple_of_the_world_size_and_skips_for_resume():
    sampler = TokenBudgetBatchSampler([10] * 10, max_sentences=3, max_tokens=NO_TOKEN_BUDGET, seed=0, num_replicas=3)
    plan = sampler.plan(0)
    assert len(plan) == 6 and plan[4:] == plan[:2]  # 4 batches, the first two repeated
    sampler.set_epoch(0, skip_batches=2)
    assert list(sampler) == plan[2:] and len(sampler) == 4


def test_inference_batches_cover_each_item_once_sorted_by_length():
    lengths = [5, 50, 7, 33, 12]
    for no_budget in (NO_TOKEN_BUDGET, 0):  # --max-tokens -1, or a resolved budget of none
        batches = inference_batches(lengths, max_sentences=2, max_tokens=no_budget)
        assert sorted(i for b in batches for i in b) == list(range(5))
        assert batches[0] == [1, 3]


def test_collate_rounds_the_width_and_masks_the_extra_padding(tokenizer):
    examples = [Example(["Ada", "Lovelace", "wrote"], ["B-PER", "I-PER", "O"], "a"), Example(["Paris"], ["B-LOC"], "b")]
    features = encode_examples(examples, tokenizer, LABEL2ID, 32)
    longest = max(len(f.input_ids) for f in features)
    exact, rounded = collate(features, tokenizer.pad_token_id), collate(features, tokenizer.pad_token_id, 8)
    assert exact["input_ids"].shape[1] == longest and rounded["input_ids"].shape[1] == -(-longest // 8) * 8
    width = exact["input_ids"].shape[1]
    for key in ("input_ids", "attention_mask", "labels", "word_index"):
        assert (rounded[key][:, :width] == exact[key]).all()
    assert rounded["attention_mask"][:, width:].sum() == 0 and (rounded["labels"][:, width:] == IGNORE_INDEX).all()
    assert (rounded["word_index"][:, width:] == -1).all()


def test_tokenisation_cache_is_keyed_by_the_encoding_code(tokenizer, tmp_path, monkeypatch):
    import ner.data.encode

    examples = [Example(["Ada", "visited", "London"], ["B-PER", "O", "B-LOC"], "x")]
    first = cached_encode(examples, tokenizer, LABEL2ID, 32, cache_dir=tmp_path)
    assert cached_encode(examples, tokenizer, LABEL2ID, 32, cache_dir=tmp_path) == first
    assert len(list(tmp_path.glob("*.npz"))) == 1  # the second call was a hit
    monkeypatch.setattr(ner.data.encode, "_encoder_source_digest", lambda: "the encoding code after an edit")
    cached_encode(examples, tokenizer, LABEL2ID, 32, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2  # a miss: the old entry is not trusted


def test_tests_use_a_private_tokenisation_cache(private_tokenization_cache):
    from pathlib import Path

    from ner.training.config import tokenization_cache_dir

    assert tokenization_cache_dir("auto") == private_tokenization_cache / "features"
    assert not tokenization_cache_dir("auto").is_relative_to(Path.home() / ".cache")


# ----------------------------------------------------------------------------- document context

def test_context_windows_give_every_owned_word_context_on_both_sides():
    counts = [1, 2, 1, 3, 1] * 12  # 60 words, 96 tokens
    windows = plan_context_windows(counts, budget=20, context_tokens=4)
    assert [w for _, _, own_start, own_end in windows for w in range(own_start, own_end)] == list(range(60))
    for start, end, own_start, own_end in windows:
        assert sum(counts[start:end]) <= 20 and start <= own_start < own_end <= end
        assert sum(counts[start:own_start]) >= min(4 - 2, sum(counts[:own_start]))  # whole words: within one word
        assert sum(counts[own_end:end]) >= min(4 - 2, sum(counts[own_end:]))
    assert len(windows) <= -(-96 // (20 - 2 * 4)) + 1  # cost: about budget / core times the tokens


def document(words_per_sentence: list[int], document_id, start: int = 0) -> list[Example]:
    examples = []
    for n in words_per_sentence:
        words = [f"w{start + i}" for i in range(n)]
        tags = ["B-PER" if (start + i) % 5 == 0 else ("I-PER" if (start + i) % 5 == 1 else "O") for i in range(n)]
        examples.append(Example(words, tags, "doc", document=document_id))
        start += n
    return examples


def test_context_reaches_across_sentences_of_one_document_only(tokenizer):
    examples = document([3, 4, 2], "a") + document([5], "b") + document([2, 2], "c")
    features, merged = roundtrip(examples, tokenizer, 64, context=True, context_tokens=8)
    assert merged == [e.tags for e in examples]
    assert len(features) == 3  # one window per (short) document
    first_doc = features[0]
    assert sum(w >= 0 for w in first_doc.word_index) == 9  # 3 sentences owned together
    for feature in features:  # context never carries a label: labels only where a word is owned
        for label, word in zip(feature.labels, feature.word_index):
            assert (label != IGNORE_INDEX) == (word >= 0)


@settings(max_examples=40, deadline=None)
@given(sentences=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=12),
       documents=st.lists(st.integers(min_value=0, max_value=2), min_size=12, max_size=12),
       max_seq_length=st.integers(min_value=12, max_value=48), context_tokens=st.integers(min_value=0, max_value=4))
def test_property_every_word_predicted_once_with_context(tokenizer, sentences, documents, max_seq_length,
                                                         context_tokens):
    """Documents longer than a window, sentences longer than a window, one-sentence documents, empty ones."""
    examples, start = [], 0
    for n, doc in zip(sentences, documents):
        examples += document([n], doc, start)
        start += n
    features, merged = roundtrip(examples, tokenizer, max_seq_length, context=True, context_tokens=context_tokens)
    assert merged == [e.tags for e in examples]
    assert all(len(f.input_ids) <= max_seq_length for f in features)
    for feature in features:
        for label, word in zip(feature.labels, feature.word_index):
            assert (label != IGNORE_INDEX) == (word >= 0)
