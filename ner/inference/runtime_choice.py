"""--runtime auto: the fastest runtime for the device at hand among those the export's files and the installed
packages allow, from one table of measurements keyed by CPU class (docs/performance.md, "Runtimes by CPU class").

    resolve_runtime("auto", model_dir)    # choose()'s pick for this device, said in one log line
    choose(device_class, model_dir)       # the pick and the faster runtimes it could not use, with their fixes
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ner.cpu import this_cpu_class
from ner.inference.runtimes import (
    AUTO_RUNTIME,
    ONNX,
    ONNX_INT8,
    OPENVINO,
    OPENVINO_INT8,
    TORCH,
    missing,
)

log = logging.getLogger("ner")

# The fastest runtime for the device at hand among those the export's files and the installed packages allow, from
# one table of measurements keyed by CPU class (docs/performance.md, "Runtimes by CPU class"). The order is a
# property of the instruction set, measured: on an AVX2-only EPYC per-token int8 in onnxruntime was fastest and
# OpenVINO's static int8 slowest (int8 without VNNI gains little in OpenVINO's kernels); with AVX-512 VNNI the order
# flips; with AMX OpenVINO's bf16 leads. The CPU class is read from the CPU's flags (ner/cpu.py), so the choice is
# the same on every run on one machine. On a GPU torch runs (onnxruntime's CUDA provider has not been measured). An
# explicit --runtime is never second-guessed: only "auto" is resolved.

# The fastest first, each with the figure the place rests on: raw-text tagging of the 14,041 CoNLL-2003 train
# sentences against transformers' pipeline, whole processes (AMX: one forward of 16 x 32 tokens). "reasoned": not
# measured on that class; the reason says which measurement it follows. docs/performance.md has the table.
RUNTIME_ORDER: dict[str, tuple[tuple[str, str], ...]] = {
    "amx": (
        (OPENVINO, "bf16 on AMX, 53,931 tokens/s a forward"),
        (OPENVINO_INT8, "reasoned: OpenVINO runs int8 on AMX too; not measured on AMX"),
        (ONNX_INT8, "28,063 tokens/s a forward"),
        (TORCH, "bf16, 20,943 tokens/s a forward"),
        (ONNX, "reasoned: fp32, no AMX units; not measured on AMX")),
    "avx512-vnni-bf16": (
        (OPENVINO_INT8, "8.54x to 9.05x a pipeline over three runs"),
        (OPENVINO, "bf16, 6.69x a pipeline"),
        (ONNX_INT8, "5.13x a pipeline"),
        (TORCH, "bf16, 4.32x a pipeline"),
        (ONNX, "3.55x a pipeline")),
    "avx512-vnni": (
        (OPENVINO_INT8, "reasoned: AVX-512 VNNI with BF16's 8.54x-9.05x is int8 on VNNI (bf16 gained nothing)"),
        (ONNX_INT8, "reasoned: the 5.13x of AVX-512 VNNI with BF16, int8 on VNNI"),
        (OPENVINO, "reasoned: fp32 without bf16 units, as on AVX2 (2.73x a pipeline)"),
        (ONNX, "reasoned: fp32, as on AVX2 (2.62x a pipeline)"),
        (TORCH, "reasoned: fp32, as on AVX2 (2.24x a pipeline)")),
    "avx2": (
        (ONNX_INT8, "3.53x a pipeline"),
        (OPENVINO, "fp32, 2.73x a pipeline"),
        (ONNX, "2.62x a pipeline"),
        (TORCH, "fp32, 2.24x a pipeline"),
        (OPENVINO_INT8, "1.99x a pipeline: int8 without VNNI gains little in OpenVINO's kernels")),
    "arm": (
        (ONNX_INT8, "reasoned: onnxruntime's integer kernels use Arm's dot-product instructions; AVX2's order"),
        (ONNX, "reasoned: AVX2's order (2.62x a pipeline there)"),
        (TORCH, "reasoned: AVX2's order (2.24x a pipeline there)"),
        (OPENVINO, "reasoned: OpenVINO's Arm plugin is not measured"),
        (OPENVINO_INT8, "reasoned: OpenVINO's Arm plugin is not measured")),
    "gpu": (
        (TORCH, "the GPU budgets of docs/performance.md; onnxruntime's CUDA provider is not measured"),
        (ONNX, "not measured on a GPU"), (ONNX_INT8, "not measured on a GPU"),
        (OPENVINO, "CPU only"), (OPENVINO_INT8, "CPU only")),
}
CPU_CLASS_HELP = {"amx": "AMX (amx_bf16)", "avx512-vnni-bf16": "AVX-512 VNNI and BF16, no AMX",
                  "avx512-vnni": "AVX-512 VNNI without BF16", "avx2": "x86 without VNNI (AVX2-only and older)",
                  "arm": "Arm (aarch64)", "gpu": "a GPU"}


@dataclass(frozen=True)
class Choice:
    """What auto resolved to, on which class and figure, and the faster runtimes it could not use (with the fix)."""

    runtime: str
    device_class: str
    figure: str
    faster: tuple[tuple[str, str, str], ...] = field(default=())  # (runtime, figure, fix)

    def line(self) -> str:
        said = (f"--runtime auto: {self.runtime} ({CPU_CLASS_HELP[self.device_class]}: {self.figure}; the fastest "
                "this export and the installed packages allow, docs/performance.md)")
        if self.faster:
            runtime, figure, fix = self.faster[0]
            said += f"; {runtime} would be faster here ({figure}): {fix}"
        return said


def choose(device_class: str, model_dir: Path, installed=importlib.util.find_spec) -> Choice:
    """The first runtime of the class's order that this export and these packages allow; none: torch (whose
    loading then names what is missing)."""
    faster = []
    for runtime, figure in RUNTIME_ORDER[device_class]:
        fix = missing(runtime, model_dir, installed)
        if fix is None:
            return Choice(runtime, device_class, figure, tuple(faster))
        faster.append((runtime, figure, fix))
    return Choice(TORCH, device_class, dict(RUNTIME_ORDER[device_class])[TORCH], tuple(faster))


def device_class_of(device: str | None) -> str:
    """"gpu" where the runtime would run on an accelerator (the given device, else torch's default), else the CPU's
    class. torch is asked only where it is loaded already or an accelerator's driver is present, so choosing an
    ONNX or OpenVINO runtime on a CPU never imports it."""
    if device is not None:
        return this_cpu_class() if device.split(":")[0] == "cpu" else "gpu"
    # No torch: nothing here runs on a GPU but onnxruntime, whose CUDA is unmeasured; asked before the probe, since
    # importing ner.backends succeeds without torch and only default_device() would fail
    if importlib.util.find_spec(TORCH_MODULE) is None:
        return this_cpu_class()
    if TORCH_MODULE in sys.modules or accelerator_present():
        from ner.backends import default_device

        return this_cpu_class() if default_device().type == "cpu" else "gpu"
    return this_cpu_class()


TORCH_MODULE = "torch"  # the package, asked whether installed or loaded
DEV = Path("/dev")
# NVIDIA's GPU N (a container given GPU 3 may hold /dev/nvidia3 alone; nvidiactl and nvidia-uvm come with the driver
# whether or not a GPU is given), ROCm, WSL's GPU
ACCELERATOR_NODES = ("nvidia[0-9]*", "kfd", "dxg")


def accelerator_present(nodes: tuple[str, ...] = ACCELERATOR_NODES) -> bool:
    """Where torch may find an accelerator: macOS (MPS) or a GPU's device node under /dev."""
    return sys.platform == "darwin" or any(next(DEV.glob(pattern), None) is not None for pattern in nodes)


def resolve_runtime(runtime: str, model_dir: Path, device: str | None = None) -> str:
    """`runtime` itself unless it is "auto"; auto: choose()'s pick for this device, said in one log line."""
    if runtime != AUTO_RUNTIME:
        return runtime
    choice = choose(device_class_of(device), Path(model_dir))
    log.info("%s", choice.line())
    return choice.runtime
