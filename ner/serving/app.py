"""The FastAPI app of `python -m ner.serve`: its routes, the Label Studio routes mounted beside them, operations
(metrics, CORS, the request log) and the JSON error handlers."""

import asyncio
import os
from collections.abc import Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from ner.serving.batcher import BatcherEvents, ClientGone, Draining, MicroBatcher, Overloaded, TextFailed, TimedOut
from ner.serving.lifecycle import Lifecycle, ServeOptions, drain_on_signals
from ner.serving.requests import BadRequest, Limits, parse_texts, read_body


def health_info(tagger, model_dir: Path) -> dict:
    """What /health reports: the folder, the encoder it was fine-tuned from, the labels and entity types."""
    import json

    from ner.data.tags import entity_types

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
        lifecycle.stopped()

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
    app.state.label_studio = mount_label_studio(app, batcher, tagger, model_dir, info, limits,
                                                api_key) if label_studio else None
    return app


def serve_model(batcher: MicroBatcher, info: dict, tagger, model_dir: Path) -> None:
    """A retrained model replaces the served one: the batcher calls it and /health names it. `info` is the dict
    /health reads, updated in place; built first, so a model that cannot be described changes nothing."""
    fresh = health_info(tagger, model_dir)
    batcher.predict = tagger.predict
    info.update(fresh)


def mount_label_studio(app, batcher: MicroBatcher, tagger, model_dir: Path, info: dict, limits: Limits,
                       api_key: str | None):
    """Label Studio's ML backend protocol under /label-studio (docs/label_studio.md), sharing the batcher and the
    limits; every route that tags or trains needs the key. Retraining swaps in models loaded as `tagger` was,
    and /health (`info`) then names them."""
    from functools import partial

    from fastapi import Depends

    from ner.serving import label_studio
    from ner.serving.api import label_studio_key_check, label_studio_openapi

    served = label_studio.LabelStudioModel(batcher.submit, model_dir, info["types"],
                                           on_swap=partial(serve_model, batcher, info), limits=limits,
                                           load_tagger=getattr(tagger, "like", None),
                                           runtime=getattr(tagger, "runtime_name", None))
    guard = [Depends(label_studio_key_check(api_key))] if api_key is not None else []
    app.include_router(label_studio.router(served, guard, openapi=label_studio_openapi(api_key is not None)),
                       prefix=label_studio.PREFIX)
    return served


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
