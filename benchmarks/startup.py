"""Start-up time and peak RSS of `ner.predict` per runtime: what a deployment without torch saves.

    python -m ner.export runs/final runs/final_onnx --onnx --quantize int8
    python -m benchmarks.startup runs/final_onnx --runs 3            # torch vs onnx vs onnx-int8

Each run is a fresh `python -m ner.predict MODEL --runtime R` tagging one sentence from stdin: "first answer"
is the time from starting the process to its first line of output (imports, tokenizer, model, one forward);
peak RSS is the kernel's high-water mark of that process (wait4). "torch imported" says whether the
process imported torch at all (python -X importtime). Runs are interleaved (torch, onnx, onnx-int8, torch,
...) so that load from other processes spreads over all rows. Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNTIMES = ("torch", "onnx", "onnx-int8")
SENTENCE = b"Angela Merkel met Emmanuel Macron in Paris .\n"


def one_run(model_dir: Path, runtime: str) -> tuple[float, float, bool]:
    """(seconds to the first answer, peak RSS in MiB, whether torch was imported)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-X", "importtime", "-m", "ner.predict", str(model_dir), "--runtime", runtime,
               "--quiet"]
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: -X importtime writes more than a pipe holds
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env)
        proc.stdin.write(SENTENCE)
        proc.stdin.close()
        first = proc.stdout.readline()
        seconds = time.perf_counter() - start
        proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        stderr.seek(0)
        imports = stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0 or not first.startswith(b"{"):
        raise RuntimeError(f"{' '.join(command)} failed:\n{imports[-2000:]}")
    torch_imported = any(line.rstrip().endswith("| torch") for line in imports.splitlines())
    return seconds, usage.ru_maxrss / 1024, torch_imported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported folder with model.onnx and model.int8.onnx")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    args = parser.parse_args(argv)
    measured = {runtime: [] for runtime in args.runtimes}
    for _ in range(args.runs):
        for runtime in args.runtimes:
            measured[runtime].append(one_run(args.model_dir, runtime))
    base = statistics.median(s for s, _, _ in measured[args.runtimes[0]])
    print(f"| runtime | first answer s (each run) | median s | vs {args.runtimes[0]} | peak RSS MiB (each run) | "
          "torch imported |\n|---|---|---:|---:|---|---|")
    for runtime, runs in measured.items():
        median = statistics.median(s for s, _, _ in runs)
        print(f"| `--runtime {runtime}` | {', '.join(f'{s:.2f}' for s, _, _ in runs)} | {median:.2f} | "
              f"{median / base:.2f}x | {', '.join(f'{m:.0f}' for _, m, _ in runs)} | "
              f"{'yes' if any(t for _, _, t in runs) else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
