"""`python -m ner.serve --workers N`: N uvicorn processes on one port, each building its app from the command line."""

import argparse
import logging
import os

from ner.errors import UserError
from ner.serving.lifecycle import ServeOptions

log = logging.getLogger("ner.serve")

ARGV_ENV = "NER_SERVE_ARGV"  # main's command line, for each --workers process (app_factory)


def run_workers(args: argparse.Namespace, argv: list[str], options: ServeOptions) -> int:
    """N uvicorn worker processes on one socket. Each runs its model on cores/N threads (OMP_NUM_THREADS, read
    by torch and by the ONNX runtimes): N processes each taking every core would fight over them. The
    workers' metrics meet in a PROMETHEUS_MULTIPROC_DIR made here and removed on exit (one given is kept)."""
    import json
    import shutil
    import tempfile
    import uuid

    import uvicorn

    from ner.serving.label_studio import SESSION_ENV
    from ner.serving.metrics import MULTIPROC_ENV

    if not (args.model_dir / "config.json").is_file():  # before N workers each fail on it
        raise UserError(f"{args.model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
    made_dir = None if MULTIPROC_ENV in os.environ else tempfile.mkdtemp(prefix="ner-serve-metrics-")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, cores // args.workers)))
    env = {ARGV_ENV: json.dumps(argv), SESSION_ENV: uuid.uuid4().hex, "OMP_NUM_THREADS": threads}
    if made_dir is not None:
        env[MULTIPROC_ENV] = made_dir
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the workers are spawned: they start from this environment
    try:
        log.info("serving %s on http://%s:%d/ with %d workers, %s threads each", args.model_dir, args.host,
                 args.port, args.workers, env["OMP_NUM_THREADS"])
        uvicorn.run("ner.serve:app_factory", factory=True, workers=args.workers, host=args.host, port=args.port,
                    log_level="warning", limit_concurrency=options.max_concurrency,
                    timeout_graceful_shutdown=options.shutdown_timeout_s)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
    return 0
