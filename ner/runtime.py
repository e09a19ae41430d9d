"""What computes the logits inside the one inference path: PyTorch, or an ONNX export of the same model.

    python -m ner.export runs/ner/final exported --onnx --quantize int8     # writes model.onnx, model.int8.onnx
    python -m ner.predict exported articles.txt --runtime onnx-int8

A runtime is called as `runtime(input_ids, attention_mask) -> logits` on one padded batch; windows,
document context, merging and decoding stay in ner/infer.py, so every runtime tags the same way.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from ner.errors import UserError

log = logging.getLogger(__name__)
ONNX_FILES = {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx"}
EXPORT_COMMAND = "python -m ner.export MODEL_DIR OUT --onnx --quantize int8"


class TorchRuntime:
    """The PyTorch model on its device, under the given autocast."""

    def __init__(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> None:
        self.model, self.device, self.autocast = model, device, autocast
        self.num_labels = model.config.num_labels

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)).logits


class OnnxRuntime:
    """An onnxruntime session over model.onnx or model.int8.onnx, on the CUDA provider where the tagger's
    device is a CUDA GPU and onnxruntime has that provider, else on the CPU; logits come back as a CPU tensor."""

    def __init__(self, path: Path, num_labels: int, device: torch.device | None = None) -> None:
        self.session = onnx_session(path, device)
        self.num_labels = num_labels

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feed = {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention_mask.cpu().numpy()}
        return torch.from_numpy(self.session.run(["logits"], feed)[0])


def onnx_path(model_dir: Path, runtime: str) -> Path:
    """The file a runtime reads; missing: a one-line error naming the command that writes it."""
    path = Path(model_dir) / ONNX_FILES[runtime]
    if not path.is_file():
        raise UserError(f"{path}: not found; --runtime {runtime} needs an ONNX export: {EXPORT_COMMAND}")
    return path


# onnxruntime's accelerated providers, by torch device type (dictionary keys: the device comes from the backend)
GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider"}


def onnx_providers(available: list[str], device_type: str) -> list[str]:
    """The GPU provider for `device_type` where onnxruntime has it, then the CPU (onnxruntime's fallback for
    the operators the GPU provider lacks); just the CPU otherwise."""
    gpu = GPU_PROVIDERS.get(device_type)
    return [gpu, "CPUExecutionProvider"] if gpu in available else ["CPUExecutionProvider"]


def onnx_threads(omp_num_threads: str | None, torch_threads: int, cpu_quota: float | None) -> int:
    """Intra-op threads: OMP_NUM_THREADS when set (torch reads it too, so both runtimes use the same count);
    else torch's own count in this process, capped by the container's CPU quota (torch ignores quotas,
    and threads beyond the quota are only throttled)."""
    if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
        return int(omp_num_threads)
    if cpu_quota is not None:
        return max(1, min(torch_threads, math.ceil(cpu_quota)))
    return max(1, torch_threads)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs this container may use per second (cgroup v2 cpu.max, or v1 cfs quota / period); None: no quota."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
        else:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1") or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


def onnx_session(path: Path, device: torch.device | None = None):
    """An InferenceSession on the threads and device of onnx_threads / onnx_providers; unreadable files are
    one-line errors. A GPU asked for that onnxruntime cannot use is said plainly, once, in the log."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError('ONNX runtimes need onnxruntime: pip install -e ".[onnx]"') from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = onnx_threads(os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads(),
                                                cgroup_cpu_quota())
    options.log_severity_level = 3  # errors only: graph-optimisation notices are not the user's business
    device_type = device.type if device is not None else "cpu"
    providers = onnx_providers(onnxruntime.get_available_providers(), device_type)
    if device_type != "cpu" and len(providers) == 1:
        log.warning("%s: onnxruntime has no provider for the %s device here (it has %s); ONNX runs on the CPU "
                    "(onnxruntime-gpu provides CUDAExecutionProvider)", path.name, device_type,
                    ", ".join(onnxruntime.get_available_providers()))
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidProtobuf / RuntimeError types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable ONNX model ({reason}); re-export it: {EXPORT_COMMAND}") from None
