"""HTTP service over Tagger.predict: raw text in, entities with character offsets out.

    pip install -e ".[serve]"
    python -m ner.serve runs/ner/final                                  # http://127.0.0.1:8000/ in a browser
    curl -s localhost:8000/predict -d '{"text": "Angela Merkel met Emmanuel Macron in Paris."}'
    curl -s localhost:8000/predict -d '{"texts": ["Angela Merkel visited Paris.", "Nothing here."]}'
    curl -s localhost:8000/health                                       # liveness; /ready: readiness

POST /predict: {"text": "..."} -> {"entities": [...]}; {"texts": [...]} -> {"results": [{"entities": [...]}, ...]}.
Entities are those of `python -m ner.predict` on raw text: {"text", "type", "start", "end", "score"}, character
offsets, end exclusive. Requests that arrive within --max-wait-ms of each other share one forward pass (up
to --max-batch-texts texts and --max-batch-words words); each text is still tagged on its own, so an answer
does not depend on what shared its batch. Bad requests get {"error": "..."}: 422 (not JSON, wrong shape
or type), 413 (body over --max-request-bytes, more than --max-texts texts, a text over --max-text-chars).
Under load and faults (docs/serving.md): 503 + Retry-After when --max-queue texts wait already, 504 after
--request-timeout, 500 only for the request whose text made the model fail. SIGTERM or Ctrl-C: /ready turns
503, what fits in --shutdown-timeout is answered, the rest gets 503, and the process exits in time.
GET /health (liveness): the model, its labels and types, "in_flight", "queued_texts"; 503 once the
batcher has died (the process then exits 1). GET /ready (readiness): 200 once warmed up, else 503.
GET /openapi.json documents the bodies (ner/serving/api.py). GET /metrics: Prometheus text format; every answer
carries an X-Request-ID and gets one "ner.access" log line (ner/serving/metrics.py). --api-key (or NER_API_KEY):
POST /predict needs `Authorization: Bearer KEY`, and so does every Label Studio route that tags or trains
(--label-studio mounts them under /label-studio: ner/serving/label_studio.py). --cors-origin: pages served elsewhere
may call the API.
--workers N: N processes on one port, each with its own model and batcher; exit status 1 when one did not end cleanly.

    NER_API_KEY=s3cret python -m ner.serve runs/ner/final --workers 2 --cors-origin https://app.example.com
    curl -s localhost:8000/metrics | grep '^ner_requests_total'
"""


import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from ner.errors import UserError, cli
from ner.extras import install_hint
from ner.inference.options import add_model_arguments
from ner.process import log_to_stderr
from ner.serving.app import create_app
from ner.serving.lifecycle import ServeOptions
from ner.serving.requests import Limits
from ner.serving.workers import ARGV_ENV, mark_worker, run_workers

log = logging.getLogger("ner.serve")
API_KEY_ENV = "NER_API_KEY"


def check_port_free(host: str, port: int) -> None:
    """A taken port is a one-line error before the model loads, not a traceback from uvicorn."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise UserError(f"{host}:{port}: cannot listen there ({exc.strerror}); pass another --port or --host") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ner.serve", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="an exported model folder (OUTPUT_DIR/final)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine "
                        "only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    defaults = Limits()
    parser.add_argument("--max-request-bytes", type=int, default=defaults.max_request_bytes,
                        help="larger bodies get 413 (default: 1 MiB)")
    parser.add_argument("--max-texts", type=int, default=defaults.max_texts,
                        help=f"more texts in one request get 413 (default: {defaults.max_texts})")
    parser.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms,
                        help=f"how long a request waits to share a batch (default: {defaults.max_wait_ms})")
    parser.add_argument("--max-batch-texts", type=int, default=defaults.max_batch_texts,
                        help=f"texts per batch at most (default: {defaults.max_batch_texts})")
    parser.add_argument("--max-batch-words", type=int, default=defaults.max_batch_words,
                        help=f"words per batch; a larger request runs alone (default: {defaults.max_batch_words})")
    parser.add_argument("--max-queue", type=int, default=defaults.max_queue_texts,
                        help="texts waiting at most; a request that would pass it gets 503 with Retry-After at once "
                             f"(default: {defaults.max_queue_texts}; at least --max-texts)")
    parser.add_argument("--request-timeout", type=float, default=defaults.request_timeout_s,
                        help="seconds from arrival to answer; later gets 504 and its texts leave the queue "
                             f"(default: {defaults.request_timeout_s:g})")
    parser.add_argument("--max-text-chars", type=int, default=defaults.max_text_chars,
                        help=f"a longer text gets 413 (default: {defaults.max_text_chars:,})")
    options = ServeOptions()
    parser.add_argument("--max-concurrency", type=int, default=options.max_concurrency,
                        help="connections and requests at once; more get uvicorn's plain 503 "
                             f"(default: {options.max_concurrency})")
    parser.add_argument("--shutdown-timeout", type=float, default=options.shutdown_timeout_s,
                        help="seconds from SIGTERM to exit: what fits is answered, the rest gets 503 "
                             f"(default: {options.shutdown_timeout_s:g})")
    add_model_arguments(parser)
    add_operation_arguments(parser)
    return parser


def add_operation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"POST /predict and the Label Studio routes that tag or train then need "
                             f"'Authorization: Bearer KEY'; GET /, /health, /ready and /metrics stay open "
                             f"(default: ${API_KEY_ENV}, else none; the variable keeps the key out of `ps`)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="let pages from ORIGIN (e.g. https://app.example.com) call the API; repeatable")
    parser.add_argument("--label-studio", action="store_true",
                        help="also serve Label Studio's ML backend routes under /label-studio (predictions, "
                             "retraining: docs/label_studio.md); with --api-key they need the key too")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes serving the one port, each with its own model and batcher (default: 1); "
                             "each gets cores/N threads unless OMP_NUM_THREADS is set")


def limits_of(args) -> tuple[Limits, ServeOptions]:
    """The parsed options as Limits and ServeOptions, checked."""
    for flag, value in (("--max-queue", args.max_queue), ("--request-timeout", args.request_timeout),
                        ("--max-text-chars", args.max_text_chars), ("--max-concurrency", args.max_concurrency),
                        ("--shutdown-timeout", args.shutdown_timeout), ("--max-texts", args.max_texts)):
        if not value > 0:
            raise UserError(f"{flag} {value}: expected a number above 0")
    if args.max_queue < args.max_texts:
        raise UserError(f"--max-queue {args.max_queue} is below --max-texts {args.max_texts}: a request of "
                        "--max-texts texts could never be admitted")
    limits = Limits(max_wait_ms=args.max_wait_ms, max_batch_texts=args.max_batch_texts,
                    max_batch_words=args.max_batch_words, max_queue_texts=args.max_queue,
                    request_timeout_s=args.request_timeout, max_request_bytes=args.max_request_bytes,
                    max_texts=args.max_texts, max_text_chars=args.max_text_chars)
    return limits, ServeOptions(args.max_concurrency, args.shutdown_timeout)


def app_from_args(args: argparse.Namespace):
    """The model and the app the command line asks for."""
    from ner.inference.tagger import Tagger

    limits, options = limits_of(args)
    tagger = Tagger.from_args(args)
    return create_app(tagger, args.model_dir, limits, options, api_key=args.api_key or None,
                      cors_origins=args.cors_origin, label_studio=args.label_studio)


def configure_logging() -> None:
    log_to_stderr(logging.INFO)


def app_factory():
    """What each of uvicorn's --workers processes calls: its own model, batcher and app, from the command line
    main() left in NER_SERVE_ARGV. A user error stops every worker (uvicorn's startup-failure status) rather
    than having uvicorn restart a worker that fails the same way each time. Only a clean stop removes the
    worker's mark, so the parent exits 1 after any other end (run_workers)."""
    import json

    configure_logging()
    ended_cleanly = mark_worker()
    try:
        app = app_from_args(build_parser().parse_args(json.loads(os.environ[ARGV_ENV])))
    except UserError as exc:
        log.error("error: %s", exc)
        sys.exit(3)
    # a dead batcher ends this worker with status 1 (uvicorn's supervisor starts another): /health said 503

    def exit_failed(reason: str) -> None:
        app.state.metrics.process_ended()  # its queue gauge leaves the sum
        os._exit(1)

    app.state.lifecycle.on_failure = lambda reason: app.state.lifecycle.loop.call_later(0.5, exit_failed, reason)
    app.state.lifecycle.on_clean_stop = ended_cleanly
    return app


def server_config(app, args, options: ServeOptions):
    import uvicorn

    return uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                          limit_concurrency=options.max_concurrency,
                          timeout_graceful_shutdown=options.shutdown_timeout_s)


@cli
def main(argv: list[str] | None = None) -> int:
    """0 after a shutdown (uvicorn then re-raises SIGTERM: exit status 143); 1 when the batcher died."""
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: expected 0-65535")
    _, options = limits_of(args)  # checked before the model loads
    try:
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError:
        raise UserError("the server needs FastAPI, uvicorn and prometheus-client: "
                        f"{install_hint('fastapi', 'uvicorn', 'prometheus_client')}") from None
    if args.workers < 1:
        raise UserError(f"--workers {args.workers}: expected 1 or more")
    check_port_free(args.host, args.port)
    configure_logging()
    if args.workers > 1:
        return run_workers(args, sys.argv[1:] if argv is None else argv, options)
    app = app_from_args(args)
    server = uvicorn.Server(server_config(app, args, options))

    def stop(reason: str) -> None:  # a supervisor (systemd, Kubernetes) restarts a process that exits non-zero
        server.should_exit = True

    app.state.lifecycle.on_failure = stop
    log.info("serving %s on http://%s:%d/", args.model_dir, args.host, args.port)
    server.run()
    if app.state.lifecycle.failure is not None:
        log.error("exiting with status 1: %s", app.state.lifecycle.failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
