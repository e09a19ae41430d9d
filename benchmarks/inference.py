"""Raw-text tagging speed, memory and F1 per runtime: transformers' pipeline, auto, torch, onnx(-int8), openvino(-int8).

    python -m ner.export runs/final runs/final_onnx --export-int8 --calibrate ../shared/data/conll2003/train.txt
    python -m benchmarks.inference runs/final_onnx ../shared/data/conll2003/train.txt   # speed
    python -m benchmarks.inference runs/final_onnx ../shared/data/conll2003/valid.txt   # F1

Every CoNLL sentence is detokenised into one text (scripts/raw_text_f1.py's detokenize); each runtime tags all of
them in its own process (run_measured: peak RSS), after a warm-up on the first 32 texts. Rows:
`transformers.pipeline("token-classification", aggregation_strategy="simple", batch_size=32)` on the
same folder, and Tagger.predict (ner's one inference path: windows, context, Viterbi) with
`--runtime auto` (what ner.predict runs by default: the row names the runtime it resolved to), `torch` (bf16
autocast where the CPU supports it, as ner.predict), `onnx`, `onnx-int8`, `openvino` and `openvino-int8`. Every row
names the CPU class it ran on (inference/options.py's cpu_class: the key of --runtime auto's table).
"whole process" divides by the process's wall time: imports, model loading, warm-up and tagging.
F1: exact character spans against the gold entities. MFU: forward FLOPs of the texts (each text's subword
count from the export's tokenizer; measure.inference_flops) per second of tagging, against the matmul peak of
the row's precision in the row's own runtime, measured in the same run after the rows (torch: measure_peak_flops;
onnxruntime and OpenVINO: runtime_matmul_peak, a 2048^3 product on one thread in CPU time, times the threads).
Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.measure import inference_flops, measure_peak_flops, model_shape, run_measured, runtime_matmul_peak
from ner.cpu import this_cpu_class
from ner.data.conll import read_conll
from ner.inference.runtime_choice import choose
from ner.inference.runtimes import (
    AUTO_RUNTIME,
    ONNX,
    ONNX_INT8,
    OPENVINO,
    OPENVINO_INT8,
    RUNTIME_CHOICES,
    RUNTIME_PACKAGES,
    RUNTIMES,
    TORCH,
)
from scripts.raw_text_f1 import detokenize, prf

ROWS = ("pipeline", *RUNTIME_CHOICES)
# torch and openvino: what ner.predict's auto resolves to (bf16 where the CPU has it)
PRECISION = {"pipeline": "fp32", ONNX: "fp32", ONNX_INT8: "int8", OPENVINO_INT8: "int8"}
ROOT = Path(__file__).resolve().parents[1]


def sentence_texts(conll: Path, limit: int | None) -> tuple[list[str], set, int]:
    """(one text per sentence, gold entities as (text index, start, end, type), word count)."""
    examples = [e for e in read_conll(conll) if e.words][:limit]
    texts, gold = [], set()
    for i, example in enumerate(examples):
        text, _, entities = detokenize([example])
        texts.append(text)
        gold |= {(i, *span) for span in entities}
    return texts, gold, sum(len(e.words) for e in examples)


def tag_function(row: str, model_dir: Path, max_tokens: int | None = None):
    """texts -> [[(start, end, type)]] for one row of the table."""
    if row == "pipeline":
        from transformers import pipeline

        tagger = pipeline("token-classification", model=str(model_dir), aggregation_strategy="simple",
                          batch_size=32, device=-1)
        return lambda texts: [[(e["start"], e["end"], e["entity_group"]) for e in found] for found in tagger(texts)]
    from ner.inference.tagger import Tagger

    tagger = Tagger(model_dir, runtime=row)  # what ner.predict does: bf16 autocast where the CPU has it
    return lambda texts: [[(e["start"], e["end"], e["type"]) for e in r["entities"]]
                          for r in tagger.predict(texts, max_tokens=max_tokens)]


def child(row: str, model_dir: Path, conll: Path, limit: int | None, result: Path, max_tokens: int | None) -> None:
    texts, gold, words = sentence_texts(conll, limit)
    tag_all = tag_function(row, model_dir, max_tokens)
    tag_all(texts[:32])
    start = time.perf_counter()
    found = tag_all(texts)
    seconds = time.perf_counter() - start
    predicted = {(i, *span) for i, spans in enumerate(found) for span in spans}
    result.write_text(json.dumps({"seconds": seconds, "sentences_per_s": len(texts) / seconds,
                                  "words_per_s": words / seconds, "sentences": len(texts), **prf(gold, predicted)}))


# What runs each row's matmuls: the package each runtime needs (the pipeline is transformers' on torch)
ENGINE = {"pipeline": RUNTIME_PACKAGES[TORCH][0], **{runtime: RUNTIME_PACKAGES[runtime][0] for runtime in RUNTIMES}}


def print_mfu(model_dir: Path, conll: Path, limit: int | None, seconds: dict[str, float]) -> None:
    """Model FLOP utilisation of each row's tagging against the matmul peak of its precision in its own runtime
    (torch, onnxruntime, OpenVINO), per core in CPU time, times the threads (measure.runtime_matmul_peak)."""
    import torch
    from transformers import AutoTokenizer

    from ner.backends import resolve_precision

    texts, _, _ = sentence_texts(conll, limit)
    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(model_dir)(texts)["input_ids"]]
    num_labels = len(json.loads((model_dir / "config.json").read_text())["id2label"])
    flops = inference_flops(lengths, model_shape(model_dir, num_labels))
    threads = torch.get_num_threads()
    auto = "bf16" if resolve_precision("auto", torch.device("cpu")) == "bf16" else "fp32"
    precision = {**PRECISION, TORCH: auto, OPENVINO: auto}
    picked = choose(this_cpu_class(), model_dir).runtime
    precision[AUTO_RUNTIME], engine = precision[picked], {**ENGINE, AUTO_RUNTIME: ENGINE[picked]}
    torch_peaks = measure_peak_flops(torch.device("cpu"), threads)
    peaks = {(ENGINE[TORCH], p): torch_peaks[f"{p}_flops_per_s"] for p in ("fp32", "bf16")
             if f"{p}_flops_per_s" in torch_peaks}
    for row in seconds:
        key = (engine[row], precision[row])
        if key not in peaks:
            peaks[key] = runtime_matmul_peak(*key, threads)
    print(f"\n{sum(lengths):,} subword tokens, {flops / 1e12:.2f} TFLOP forward; matmul peaks on {threads} threads: "
          + ", ".join(f"{engine} {p} {peak / 1e12:.2f} T/s" for (engine, p), peak in peaks.items()))
    print("| runtime | CPU class | precision | TFLOP/s (tagging) | peak T/s (its runtime, its precision) | MFU |\n"
          "|---|---|---|---:|---:|---:|")
    for row, s in seconds.items():
        achieved, peak = flops / s, peaks[(engine[row], precision[row])]
        print(f"| {row_name(row, model_dir)} | {this_cpu_class()} | {precision[row]} | {achieved / 1e12:.3f} | "
              f"{peak / 1e12:.2f} | {achieved / peak:.1%} |")


def row_name(row: str, model_dir: Path) -> str:
    """auto names the runtime it resolves to on this CPU."""
    return f"{row} ({choose(this_cpu_class(), model_dir).runtime})" if row == AUTO_RUNTIME else row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported folder with model.onnx and model.int8.onnx")
    parser.add_argument("conll", type=Path, help="CoNLL file with gold tags (validation)")
    parser.add_argument("--limit", type=int, default=None, help="first N sentences only")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="padded tokens per forward (default: the device's)")
    parser.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.model_dir, args.conll, args.limit, args.result, args.max_tokens)
        return 0
    print("| runtime | CPU class | sentences/s (tagging) | sentences/s (whole process) | vs pipeline (process) | "
          "words/s (tagging) | peak RSS (MiB) | entity F1 (char spans) |\n|---|---|---:|---:|---:|---:|---:|---:|")
    baseline = None
    rates = {}
    with tempfile.TemporaryDirectory() as folder:
        for row in args.rows:
            out = Path(folder) / f"{row}.json"
            command = [sys.executable, "-m", "benchmarks.inference", str(args.model_dir.resolve()),
                       str(args.conll.resolve()), "--child", row, "--result", str(out)]
            command += ["--limit", str(args.limit)] if args.limit else []
            command += ["--max-tokens", str(args.max_tokens)] if args.max_tokens else []
            measured = run_measured(command, Path(folder) / f"{row}.log", cwd=ROOT)
            r = json.loads(out.read_text())
            rates[row] = r["seconds"]
            process_rate = r["sentences"] / measured["wall_s"]  # imports, loading, warm-up and tagging
            baseline = process_rate if row == "pipeline" else baseline
            ratio = f"{process_rate / baseline:.2f}x" if baseline else ""
            print(f"| {row_name(row, args.model_dir)} | {this_cpu_class()} | {r['sentences_per_s']:.0f} | "
                  f"{process_rate:.0f} | {ratio} | {r['words_per_s']:.0f} | "
                  f"{measured['peak_rss_bytes'] / 2**20:.0f} | {r['f1'] * 100:.2f} |", flush=True)
    print_mfu(args.model_dir, args.conll, args.limit, rates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
