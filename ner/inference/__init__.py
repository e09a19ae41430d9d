"""Inference: the one path that turns texts into tags and entities, used by training's evaluation, ner.predict,
ner.evaluate, ner.serve and corpus tagging. Imports data, backends and the shared leaves; never training.

    tagger.py       Tagger (load an exported model, tag words or raw text), the batched forward, windows -> words
    model_folder.py what an export says: how it was trained, its labels and length limit, its version
    entities.py     tagged words -> entities with scores, the --min-score filter, a text's confidence
    selection.py    what to annotate next (ner.select, Label Studio): least confident texts over clusters, a budget
    options.py      the inference options (--runtime, --max-seq-length, ...), per-device forward budgets, and the
                    runtime --runtime auto picks by CPU class (one table of measurements)
    runtime.py      what every runtime (torch, ONNX, OpenVINO) keeps to: the call, passes in order or at once
    torch_runtime.py  PyTorch over the weights, one thread a pass on a CPU
    onnx_runtime.py   onnxruntime over model.onnx / model.int8.onnx, on the provider it picks for the device
    cpu_threads.py  the CPU threads a runtime uses: OMP_NUM_THREADS, else torch's count within the CPU quota
    openvino_runtime.py  OpenVINO over model.onnx (bf16 where the CPU has it) or the static model.int8.xml
    decode.py       per-word scores -> tags: argmax, or Viterbi over the sequences the scheme allows
    onnx_export.py  writing and checking the ONNX files (fp32, per-token int8)
    openvino_export.py  the static int8 model: calibrated by NNCF on the user's text, checked as the ONNX ones are
    analysis.py     where predictions go wrong: kinds of error, schemas, confusions, thresholds, calibration
    analysis_plots.py  the plots of an evaluation (ner.evaluate --plots)

    from ner.inference.tagger import Tagger   # also: from ner import Tagger
"""
