"""onnxruntime as a runtime: an ONNX export of the model (model.onnx, or model.int8.onnx), on the CPU or on a GPU
where onnxruntime has its provider.

    python -m ner.export runs/ner/final exported --onnx --quantize int8     # writes model.onnx, model.int8.onnx
    python -m ner.predict exported articles.txt --runtime onnx-int8       # the default, auto, may pick it

The int8 file quantizes each activation row by row (ner/inference/onnx_export.py: rows_own_scales), so it batches
as fp32 does. onnxruntime threads each pass itself, on the threads of ner/inference/cpu_threads.py.

This path never imports torch, so a deployment needs neither torch nor its start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ner.errors import UserError
from ner.inference.cpu_threads import runtime_threads
from ner.inference.runtime import Batch, first_line, in_order, warn_runs_on_cpu
from ner.inference.runtimes import ONNX, export_command, install_command

CPU_PROVIDER = "CPUExecutionProvider"
# onnxruntime's accelerated providers, by torch device type (dictionary keys: the device comes from the backend)
GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider"}
CPU_DISABLED_FUSIONS = ("SkipLayerNormFusion",)  # graph optimizers a CPU session runs without (onnx_session)


class OnnxRuntime:
    """An onnxruntime session over model.onnx or model.int8.onnx, on the device onnx_providers picks for `device`."""

    def __init__(self, path: Path, num_labels: int, device: str | None = None):
        self.session = onnx_session(path, device)
        self.num_labels = num_labels
        # what runs the passes: picks the default batch budget (options.inference_budget)
        self.device_type = runs_on(self.session.get_providers())

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.session.run(["logits"], {k: v for k, v in inputs.items() if v is not None})[0]

    def map(self, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
        """(batch, logits) of each batch, in order: onnxruntime threads each pass itself."""
        return in_order(self, batches)


def onnx_providers(device: str | None, available: list[str]) -> list[str]:
    """The providers of an ONNX session, the one place that decides which device ONNX runs on: the GPU provider of
    the device asked for (its type: "cuda:1" -> "cuda"; none asked: the first of GPU_PROVIDERS, where torch's default
    device would be a GPU too) where onnxruntime has it, then the CPU (onnxruntime's fallback for the operators the
    GPU provider lacks); the CPU alone otherwise."""
    kinds = [device.split(":")[0]] if device else list(GPU_PROVIDERS)
    gpu = next((GPU_PROVIDERS[kind] for kind in kinds if GPU_PROVIDERS.get(kind) in available), None)
    return [gpu, CPU_PROVIDER] if gpu else [CPU_PROVIDER]


def provider_options(device: str | None, providers: list[str]) -> list[dict[str, str]]:
    """Each provider's options: the GPU's index ("cuda:1" -> device_id 1, as torch numbers them; a corpus process
    runs on its own GPU), else onnxruntime's defaults (GPU 0)."""
    index = device.split(":")[1] if device and ":" in device else None
    return [{"device_id": index} if index is not None and provider != CPU_PROVIDER else {} for provider in providers]


def runs_on(providers: list[str]) -> str:
    """The device type a session's passes run on, read from its providers (the first runs them)."""
    return next((kind for kind, provider in GPU_PROVIDERS.items() if provider == providers[0]), "cpu")


def onnx_session(path: Path, device: str | None = "cpu"):
    """An InferenceSession on the threads of runtime_threads and the providers of onnx_providers; unreadable files
    are one-line errors. A GPU asked for that onnxruntime cannot use is said plainly, once, in the log."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"ONNX runtimes need {install_command(ONNX)}") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = runtime_threads()
    options.log_severity_level = 3  # errors only: graph-optimisation notices are not the user's business
    # Idle intra-op threads sleep instead of spinning: with other processes on the cores, spinning threads took the
    # CPU that the pass and the caller's Python needed (measured in docs/performance.md, "Where inference time goes").
    # The numbers do not change: only how threads wait.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    available = onnxruntime.get_available_providers()
    providers = onnx_providers(device, available)
    if providers == [CPU_PROVIDER]:
        warn_runs_on_cpu(path, device, "ONNX", f"onnxruntime has no provider for it here (it has "
                         f"{', '.join(available)}; onnxruntime-gpu provides CUDAExecutionProvider)")
    # On the CPU, Add + LayerNormalization stay two operators: onnxruntime's fused SkipLayerNormalization kernel was
    # slower than the two in the int8 graph, with the same argmax either way (docs/performance.md, "Where inference
    # time goes"). The fp32 graph has no such fusion left to lose.
    disabled = list(CPU_DISABLED_FUSIONS) if providers == [CPU_PROVIDER] else None
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=providers,
                                            provider_options=provider_options(device, providers),
                                            disabled_optimizers=disabled)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidProtobuf / RuntimeError types
        raise UserError(f"{path}: not a readable ONNX model ({first_line(exc)}); re-export it: "
                        f"{export_command()}") from None
