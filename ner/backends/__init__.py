"""The backend seam: everything that differs between Accelerate, raw DDP and DataParallel.

The loop (ner/training/loop.py) calls only these methods, named as Accelerate names them, so the
Accelerate path reads like Accelerate's own examples and the raw paths show what it does.
Only modules in this package import accelerate, torch.distributed, torch.nn.parallel or
torch.multiprocessing (tests/test_layout.py enforces it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ner.cpu import has_bf16_units

# torch is imported inside the functions: this package is imported by modules that need no torch
# (ner.evaluate reaches backends/trackers.py through training/config.py), and importing torch takes seconds.
if TYPE_CHECKING:
    import torch


# The training backends by the name --backend takes (the first is the default), and the autocast precisions a
# backend runs in once `auto` is resolved: declared once, read by the config, the command line and the tests.
ACCELERATE, RAW_DDP, DATA_PARALLEL = BACKENDS = ("accelerate", "raw-ddp", "data-parallel")
NO_MIXED_PRECISION, BF16, FP16 = MIXED_PRECISIONS = ("no", "bf16", "fp16")


class Backend(Protocol):
    device: torch.device
    num_processes: int
    process_index: int
    mixed_precision: str  # one of MIXED_PRECISIONS, resolved

    @property
    def is_main_process(self) -> bool: ...

    def prepare(self, model, optimizer, train_loader) -> tuple[Any, Any, Iterable]: ...

    def set_epoch(self, train_loader, epoch: int, skip_batches: int) -> None: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def no_sync(self, model) -> ContextManager: ...

    def autocast(self) -> ContextManager: ...

    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor: ...

    def step(self, optimizer) -> bool: ...

    @property
    def grad_scaler(self) -> torch.amp.GradScaler | None: ...

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def gather_object(self, obj: Any) -> list: ...

    def unwrap_model(self, model) -> torch.nn.Module: ...

    def log_metrics(self, values: dict, step: int) -> None: ...

    def wait_for_everyone(self) -> None: ...


def cpu_supports_bf16() -> bool:
    """Native bf16 (AVX512-BF16 or AMX) makes autocast faster; without it bf16 is emulated and slow (ner/cpu.py
    reads the flags)."""
    return has_bf16_units()


def default_device() -> torch.device:
    """The first accelerator when there is one (inference needs no process group)."""
    import torch

    return torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")


def resolve_precision(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    import torch

    if device.type == "cuda":
        return BF16 if torch.cuda.is_bf16_supported() else NO_MIXED_PRECISION
    return BF16 if device.type == "cpu" and cpu_supports_bf16() else NO_MIXED_PRECISION


def autocast_for(device: torch.device, precision: str) -> ContextManager:
    if precision == NO_MIXED_PRECISION:
        return contextlib.nullcontext()
    import torch

    dtype = torch.bfloat16 if precision == BF16 else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


class LossScaler:
    """The gradient-scaler step of the classic AMP recipe, for the plain-torch backends.

    fp16 has 5 exponent bits: small gradients underflow to zero. So the loss is multiplied by
    a large scale before backward, gradients are divided by it again before clipping, and an
    update whose gradients overflowed (inf/nan) is skipped while the scale halves. Accelerate
    does the same inside `accelerator.backward` / its prepared optimizer, so it does not use this.
    """

    def __init__(self, device: torch.device, precision: str) -> None:
        import torch

        self.scaler = torch.amp.GradScaler(device.type) if precision == FP16 else None
        self.optimizer: torch.optim.Optimizer | None = None  # set by the backend's prepare()

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        import torch

        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step unless the gradients overflowed; True if the weights were updated."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = scale_on_device(self.scaler)
        self.scaler.step(optimizer)  # skips optimizer.step() when a gradient is inf or nan
        self.scaler.update()  # halves the scale after an overflow, doubles it after 2000 clean steps
        return scale_held(self.scaler, scale)


def scale_on_device(scaler) -> torch.Tensor | float:
    """The loss scale before a step, copied where it lives: GradScaler.get_scale() reads it to the host (.item()),
    and a host read waits for the whole backward pass on a GPU. update() changes the scale in place, hence the copy."""
    scale = device_scale(scaler)
    return scale.clone() if scale is not None else scaler.get_scale()


def scale_held(scaler, before: torch.Tensor | float) -> bool:
    """True when the scale did not fall over the step (an overflow halves it and skips the step): the one host read
    of the update, which the schedule needs now, since it must not advance on a skipped step."""
    scale = device_scale(scaler)
    return bool(scale >= before) if scale is not None else scaler.get_scale() >= before


def device_scale(scaler) -> torch.Tensor | None:
    """GradScaler's scale tensor, on its device; None before its first scale(). Private (`_scale`): torch's public
    get_scale() is a host read (.item()), and no public accessor returns the tensor. scaler.step() tells nothing
    either: a fused optimizer skips inside its own step, so both return None. tests/test_private_apis.py fails by
    name when torch renames or changes it."""
    return scaler._scale


def before_any_process_group() -> None:
    """Import torch.distributed.nn now, before a process group exists. Its functions take `group=group.WORLD` as a
    default argument, evaluated at import: imported after init_process_group (transformers' from_pretrained does),
    they keep the group alive past destroy_process_group, and gloo's threads can then free a tensor while Python
    shuts down ('terminate called without an active exception', SIGABRT, after the work is done). Called where
    each backend starts: launch(), inference_backend(), and the definition of a plain-torch backend class (a
    worker that raw_ddp spawns starts from its module, not from launch())."""
    import torch.distributed.nn  # noqa: F401


def launch(cfg, worker: Callable[[Backend], None], local_rank_arg: int | None = None) -> None:
    """Build the backend the config asks for and run `worker(backend)` in each process."""
    before_any_process_group()
    if cfg.backend == ACCELERATE:
        from ner.backends.hf_accelerate import AccelerateBackend

        backend = AccelerateBackend(cfg)
        try:
            worker(backend)
        finally:
            backend.end()
    elif cfg.backend == RAW_DDP:
        from ner.backends import raw_ddp

        raw_ddp.launch(cfg, worker, local_rank_arg)
    else:
        from ner.backends.data_parallel import DataParallelBackend

        worker(DataParallelBackend(cfg))


class RawPrecisionSteps:
    """The autocast and loss-scaler steps both plain-torch backends take the same way.

    Needs `self.device`, `self.mixed_precision` and `self.amp` (a LossScaler).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        before_any_process_group()  # raw_ddp defines one at import, before any of its groups can exist

    def autocast(self) -> ContextManager:
        return autocast_for(self.device, self.mixed_precision)

    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor:
        return self.amp.clip_grad_norm_(parameters, max_norm)

    def step(self, optimizer) -> bool:
        return self.amp.step(optimizer)

    @property
    def grad_scaler(self):
        return self.amp.scaler


class SingleProcess:
    """The inference backend without a launcher: one process, nothing to meet, and no torch (an ONNX or OpenVINO
    runtime needs none). `device` None: the runtime's own default (the first accelerator, or the CPU)."""

    process_index, local_rank, num_processes, is_main_process, device = 0, 0, 1, True, None

    def wait_for_everyone(self) -> None:
        pass

    def gather_object(self, obj: Any) -> list:
        return [obj]

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def end(self) -> None:
        pass


def inference_backend(timeout_s: float):
    """One process per model copy, as the launcher started them (torchrun, or accelerate launch, which sets
    the same RANK / WORLD_SIZE / LOCAL_RANK): a process group (nccl on GPUs, gloo on CPUs) and this process's
    device; a single process when nothing launched it. Has the Backend's process_index, num_processes, device,
    is_main_process, wait_for_everyone, gather_object, reduce_sum, plus end(). The one home of the rule that
    WORLD_SIZE unset or 1 is one process."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return SingleProcess()
    before_any_process_group()
    from ner.backends.raw_ddp import InferenceGroup

    return InferenceGroup(timeout_s)
