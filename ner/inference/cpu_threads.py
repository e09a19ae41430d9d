"""How many CPU threads inference uses: torch's count in this process, and the count an ONNX session or an OpenVINO
model gets (OMP_NUM_THREADS, else torch's count within the container's CPU quota).

    OMP_NUM_THREADS=2 python -m ner.predict exported articles.txt --runtime onnx-int8   # 2 intra-op threads

Reading the count never imports torch: where this process has not imported it, the count torch would choose
(the physical cores) is asked of psutil, so the ONNX and OpenVINO runtimes stay torch-free.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path


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
