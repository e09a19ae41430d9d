"""Which runtimes compute the logits at inference, declared once: the files of a model folder each reads, the
packages each imports to run them and to write them, the ner.train flags that write its files. Export, retraining,
serving, --runtime auto, the runtime x use matrix test and the install checks all read this table, so a new runtime is
one more row here.

    RUNTIMES                    # ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8")
    missing(runtime, model_dir) # what it lacks here, as the command that fixes it; None: it can run
    export_packages(runtimes)   # what writing their files imports (ner.train --export-runtime, retraining's check)
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ner.extras import install_hint

# The one flag (ner.export, ner.train; TrainConfig.export_int8) that writes every file a runtime reads besides
# torch's: model.onnx, model.int8.onnx and OpenVINO's static model.int8.xml, each past its accuracy gate
FAST_RUNTIMES_FLAG = "--export-int8"
FAST_RUNTIMES_COMMAND = "python -m ner.export {model} {model} " + FAST_RUNTIMES_FLAG + " --calibrate TRAIN_FILE"
# ner.train's flag (TrainConfig.export_runtime) that writes the named runtimes' files only, with their packages only
EXPORT_RUNTIME_FLAG = "--export-runtime"
# torch's TorchScript exporter writes a graph with the onnx package; onnxruntime checks it against PyTorch (and its
# quantization module, part of the same wheel, writes model.int8.onnx)
ONNX_WRITER = ("onnx", "onnxruntime")


@dataclass(frozen=True)
class Runtime:
    """One runtime: what it needs beside the weights, config and tokenizer that every runtime reads."""

    name: str
    files: tuple[str, ...]  # the model folder's files only it reads
    packages: tuple[str, ...]  # what it imports to run, by import name (ner/extras.py says how to install each)
    # what writing its files imports (they are made from model.onnx, checked against PyTorch): what ner.train
    # --export-runtime NAME and a Label Studio server retraining for this runtime require
    export_packages: tuple[str, ...] = ()
    calibrated: bool = False  # its files are calibrated on training text (ner.train's own data)

    @property
    def train_flags(self) -> tuple[str, ...]:
        """The ner.train flags that write its files into OUTPUT_DIR/final, checked against PyTorch (and calibrated on
        the training data where it needs it): Label Studio's retraining passes the served runtime's, so the model it
        swaps in can be run the way the server runs. () where the weights alone do."""
        return (EXPORT_RUNTIME_FLAG, self.name) if self.files else ()


REGISTRY: dict[str, Runtime] = {runtime.name: runtime for runtime in (
    Runtime("torch", (), ("torch",)),
    Runtime("onnx", ("model.onnx",), ("onnxruntime",), ONNX_WRITER),
    Runtime("onnx-int8", ("model.int8.onnx",), ("onnxruntime",), ONNX_WRITER),
    Runtime("openvino", ("model.onnx",), ("openvino",), ONNX_WRITER),
    Runtime("openvino-int8", ("model.int8.xml", "model.int8.bin"), ("openvino",), (*ONNX_WRITER, "openvino", "nncf"),
            calibrated=True),
)}

# The names as constants, for the code and tests that name one runtime; the tables below are read off REGISTRY
TORCH, ONNX, ONNX_INT8, OPENVINO, OPENVINO_INT8 = RUNTIMES = tuple(REGISTRY)
RUNTIME_FILES = {name: runtime.files for name, runtime in REGISTRY.items()}
RUNTIME_PACKAGES = {name: runtime.packages for name, runtime in REGISTRY.items()}
RUNTIME_TRAIN_FLAGS = {name: runtime.train_flags for name, runtime in REGISTRY.items()}
FAST_RUNTIMES = tuple(name for name in RUNTIMES if RUNTIME_FILES[name])  # every runtime that reads files of its own
# The runtimes OpenVINO runs (on the CPU only, without torch): read from the packages each needs
OPENVINO_RUNTIMES = tuple(name for name in RUNTIMES if "openvino" in RUNTIME_PACKAGES[name])
# --runtime's default: the fastest of RUNTIMES for the device that the export's files allow (runtime_choice.py)
AUTO_RUNTIME = "auto"
RUNTIME_CHOICES = (AUTO_RUNTIME, *RUNTIMES)


def export_command(model_dir: Path | str = "MODEL_DIR") -> str:
    """The command that writes every runtime's files into `model_dir` (an export or a checkpoint's), for the errors
    and hints that name it."""
    return FAST_RUNTIMES_COMMAND.format(model=model_dir)


def install_command(runtime: str) -> str:
    """The package `runtime` needs and the command that installs it, for its one-line error."""
    package = RUNTIME_PACKAGES[runtime][0]
    return f"{package}: {install_hint(package)}"


def missing(runtime: str, model_dir: Path, installed=importlib.util.find_spec) -> str | None:
    """What `runtime` lacks to run this export here, as the fix (the install or export command); None: nothing."""
    for package in RUNTIME_PACKAGES[runtime]:
        if installed(package) is None:
            return install_hint(package)
    if any(not (Path(model_dir) / name).is_file() for name in RUNTIME_FILES[runtime]):
        return export_command(model_dir)
    return None


def export_packages(runtimes) -> tuple[str, ...]:
    """What writing the files of `runtimes` imports, each package once."""
    return tuple(dict.fromkeys(package for runtime in runtimes for package in REGISTRY[runtime].export_packages))
