"""ONNX files beside an exported model folder, checked against PyTorch before they are kept.

    python -m ner.export runs/ner/final exported --onnx                  # + model.onnx (fp32)
    python -m ner.export runs/ner/final exported --onnx --quantize int8  # + model.int8.onnx (dynamic int8)

torch's TorchScript exporter (`dynamo=False`): it needs only the `onnx` package, so it works offline
(the dynamo exporter also needs `onnxscript`). Inputs input_ids and attention_mask, output logits,
batch and sequence axes dynamic. Files are written under temporary names (ner/files.py) and renamed
only after the check: fp32 logits within MAX_LOGIT_DIFF of PyTorch, int8 argmax agreeing on MIN_INT8_AGREEMENT
of the tokens of CHECK_SENTENCES.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from ner.errors import UserError
from ner.files import staged_file
from ner.runtime import ONNX_FILES, onnx_session

MAX_LOGIT_DIFF = 1e-3
MIN_INT8_AGREEMENT = 0.99
QUANTIZATIONS = ("int8",)
CHECK_SENTENCES = [
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday .",
    "Shares of Siemens AG rose 3 percent in Frankfurt after the results .",
    "The United Nations Security Council voted on the resolution in New York .",
    "Ada Lovelace worked with Charles Babbage in London .",
    "Nothing happened today .",
    "Real Madrid beat Barcelona 2-1 at the Santiago Bernabeu stadium on Sunday , with goals from Ronaldo and Benzema .",
    "Microsoft and Google reported earnings ; analysts in Seattle and Mountain View expected more .",
    "EU officials said talks with the British government would resume in Brussels next week .",
    "Tokyo stocks fell as the yen gained against the dollar .",
    "Marie Curie won the Nobel Prize in Physics in 1903 together with Pierre Curie and Henri Becquerel .",
    "Alan Turing , Grace Hopper and Niels Bohr visited Lisbon , Cairo and Berlin .",
    "The World Health Organization warned about influenza in Geneva .",
]


def write_onnx(model_dir: Path, quantize: str | None = None) -> dict[str, float]:
    """model.onnx (and model.int8.onnx) in `model_dir`, each kept only if it passes its check; the measured
    max |logit difference| (fp32) and argmax agreement (int8) with PyTorch on CHECK_SENTENCES."""
    import transformers
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
    batch = AutoTokenizer.from_pretrained(model_dir)(CHECK_SENTENCES, padding=True, return_tensors="np",
                                                     return_token_type_ids=False)
    inputs = {k: batch[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        reference = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
    with staged_file(model_dir / ONNX_FILES["onnx"]) as fp32:
        export_graph(model, inputs, fp32)
        measured = {"max_logit_diff": check_fp32(fp32, inputs, reference)}
        if quantize == "int8":
            with staged_file(model_dir / ONNX_FILES["onnx-int8"]) as int8:
                quantize_int8(fp32, int8)
                measured["int8_agreement"] = check_int8(int8, inputs, reference)
    return measured


def export_graph(model: torch.nn.Module, inputs: dict[str, np.ndarray], path: Path) -> None:
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # aten::index notes: the owned-position gather happens outside the graph
        torch.onnx.export(model, (torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"])),
                          str(path), input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": axes},
                          opset_version=17, dynamo=False)


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 weights; per channel measured closer to fp32 than per tensor."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process (shape inference) is for static quantization
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        root.setLevel(level)


def run_session(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return onnx_session(path).run(["logits"], inputs)[0]


def check_fp32(path: Path, inputs: dict[str, np.ndarray], reference: np.ndarray) -> float:
    mask = inputs["attention_mask"].astype(bool)
    diff = float(np.abs(run_session(path, inputs)[mask] - reference[mask]).max())
    if diff > MAX_LOGIT_DIFF:
        raise UserError(f"ONNX export differs from PyTorch: max |logit difference| {diff:.2e} > {MAX_LOGIT_DIFF:.0e}; "
                        "nothing written")
    return diff


def check_int8(path: Path, inputs: dict[str, np.ndarray], reference: np.ndarray) -> float:
    mask = inputs["attention_mask"].astype(bool)
    agreement = float((run_session(path, inputs).argmax(-1)[mask] == reference.argmax(-1)[mask]).mean())
    if agreement < MIN_INT8_AGREEMENT:
        raise UserError(f"int8 ONNX model agrees with PyTorch on {agreement:.1%} of tokens "
                        f"(< {MIN_INT8_AGREEMENT:.0%}); nothing written; export without --quantize")
    return agreement
