"""`python -m ner.serve --workers N`: N uvicorn processes on one port, each building its app from the command line;
the command exits 1 when a worker did not end cleanly."""

import argparse
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ner.errors import UserError
from ner.files import made_here, remove_recorded
from ner.serving.lifecycle import ServeOptions

log = logging.getLogger("ner.serve")

ARGV_ENV = "NER_SERVE_ARGV"  # main's command line, for each --workers process (app_factory)
MARKS_ENV = "NER_SERVE_WORKER_MARKS"  # a folder of one file per worker, removed when that worker ends cleanly


def run_workers(args: argparse.Namespace, argv: list[str], options: ServeOptions) -> int:
    """N uvicorn worker processes on one socket; 0 when every worker ended cleanly, else 1. uvicorn's supervisor
    returns the same way whether it was stopped or its workers failed to start, and it restarts a worker that
    died: each worker's mark (mark_worker) is how this process tells them apart."""
    import uvicorn

    if not (args.model_dir / "config.json").is_file():  # before N workers each fail on it
        raise UserError(f"{args.model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
    with workers_environment(args.workers, argv) as marks_dir:
        log.info("serving %s on http://%s:%d/ with %d workers, %s threads each", args.model_dir, args.host,
                 args.port, args.workers, os.environ["OMP_NUM_THREADS"])
        uvicorn.run("ner.serve:app_factory", factory=True, workers=args.workers, host=args.host, port=args.port,
                    log_level="warning", limit_concurrency=options.max_concurrency,
                    timeout_graceful_shutdown=options.shutdown_timeout_s)
        failed = sorted(mark.name for mark in marks_dir.iterdir())
    if failed:
        log.error("worker process(es) %s did not end cleanly (their errors are above); exiting with status 1",
                  ", ".join(failed))
        return 1
    return 0


@contextmanager
def workers_environment(workers: int, argv: list[str]) -> Iterator[Path]:
    """The environment the spawned workers start from, restored afterwards; yields the marks folder. Each worker
    runs its model on cores/N threads (OMP_NUM_THREADS, read by torch and by the ONNX and OpenVINO runtimes,
    ner/inference/cpu_threads.py): N processes each taking every core would fight over them. The workers' metrics
    meet in a PROMETHEUS_MULTIPROC_DIR made here (one given is kept); the folders made here are removed."""
    import json
    import tempfile
    import uuid

    from ner.serving.label_studio import SESSION_ENV
    from ner.serving.metrics import MULTIPROC_ENV

    marks_dir = tempfile.mkdtemp(prefix="ner-serve-workers-")
    metrics_dir = None if MULTIPROC_ENV in os.environ else tempfile.mkdtemp(prefix="ner-serve-metrics-")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env = {ARGV_ENV: json.dumps(argv), SESSION_ENV: uuid.uuid4().hex, MARKS_ENV: marks_dir,
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, cores // workers)))}
    if metrics_dir is not None:
        env[MULTIPROC_ENV] = metrics_dir
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the workers are spawned: they start from this environment
    try:
        yield Path(marks_dir)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        for folder in (marks_dir, metrics_dir):
            if folder is not None:  # made here by mkdtemp, written by this server alone: removed whole
                remove_recorded(Path(folder), made_here(Path(folder)), whole=True)


def mark_worker() -> Callable[[], None]:
    """In a --workers process: a file named by its pid in the marks folder, left by any end but a clean one (a
    user error at start, a dead batcher's exit 1, a kill); returns what removes it at a clean end."""
    mark = Path(os.environ[MARKS_ENV]) / str(os.getpid())
    mark.write_text("running\n", encoding="utf-8")

    def ended_cleanly() -> None:
        remove_recorded(mark.parent, {mark.name: {}})

    return ended_cleanly
