"""What computes the logits inside the one inference path: PyTorch, or an ONNX export of the same model.

    python -m ner.export runs/ner/final exported --onnx --quantize int8     # writes model.onnx, model.int8.onnx
    python -m ner.predict exported articles.txt --runtime onnx-int8       # the default, auto, may pick it

A runtime is called as `runtime(input_ids, attention_mask) -> logits` on one padded batch, numpy in
(int64, rows x width) and numpy out (float32, rows x width x labels), and `runtime.map(batches)` runs a
stream of collated batches, in order; windows, document context, merging and decoding stay in
ner/inference/tagger.py, so every runtime tags the same way.

On a CPU, torch runs every forward pass on one thread and several passes at once, one per thread it may use
(`TorchRuntime.map`): a CPU kernel picks its blocking, and so its summation order, by its threads as well as by
the shape (oneDNN's bf16 GEMMs on AMX give other logits for one 128-token window on 1 thread than on 2), so one
thread a pass makes a window's numbers a function of its pass's shape alone: 1 process x 2 threads and
2 processes x 1 thread write the same bytes, in every precision (docs/performance.md). The int8 file
quantizes each activation row by row (ner/inference/onnx_export.py: rows_own_scales), so it batches as fp32 does.

The ONNX runtimes never import torch (nor does the rest of the path they take), so a deployment needs neither
torch nor its start-up.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ner.errors import UserError
from ner.inference.options import FAST_RUNTIMES_COMMAND, ONNX, RUNTIME_FILES, install_command

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
EXPORT_COMMAND = FAST_RUNTIMES_COMMAND.format(model="MODEL_DIR")  # writes every runtime's files


Batch = dict[str, np.ndarray]  # one collated batch (data/encode.collate)


def forward(runtime, batch: Batch) -> np.ndarray:
    return runtime(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))


def passes_at_once(pool, workers: int, runtime, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, logits) of each batch, in input order, with up to `workers` passes running on `pool`
    at once; at most that many run ahead of the caller, so a caller that stops reading (a server's drain) stops
    the passes at the next boundary."""
    running: deque = deque()  # (batch, its pass) in input order
    try:
        for batch in batches:
            running.append((batch, pool.submit(forward, runtime, batch)))
            if len(running) >= workers:
                batch_done, logits = running.popleft()
                yield batch_done, logits.result()
        while running:
            batch_done, logits = running.popleft()
            yield batch_done, logits.result()
    finally:
        for _, logits in running:
            logits.cancel()


def in_order(runtime, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, logits) of each batch, one pass after the other."""
    for batch in batches:
        yield batch, forward(runtime, batch)


class TorchRuntime:
    """The PyTorch model on its device, under the given autocast; float32 logits back on the CPU."""

    def __init__(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> None:
        self.model, self.device, self.autocast = model, device, autocast
        self.num_labels = model.config.num_labels
        self.device_type = device.type  # picks the default batch budget (options.inference_budget)
        self.threads_per_forward = 1 if device.type == "cpu" else None  # see the module's docstring
        self._pool: ThreadPoolExecutor | None = None
        self._pool_workers = 0

    def map(self, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
        """(batch, logits) of each batch, in order. On a CPU, one pass per thread torch may use runs at once,
        each on one thread (passes_at_once)."""
        if self.threads_per_forward is None:
            yield from in_order(self, batches)
            return
        pool, workers = self._workers()
        yield from passes_at_once(pool, workers, self, batches)

    def _workers(self) -> tuple[ThreadPoolExecutor, int]:
        """The pool of one-thread passes, as many as the process's torch threads (process_threads)."""
        import torch

        workers = process_threads()
        if self._pool is None or self._pool_workers != workers:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ner-forward",
                                            initializer=torch.set_num_threads, initargs=(1,))
            self._pool_workers = workers
        return self._pool, workers

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        import torch

        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        with torch.no_grad(), self.autocast():
            logits = self.model(**{k: torch.from_numpy(v).to(self.device) for k, v in inputs.items()
                                   if v is not None}).logits
        return logits.float().cpu().numpy()


class OnnxRuntime:
    """An onnxruntime session over model.onnx or model.int8.onnx, on the CUDA provider where `device_type`
    is "cuda" and onnxruntime has that provider, else on the CPU."""

    def __init__(self, path: Path, num_labels: int, device_type: str = "cpu"):
        self.session = onnx_session(path, device_type)
        self.num_labels = num_labels
        self.device_type = onnx_runs_on(device_type)  # what runs the passes: picks the default batch budget

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> np.ndarray:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.session.run(["logits"], {k: v for k, v in inputs.items() if v is not None})[0]

    def map(self, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
        """(batch, logits) of each batch, in order: onnxruntime threads each pass itself."""
        return in_order(self, batches)


def export_command(runtime: str) -> str:
    """The command that writes the file `runtime` reads: the one that writes every runtime's files."""
    return EXPORT_COMMAND


def runtime_path(model_dir: Path, runtime: str) -> Path:
    """The file an ONNX or OpenVINO runtime reads; missing: a one-line error naming the command that writes it."""
    path = Path(model_dir) / RUNTIME_FILES[runtime][0]
    if not path.is_file():
        raise UserError(f"{path}: not found; --runtime {runtime} needs an export: {export_command(runtime)}")
    return path


def onnx_device_type(device: str | None) -> str:
    """The device type an ONNX runtime asks for: the given one (its type: "xpu:1" -> "xpu"), else the first
    of GPU_PROVIDERS that onnxruntime has (where torch's default device would be a GPU too), else "cpu"."""
    if device:
        return device.split(":")[0]
    try:
        import onnxruntime
    except ImportError:
        return "cpu"  # onnx_session says what to install
    available = onnxruntime.get_available_providers()
    return next((kind for kind, provider in GPU_PROVIDERS.items() if provider in available), "cpu")


def warn_runs_on_cpu(path: Path, device: str | None, runtime: str, why: str) -> None:
    """The one line a runtime logs when it was asked for a device it will not use: it runs on the CPU instead, and
    `why` (ONNX: no provider for the device; OpenVINO: CPU only). Nothing when no device or the CPU was asked for."""
    if device and device.split(":")[0] != "cpu":
        log.warning("%s: %s runs on the CPU, not on %s: %s", path.name, runtime, device, why)


# onnxruntime's accelerated providers, by torch device type (dictionary keys: the device comes from the backend)
GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider"}


def onnx_runs_on(device_type: str) -> str:
    """The device type an ONNX session asked for `device_type` runs its passes on: the CPU where onnxruntime
    lacks the GPU provider."""
    try:
        import onnxruntime
    except ImportError:
        return "cpu"  # onnx_session says what to install
    return device_type if GPU_PROVIDERS.get(device_type) in onnxruntime.get_available_providers() else "cpu"


def onnx_providers(available: list[str], device_type: str) -> list[str]:
    """The GPU provider for `device_type` where onnxruntime has it, then the CPU (onnxruntime's fallback for
    the operators the GPU provider lacks); just the CPU otherwise."""
    gpu = GPU_PROVIDERS.get(device_type)
    return [gpu, "CPUExecutionProvider"] if gpu in available else ["CPUExecutionProvider"]


def onnx_threads(omp_num_threads: str | None, torch_threads: int, cpu_quota: float | None) -> int:
    """Intra-op threads: OMP_NUM_THREADS when set (torch reads it too, so both runtimes use the same count);
    else torch's own count (default_threads), capped by the container's CPU quota (torch ignores quotas,
    and threads beyond the quota are only throttled)."""
    if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
        return int(omp_num_threads)
    if cpu_quota is not None:
        return max(1, min(torch_threads, math.ceil(cpu_quota)))
    return max(1, torch_threads)


def runtime_threads() -> int:
    """The threads an ONNX session gets in this process, and the streams of an OpenVINO model (onnx_threads of the
    environment, torch's count and the CPU quota as they are now)."""
    return onnx_threads(os.environ.get("OMP_NUM_THREADS"), default_threads(), cgroup_cpu_quota())


def first_line(exc: Exception) -> str:
    """A runtime's error in one line: its first, or its type where it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


_process_threads: int | None = None  # process_threads' last reading on the main thread


def process_threads() -> int:
    """The threads this process's torch may use (OMP_NUM_THREADS, the cores, or what training set per
    process), as the main thread reads them. Another thread reads what the main thread last read: a thread
    started after a pass pool's initializer ran gets 1 from torch (torch.set_num_threads also sets the
    count new threads start with)."""
    global _process_threads
    torch = sys.modules["torch"]
    if threading.current_thread() is threading.main_thread() or _process_threads is None:
        _process_threads = torch.get_num_threads()
    return _process_threads


def default_threads() -> int:
    """torch's intra-op thread count: asked of torch where this process has imported it, else the count
    torch would choose (the physical cores), so that an ONNX runtime need not import torch to learn it."""
    if "torch" in sys.modules:
        return process_threads()
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


CPU_DISABLED_FUSIONS = ("SkipLayerNormFusion",)  # graph optimizers a CPU session runs without (onnx_session)


def onnx_session(path: Path, device_type: str = "cpu"):
    """An InferenceSession on the threads and device of onnx_threads / onnx_providers; unreadable files are
    one-line errors. A GPU asked for that onnxruntime cannot use is said plainly, once, in the log."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"ONNX runtimes need {install_command(ONNX)}") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = runtime_threads()
    options.log_severity_level = 3  # errors only: graph-optimisation notices are not the user's business
    # Idle intra-op threads sleep instead of spinning: with other processes on the cores, spinning threads took the
    # CPU that the pass and the caller's Python needed (int8 passes 2.4-3.4x faster without it on a loaded 2-core
    # EPYC; docs/performance.md, "Where inference time goes"). The numbers do not change: only how threads wait.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = onnx_providers(onnxruntime.get_available_providers(), device_type)
    if len(providers) == 1:
        warn_runs_on_cpu(path, device_type, "ONNX", f"onnxruntime has no provider for it here (it has "
                         f"{', '.join(onnxruntime.get_available_providers())}; onnxruntime-gpu provides "
                         f"CUDAExecutionProvider)")
    # On the CPU, Add + LayerNormalization stay two operators: onnxruntime's fused SkipLayerNormalization kernel took
    # 0.26 s where the two took 0.06 s in the int8 graph (a 1.24x faster int8 pass, the same argmax as fp32 on 99.6% of
    # tokens either way; docs/performance.md). The fp32 graph has no such fusion left to lose.
    disabled = list(CPU_DISABLED_FUSIONS) if providers == ["CPUExecutionProvider"] else None
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidProtobuf / RuntimeError types
        raise UserError(f"{path}: not a readable ONNX model ({first_line(exc)}); re-export it: "
                        f"{EXPORT_COMMAND}") from None
