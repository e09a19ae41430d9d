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
--workers N: N processes on one port, each with its own model and batcher.

    NER_API_KEY=s3cret python -m ner.serve runs/ner/final --workers 2 --cors-origin https://app.example.com
    curl -s localhost:8000/metrics | grep '^ner_requests_total'
"""


import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path

from ner.errors import UserError, cli, log_to_stderr
from ner.inference.options import add_model_arguments
from ner.serving.batcher import (
    BatcherEvents,
    BatchLimits,
    ClientGone,
    Draining,
    MicroBatcher,
    Overloaded,
    TextFailed,
    TimedOut,
)

log = logging.getLogger("ner.serve")
MIB = 1024 * 1024
WARM_UP_TEXT = "Ada Lovelace met Charles Babbage in London."
API_KEY_ENV = "NER_API_KEY"
ARGV_ENV = "NER_SERVE_ARGV"  # main's command line, for each --workers process (app_factory)


@dataclass
class Limits(BatchLimits):
    """What one request may ask (the batching and queue limits are BatchLimits')."""

    max_request_bytes: int = MIB
    max_texts: int = 256
    max_text_chars: int = 100_000  # about 17 s of the CoNLL MiniLM on 2 cores: under --request-timeout


@dataclass
class ServeOptions:
    """How the process stops taking work (uvicorn's settings, which the app must know to drain in time)."""

    max_concurrency: int | None = 256  # connections and requests at once (uvicorn's limit_concurrency)
    shutdown_timeout_s: float | None = 20.0  # SIGTERM to exit (uvicorn's timeout_graceful_shutdown)

    def drain_budget_s(self) -> float | None:
        """Seconds after SIGTERM during which batches may still start: the deadline less a margin in which the
        refused requests are answered, uvicorn closes their connections and the process exits."""
        if self.shutdown_timeout_s is None:
            return None
        return self.shutdown_timeout_s - min(1.0, self.shutdown_timeout_s / 4)


class Lifecycle:
    """Liveness and readiness: ready after the warm-up pass; draining from SIGTERM; failed when the batcher died.

    `on_failure` is how the process stops itself after a failure (main sets it to stop uvicorn and exit 1)."""

    def __init__(self, batcher: MicroBatcher, options: ServeOptions) -> None:
        self.batcher = batcher
        self.options = options
        self.ready = False
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.on_failure: Callable[[str], None] | None = None
        batcher.on_failure = self._failed

    @property
    def failure(self) -> str | None:
        return self.batcher.failure

    def _failed(self, reason: str) -> None:
        if self.on_failure is not None:
            self.on_failure(reason)

    def begin_drain(self) -> None:
        """From any thread or a signal handler: stop being ready, finish what fits the deadline, refuse the rest."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("draining: %d texts queued, %s s to finish", self.batcher.queued_texts(),
                     self.options.shutdown_timeout_s)
            self.batcher.drain(self.options.drain_budget_s())

    async def warm_up(self) -> None:
        try:
            await self.batcher.warm_up(WARM_UP_TEXT)
        except Exception as exc:  # a model that cannot tag one sentence will not serve: stop, exit non-zero
            log.exception("the warm-up pass failed")
            self.batcher.failure = f"the warm-up pass failed ({exc!r})"
            self._failed(self.batcher.failure)
            return
        self.ready = True
        log.info("ready: model loaded and warmed up")

    def readiness(self) -> tuple[int, dict]:
        if self.failure is not None:
            return 503, {"status": "failed", "error": self.failure}
        if self.draining:
            return 503, {"status": "draining", "error": "shutting down; send requests elsewhere"}
        if not self.ready:
            return 503, {"status": "starting", "error": "the model is warming up"}
        return 200, {"status": "ready"}


@contextmanager
def drain_on_signals(lifecycle: Lifecycle):
    """SIGTERM / SIGINT start the drain, then go on to the handler in place (uvicorn's: stop accepting, wait up to
    --shutdown-timeout for the requests in flight). Installed from the app so that it holds with any server."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig, frame):
        lifecycle.begin_drain()
        if callable(previous[sig]):
            previous[sig](sig, frame)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over `limit` bytes, without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body is {declared} bytes; the limit is {limit} (--max-request-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(413, f"request body is over {limit} bytes (--max-request-bytes)")
    return bytes(body)


def parse_texts(body: bytes, max_texts: int, max_text_chars: int | None = None) -> tuple[list[str], bool]:
    """(texts, whether the request sent one "text") from {"text": str} or {"texts": [str, ...]}."""
    import json

    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(422, f"body is not JSON ({exc}); send {{\"text\": \"...\"}} or {{\"texts\": [...]}}") from None
    if not isinstance(payload, dict) or len(payload) != 1 or not ({"text", "texts"} & payload.keys()):
        raise BadRequest(422, 'expected an object with exactly one key: "text" (a string) or "texts" (strings)')
    single = "text" in payload
    texts = [payload["text"]] if single else payload["texts"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest(422, '"text" must be a string and "texts" a list of strings')
    check_texts(texts, max_texts, max_text_chars)
    return texts, single


def check_texts(texts: list[str], max_texts: int, max_text_chars: int | None = None) -> None:
    """413 for more than `max_texts` texts or a text over `max_text_chars`; 422 for a lone surrogate."""
    if len(texts) > max_texts:
        raise BadRequest(413, f"{len(texts)} texts in one request; the limit is {max_texts} (--max-texts)")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(422, f"text {i} holds a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None
        if max_text_chars is not None and len(text) > max_text_chars:
            raise BadRequest(413, f"text {i} has {len(text)} characters; the limit is {max_text_chars} "
                                  "(--max-text-chars): send it in parts")


def health_info(tagger, model_dir: Path) -> dict:
    """What /health reports: the folder, the encoder it was fine-tuned from, the labels and entity types."""
    import json

    from ner.data.examples import entity_types

    labels = [tagger.id2label[i] for i in sorted(tagger.id2label)]
    args_file = model_dir / "training_args.json"
    base = json.loads(args_file.read_text(encoding="utf-8")).get("model") if args_file.is_file() else None
    return {"status": "ok", "model": str(model_dir), "base_model": base, "labels": labels,
            "types": entity_types(labels), "pid": os.getpid()}


def create_app(tagger, model_dir: Path, limits: Limits = Limits(), options: ServeOptions = ServeOptions(),
               events: BatcherEvents | None = None, *, api_key: str | None = None, cors_origins: Sequence[str] = (),
               label_studio: bool = False):
    """The FastAPI app: GET / (the page), GET /health, GET /ready, POST /predict, GET /metrics, GET /openapi.json;
    errors are {"error": ...}. app.state.batcher and app.state.lifecycle are its batcher and its readiness. With
    `api_key`, POST /predict needs `Authorization: Bearer <api_key>`. `events`: the batcher's listener (default:
    the app's Prometheus metrics). `label_studio`: mount Label Studio's ML backend routes under /label-studio."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse

    from ner.serving.api import bearer_key_check, health_openapi, predict_openapi, ready_openapi
    from ner.serving.metrics import ServeMetrics

    metrics = ServeMetrics()
    batcher = MicroBatcher(tagger.predict, limits, events or metrics)
    metrics.queued_texts = batcher.queued_texts
    lifecycle = Lifecycle(batcher, options)

    @asynccontextmanager
    async def lifespan(app):
        lifecycle.loop = asyncio.get_running_loop()
        batcher.start()
        warm_up = asyncio.create_task(lifecycle.warm_up())  # not awaited: /health answers, /ready says starting
        watch = asyncio.create_task(app.state.label_studio.retrainer.watch()) if label_studio else None
        with drain_on_signals(lifecycle):
            yield
        warm_up.cancel()
        if watch is not None:
            watch.cancel()
            await app.state.label_studio.retrainer.stop()  # no ner.train outlives the server
        await batcher.stop()  # uvicorn has answered the requests in flight by now
        metrics.process_ended()

    app = FastAPI(title="ner", lifespan=lifespan, docs_url=None, redoc_url=None)  # the docs pages load a CDN
    page = resources.files("ner").joinpath("static/index.html").read_text(encoding="utf-8")
    info = health_info(tagger, model_dir)
    add_error_handlers(app)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/health", **health_openapi())
    async def health():
        """Liveness: 200 while the process can serve (also while starting and draining); 503 once it cannot."""
        state = {**info, "in_flight": in_flight[0], "queued_texts": batcher.queued_texts(),
                 "ready": lifecycle.readiness()[0] == 200, "draining": lifecycle.draining}
        if lifecycle.failure is not None:
            return JSONResponse({**state, "status": "failed", "error": lifecycle.failure}, status_code=503)
        return state

    @app.get("/ready", **ready_openapi())
    async def ready():
        """Readiness: 200 once the warm-up pass has run, 503 while starting, draining or failed."""
        status, body = lifecycle.readiness()
        return JSONResponse(body, status_code=status)

    in_flight = [0]  # /predict requests received and not yet answered: what a drain waits for

    @app.post("/predict", **predict_openapi(limits.max_texts, api_key is not None, limits.max_text_chars),
              dependencies=[Depends(bearer_key_check(api_key))] if api_key is not None else [])
    async def predict(request: Request):
        in_flight[0] += 1
        try:
            return await answer(request)
        finally:
            in_flight[0] -= 1

    async def answer(request):
        batcher.check_open()  # a full queue answers 503 before the body is read
        texts, single = parse_texts(await read_body(request, limits.max_request_bytes), limits.max_texts,
                                    limits.max_text_chars)
        request.state.texts = len(texts)  # for the access log
        results = await batcher.submit(texts, request.is_disconnected) if texts else []
        return results[0] if single else {"results": results}

    add_operations(app, metrics, cors_origins)
    app.state.batcher = batcher
    app.state.lifecycle = lifecycle
    app.state.metrics = metrics
    app.state.label_studio = mount_label_studio(app, batcher, tagger, model_dir, info["types"], limits,
                                                api_key) if label_studio else None
    return app


def mount_label_studio(app, batcher: MicroBatcher, tagger, model_dir: Path, types: list[str], limits: Limits,
                       api_key: str | None):
    """Label Studio's ML backend protocol under /label-studio (docs/label_studio.md), sharing the batcher and the
    limits; every route that tags or trains needs the key. Retraining swaps in models loaded as `tagger` was."""
    from fastapi import Depends

    from ner.serving import label_studio
    from ner.serving.api import label_studio_key_check, label_studio_openapi

    backend = label_studio.Backend(batcher.submit, model_dir, types,
                                   swap_predict=lambda new: setattr(batcher, "predict", new.predict),
                                   check_texts=lambda texts: check_texts(texts, limits.max_texts,
                                                                         limits.max_text_chars),
                                   load_tagger=getattr(tagger, "like", None))
    guard = [Depends(label_studio_key_check(api_key))] if api_key is not None else []
    app.include_router(label_studio.router(backend, guard, partial(read_body, limit=limits.max_request_bytes),
                                           openapi=label_studio_openapi(api_key is not None)),
                       prefix=label_studio.PREFIX)
    return backend


def add_operations(app, metrics, cors_origins: Sequence[str]) -> None:
    """GET /metrics (open even with an API key: counts and timings, never text), CORS for pages served from
    `cors_origins`, and outermost the request log (ids, access log, request metrics)."""
    from fastapi import Response
    from starlette.middleware.cors import CORSMiddleware

    from ner.serving.api import metrics_openapi
    from ner.serving.metrics import CONTENT_TYPE, RequestLog

    @app.get("/metrics", response_class=Response, **metrics_openapi())
    async def scrape() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["X-Request-ID", "Retry-After"], max_age=600)
    app.add_middleware(RequestLog, metrics=metrics)  # added last: outermost


# what each batcher exception answers: status, and whether it says when to come back
BATCHER_ERRORS = {Overloaded: 503, Draining: 503, TimedOut: 504, TextFailed: 500, ClientGone: 499}


def add_error_handlers(app) -> None:
    """Every error as {"error": "..."}: bad requests, HTTP errors, validation, and the batcher's refusals."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(BadRequest)
    async def bad_request(request, exc: BadRequest):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return JSONResponse({"error": str(exc.errors())}, status_code=422)

    async def refused(request, exc: Exception):
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
        return JSONResponse({"error": str(exc)}, status_code=BATCHER_ERRORS[type(exc)], headers=headers)

    for kind in BATCHER_ERRORS:
        app.add_exception_handler(kind, refused)


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
    than having uvicorn restart a worker that fails the same way each time."""
    import json

    configure_logging()
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
        raise UserError('the server needs FastAPI, uvicorn and prometheus-client: pip install -e ".[serve]"') from None
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


if __name__ == "__main__":
    sys.exit(main())
