"""What to annotate next: the least confident texts (entities.text_confidence), spread over clusters of similar
texts so that near-duplicates and one kind of sentence do not fill a batch, within a budget of words or texts.
ner.select and the Label Studio backend use it; benchmarks.active_learning measures it against random choice.

Texts are compared as TF-IDF vectors of hashed lower-cased words and word pairs (text_vectors): the same for every
runtime (the ONNX and OpenVINO files give logits, not sentence vectors), and cheap next to tagging the pool.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HASHED_FEATURES = 1 << 11  # vector width: a pool's vocabulary shares these by hash (collisions only blur clusters)
CANDIDATE_FACTOR = 3  # the least confident texts worth 3x the budget are clustered and picked from
KMEANS_ROUNDS = 20  # Lloyd iterations; the assignment is settled well before on pools of thousands
POOL_CLUSTERS = 32  # clusters over a whole pool (Label Studio's tasks): its uncertainty sampling spreads over them
# a text sharing this share of its distinct words (Jaccard) with one picked already is a near-duplicate: not picked.
# TF-IDF alone lets a near-duplicate's one rare word (a name) outweigh the nine it shares
NEAR_DUPLICATE = 0.7


@dataclass(frozen=True)
class Pick:
    index: int  # into the pool
    cluster: int  # among the picks' clusters, 0-based


def text_vectors(words_per_text: Sequence[Sequence[str]]) -> np.ndarray:
    """L2-normalised TF-IDF over hashed lower-cased words and adjacent word pairs, one row per text: texts
    that share words (near-duplicates above all) point the same way. A stable hash (crc32), so the same pool gives
    the same vectors in every process."""
    counts = np.zeros((len(words_per_text), HASHED_FEATURES), dtype=np.float32)
    for row, words in enumerate(words_per_text):
        lowered = [w.lower() for w in words]
        for term in lowered + [f"{a} {b}" for a, b in zip(lowered, lowered[1:])]:
            counts[row, zlib.crc32(term.encode("utf-8")) % HASHED_FEATURES] += 1.0
    document_frequency = (counts > 0).sum(axis=0)
    idf = np.log((1.0 + len(counts)) / (1.0 + document_frequency)) + 1.0
    weighted = np.log1p(counts) * idf.astype(np.float32)
    norms = np.linalg.norm(weighted, axis=1, keepdims=True)
    return weighted / np.where(norms > 0, norms, 1.0)


def kmeans(vectors: np.ndarray, clusters: int, seed: int = 0) -> np.ndarray:
    """Cluster of each row (spherical k-means, k-means++ start from a fixed seed): the same rows give the same
    clusters on every run."""
    clusters = max(1, min(clusters, len(vectors)))
    if clusters == 1:
        return np.zeros(len(vectors), dtype=np.int64)
    rng = np.random.default_rng(seed)
    centres = [vectors[0]]  # the first row: the least confident where the caller ranked them
    distance = 1.0 - vectors @ vectors[0]
    for _ in range(1, clusters):
        weights = np.maximum(distance, 0.0)
        total = weights.sum()
        chosen = int(rng.choice(len(vectors), p=weights / total)) if total > 0 else int(rng.integers(len(vectors)))
        centres.append(vectors[chosen])
        distance = np.minimum(distance, 1.0 - vectors @ vectors[chosen])
    centres = np.stack(centres)
    for _ in range(KMEANS_ROUNDS):
        assigned = (vectors @ centres.T).argmax(axis=1)
        for k in range(clusters):
            members = vectors[assigned == k]
            if len(members):
                mean = members.sum(axis=0)
                centres[k] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return (vectors @ centres.T).argmax(axis=1)


def pool_clusters(words_per_text: Sequence[Sequence[str]], clusters: int = POOL_CLUSTERS) -> np.ndarray:
    """A cluster for every text of a pool (Label Studio's `cluster`), from its text vectors."""
    return kmeans(text_vectors(words_per_text), clusters) if len(words_per_text) else np.zeros(0, dtype=np.int64)


def ranked(confidence: Sequence[float], word_counts: Sequence[int]) -> list[int]:
    """Pool indices with words, least confident first (ties: pool order)."""
    return sorted((i for i, n in enumerate(word_counts) if n > 0), key=lambda i: (confidence[i], i))


def select(confidence: Sequence[float], words_per_text: Sequence[Sequence[str]], words: int | None = None,
           texts: int | None = None, diverse: bool = True) -> list[Pick]:
    """The texts to annotate next, in the order to annotate them, within `words` words or `texts` texts.

    The least confident texts worth CANDIDATE_FACTOR budgets are clustered, about one cluster per text the budget
    buys; then each round takes every cluster's least confident text left (clusters in the order of their least
    confident text) that fits the budget and is no near-duplicate of a pick (NEAR_DUPLICATE). `diverse=False`: the
    candidates in confidence order alone, near-duplicates included."""
    if (words is None) == (texts is None):
        raise ValueError("give a budget of words or of texts")
    word_counts = [len(w) for w in words_per_text]
    order = ranked(confidence, word_counts)
    candidates = _candidates(order, word_counts, words, texts)
    if not candidates:
        return []
    if diverse:
        mean_words = float(np.mean([word_counts[i] for i in candidates]))
        affordable = texts if texts is not None else max(1, round(words / mean_words))
        cluster_of = kmeans(text_vectors([words_per_text[i] for i in candidates]), affordable)
    else:
        cluster_of = np.zeros(len(candidates), dtype=np.int64)
    word_sets = [frozenset(w.lower() for w in words_per_text[i]) for i in candidates] if diverse else None
    return _round_robin(candidates, cluster_of, word_counts, words, texts, word_sets)


def _candidates(order: list[int], word_counts: Sequence[int], words: int | None, texts: int | None) -> list[int]:
    if texts is not None:
        return order[:CANDIDATE_FACTOR * texts]
    limit, taken, total = CANDIDATE_FACTOR * words, [], 0
    for index in order:
        if total >= limit:
            break
        taken.append(index)
        total += word_counts[index]
    return taken


def _near_duplicate(words: frozenset, picked: list[frozenset]) -> bool:
    return any(len(words & other) >= NEAR_DUPLICATE * len(words | other) for other in picked)


def _round_robin(candidates: list[int], cluster_of: np.ndarray, word_counts: Sequence[int], words: int | None,
                 texts: int | None, word_sets: list[frozenset] | None) -> list[Pick]:
    queues: dict[int, list[int]] = {}
    for position in range(len(candidates)):  # candidates are least confident first: so is every queue
        queues.setdefault(int(cluster_of[position]), []).append(position)
    numbering = {cluster: number for number, cluster in enumerate(queues)}  # first seen = least confident head
    picks: list[Pick] = []
    picked_sets: list[frozenset] = []
    left = words if words is not None else texts
    while left > 0 and any(queues.values()):
        for cluster, queue in queues.items():
            while queue:
                position = queue.pop(0)
                index = candidates[position]
                cost = word_counts[index] if words is not None else 1
                if cost > left or (word_sets is not None and _near_duplicate(word_sets[position], picked_sets)):
                    continue
                picks.append(Pick(index, numbering[cluster]))
                picked_sets += [word_sets[position]] if word_sets is not None else []
                left -= cost
                break
            if left <= 0:
                break
    return picks
