"""Corpus tagging over processes x threads: texts/s of each layout, whole runs, and whether the outputs agree.

    python -m benchmarks.corpus_scaling MODEL_DIR ../shared/data/conll2003/train.txt --texts 12000 \
        --layouts 1x2 2x1 --runtime onnx-int8 --out scaling_out/

Each CoNLL sentence becomes one raw text (words joined by spaces), cycled to --texts lines. Each layout
PxT runs `ner.predict MODEL texts.txt --output-dir OUT --merge` once, as a fresh process tree: P=1 as a
plain process, P>1 under `torch.distributed.run --standalone --nproc_per_node P` (gloo on CPU), every
process with OMP_NUM_THREADS=T. "whole run" is the wall time of the tree: imports, model loading in every
process, the counting pass, tagging and the merge. The first layout is the baseline of the ratio column;
"same output" compares each layout's predictions.jsonl with the baseline's, byte for byte. Results:
docs/corpus.md.
"""

from __future__ import annotations

import argparse
import filecmp
import itertools
import shutil
import sys
from pathlib import Path

from benchmarks.measure import contention, run_measured
from ner.data.conll import read_conll
from ner.errors import UserError
from ner.inference.runtimes import ONNX, ONNX_INT8, TORCH

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".made-by-benchmarks"


def write_texts(conll: Path, count: int, path: Path) -> None:
    sentences = [" ".join(e.words) for e in read_conll(conll) if e.words]
    path.write_text("".join(f"{text}\n" for text in itertools.islice(itertools.cycle(sentences), count)),
                    encoding="utf-8")


def parse_layout(layout: str) -> tuple[int, int]:
    processes, _, threads = layout.partition("x")
    if not (processes.isdigit() and threads.isdigit() and int(processes) > 0 and int(threads) > 0):
        raise UserError(f"--layouts {layout}: expected PROCESSESxTHREADS, e.g. 2x1")
    return int(processes), int(threads)


def command(model_dir: Path, texts: Path, out: Path, processes: int, runtime: str,
            chunk_texts: int | None) -> list[str]:
    tail = ["-m", "ner.predict", str(model_dir), str(texts), "--output-dir", str(out), "--merge",
            "--runtime", runtime, "--quiet"] + (["--chunk-texts", str(chunk_texts)] if chunk_texts else [])
    if processes == 1:
        return [sys.executable, *tail]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *tail]


def claim(out: Path) -> Path:
    """OUT: new, empty, or one this benchmark made (never anything else)."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"{out}: not empty and not made by this benchmark; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an export (with model.int8.onnx for --runtime onnx-int8)")
    parser.add_argument("conll", type=Path, help="CoNLL file whose sentences become the texts")
    parser.add_argument("--texts", type=int, default=12000, help="texts to tag (the sentences, cycled)")
    parser.add_argument("--layouts", nargs="+", default=["1x2", "2x1"],
                        help="PROCESSESxTHREADS; the first is the baseline")
    parser.add_argument("--runtime", default=ONNX_INT8, choices=(TORCH, ONNX, ONNX_INT8))
    parser.add_argument("--chunk-texts", type=int, default=None, help="ner.predict --chunk-texts (default: its own)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder, or one this benchmark made")
    args = parser.parse_args(argv)
    layouts = [parse_layout(layout) for layout in args.layouts]
    out = claim(args.out)
    texts = out / "texts.txt"
    write_texts(args.conll, args.texts, texts)
    print(f"| processes x threads | whole run s | texts/s | vs {args.layouts[0]} | peak RSS all processes MiB | "
          "other load | same output |\n|---|---:|---:|---:|---:|---:|---|", flush=True)
    baseline_s = baseline_output = None
    for (processes, threads), name in zip(layouts, args.layouts):
        run_out = out / f"run_{name}"
        if run_out.exists():
            shutil.rmtree(run_out)  # this benchmark's own earlier output (OUT carries the marker)
        argv = command(args.model_dir.resolve(), texts, run_out, processes, args.runtime, args.chunk_texts)
        measured = run_measured(argv, out / f"{name}.log", cwd=ROOT,
                                env={"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"})
        output = run_out / "predictions.jsonl"
        baseline_s = baseline_s or measured["wall_s"]
        baseline_output = baseline_output or output
        same = "yes" if filecmp.cmp(output, baseline_output, shallow=False) else "no"
        print(f"| {processes} x {threads} | {measured['wall_s']:.1f} | {args.texts / measured['wall_s']:.0f} | "
              f"{baseline_s / measured['wall_s']:.2f}x | {measured['peak_tree_rss_bytes'] / 2**20:.0f} | "
              f"{contention(measured):.0%} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
