"""Repeat a two-process corpus run under CPU load and count the runs that end cleanly.

    python scripts/soak_two_processes.py MODEL_DIR --runs 100 --busy 2 --out soak_out/

Each run is `torchrun --standalone --nproc_per_node=2 -m ner.predict MODEL_DIR a.txt b.txt --output-dir OUT
--chunk-texts 3 --merge` on 11 short texts (the shape of tests/test_corpus.py's two-process tests), with
OMP_NUM_THREADS=1 per process and `--busy` Python processes spinning beside it the whole time. A run is clean
when it exits 0, its stderr holds no "terminate called" / "core dumped" / "Traceback", and its merged output
is byte-identical to the first run's. Every unclean run's stderr is kept in OUT/failed-N.txt. Bounded: at most
--runs runs, and no run past --limit-s seconds of the whole soak.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TEXTS = ["Angela Merkel met Emmanuel Macron in Paris .", "Siemens opened a plant in Shanghai .",
         "John Smith works for Acme Corp in Boston .", "The United Nations met in Geneva on Monday .",
         "Maria Santos joined Harper Logistics in Lisbon .", "Rome beat Milan 2-1 .",
         "Shares of Apple rose in New York .", "Tokyo and Osaka saw rain .",
         "Ada Lovelace wrote about the Analytical Engine .", "The Red Cross sent aid to Haiti .",
         "Berlin is the capital of Germany ."]
SIGNS_OF_AN_UNCLEAN_END = ("terminate called", "core dumped", "Traceback")


def spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def one_run(model_dir: Path, inputs: list[Path], out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "ner.predict", str(model_dir), *map(str, inputs), "--output-dir", str(out), "--chunk-texts", "3",
               "--merge", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside every run")
    parser.add_argument("--limit-s", type=float, default=3600, help="start no run after this many seconds")
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out}: exists; pass a new folder")
    args.out.mkdir(parents=True)
    inputs = [args.out / "a.txt", args.out / "b.txt"]
    inputs[0].write_text("\n".join(TEXTS[:7]) + "\n", encoding="utf-8")
    inputs[1].write_text("\n".join(TEXTS[7:]) + "\n", encoding="utf-8")
    spinners = [spin() for _ in range(args.busy)]
    clean, reference, start, done = 0, None, time.monotonic(), 0
    try:
        while done < args.runs and time.monotonic() - start < args.limit_s:
            run_dir = args.out / "run"
            result = one_run(args.model_dir, inputs, run_dir)
            merged = (run_dir / "predictions.jsonl").read_bytes() if result.returncode == 0 else None
            reference = reference if reference is not None else merged
            ok = (result.returncode == 0 and merged == reference
                  and not any(sign in result.stderr for sign in SIGNS_OF_AN_UNCLEAN_END))
            clean += ok
            done += 1
            if not ok:
                (args.out / f"failed-{done}.txt").write_text(f"exit {result.returncode}\n{result.stderr}")
            shutil.rmtree(run_dir, ignore_errors=True)
            print(f"run {done}: {'clean' if ok else 'UNCLEAN'} ({clean}/{done} clean)", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
    print(f"{clean} of {done} two-process runs ended cleanly beside {args.busy} busy loops, "
          f"{time.monotonic() - start:.0f} s")
    return 0 if clean == done else 1


if __name__ == "__main__":
    sys.exit(main())
