"""The optional packages ner imports only where a run asks for them, and the command that installs each: the one
table the one-line errors and hints that name a missing package read (a shared leaf: data readers, runtimes,
training's flags and the commands alike).

    pip install -e ".[onnx]"        # --runtime onnx|onnx-int8, ner.export --onnx, ner.train --export-runtime onnx-int8
    pip install -e ".[openvino]"    # --runtime openvino|openvino-int8, --export-int8, --calibrate
    pip install -e ".[serve]"       # ner.serve
"""

from __future__ import annotations

import importlib.util

from ner.errors import UserError

# pyproject.toml's extras (which pin the tested versions) -> the packages each brings, by the names code imports
EXTRA_PACKAGES = {
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "onnx": ("onnx", "onnxruntime"),
    "openvino": ("openvino", "nncf"),
    "spacy": ("spacy",),
    "ray": ("ray",),
}
# import name -> the command that installs it; torch is a dependency of ner, missing only where an ONNX or OpenVINO
# deployment left it out
INSTALL = {"torch": "pip install torch",
           **{package: f'pip install -e ".[{extra}]"' for extra, packages in EXTRA_PACKAGES.items()
              for package in packages}}


def install_hint(*packages: str) -> str:
    """The command that installs `packages`: each one's extra, named once, and the packages no extra brings (a
    tracker, say) by name in one pip command; several commands are joined by "; "."""
    commands = dict.fromkeys(INSTALL[package] for package in packages if package in INSTALL)
    others = [package for package in packages if package not in INSTALL]
    if others:
        commands[f"pip install {' '.join(others)}"] = None
    return "; ".join(commands)


def require(asker: str, *packages: str, hint: str | None = None) -> None:
    """A one-line error naming what `asker` needs and the command that installs it (`hint`, else install_hint's),
    unless every package is there: asked before any work, not after it."""
    if all(importlib.util.find_spec(package) for package in packages):
        return
    names = f"{', '.join(packages[:-1])} and {packages[-1]}" if len(packages) > 1 else packages[0]
    raise UserError(f"{asker} needs {names}: {hint or install_hint(*packages)}")
