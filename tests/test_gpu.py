"""On a CUDA GPU: training runs there, and its export tags the same on the GPU and the CPU.

Marked `gpu`: skipped (with the reason shown) where torch sees no CUDA device. The full GPU
check (every backend, the benchmark, the CoNLL recipe) is `scripts/gpu_check.sh`.
"""

from __future__ import annotations

import pytest
from conftest import python_module, read_state, run_cli, tiny_args

from ner.backends import NO_MIXED_PRECISION
from ner.data.conll import read_conll
from ner.training.checkpoint import list_checkpoints

pytestmark = pytest.mark.gpu


def test_trains_on_cuda_and_its_export_tags_the_same_on_cpu(tiny_bert, tiny_data, tmp_path):
    from ner.inference.tagger import Tagger

    out = tmp_path / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--max-steps", "8",
                                                           "--max-tokens", "0")))
    assert result.returncode == 0, result.stderr[-3000:]
    state = read_state(list_checkpoints(out)[-1])
    assert state["config"]["attn_implementation"] == "sdpa"  # auto resolved for the GPU
    assert state["config"]["max_tokens"] == 16384  # ... and the token budget
    examples = read_conll(tiny_data["validation"])
    on_gpu, _ = Tagger(out / "final", device="cuda", precision=NO_MIXED_PRECISION).tag(examples)
    on_cpu, _ = Tagger(out / "final", device="cpu", precision=NO_MIXED_PRECISION).tag(examples)
    assert on_gpu == on_cpu
