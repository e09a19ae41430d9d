"""Static int8 for OpenVINO: model.int8.xml and model.int8.bin beside model.onnx, calibrated once on the user's text.

    python -m ner.export runs/ner/final exported --onnx --quantize int8 --calibrate train.conll
    python -m ner.train --train-file train.conll --export-int8     # the same at the end of training, on its data

NNCF's post-training quantization of model.onnx (`model_type=TRANSFORMER`: SmoothQuant moves the activations'
outliers into the weights; per-channel int8 weights) with activation ranges measured on CALIBRATION_WINDOWS
windows of the calibration text (the file, or the run's training data), cut and encoded as the tagger cuts them.
Every activation scale is then a constant of the graph: a text's numbers cannot depend on what shares its
forward, and no pass computes a scale. The files are kept only if their tags pass the gate onnx-int8 passes
(onnx_export.check_int8: argmax agreement with PyTorch on words and entity words).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ner.data.encode import collate, model_inputs
from ner.data.examples import Example
from ner.errors import UserError
from ner.extras import install_hint, require
from ner.files import remove_recorded
from ner.inference.options import ONNX, OPENVINO_INT8, PAD_TO_MULTIPLE_OF, RUNTIME_FILES

log = logging.getLogger("ner")
CALIBRATION_WINDOWS = 300  # windows whose activation ranges set the scales (NNCF's default subset is 300)
STATIC_INT8_PACKAGES = ("onnxruntime", "openvino", "nncf")  # onnxruntime: model.int8.onnx is written first


def require_packages(asker: str) -> None:
    """A one-line error naming the extra to install unless the static int8 export's packages are there: asked
    before any export or training work, not after it."""
    require(asker, *STATIC_INT8_PACKAGES, hint=install_hint("nncf"))  # its extra brings the other two


def calibration_batches(model_dir: Path, examples: list[Example]) -> list[dict[str, np.ndarray]]:
    """Up to CALIBRATION_WINDOWS windows of `examples`, spread evenly over them, each one forward of one row at its
    own padded width, as `Tagger(model_dir)` would encode them."""
    from ner.inference.tagger import Tagger

    tagger = Tagger(model_dir, runtime=ONNX)
    examples = [e for e in examples if e.words]
    if not examples:
        raise UserError("no sentences to calibrate the static int8 model on; pass the training file")
    features = tagger.encode(examples)
    step = max(1, len(features) // CALIBRATION_WINDOWS)
    chosen = features[::step][:CALIBRATION_WINDOWS]
    return [model_inputs(collate([f], tagger.tokenizer.pad_token_id, PAD_TO_MULTIPLE_OF)) for f in chosen]


def quantize_static(model_dir: Path, examples: list[Example]) -> Path:
    """model.int8.xml (+ .bin) in `model_dir`, from its model.onnx, calibrated on `examples`; returns the .xml."""
    require_packages("a static int8 export")
    import nncf
    import openvino

    batches = calibration_batches(model_dir, examples)
    model = openvino.Core().read_model(str(model_dir / RUNTIME_FILES[ONNX][0]))
    nncf_log = logging.getLogger("nncf")
    level = nncf_log.level
    nncf_log.setLevel(logging.ERROR)  # its progress bars and notes are not the user's business
    try:
        quantized = nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(batches))
    finally:
        nncf_log.setLevel(level)
    xml = model_dir / RUNTIME_FILES[OPENVINO_INT8][0]
    openvino.save_model(quantized, str(xml))  # and model.int8.bin beside it
    log.info("static int8 calibrated on %d windows of %d sentences", len(batches), len(examples))
    return xml


def remove_static(model_dir: Path) -> None:
    """The static int8 files quantize_static wrote a moment ago into the staged export, refused by their gate."""
    remove_recorded(model_dir, {name: {} for name in RUNTIME_FILES[OPENVINO_INT8]})
