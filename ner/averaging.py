"""An exponential moving average (EMA) of the weights: the model that validation scores, checkpoints
save as `model/` and the export holds. Training itself goes on updating its own weights.

After optimizer update t the average moves towards the weights by 1 - d_t, with
d_t = min(decay, (1 + t) / (10 + t)): early on, when the weights move fast and the average would
mostly remember the random head, it follows them closely (the warm-up timm and Polyak averaging use).
Every rank keeps its own copy; the ranks' weights are equal after each update, so the copies are too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float, updates: int = 0) -> None:
        """`model` is the bare model (not a DDP or DataParallel wrapper); `updates` so far, on resume."""
        self.decay, self.updates = decay, updates
        self.params = dict(model.named_parameters())
        self.average = {name: p.detach().float().clone() for name, p in self.params.items()}

    def rate(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        weight = 1.0 - self.rate()
        for name, param in self.params.items():
            self.average[name].lerp_(param.detach().float(), weight)

    @torch.no_grad()
    def load_from_model(self) -> None:
        """The model's current weights become the average (resume: a checkpoint's model/ holds it)."""
        for name, param in self.params.items():
            self.average[name].copy_(param.detach())

    @torch.no_grad()
    def apply(self) -> None:
        """Put the average into the model for good (the end of training)."""
        for name, param in self.params.items():
            param.copy_(self.average[name])

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[dict[str, torch.Tensor]]:
        """The average in the model for the block; yields the training weights, which come back after it."""
        training = {name: p.detach().clone() for name, p in self.params.items()}
        self.apply()
        try:
            yield training
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    param.copy_(training[name])


def averaged(average: WeightAverage | None) -> contextlib.AbstractContextManager:
    """The average swapped in, or, without averaging, the model as it is (yields None)."""
    return average.swapped_in() if average is not None else contextlib.nullcontext()
