"""What a benchmarked process costs: wall and CPU time, peak RSS, and the CPU time others took meanwhile.

    from bench_measure import run_measured
    run_measured([sys.executable, "-m", "ner.train", ...], Path("logs/ours.log"), cwd=ROOT)

Peak RSS is the kernel's high-water mark of the largest process (wait4); the tree peak polls the
sum over the process and its descendants (multi-process runs). `other_cpu_s` is the machine's
busy CPU time during the run minus the run's own: above a few percent of the machine, timings of
2-thread PyTorch runs are not comparable.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path


def tree_rss(root) -> int:
    """Summed RSS of a psutil.Process and its descendants; processes that exit meanwhile count 0."""
    import psutil

    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakTreeRss:
    """Polls the summed RSS of a process and its descendants (for multi-process runs)."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s, self.peak = pid, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            while not self._stop.is_set():
                self.peak = max(self.peak, tree_rss(root))
                self._stop.wait(self.interval_s)
        except psutil.Error:  # the root process has exited
            return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_measured(argv: list[str], log_path: Path, cwd: Path, env: dict | None = None) -> dict:
    """Run a command offline; wall seconds, exit code, CPU seconds, peak RSS of its largest process, tree peak."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    busy_before = busy_cpu_seconds()
    with open(log_path, "w", encoding="utf-8") as log:
        start_time, start = time.time(), time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        poller = PeakTreeRss(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)  # wait4: the child's own rusage (peak RSS, CPU time)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    tree_peak = poller.stop()
    cpu_s = usage.ru_utime + usage.ru_stime
    result = {"wall_s": wall, "returncode": proc.returncode, "start_time": start_time, "cpu_s": cpu_s,
              "other_cpu_s": max(busy_cpu_seconds() - busy_before - cpu_s, 0.0),
              "peak_rss_bytes": usage.ru_maxrss * 1024, "peak_tree_rss_bytes": max(tree_peak, usage.ru_maxrss * 1024)}
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}); end of {log_path}:\n{tail}")
    return result


def busy_cpu_seconds() -> float:
    """CPU seconds this machine has spent busy (all processes): to see what else ran during a run."""
    import psutil

    times = psutil.cpu_times()
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


def contention(run: dict) -> float:
    """Share of the machine's CPU time (cores x wall) taken by *other* processes during a run."""
    return run.get("other_cpu_s", 0.0) / ((os.cpu_count() or 1) * run["wall_s"]) if run.get("wall_s") else 0.0


def synchronize(device) -> None:
    """Wait for queued accelerator work, so a clock read after it times the work itself."""
    import torch

    if device.type != "cpu":
        torch.accelerator.synchronize()
