"""What a benchmarked run costs: process time and memory, FLOPs and MFU of its training loop (a library).

    from benchmarks.measure import run_measured, summarise_loop, updates_from_records
    run_measured([sys.executable, "-m", "ner.train", ...], Path("logs/ours.log"), cwd=ROOT)
    step_times, steps = updates_from_records(records)   # metrics.jsonl, --logging-steps 1
    loop = summarise_loop(steps, step_times, model_shape(model_dir, num_labels), peak_flops_per_s)

Processes: peak RSS is the kernel's high-water mark of the largest process (wait4); the tree peak polls
the sum over the process and its descendants (multi-process runs). `other_cpu_s` is the machine's busy
CPU time during the run minus the run's own: above a few percent of the machine, timings of 2-thread
PyTorch runs are not comparable.

FLOPs: an update is the list of its micro-batches (every rank's), each `[rows, padded width, real
tokens]`: what the project's metrics.jsonl logs as `batch_shapes`, and what the baseline records the
same way. Model FLOPs of a row of width S: 6 x P x S + 12 x layers x hidden x S^2 (P: parameters in
matmuls; embeddings excluded, they are lookups). "Computed" FLOPs use each batch's rows and padded
width; "real" FLOPs use its real tokens, the attention term at the batch's mean real length per row
(per-row lengths are not logged; attention is a few percent of the total at CoNLL widths, so this moves
MFU (real) by about a percent at most). MFU is measured against the matmul peak (measure_peak_flops).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

Shape = list[int]  # [rows, padded width, real tokens] of one micro-batch


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


def matmul_params(hidden: int, layers: int, intermediate: int, num_labels: int) -> int:
    """Weights that take part in matmuls per token: Q, K, V, O, the two FFN ones, and the head."""
    return layers * (4 * hidden * hidden + 2 * hidden * intermediate) + hidden * num_labels


def model_shape(model_dir: str | Path, num_labels: int) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    return {"hidden": hidden, "layers": layers,
            "matmul_params": matmul_params(hidden, layers, config["intermediate_size"], num_labels)}


def train_flops(widths: list[float], rows: list[int], params: int, layers: int, hidden: int) -> float:
    """Forward + backward FLOPs of batches of rows x width tokens: 6PT plus attention 12 L d S^2 per row."""
    return float(sum(r * (6 * params * w + 12 * layers * hidden * w * w) for w, r in zip(widths, rows, strict=True)))


def computed_flops(shapes: list[Shape], model: dict) -> float:
    """FLOPs of the padded batches as run."""
    return train_flops([w for _, w, _ in shapes], [r for r, _, _ in shapes], model["matmul_params"],
                       model["layers"], model["hidden"])


def real_flops(shapes: list[Shape], model: dict) -> float:
    """FLOPs of the real tokens alone, rows at their batch's mean real length."""
    return train_flops([real / rows for rows, _, real in shapes], [r for r, _, _ in shapes], model["matmul_params"],
                       model["layers"], model["hidden"])


def padding_efficiency(real_tokens: int, computed_tokens: int) -> float:
    return real_tokens / computed_tokens if computed_tokens else 0.0


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    return flops / seconds / peak_flops_per_s if seconds > 0 and peak_flops_per_s > 0 else 0.0


def loop_window(step_times: list[float]) -> tuple[int, int, float]:
    """(first, last) update index (0-based, inclusive) and seconds of the timed loop: updates 2..N."""
    if len(step_times) < 2:
        return 0, len(step_times) - 1, 0.0
    return 1, len(step_times) - 1, step_times[-1] - step_times[0]


def updates_from_records(records: list[dict]) -> tuple[list[float], list[list[Shape]]]:
    """(end time, micro-batch shapes) of every update, from metrics.jsonl records of a --logging-steps 1 run."""
    logged = [r for r in records if "loss" in r]
    steps = [r["step"] for r in logged]
    if steps != list(range(1, len(steps) + 1)):
        raise ValueError(f"expected one logging record per update from step 1 (--logging-steps 1), got steps "
                         f"{steps[:5]}...")
    return [r["time"] for r in logged], [r["batch_shapes"] for r in logged]


def summarise_loop(steps: list[list[Shape]], step_times: list[float], model: dict, peak: float) -> dict:
    """Tokens and padding of the epoch; rates, FLOPs and MFU of the timed updates (2..N)."""
    first, last, seconds = loop_window(step_times)
    timed = [shape for step in steps[first:last + 1] for shape in step]
    every = [shape for step in steps for shape in step]
    real_epoch, computed_epoch = sum(s[2] for s in every), sum(s[0] * s[1] for s in every)
    flops_computed = computed_flops(timed, model)
    return {
        "steps": len(steps), "timed_steps": max(last - first + 1, 0), "loop_s": seconds,
        "real_tokens_epoch": real_epoch, "computed_tokens_epoch": computed_epoch,
        "padding_efficiency": padding_efficiency(real_epoch, computed_epoch),
        "loop_real_tokens_per_s": sum(s[2] for s in timed) / seconds if seconds else 0.0,
        "loop_computed_tokens_per_s": sum(s[0] * s[1] for s in timed) / seconds if seconds else 0.0,
        "mfu_computed": mfu(flops_computed, seconds, peak), "mfu_real": mfu(real_flops(timed, model), seconds, peak),
        "model_tflops_per_s": flops_computed / seconds / 1e12 if seconds else 0.0,
    }


def measure_peak_flops(device, threads: int, size: int = 4096, reps: int = 3) -> dict:
    """Matmul FLOP/s in fp32 and bf16: `<dtype>_flops_per_s` is the peak MFU is measured against.

    On CPU that peak is one core's rate, timed in thread CPU time (so other jobs sharing the
    machine do not lower it), times `threads`; the wall-clock rate with `threads` is kept beside it.
    """
    import torch

    from ner.backends import cpu_supports_bf16

    result = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if name == "bf16" and device.type == "cpu" and not cpu_supports_bf16():
            continue  # emulated: a 4096^3 product took minutes (AVX2-only EPYC), and auto runs nothing in bf16 there
        wall = best_matmul_time(device, dtype, size, reps, time.perf_counter)
        result[f"{name}_wall_flops_per_s"] = 2 * size ** 3 / wall
        if device.type == "cpu":
            previous = torch.get_num_threads()
            torch.set_num_threads(1)
            per_core = 2 * (size // 2) ** 3 / best_matmul_time(device, dtype, size // 2, reps, time.thread_time)
            torch.set_num_threads(previous)
            result[f"{name}_flops_per_s"] = per_core * threads
        else:
            result[f"{name}_flops_per_s"] = result[f"{name}_wall_flops_per_s"]
    return result


def best_matmul_time(device, dtype, size: int, reps: int, clock) -> float:
    """Best of `reps` timings of one size^3 matmul by `clock`, after one warm-up."""
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for rep in range(reps + 1):
        synchronize(device)
        start = clock()
        torch.mm(a, b)
        synchronize(device)
        if rep:
            best = min(best, clock() - start)
    return best


def inference_flops(lengths: list[int], model: dict) -> float:
    """Forward FLOPs of rows of the given real lengths: 2 x P x S + 4 x layers x hidden x S^2 a row (a third
    of train_flops: no backward)."""
    return sum(2 * model["matmul_params"] * n + 4 * model["layers"] * model["hidden"] * n * n for n in lengths)


def int8_session(size: int, threads: int):
    """An onnxruntime session of one uint8 x int8 MatMulIntegerToFloat of size^3."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).integers(-127, 128, (size, size), dtype=np.int8), "b")
    scalars = [numpy_helper.from_array(np.array(v, dtype=t), n)
               for n, v, t in (("a_scale", 1.0, np.float32), ("b_scale", 1.0, np.float32), ("a_zero", 128, np.uint8))]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "a_scale", "b_scale", "a_zero"], ["y"],
                            domain="com.microsoft")
    graph = helper.make_graph([node], "peak", [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
                              [weight, *scalars])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return onnx_session_of(helper.make_model(graph, opset_imports=opsets), threads)


def matmul_graph(size: int, int8: bool):
    """An ONNX graph of one size^3 product: fp32 MatMul, or int8 (uint8 activations quantized in the graph, int8
    weights; QDQ, which OpenVINO runs as an integer matmul and onnxruntime as QLinearMatMul)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])]
    if not int8:
        weight = numpy_helper.from_array(rng.standard_normal((size, size), dtype=np.float32), "b")
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "peak", inputs, outputs, [weight])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    constants = [numpy_helper.from_array(rng.integers(-127, 128, (size, size), dtype=np.int8), "bq"),
                 numpy_helper.from_array(np.array(0.01, dtype=np.float32), "s"),
                 numpy_helper.from_array(np.array(128, dtype=np.uint8), "za"),
                 numpy_helper.from_array(np.array(0, dtype=np.int8), "zb")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "za"], ["ad"]),
             helper.make_node("DequantizeLinear", ["bq", "s", "zb"], ["bd"]),
             helper.make_node("MatMul", ["ad", "bd"], ["y"])]
    graph = helper.make_graph(nodes, "peak", inputs, outputs, constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def runtime_matmul_peak(runtime: str, precision: str, threads: int, size: int = 2048, reps: int = 3) -> float:
    """FLOP/s (op/s for int8) of one size^3 product in `runtime` ("onnxruntime" | "openvino") and `precision`
    ("fp32" | "bf16" | "int8"), run on one thread and timed in process CPU time (so other jobs sharing the machine
    do not lower it), times `threads`: the peak a runtime's passes (one thread each, or `threads` per pass) can
    reach. Best of `reps` after a warm-up. int8 in onnxruntime is MatMulIntegerToFloat, what the per-token int8
    graph runs."""
    import numpy as np

    a = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    if runtime == "openvino":
        import openvino

        hint = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}[precision]
        compiled = openvino.Core().compile_model(openvino.Core().read_model(matmul_graph(size, precision == "int8")
                                                                            .SerializeToString(), b""), "CPU",
                                                 {"INFERENCE_PRECISION_HINT": hint, "NUM_STREAMS": 1,
                                                  "INFERENCE_NUM_THREADS": 1})
        request = compiled.create_infer_request()
        run = lambda: request.infer({0: a})  # noqa: E731
    else:
        session = int8_session(size, 1) if precision == "int8" else onnx_session_of(matmul_graph(size, False), 1)
        feed = {"a": np.random.default_rng(1).integers(0, 256, (size, size), dtype=np.uint8)} if precision == "int8" \
            else {"a": a}
        run = lambda: session.run(["y"], feed)  # noqa: E731
    best = float("inf")
    for rep in range(reps + 1):
        start = time.process_time()
        run()
        if rep:
            best = min(best, time.process_time() - start)
    return 2 * size ** 3 / best * threads


def onnx_session_of(model, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def peak_for(peaks: dict, precision: str) -> float:
    """The peak of a run's precision; nan for bf16 on a CPU without bf16 units (not measured: emulated)."""
    return peaks.get("bf16_flops_per_s", float("nan")) if precision == "bf16" else peaks["fp32_flops_per_s"]


def cpu_description() -> str:
    """The CPU's model and the vector units the defaults depend on, to print beside every figure."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    units = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if name in flags]
    amx = "" if "amx_bf16" in flags else ", no AMX"
    return f"{model}, {os.cpu_count()} cores ({' '.join(units) or 'no avx2'}{amx})"
