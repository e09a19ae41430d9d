"""ONNX files beside an exported model folder, checked against PyTorch before they are kept.

    python -m ner.export runs/ner/final exported --onnx                  # + model.onnx (fp32)
    python -m ner.export runs/ner/final exported --onnx --quantize int8  # + model.int8.onnx (dynamic int8)

torch's TorchScript exporter (`dynamo=False`): it needs only the `onnx` package, so it works offline
(the dynamo exporter also needs `onnxscript`). Inputs input_ids and attention_mask (and token_type_ids for
a model trained with casing types), output logits,
batch and sequence axes dynamic. Files are written under temporary names (ner/files.py) and renamed only after
the check, on the traced batch (CHECK_SENTENCES) and on two shapes unlike it (CHECK_SHAPES: fewer rows of
different lengths, padded to another width; one unpadded row), since a graph can hold the traced shape as
a constant: fp32 logits within MAX_LOGIT_DIFF of PyTorch on every attended token; int8 argmax agreeing
with PyTorch's on MIN_INT8_WORD_AGREEMENT of the words (their first subwords: what the tags are read
from) and on MIN_INT8_ENTITY_AGREEMENT of the words PyTorch tags as entities.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from ner.data.encode import UNKNOWN_CASE, casing_type, model_inputs
from ner.data.examples import Example
from ner.errors import UserError
from ner.extras import require
from ner.files import remove_recorded, staged_file
from ner.inference.model_folder import ModelSettings
from ner.inference.onnx_runtime import onnx_session
from ner.inference.runtimes import ONNX, ONNX_INT8, OPENVINO_INT8, REGISTRY, RUNTIME_FILES, RUNTIMES

EXPORT_PACKAGES = REGISTRY[ONNX].export_packages  # what model.onnx needs to be written and checked


def require_packages(asker: str) -> None:
    """A one-line error naming the command that installs the ONNX export's packages, before any export work."""
    require(asker, *EXPORT_PACKAGES)


class GateRefused(UserError):
    """A file's check against PyTorch failed, so the file is not written: the one failure an export that keeps the
    other files (write_onnx's `refused`) records instead of raising. Any other error is a bug, and raised."""


MAX_LOGIT_DIFF = 1e-3
# int8 noise flips words whose two best tags are close, and entity words are where that happens, so they
# get the looser bound. The check batches hold ~190 words, ~50 of them entities for a trained model: 0.98
# allows 3 flips, 0.95 allows 2 of 50. Measured: 99.5% of words (fitted and untrained tiny test models),
# 99.5% of tokens for the CoNLL-tuned MiniLM (docs/performance.md); a broken graph lands far lower.
MIN_INT8_WORD_AGREEMENT = 0.98
MIN_INT8_ENTITY_AGREEMENT = 0.95
MIN_ENTITY_WORDS = 10  # fewer entity words than this (an untrained head): too few to gate on, reported only
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


CHECK_SHAPES = ((4, 0, 3), (9,))  # rows of CHECK_SENTENCES; each batch padded 3 tokens wider than its longest


def write_onnx(model_dir: Path, runtimes: tuple[str, ...] = (ONNX,), calibrate: list[Example] | None = None,
               refused: dict[str, str] | None = None) -> dict[str, float]:
    """The files the `runtimes` read in `model_dir` (model.onnx, model.int8.onnx; OpenVINO's static int8, calibrated
    on the `calibrate` examples), each kept only if it passes its check; the measured max |logit difference| (fp32)
    and argmax agreement on words and entity words (int8) with PyTorch. `refused` (a dict): a file its gate refuses is
    recorded there under each runtime that reads it, with the reason, and the others are still written; else the
    refusal is raised."""
    if OPENVINO_INT8 in runtimes and calibrate is None:
        raise UserError(f"--runtime {OPENVINO_INT8}'s files are calibrated on training text: pass it (--calibrate)")
    import transformers
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    # eager attention: SDPA's traced mask handling adds an IsNaN and Where per layer; onnxruntime ran the eager
    # graph faster, fp32 and int8 alike (measured: docs/performance.md, "Eager attention in the export")
    model = AutoModelForTokenClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    settings = ModelSettings.of(model_dir)
    batches = check_batches(AutoTokenizer.from_pretrained(model_dir), casing=settings.casing == "types")
    with torch.no_grad():
        references = [model(**{k: torch.from_numpy(v) for k, v in model_inputs(b).items()}).logits.numpy()
                      for b in batches]
    outside = outside_id(model.config.id2label)

    def fp32_then_dynamic_int8() -> dict[str, float]:
        with staged_file(model_dir / RUNTIME_FILES[ONNX][0]) as fp32:
            export_graph(model, model_inputs(batches[0]), fp32)
            measured = {"max_logit_diff": check_fp32(fp32, batches, references)}
            if ONNX_INT8 in runtimes:
                measured |= gated((ONNX_INT8,), refused, lambda: write_dynamic_int8(
                    model_dir, fp32, batches, references, outside))
        return measured

    # every file is made from model.onnx: its refusal refuses each runtime asked for (the int8 gate's, inside, its own)
    measured = gated(runtimes, refused, fp32_then_dynamic_int8)
    if OPENVINO_INT8 in runtimes and OPENVINO_INT8 not in (refused or {}):
        measured |= gated((OPENVINO_INT8,), refused, lambda: write_static_int8(
            model_dir, calibrate, batches, references, outside))
    if not set(runtimes) & set(READS_MODEL_ONNX):  # written only as the int8 files' source: not asked for, it goes
        remove_recorded(model_dir, {RUNTIME_FILES[ONNX][0]: {}})  # written above, in the export's staging folder
    return measured


READS_MODEL_ONNX = tuple(runtime for runtime in RUNTIMES if RUNTIME_FILES[runtime] == RUNTIME_FILES[ONNX])


def gated(runtimes: tuple[str, ...], refused: dict[str, str] | None, write) -> dict[str, float]:
    """write()'s measurements; where `refused` is a dict, a gate's refusal (GateRefused) is recorded there for each of
    `runtimes` instead of raised. Any other error is raised: a bug must not read as a file its check refused."""
    if refused is None:
        return write()
    try:
        return write()
    except GateRefused as exc:
        refused.update(dict.fromkeys(runtimes, str(exc)))
        return {}


def write_dynamic_int8(model_dir: Path, fp32: Path, batches: list[dict[str, np.ndarray]],
                       references: list[np.ndarray], outside: int) -> dict[str, float]:
    """model.int8.onnx from the staged fp32 file, kept only past its gate; the measured agreement."""
    with staged_file(model_dir / RUNTIME_FILES[ONNX_INT8][0]) as int8:
        quantize_int8(fp32, int8)
        return check_int8(lambda batch, path=int8: run_session(path, batch), batches, references, outside)


def outside_id(id2label: dict[int, str]) -> int:
    return next((i for i, label in id2label.items() if label == "O"), -1)


def write_static_int8(model_dir: Path, calibrate: list[Example], batches: list[dict[str, np.ndarray]],
                      references: list[np.ndarray], outside: int) -> dict[str, float]:
    """OpenVINO's static int8 files from the model.onnx just kept, gated as model.int8.onnx is; the measured
    agreement, its keys prefixed "static_"."""
    from ner.inference.openvino_export import quantize_static, remove_static
    from ner.inference.openvino_runtime import OpenVinoRuntime

    try:
        runtime = OpenVinoRuntime(quantize_static(model_dir, calibrate), references[0].shape[-1])
        measured = check_int8(lambda batch: runtime(**model_inputs(batch)), batches, references, outside,
                              "static int8 OpenVINO model", "export without --calibrate")
    except BaseException:
        remove_static(model_dir)
        raise
    return {f"static_{key}": value for key, value in measured.items()}


def check_batches(tokenizer, casing: bool) -> list[dict[str, np.ndarray]]:
    """The traced batch (all CHECK_SENTENCES, padded to the longest), then one batch per CHECK_SHAPES,
    each with `first_subwords`: True where a word's first subword is (and, with `casing`, casing types)."""
    rows = [sentence.split() for sentence in CHECK_SENTENCES]
    traced = tokenizer(rows, is_split_into_words=True, padding=True, return_tensors="np",
                       return_token_type_ids=False)
    batches = [with_first_subwords(traced, rows, casing)]
    for picked in CHECK_SHAPES:
        chosen = [rows[i] for i in picked]
        longest = max(len(tokenizer(r, is_split_into_words=True)["input_ids"]) for r in chosen)
        width = longest + 3 if len(picked) > 1 else longest
        if width == traced["input_ids"].shape[1]:
            width += 1
        encoded = tokenizer(chosen, is_split_into_words=True, padding="max_length", max_length=width,
                            return_tensors="np", return_token_type_ids=False)
        batches.append(with_first_subwords(encoded, chosen, casing))
    return batches


def with_first_subwords(encoded, rows: list[list[str]], casing: bool) -> dict[str, np.ndarray]:
    first = np.zeros(encoded["input_ids"].shape, dtype=bool)
    types = np.full(encoded["input_ids"].shape, UNKNOWN_CASE, dtype=np.int64)
    for i, words in enumerate(rows):
        seen = set()
        for j, word in enumerate(encoded.word_ids(i)):
            if word is not None:
                types[i, j] = casing_type(words[word])
            if word is not None and word not in seen:
                first[i, j] = True
                seen.add(word)
    batch = {"input_ids": encoded["input_ids"].astype(np.int64),
             "attention_mask": encoded["attention_mask"].astype(np.int64), "first_subwords": first}
    return {**batch, "token_type_ids": types} if casing else batch


def export_graph(model: torch.nn.Module, inputs: dict[str, np.ndarray], path: Path) -> None:
    """`inputs` in the model's argument order (encode.model_inputs); token_type_ids is the forward's third."""
    axes = {0: "batch", 1: "sequence"}
    names = list(inputs)
    args = tuple(torch.from_numpy(value) for value in inputs.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # aten::index notes: the owned-position gather happens outside the graph
        torch.onnx.export(model, args, str(path), input_names=names, output_names=["logits"],
                          dynamic_axes={**{name: axes for name in names}, "logits": axes},
                          opset_version=17, dynamo=False)


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 weights (per channel: measured closer to fp32 than per tensor), with every activation
    quantized row by row (rows_own_scales), so a window's numbers never depend on the windows batched with it;
    onnxruntime's static scales (QDQ) calibrated on training text were measured and lost accuracy and speed
    (docs/performance.md); OpenVINO's static int8 is ner/inference/openvino_export.py."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process (shape inference) is for static quantization
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        root.setLevel(level)
    graph = onnx.load(str(target))
    rows_own_scales(graph)
    onnx.save(graph, str(target))


ROW_CONSTANTS = {"row_q_inv127": (1 / 127, "float32"), "row_q_tiny": (1e-30, "float32"),
                 "row_q_one": (1.0, "float32"), "row_q_zero_point": (128, "uint8")}


def rows_own_scales(model) -> int:
    """Replaces each DynamicQuantizeLinear (one scale and zero point for the whole tensor: every row of a
    batch, padding included) with a quantization per row, that is per token (row_quantization), so a row is
    quantized the same way in any batch; its row scales multiply the MatMul's output (row_scaled_outputs).
    Returns how many were replaced."""
    import onnx
    from onnx import numpy_helper

    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18:
        raise ValueError("rows_own_scales writes ReduceMax with an axes attribute: opset 17 or older")
    graph, nodes, row_scales = model.graph, [], {}
    graph.initializer.extend(numpy_helper.from_array(np.array(value, dtype=dtype), name)
                             for name, (value, dtype) in ROW_CONSTANTS.items())
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            nodes += row_quantization(node.input[0], *node.output)
            row_scales[node.output[0]] = node.output[1]
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(row_scaled_outputs(nodes, row_scales))
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))  # MatMulIntegerToFloat's
    return len(row_scales)


def row_quantization(x: str, quantized: str, scale: str, zero_point: str) -> list:
    """Scale max|row| / 127 (kept apart from the weight scale, see row_scaled_outputs), zero point 128: uint8
    around 128, not int8 around 0, since onnxruntime's fast integer kernels are unsigned-by-signed and
    MatMulInteger takes the activation's zero point as a scalar."""
    from onnx import helper

    p = f"{quantized}_row"
    return [helper.make_node("ReduceMax", [x], [p + "_max"], axes=[-1], keepdims=1),
            helper.make_node("ReduceMin", [x], [p + "_min"], axes=[-1], keepdims=1),
            helper.make_node("Neg", [p + "_min"], [p + "_neg_min"]),
            helper.make_node("Max", [p + "_max", p + "_neg_min"], [p + "_abs_max"]),
            helper.make_node("Mul", [p + "_abs_max", "row_q_inv127"], [p + "_scale"]),
            helper.make_node("Max", [p + "_scale", "row_q_tiny"], [scale]),  # an all-zero row
            helper.make_node("Reciprocal", [scale], [p + "_inverse"]),
            helper.make_node("Mul", [x, p + "_inverse"], [p + "_scaled"]),
            # round half to even, + 128, saturate, to uint8: one kernel
            helper.make_node("QuantizeLinear", [p + "_scaled", "row_q_one", "row_q_zero_point"], [quantized]),
            helper.make_node("Identity", ["row_q_zero_point"], [zero_point])]


def row_scaled_outputs(nodes: list, row_scales: dict[str, str]) -> list:
    """quantize_dynamic writes MatMulInteger -> Cast -> Mul by (activation scale x weight scale). With a row
    scale that chain becomes onnxruntime's MatMulIntegerToFloat with the weight scale alone, then a Mul by the row
    scale. Left as it was, onnxruntime fuses the chain into MatMulIntegerToFloat itself, which reads a non-scalar
    activation scale wrongly (measured: 6x the logit error of per-tensor int8 against fp32). `row_scales`: the
    row scale of each row-quantized activation, by the quantized tensor's name."""
    from onnx import helper

    made_by = {output: node for node in nodes for output in node.output}
    used_by = {}
    for node in nodes:
        for name in node.input:
            used_by.setdefault(name, []).append(node)
    replaced, out = {}, []
    for node in nodes:
        if node.op_type != "MatMulInteger" or node.input[0] not in row_scales:
            continue
        row_scale = row_scales[node.input[0]]
        cast, scale_mul, product = scale_chain(node, row_scale, used_by, made_by)
        weight_scale = next(i for i in product.input if i != row_scale)
        result = scale_mul.output[0]
        replaced[id(node)] = [
            helper.make_node("MatMulIntegerToFloat", [node.input[0], node.input[1], "row_q_one", weight_scale,
                                                      node.input[2], node.input[3]], [result + "_columns"],
                             domain="com.microsoft"),
            helper.make_node("Mul", [result + "_columns", row_scale], [result])]
        replaced.update({id(cast): [], id(scale_mul): [], id(product): []})
    for node in nodes:
        out += replaced.get(id(node), [node])
    return out


def scale_chain(matmul, row_scale: str, used_by: dict, made_by: dict) -> tuple:
    """(Cast, Mul by the scale product, the scale product's Mul) after `matmul`, as quantize_dynamic writes them;
    anything else is refused, since left alone it would be fused with the row scale read wrongly."""
    cast = used_by.get(matmul.output[0], [None])
    scale_mul = used_by.get(cast[0].output[0], [None]) if len(cast) == 1 and cast[0].op_type == "Cast" else [None]
    product = None
    if len(scale_mul) == 1 and scale_mul[0] is not None and scale_mul[0].op_type == "Mul":
        other = [i for i in scale_mul[0].input if i != cast[0].output[0]]
        product = made_by.get(other[0]) if len(other) == 1 else None
    if product is None or product.op_type != "Mul" or row_scale not in product.input:
        raise GateRefused(f"int8: {matmul.name or matmul.output[0]} is not followed by the Cast and scale Mul that "
                        "per-row quantization rewrites; nothing written; export without --quantize")
    return cast[0], scale_mul[0], product


def run_session(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return onnx_session(path).run(["logits"], model_inputs(inputs))[0]


def shape_of(batch: dict[str, np.ndarray]) -> str:
    rows, width = batch["input_ids"].shape
    return f"{rows} x {width} tokens"


def check_fp32(path: Path, batches: list[dict[str, np.ndarray]], references: list[np.ndarray]) -> float:
    """The largest |logit difference| over every batch's attended tokens; over MAX_LOGIT_DIFF: the file goes."""
    worst, worst_shape = 0.0, ""
    for batch, reference in zip(batches, references):
        mask = batch["attention_mask"].astype(bool)
        diff = float(np.abs(run_session(path, batch)[mask] - reference[mask]).max())
        if diff >= worst:
            worst, worst_shape = diff, shape_of(batch)
    if worst > MAX_LOGIT_DIFF:
        raise GateRefused(f"ONNX export differs from PyTorch: max |logit difference| {worst:.2e} > "
                        f"{MAX_LOGIT_DIFF:.0e} (batch of {worst_shape}); nothing written")
    return worst


def word_tags(logits: np.ndarray, first_subwords: np.ndarray) -> np.ndarray:
    """The tag id of each word: argmax at its first subword, where tags are read from; not [CLS], [SEP],
    padding or continuations, which are mostly O and would hide the flips that matter."""
    return logits.argmax(-1)[first_subwords]


def int8_agreement(ours: np.ndarray, theirs: np.ndarray, outside_id: int) -> tuple[float, float | None, int]:
    """(agreement on words, agreement on the words PyTorch tags as entities or None, how many those are),
    from word tag ids: `ours` (int8) against `theirs` (PyTorch)."""
    entity = theirs != outside_id
    entity_agreement = float((ours[entity] == theirs[entity]).mean()) if entity.any() else None
    return float((ours == theirs).mean()), entity_agreement, int(entity.sum())


def check_int8(run, batches: list[dict[str, np.ndarray]], references: list[np.ndarray], outside_id: int,
               what: str = "int8 ONNX model", fix: str = "export without --quantize") -> dict[str, float]:
    """Word and entity-word agreement over every batch, whose logits `run(batch)` gives; under its bound: the file
    goes, and the error names `what` failed and the `fix`."""
    ours = np.concatenate([word_tags(run(b), b["first_subwords"]) for b in batches])
    theirs = np.concatenate([word_tags(r, b["first_subwords"]) for r, b in zip(references, batches)])
    words, entities, entity_words = int8_agreement(ours, theirs, outside_id)
    measured = {"int8_word_agreement": words}
    failed = words < MIN_INT8_WORD_AGREEMENT
    if entities is not None:
        measured["int8_entity_agreement"] = entities
        failed |= entity_words >= MIN_ENTITY_WORDS and entities < MIN_INT8_ENTITY_AGREEMENT
    if failed:
        on_entities = f", {entities:.1%} of {entity_words} entity words" if entities is not None else ""
        raise GateRefused(f"{what} agrees with PyTorch on {words:.1%} of words{on_entities} (needs "
                        f"{MIN_INT8_WORD_AGREEMENT:.0%} and {MIN_INT8_ENTITY_AGREEMENT:.0%}); nothing written; {fix}")
    return measured
