"""Start-up costs: `ner.predict`'s first answer per runtime, and the fixed cost of `ner.train` per phase.

    python -m ner.export runs/final runs/final_onnx --onnx --quantize int8
    python -m benchmarks.startup runs/final_onnx --runs 3            # torch vs onnx vs onnx-int8
    python -m benchmarks.startup --train --runs 5                    # ner.train on the shipped sample, per phase
    python -m benchmarks.startup --train --runs 5 --against ../old   # the same, interleaved with another checkout

Predict: each run is a fresh `python -m ner.predict MODEL --runtime R` tagging one sentence from stdin: "first
answer" is the time from starting the process to its first line of output (imports, tokenizer, model, one forward);
peak RSS is the kernel's high-water mark of that process (wait4). "torch imported" says whether the process
imported torch at all (python -X importtime). Runs are interleaved (torch, onnx, onnx-int8, torch, ...) so that
load from other processes spreads over all rows.

Train: each run is a fresh `python -m ner.train` on the shipped sample (defaults, `--max-steps 5 --logging-steps 1`,
a cold tokenisation cache of its own), in a process that stamps the time at each phase boundary (probe_train below;
the command itself is unchanged). The fixed cost is process start to the end of the first update plus the end of the
last update to the process's exit; the updates between are the loop. `--against DIR` runs DIR's `ner` the same way,
alternating with this checkout's, for a before/after table. Beside them runs the floor: a process that imports torch and
transformers, loads the same tokenizer and model with `from_pretrained` and exits at once (`os._exit`), which any
trainer built on transformers pays before its first batch; the table gives the fixed cost above it. Results:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = b"Angela Merkel met Emmanuel Macron in Paris .\n"
PHASES_ENV = "NER_STARTUP_PHASES"  # where probe_train writes its time stamps
# probe_train, loaded from this file by path: with `--against`, the measured checkout's own `benchmarks` may lack it.
PROBE = ("import importlib.util as u; s = u.spec_from_file_location('ner_startup_probe', {path!r}); "
         "m = u.module_from_spec(s); s.loader.exec_module(m); m.probe_train()")
# (phase, the stamp that ends it); each phase starts where the one before it ends.
START_UP = (("interpreter, imports", "imports"), ("config, data, tokenise", "data"), ("model load", "model"),
            ("optimizer, first update", "first_update"))
# The floor, run by `python -c` with the model's folder as its argument: nothing of ner is imported.
FLOOR = ("import os, sys, torch; from transformers import AutoModelForTokenClassification, AutoTokenizer; "
         "AutoTokenizer.from_pretrained(sys.argv[1]); "
         "AutoModelForTokenClassification.from_pretrained(sys.argv[1], num_labels=9); os._exit(0)")
TEAR_DOWN = (("final evaluation", "checkpoint_start"), ("checkpoint", "checkpoint_end"),
             ("test, predictions file", "export_start"), ("export", "export_end"), ("plots, summary", "finish"),
             ("exit", "exit"))


# --------------------------------------------------------------------------- ner.predict: first answer


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


def predict_section(args: argparse.Namespace) -> None:
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


# --------------------------------------------------------------------------- ner.train: phases


def probe_train() -> None:
    """In the measured process: `python -m ner.train` (the args after -c) with time stamps at the phase boundaries,
    written to $NER_STARTUP_PHASES at exit (atexit, so a command that ends without the interpreter's teardown still
    writes them). Registered before anything else, the writer runs after every other exit handler."""
    stamps: dict = {"calls": {}}
    atexit.register(lambda: Path(os.environ[PHASES_ENV]).write_text(json.dumps(stamps)))
    import ner.train

    stamps["imports"] = time.time()
    from ner.training import hooks, run

    for owner, name in ((run, "prepare_data"), (run, "build_model"), (hooks.RunHooks, "save"),
                        (run, "export_checkpoint"), (run, "finish")):
        setattr(owner, name, timed(getattr(owner, name), stamps["calls"].setdefault(name, [])))
    runpy.run_path(ner.train.__file__, run_name="__main__")  # as `python -m ner.train` runs it, exit included


def timed(function, calls: list):
    """`function`, appending [start, end] of each call to `calls`."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        calls.append([time.time(), None])
        try:
            return function(*args, **kwargs)
        finally:
            calls[-1][1] = time.time()
    return wrapper


def train_run(checkout: Path, work: Path, extra: list[str]) -> dict:
    """One measured `ner.train` process from `checkout`; its phase boundaries in seconds from process start."""
    from benchmarks.measure import run_measured

    work.mkdir(parents=True)
    stamps_path = work / "stamps.json"
    argv = [sys.executable, "-c", PROBE.format(path=str(Path(__file__).resolve())), "--output-dir", str(work / "run"),
            "--tokenization-cache", str(work / "cache"), "--max-steps", "5", "--logging-steps", "1", *extra]
    measured = run_measured(argv, work / "log.txt", cwd=checkout, env={PHASES_ENV: str(stamps_path)})
    updates = [r["time"] for r in map(json.loads, (work / "run" / "metrics.jsonl").read_text().splitlines())
               if "loss" in r]
    return {"bounds": boundaries(json.loads(stamps_path.read_text()), updates, measured), "updates": len(updates),
            "other_cpu_s": measured["other_cpu_s"], "wall_s": measured["wall_s"]}


def boundaries(stamps: dict, updates: list[float], measured: dict) -> dict[str, float]:
    """Seconds from process start to each phase boundary (clock times of the stamps and metrics.jsonl)."""
    calls, start = stamps["calls"], measured["start_time"]
    saves = [call for call in calls["save"] if call[0] >= updates[-1]] or [[updates[-1], updates[-1]]]
    clock = {"imports": stamps["imports"], "data": calls["prepare_data"][-1][1], "model": calls["build_model"][-1][1],
             "first_update": updates[0], "last_update": updates[-1], "checkpoint_start": saves[0][0],
             "checkpoint_end": saves[-1][1], "export_start": calls["export_checkpoint"][-1][0],
             "export_end": calls["export_checkpoint"][-1][1], "finish": calls["finish"][-1][1],
             "exit": start + measured["wall_s"]}
    return {name: t - start for name, t in clock.items()}


def floor_run(work: Path, train_args: list[str]) -> float:
    """Seconds of one floor process (FLOOR) on the model the measured runs train: --model in `train_args`, else
    ner.train's default."""
    from benchmarks.measure import run_measured
    from ner.training.config import DEFAULT_MODEL
    from ner.training.model import resolve_model_path

    model_flag = argparse.ArgumentParser(add_help=False)
    model_flag.add_argument("--model", default=DEFAULT_MODEL)
    argv = [sys.executable, "-c", FLOOR, resolve_model_path(model_flag.parse_known_args(train_args)[0].model)]
    return run_measured(argv, work / "floor_log.txt", cwd=work)["wall_s"]


def phase_seconds(bounds: dict[str, float]) -> dict[str, float]:
    """Each phase's length, the loop's, and the fixed cost (start-up + tear-down)."""
    phases, previous = {}, 0.0
    for name, end in START_UP:
        phases[name], previous = bounds[end] - previous, bounds[end]
    previous = bounds["last_update"]
    for name, end in TEAR_DOWN:
        phases[name], previous = bounds[end] - previous, bounds[end]
    phases["start-up"] = bounds["first_update"]
    phases["tear-down"] = bounds["exit"] - bounds["last_update"]
    phases["fixed cost"] = phases["start-up"] + phases["tear-down"]
    phases["loop (updates 2..N)"] = bounds["last_update"] - bounds["first_update"]
    return phases


def train_section(args: argparse.Namespace) -> None:
    from benchmarks.measure import cpu_description

    checkouts = {"this checkout": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    runs, floors = {name: [] for name in checkouts}, []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="startup_") as tmp:
        for index in range(args.runs):
            floors.append(floor_run(Path(tmp), args.train_args))
            for name, checkout in checkouts.items():
                result = train_run(checkout, Path(tmp) / f"{name.replace(' ', '_')}_{index}", args.train_args)
                runs[name].append(result)
                print(f"  {name} run {index + 1}: fixed cost {phase_seconds(result['bounds'])['fixed cost']:.2f} s",
                      file=sys.stderr, flush=True)
    print(f"CPU: {cpu_description()}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"other processes took {other_load(runs):.0%} of the CPU time; median of {args.runs} runs each\n")
    print(phase_table(runs))
    print(floor_line(runs, floors))


def floor_line(runs: dict[str, list[dict]], floors: list[float]) -> str:
    floor = statistics.median(floors)
    fixed = {name: statistics.median(phase_seconds(r["bounds"])["fixed cost"] for r in results)
             for name, results in runs.items()}
    above = ", ".join(f"{name} {seconds - floor:.2f} s" for name, seconds in fixed.items())
    return (f"\nFloor (torch and transformers imported, tokenizer and model loaded, nothing else): {floor:.2f} s "
            f"median ({', '.join(f'{s:.2f}' for s in floors)}); fixed cost above it: {above}")


def other_load(runs: dict[str, list[dict]]) -> float:
    every = [r for results in runs.values() for r in results]
    return sum(r["other_cpu_s"] for r in every) / ((os.cpu_count() or 1) * sum(r["wall_s"] for r in every))


def phase_table(runs: dict[str, list[dict]]) -> str:
    names = list(runs)
    per_run = {name: [phase_seconds(r["bounds"]) for r in results] for name, results in runs.items()}
    header = " | ".join(f"{name}: median s (each run)" for name in names)
    lines = [f"| phase | {header} |" + (" ratio |" if len(names) == 2 else ""),
             "|---|" + "---|" * len(names) + ("---:|" if len(names) == 2 else "")]
    for phase in per_run[names[0]][0]:
        medians = [statistics.median(p[phase] for p in per_run[name]) for name in names]
        cells = [f"{m:.2f} ({', '.join(f'{p[phase]:.2f}' for p in per_run[name])})" for m, name in zip(medians, names)]
        ratio = [f"{medians[0] / medians[1]:.2f}x" if medians[1] > 0 else "-"] if len(names) == 2 else []
        lines.append(f"| {phase} | " + " | ".join(cells + ratio) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    # imported here: probe_train loads this file inside the measured process, whose checkout may lack them
    from ner.inference.runtimes import ONNX, ONNX_INT8, TORCH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, nargs="?", help="exported folder with model.onnx and "
                        "model.int8.onnx (ner.predict's start-up; not with --train)")
    parser.add_argument("--runs", type=int, default=3)
    runtimes = (TORCH, ONNX, ONNX_INT8)  # the runtimes ner.predict can start without OpenVINO
    parser.add_argument("--runtimes", nargs="+", choices=runtimes, default=list(runtimes))
    parser.add_argument("--train", action="store_true", help="measure ner.train's fixed cost per phase instead")
    parser.add_argument("--against", type=Path, help="with --train: another checkout (its root), run alternately")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="with --train: more ner.train flags (last on the line)")
    args = parser.parse_args(argv)
    if args.train == (args.model_dir is not None):
        parser.error("give MODEL_DIR (ner.predict) or --train, one of them")
    train_section(args) if args.train else predict_section(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
