"""ner.train with label-smoothed cross-entropy: an ablation for docs/accuracy.md, not a product path.

    python -m benchmarks.seeds --trainer benchmarks.label_smoothing --seeds 1 2 3 --out OUT -- FLAGS

The training loss spreads LABEL_SMOOTHING of each labelled token's target over all tags (torch's
`label_smoothing`); evaluation, Viterbi decoding and the export are ner.train's.
"""

from __future__ import annotations

import os
import sys

import torch.nn.functional as F

from ner.training import loop, run

LABEL_SMOOTHING = float(os.environ.get("NER_LABEL_SMOOTHING", "0.1"))


def smoothed_loss_and_logits(model, encoder, inputs: dict, labels):
    """loop.loss_and_logits with the smoothed target."""
    if "attention_mask" in inputs:
        inputs = {**inputs, "attention_mask": loop.attention_mask_as_given(encoder, inputs["attention_mask"])}
    logits = model(**inputs).logits
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=loop.IGNORE_INDEX,
                               reduction="sum", label_smoothing=LABEL_SMOOTHING)
    return loss_sum, logits


def main(argv: list[str] | None = None) -> int:
    run.loss_and_logits = smoothed_loss_and_logits
    from ner import train
    return train.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
