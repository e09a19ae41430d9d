"""ner.train in bf16 with the last part of training in fp32: an ablation for docs/accuracy.md, not a product path.

    python -m benchmarks.seeds --trainer benchmarks.fp32_tail --seeds 1 2 3 --out OUT -- FLAGS

Updates from FP32_FROM (a fraction of the run's updates; env NER_FP32_FROM, default 0.75: the last of 4 epochs)
run without autocast. Accelerate wraps the prepared model's forward in its own autocast, which a nested
`torch.autocast(enabled=False)` outside the forward cannot undo, so the tail restores the forward Accelerate
kept (`_original_forward`) and computes inside a disabled autocast. Evaluation and the export are ner.train's.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from ner.training import loop, run

FP32_FROM = float(os.environ.get("NER_FP32_FROM", "0.75"))
log = logging.getLogger("ner")


def fit_with_fp32_tail(model, optimizer, scheduler, train_loader, backend, state, total_steps, *args):
    switch_step = int(FP32_FROM * total_steps)
    compute = args[-1]

    def compute_then_fp32(model_, encoder, inputs, labels):
        if state.global_step < switch_step:
            return compute(model_, encoder, inputs, labels)
        if hasattr(model_, "_original_forward") and model_.forward is not model_._original_forward:
            log.info("fp32 from update %d of %d", state.global_step, total_steps)
            model_.forward = model_._original_forward
        with torch.autocast(device_type=backend.device.type, enabled=False):
            return compute(model_, encoder, inputs, labels)

    return loop.fit(model, optimizer, scheduler, train_loader, backend, state, total_steps, *args[:-1],
                    compute_then_fp32)


def main(argv: list[str] | None = None) -> int:
    run.fit = fit_with_fp32_tail
    from ner import train
    return train.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
