"""One process, nn.DataParallel over every visible GPU.

    CUDA_VISIBLE_DEVICES=0,1 python -m ner.train --data-parallel --train-file train.conll

DataParallel splits each batch along its first dimension across the GPUs, runs a replica on
each, and gathers the outputs on the first GPU. So `--batch-size` / `--max-tokens` are the
*whole* batch here, split N ways, whereas under DDP they are per process (per GPU). The loss
is computed on the gathered logits, so its reduction spans the whole batch as on the other
backends. DDP is faster (no replication each step, no single-GPU gather): prefer it.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.nn.parallel import DataParallel

from ner.backends import LossScaler, RawPrecisionSteps, resolve_precision

log = logging.getLogger(__name__)


class DataParallelBackend(RawPrecisionSteps):
    num_processes = 1
    process_index = 0
    is_main_process = True

    def __init__(self, cfg) -> None:
        gpus = torch.cuda.device_count()
        self.device = torch.device("cuda", 0) if gpus else torch.device("cpu")
        if gpus < 2:
            log.warning("--data-parallel: %d GPU(s) visible, need 2 or more to split batches; "
                        "training on %s", gpus, self.device)
        self.mixed_precision = resolve_precision(cfg.mixed_precision, self.device)
        self.amp = LossScaler(self.device, self.mixed_precision)

    def prepare(self, model, optimizer, train_loader):
        self.amp.optimizer = optimizer
        return DataParallel(model), optimizer, train_loader

    def set_epoch(self, train_loader, epoch: int, skip_batches: int) -> None:
        train_loader.batch_sampler.set_epoch(epoch, skip_batches)

    def backward(self, loss: torch.Tensor) -> None:
        # .mean(): were the loss computed inside the replicas, DataParallel would return one
        # per GPU; ours is already a scalar, so this is a no-op kept for that reason.
        self.amp.backward(loss.mean())

    def no_sync(self, model):
        return contextlib.nullcontext()  # one process: gradients are never all-reduced

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_object(self, obj):
        return [obj]

    def unwrap_model(self, model):
        return model.module if isinstance(model, DataParallel) else model

    def log_metrics(self, values: dict, step: int) -> None:
        pass  # trackers come with Accelerate; metrics.jsonl has the same numbers

    def wait_for_everyone(self) -> None:
        pass
