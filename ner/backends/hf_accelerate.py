"""Accelerate: device placement, DDP wrapping, sampler sharding and autocast in `prepare`.

    accelerate launch ner/train.py --train-file train.conll
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml ner/train.py --train-file train.conll
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, gather_object, is_tensorboard_available

from ner.backends import resolve_precision
from ner.errors import UserError


class AccelerateBackend:
    def __init__(self, cfg) -> None:
        precision = cfg.mixed_precision
        if precision == "auto":  # a launch config asking for bf16/fp16 wins, else what the device supports
            from_config = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
            precision = from_config if from_config in ("bf16", "fp16") else "auto"
        if precision == "auto":
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            precision = resolve_precision("auto", device)
        tracker = None if cfg.report_to == "none" else cfg.report_to
        if tracker == "tensorboard" and not is_tensorboard_available():
            raise UserError("--report-to tensorboard: tensorboard is not installed (pip install tensorboard), "
                            "or drop the flag: metrics.jsonl has the same numbers")
        try:
            # cpu=True on machines without an accelerator: Accelerate only treats a multi-process
            # launch as MULTI_CPU (gloo) when told the job is CPU-only.
            self.accelerator = Accelerator(
                cpu=not torch.accelerator.is_available(),
                mixed_precision=precision,
                log_with=tracker,
                project_dir=cfg.output_dir,
                kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.dist_timeout))])
        except ValueError as exc:
            raise UserError(f"--mixed-precision {precision}: {exc}") from None
        self.device = self.accelerator.device
        self.num_processes = self.accelerator.num_processes
        self.process_index = self.accelerator.process_index
        self.mixed_precision = self.accelerator.mixed_precision
        self._batch_sampler = None
        self._tracking = tracker is not None
        self._config = cfg.to_dict()

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def prepare(self, model, optimizer, train_loader):
        # The scheduler is deliberately not prepared: a prepared scheduler steps once per
        # process per update, which would make its schedule differ from raw DDP's.
        self._batch_sampler = train_loader.batch_sampler
        return self.accelerator.prepare(model, optimizer, train_loader)

    def set_epoch(self, train_loader, epoch: int, skip_batches: int) -> None:
        # Our sampler is a pure function of (seed, epoch); Accelerate's BatchSamplerShard then
        # hands batch i to rank i % world, so skipping resumes mid-epoch on the exact batch.
        train_loader.set_epoch(epoch)
        self._batch_sampler.set_epoch(epoch, skip_batches * self.num_processes)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def no_sync(self, model):
        return self.accelerator.no_sync(model)

    def autocast(self):
        return self.accelerator.autocast()

    def clip_grad_norm_(self, parameters, max_norm: float):
        return self.accelerator.clip_grad_norm_(parameters, max_norm)  # unscales first under fp16

    def step(self, optimizer) -> bool:
        optimizer.step()  # the prepared optimizer runs Accelerate's own GradScaler under fp16 on GPUs
        return not optimizer.step_was_skipped

    @property
    def grad_scaler(self):
        return self.accelerator.scaler  # None unless fp16 on an accelerator

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum")

    def gather_object(self, obj):
        return gather_object([obj]) if self.num_processes > 1 else [obj]

    def unwrap_model(self, model):
        return self.accelerator.unwrap_model(model)

    def wait_for_everyone(self) -> None:
        self.accelerator.wait_for_everyone()

    def log_metrics(self, values: dict, step: int) -> None:
        if self._tracking:
            if not self.accelerator.trackers:  # after the output folder exists and holds no other run
                config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in self._config.items()}
                self.accelerator.init_trackers("tensorboard", config=config)
            self.accelerator.log(values, step=step)

    def end(self) -> None:
        self.accelerator.end_training()
