"""OpenVINO as a runtime: the exported ONNX graph, or its statically quantized int8 model, on the CPU.

    python -m ner.export runs/ner/final exported --onnx --quantize int8 --calibrate train.conll
    python -m ner.predict exported articles.txt --runtime openvino        # model.onnx, bf16 where the CPU has it
    python -m ner.predict exported articles.txt --runtime openvino-int8   # model.int8.xml: static int8

OpenVINO fuses the transformer's operators itself (attention, LayerNorm, GELU) and runs bf16 on AVX-512 BF16
and AMX, int8 on VNNI and AMX. The int8 model's activation scales are constants calibrated at export
(ner/inference/openvino_export.py), so a text's numbers never depend on what shares its forward.

As with torch on a CPU (ner/inference/torch_runtime.py), every pass runs on one thread and as many passes run at
once as the process may use threads: one OpenVINO stream of one thread each. A kernel's blocking, and so its
summation order, then never depends on the thread count, and a window's numbers are a function of its
pass's shape alone. Like the ONNX runtimes, this path never imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ner.cpu import has_bf16_units
from ner.errors import UserError
from ner.inference.cpu_threads import runtime_threads
from ner.inference.runtime import Batch, first_line, passes_at_once, warn_runs_on_cpu
from ner.inference.runtimes import ONNX, OPENVINO, TORCH, export_command, install_command


def openvino_precision(requested: str, bf16_units: bool) -> str:
    """bf16 where it was asked for (or auto) and the CPU has bf16 units (ner/cpu.py, which torch's autocast default
    reads too); else "no" (fp32)."""
    return "bf16" if requested in ("auto", "bf16") and bf16_units else "no"


class OpenVinoRuntime:
    """A compiled OpenVINO model on the CPU: one stream of one thread per thread the process may use. A `device`
    other than the CPU is not used, and the log says so (as ONNX does where it lacks the GPU's provider)."""

    device_type = "cpu"  # what runs the passes: picks the default batch budget (options.inference_budget)
    threads_per_forward = 1  # see the module's docstring

    def __init__(self, path: Path, num_labels: int, precision: str = "auto", runtime: str = OPENVINO,
                 device: str | None = None):
        try:
            import openvino
        except ImportError:
            raise UserError(f"OpenVINO runtimes need {install_command(OPENVINO)}") from None
        warn_runs_on_cpu(path, device, "OpenVINO", f"--runtime {runtime} uses the CPU only (--runtime {TORCH}, or "
                         f"{ONNX} where onnxruntime has the device's provider, can use it)")
        core = openvino.Core()
        self.precision = openvino_precision(precision, has_bf16_units())
        # the threads an ONNX session would get: OMP_NUM_THREADS (what ner.serve --workers sets), else torch's
        # count within the container's CPU quota
        self.streams = runtime_threads()
        config = {"INFERENCE_PRECISION_HINT": "bf16" if self.precision == "bf16" else "f32",
                  "NUM_STREAMS": self.streams, "INFERENCE_NUM_THREADS": self.streams,
                  "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}  # no activation scales computed per pass
        try:
            self.compiled = core.compile_model(str(path), "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses of its own
            raise UserError(f"{path}: not a model OpenVINO can read ({first_line(exc)}); re-export it: "
                            f"{export_command()}") from None
        self.input_names = {port.any_name for port in self.compiled.inputs}
        self.num_labels = num_labels
        self._requests = threading.local()  # one infer request per thread that runs passes
        self._pool = None

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self.compiled.create_infer_request()
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        request.infer({k: v for k, v in inputs.items() if k in self.input_names and v is not None})
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)  # a copy: the request reuses it

    def map(self, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
        """(batch, logits) of each batch, in order; one pass per stream at once, each on its own thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="ner-openvino")
        return passes_at_once(self._pool, self.streams, self, batches)
