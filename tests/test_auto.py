"""The auto learning rate follows the micro-batches the run builds, not the sentence budget they were cut for."""

from __future__ import annotations

import math

import pytest

from ner.data.batching import NO_TOKEN_BUDGET, TokenBudgetBatchSampler
from ner.training.auto import TRAINING_BUDGETS, auto_learning_rate, resolve_auto
from ner.training.config import TrainConfig

CPU, CUDA = "cpu", "cuda"  # device types as the backend names them (torch.device(...).type): values, no GPU needed


def epoch_of(lengths: list[int]):
    """updates_per_epoch as the run counts it (one process, no accumulation): the micro-batches the sampler cuts."""
    return lambda batch_size, max_tokens: len(TokenBudgetBatchSampler(lengths, batch_size, max_tokens, seed=0).plan(0))


@pytest.mark.parametrize("max_tokens, width, windows_per_micro_batch, cpu_windows", [
    (0, 64, 128, 32),  # auto, the CUDA budget: 128 rows of 64 tokens fit 16384, so the sentence count decides
    (NO_TOKEN_BUDGET, 64, 128, 32),  # a fixed --batch-size: the sentences' budget is the batch
    (4096, 64, 64, 32),  # the cap binds: 4096 / 64 = 64 rows a micro-batch, twice the CPU's 32, not four times
    (2048, 64, 32, 32),  # ... or holds no more than the CPU's: the measured rate, unscaled
    (0, 256, 64, 16),  # long windows: the CUDA budget binds at 64 rows, the CPU's at 16
    (NO_TOKEN_BUDGET, 256, 128, 16),  # a fixed batch does not: 128 rows whatever the width, 8x the CPU's
])
def test_the_auto_rate_on_cuda_scales_with_the_micro_batch_actually_built(max_tokens, width, windows_per_micro_batch,
                                                                          cpu_windows):
    lengths = [width] * 2560  # padded widths: 2560 windows
    resolved = resolve_auto(TrainConfig(max_tokens=max_tokens), hidden_size=384, sentences_per_window=1.0,
                            updates_per_epoch=epoch_of(lengths), device_type=CUDA)
    assert resolved.batch_size == TRAINING_BUDGETS[CUDA][0]  # 128 sentences asked for in every case
    assert resolved.max_tokens == (max_tokens or TRAINING_BUDGETS[CUDA][1])  # a fixed batch stays fixed
    scale = windows_per_micro_batch / cpu_windows
    assert resolved.learning_rate == pytest.approx(auto_learning_rate(384) * math.sqrt(scale))


def test_on_cpu_the_auto_rate_is_the_measured_one_and_a_smaller_cap_gets_a_smaller_step():
    lengths = [64] * 2560
    default = resolve_auto(TrainConfig(), hidden_size=384, sentences_per_window=1.0,
                           updates_per_epoch=epoch_of(lengths), device_type=CPU)
    assert default.learning_rate == auto_learning_rate(384) == 2e-4
    capped = resolve_auto(TrainConfig(max_tokens=1024), hidden_size=384, sentences_per_window=1.0,
                          updates_per_epoch=epoch_of(lengths), device_type=CPU)  # 16 rows of 64 tokens
    assert capped.learning_rate == pytest.approx(2e-4 * math.sqrt(16 / 32))
