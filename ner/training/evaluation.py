"""Training's evaluation: the validation and test sets batched once, tagged sharded over the ranks.

Each rank runs the one inference path (ner.inference.tagger.predict_word_scores) on its share of the batches
with the PyTorch model it trains; every word is owned by exactly one window, so gathering the shards counts each
sentence exactly once on any world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ner.data.encode import Feature, fixed_shape_plan, merge_predictions
from ner.data.examples import Example
from ner.inference.decode import Decoder
from ner.inference.options import inference_batch_limits
from ner.inference.tagger import Progress, no_progress, predict_word_scores
from ner.inference.torch_runtime import TorchRuntime

if TYPE_CHECKING:
    import torch

    from ner.backends import Backend


@dataclass
class EvalSet:
    examples: list[Example]
    features: list[Feature]
    batches: list[list[int]]  # fixed shape per width (encode.fixed_shape_plan); each window in exactly one batch
    pad_to_multiple_of: int = 1


def build_eval_set(examples: list[Example], features: list[Feature], batch_size: int, max_tokens: int,
                   pad_to_multiple_of: int) -> EvalSet:
    """Evaluation batches under the training run's limits (see inference_batch_limits), of the fixed shapes
    Tagger uses, so a sentence's scores do not depend on the evaluation set around it (features gain fillers)."""
    max_sentences, max_batch_tokens = inference_batch_limits(batch_size, max_tokens)
    planned, batches = fixed_shape_plan(features, pad_to_multiple_of, max_sentences, max_batch_tokens)
    return EvalSet(examples, planned, batches, pad_to_multiple_of)


def predict_tags(model: torch.nn.Module, eval_set: EvalSet, backend: Backend, pad_token_id: int, decoder: Decoder,
                 progress: Progress = no_progress) -> list[list[str]]:
    """Tags for every word of every sentence; batches sharded over ranks with no padding."""
    bare = backend.unwrap_model(model)
    was_training = bare.training
    bare.eval()
    my_batches = eval_set.batches[backend.process_index::backend.num_processes]
    mine = predict_word_scores(TorchRuntime(bare, backend.device, backend.autocast), eval_set.features, my_batches,
                               pad_token_id, progress, eval_set.pad_to_multiple_of)
    bare.train(was_training)
    gathered = backend.gather_object(mine)  # every word is owned by exactly one window, in one shard
    word_ids, scores = (np.concatenate([part[k] for part in gathered]) for k in range(2))
    return decoder(merge_predictions(eval_set.examples, word_ids, scores))[0]
