"""HTTP service over Tagger.predict: raw text in, entities with character offsets out.

    pip install -e ".[serve]"
    python -m ner.serve runs/ner/final                                  # http://127.0.0.1:8000/ in a browser
    curl -s localhost:8000/predict -d '{"text": "Angela Merkel met Emmanuel Macron in Paris."}'
    curl -s localhost:8000/predict -d '{"texts": ["Angela Merkel visited Paris.", "Nothing here."]}'
    curl -s localhost:8000/health

POST /predict: {"text": "..."} -> {"entities": [...]}; {"texts": [...]} -> {"results": [{"entities": [...]}, ...]}.
Entities are those of `python -m ner.predict` on raw text: {"text", "type", "start", "end", "score"}, character
offsets, end exclusive. Requests that arrive within --max-wait-ms of each other share one forward pass (up
to --max-batch-texts texts and --max-batch-words words); each text is still tagged on its own, so an answer
does not depend on what shared its batch. Bad requests get {"error": "..."}: 422 (not JSON, wrong shape
or type), 413 (body over --max-request-bytes, or more than --max-texts texts). SIGTERM or Ctrl-C stops
taking new connections, answers the requests in flight, then exits. GET /health: the model, its labels and
types, "in_flight" (requests received, not yet answered) and the answering "pid". GET /openapi.json documents
the bodies (ner/serve_api.py). GET /metrics: Prometheus text format; every answer carries an X-Request-ID and
gets one "ner.access" log line (ner/serve_metrics.py). --api-key (or NER_API_KEY): POST /predict needs
`Authorization: Bearer KEY`. --cors-origin: pages served elsewhere may call the API. --workers N: N processes
on one port, each with its own model and batcher.

    NER_API_KEY=s3cret python -m ner.serve runs/ner/final --workers 2 --cors-origin https://app.example.com
    curl -s localhost:8000/metrics | grep '^ner_requests_total'
"""


import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ner.config import add_model_arguments
from ner.errors import UserError, cli
from ner.text import split_words

log = logging.getLogger("ner.serve")
MIB = 1024 * 1024
API_KEY_ENV = "NER_API_KEY"
ARGV_ENV = "NER_SERVE_ARGV"  # main's command line, for each --workers process (app_factory)


@dataclass
class Limits:
    max_request_bytes: int = MIB
    max_texts: int = 256
    max_wait_ms: float = 5.0
    max_batch_texts: int = 64
    max_batch_words: int = 8192


@dataclass
class _Pending:
    texts: list[str]
    words: int
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """Gathers the texts of concurrent requests for a few milliseconds and tags them in one call.

    The model runs in one worker thread, so the event loop keeps accepting requests meanwhile."""

    def __init__(self, predict, limits: Limits, events=None) -> None:
        self.predict = predict
        self.limits = limits
        self.events = events  # ner.serve_metrics.ServeMetrics: told of each batch
        self.waiting_texts = 0
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner-model")
        self.task: asyncio.Task | None = None
        self.held: _Pending | None = None  # arrived when the batch was full: first in the next one
        self.closed = False  # checked as well as cancel(): _next may absorb a cancel that races a completion

    async def submit(self, texts: list[str]) -> list[dict]:
        words = sum(len(split_words(t)) for t in texts)
        pending = _Pending(texts, words, asyncio.get_running_loop().create_future())
        self.waiting_texts += len(texts)
        await self.queue.put(pending)
        return await pending.future

    def queued_texts(self) -> int:
        return self.waiting_texts

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.executor.shutdown(wait=True)

    async def _gather(self) -> list[_Pending]:
        first = self.held or await self.queue.get()
        self.held = None
        batch, texts, words = [first], len(first.texts), first.words
        deadline = asyncio.get_running_loop().time() + self.limits.max_wait_ms / 1000
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            item = await self._next(remaining)
            if item is None:
                break
            limits = self.limits
            if texts + len(item.texts) > limits.max_batch_texts or words + item.words > limits.max_batch_words:
                self.held = item
                break
            batch.append(item)
            texts, words = texts + len(item.texts), words + item.words
        return batch

    async def _next(self, timeout: float) -> _Pending | None:
        """The next request within `timeout` seconds, else None; one that arrives as time runs out is kept."""
        getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({getter}, timeout=timeout)
        if getter not in done:
            getter.cancel()
            try:
                return await getter  # it may have completed before the cancel landed
            except asyncio.CancelledError:
                return None
        return getter.result()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed:
            batch = await self._gather()
            all_texts = [t for item in batch for t in item.texts]
            self.waiting_texts -= len(all_texts)
            started = loop.time()
            try:
                results = await loop.run_in_executor(self.executor, self.predict, all_texts)
                if self.events is not None:
                    self.events.batch(len(all_texts), sum(item.words for item in batch), loop.time() - started)
            except Exception as exc:  # one failed batch answers its requests with 500, the server goes on
                log.exception("prediction failed")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            start = 0
            for item in batch:
                if not item.future.done():  # a client that went away cancelled its future
                    item.future.set_result(results[start:start + len(item.texts)])
                start += len(item.texts)


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


def parse_texts(body: bytes, max_texts: int) -> tuple[list[str], bool]:
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
    if len(texts) > max_texts:
        raise BadRequest(413, f"{len(texts)} texts in one request; the limit is {max_texts} (--max-texts)")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(422, f"text {i} holds a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None
    return texts, single


def health_info(tagger, model_dir: Path) -> dict:
    """What /health reports: the folder, the encoder it was fine-tuned from, the labels and entity types."""
    import json

    from ner.data import entity_types

    labels = [tagger.id2label[i] for i in sorted(tagger.id2label)]
    args_file = model_dir / "training_args.json"
    base = json.loads(args_file.read_text(encoding="utf-8")).get("model") if args_file.is_file() else None
    return {"status": "ok", "model": str(model_dir), "base_model": base, "labels": labels,
            "types": entity_types(labels), "pid": os.getpid()}


def create_app(tagger, model_dir: Path, limits: Limits = Limits(), *, api_key: str | None = None,
               cors_origins: Sequence[str] = ()):
    """The FastAPI app: GET / (the page), GET /health, POST /predict, GET /metrics, GET /openapi.json; errors
    are {"error": ...}. With `api_key`, POST /predict needs `Authorization: Bearer <api_key>`."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse
    from starlette.exceptions import HTTPException

    from ner.serve_api import bearer_key_check, health_openapi, predict_openapi
    from ner.serve_metrics import ServeMetrics

    metrics = ServeMetrics()
    batcher = MicroBatcher(tagger.predict, limits, events=metrics)
    metrics.queued_texts = batcher.queued_texts

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()  # uvicorn has answered the requests in flight by now

    app = FastAPI(title="ner", lifespan=lifespan, docs_url=None, redoc_url=None)  # the docs pages load a CDN
    page = resources.files("ner").joinpath("static/index.html").read_text(encoding="utf-8")
    info = health_info(tagger, model_dir)

    @app.exception_handler(BadRequest)
    async def bad_request(request, exc: BadRequest):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return JSONResponse({"error": str(exc.errors())}, status_code=422)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    @app.get("/health", **health_openapi())
    async def health() -> dict:
        return {**info, "in_flight": in_flight[0]}

    in_flight = [0]  # /predict requests received and not yet answered: what a drain waits for

    @app.post("/predict", **predict_openapi(limits.max_texts, api_key is not None),
              dependencies=[Depends(bearer_key_check(api_key))] if api_key is not None else [])
    async def predict(request: Request):
        in_flight[0] += 1
        try:
            return await answer(request)
        finally:
            in_flight[0] -= 1

    async def answer(request):
        texts, single = parse_texts(await read_body(request, limits.max_request_bytes), limits.max_texts)
        request.state.texts = len(texts)  # for the access log
        try:
            results = await batcher.submit(texts) if texts else []
        except Exception:
            return JSONResponse({"error": "prediction failed (see the server log)"}, status_code=500)
        return results[0] if single else {"results": results}

    add_operations(app, metrics, cors_origins)
    app.state.batcher = batcher
    return app


def add_operations(app, metrics, cors_origins: Sequence[str]) -> None:
    """GET /metrics (open even with an API key: counts and timings, never text), CORS for pages served from
    `cors_origins`, and outermost the request log (ids, access log, request metrics)."""
    from fastapi import Response
    from starlette.middleware.cors import CORSMiddleware

    from ner.serve_api import metrics_openapi
    from ner.serve_metrics import CONTENT_TYPE, RequestLog

    @app.get("/metrics", response_class=Response, **metrics_openapi())
    async def scrape() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["X-Request-ID", "Retry-After"], max_age=600)
    app.add_middleware(RequestLog, metrics=metrics)  # added last: outermost


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
    add_model_arguments(parser)
    add_operation_arguments(parser)
    return parser


def add_operation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"POST /predict then needs 'Authorization: Bearer KEY'; GET /, /health, /ready and "
                             f"/metrics stay open (default: ${API_KEY_ENV}, else none; the variable keeps the key "
                             f"out of `ps`)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="let pages from ORIGIN (e.g. https://app.example.com) call the API; repeatable")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes serving the one port, each with its own model and batcher (default: 1); "
                             "each gets cores/N threads unless OMP_NUM_THREADS is set")


def app_from_args(args: argparse.Namespace):
    """The model and the app the command line asks for."""
    from ner.infer import Tagger

    tagger = Tagger.from_args(args)
    limits = Limits(args.max_request_bytes, args.max_texts, args.max_wait_ms, args.max_batch_texts,
                    args.max_batch_words)
    return create_app(tagger, args.model_dir, limits, api_key=args.api_key or None, cors_origins=args.cors_origin)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


def app_factory():
    """What each of uvicorn's --workers processes calls: its own model, batcher and app, from the command line
    main() left in NER_SERVE_ARGV. A user error stops every worker (uvicorn's startup-failure status) rather
    than having uvicorn restart a worker that fails the same way each time."""
    import json

    configure_logging()
    try:
        return app_from_args(build_parser().parse_args(json.loads(os.environ[ARGV_ENV])))
    except UserError as exc:
        log.error("error: %s", exc)
        sys.exit(3)


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: expected 0-65535")
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
        return run_workers(args, sys.argv[1:] if argv is None else argv)
    app = app_from_args(args)
    log.info("serving %s on http://%s:%d/", args.model_dir, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def run_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """N uvicorn worker processes on one socket. Each runs its model on cores/N threads (OMP_NUM_THREADS, read
    by torch and by the ONNX runtimes): N processes each taking every core would fight over them. The
    workers' metrics meet in a PROMETHEUS_MULTIPROC_DIR made here and removed on exit (one given is kept)."""
    import json
    import shutil
    import tempfile

    import uvicorn

    from ner.serve_metrics import MULTIPROC_ENV

    if not (args.model_dir / "config.json").is_file():  # before N workers each fail on it
        raise UserError(f"{args.model_dir}: not a model folder (no config.json); pass OUTPUT_DIR/final")
    made_dir = None if MULTIPROC_ENV in os.environ else tempfile.mkdtemp(prefix="ner-serve-metrics-")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    env = {ARGV_ENV: json.dumps(argv), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS",
                                                                        str(max(1, cores // args.workers)))}
    if made_dir is not None:
        env[MULTIPROC_ENV] = made_dir
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the workers are spawned: they start from this environment
    try:
        log.info("serving %s on http://%s:%d/ with %d workers, %s threads each", args.model_dir, args.host,
                 args.port, args.workers, env["OMP_NUM_THREADS"])
        uvicorn.run("ner.serve:app_factory", factory=True, workers=args.workers, host=args.host, port=args.port,
                    log_level="warning")
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
