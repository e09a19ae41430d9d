"""What computes the logits inside the one inference path: PyTorch, or an ONNX export of the same model.

    python -m ner.export runs/ner/final exported --onnx --quantize int8     # writes model.onnx, model.int8.onnx
    python -m ner.predict exported articles.txt --runtime onnx-int8

A runtime is called as `runtime(input_ids, attention_mask) -> logits` on one padded batch; windows,
document context, merging and decoding stay in ner/infer.py, so every runtime tags the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from ner.errors import UserError

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
    """An onnxruntime CPU session over model.onnx or model.int8.onnx; logits come back as a CPU tensor."""

    def __init__(self, path: Path, num_labels: int) -> None:
        self.session = onnx_session(path)
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


def onnx_session(path: Path):
    """An InferenceSession on the CPU cores this process may use; unreadable files are one-line errors."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError('ONNX runtimes need onnxruntime: pip install -e ".[onnx]"') from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    options.log_severity_level = 3  # errors only: graph-optimisation notices are not the user's business
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidProtobuf / RuntimeError types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a readable ONNX model ({reason}); re-export it: {EXPORT_COMMAND}") from None
