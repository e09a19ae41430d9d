"""What `ner.serve` tells an operator: Prometheus metrics (GET /metrics), one access-log line per request, and
an `X-Request-ID` on every answer.

    curl -s localhost:8000/metrics | grep '^ner_'
    curl -si localhost:8000/predict -H 'X-Request-ID: my-id-1' -d '{"text": "Ada Lovelace"}' | grep -i x-request-id

Each app gets its own registry (tests and several apps in one process never collide). With `--workers N`,
`python -m ner.serve` sets PROMETHEUS_MULTIPROC_DIR before the workers start: every worker then writes its
counters and histograms to files there, and whichever worker answers GET /metrics reports the sum over all
of them (prometheus-client's multiprocess mode), so a scrape never sees one worker's counters jump back.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

access_log = logging.getLogger("ner.access")
log = logging.getLogger("ner.serve")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A request's id goes into log lines and headers: visible ASCII only (no spaces, no newlines), and short.
REQUEST_ID = re.compile(r"[!-~]{1,128}")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_TEXTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_WORDS_BUCKETS = (8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)


class ServeMetrics:
    """The app's metrics; also the micro-batcher's `events` (the methods of ner.serving.batcher.BatcherEvents)."""

    def __init__(self, queued_texts: Callable[[], int] = lambda: 0) -> None:
        self.queued_texts = queued_texts
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiproc_dir = os.environ.get(MULTIPROC_ENV)

        def make(kind, name: str, doc: str, labels: tuple[str, ...] = (), **kwargs):
            return kind(name, doc, labels, registry=self.registry, **kwargs)

        self.requests = make(Counter, "ner_requests", "HTTP requests answered", ("route", "method", "status"))
        self.request_seconds = make(Histogram, "ner_request_seconds", "time from request to the answer's last byte",
                                    ("route",), buckets=LATENCY_BUCKETS_S)
        # livesum: with several workers, the sum of the live workers' queues
        self.queue_texts = make(Gauge, "ner_queue_texts", "texts waiting for a batch", multiprocess_mode="livesum")
        self.batch_texts = make(Histogram, "ner_batch_texts", "texts per batch", buckets=BATCH_TEXTS_BUCKETS)
        self.batch_words = make(Histogram, "ner_batch_words", "words per batch", buckets=BATCH_WORDS_BUCKETS)
        self.batch_seconds = make(Histogram, "ner_batch_seconds", "model time per batch", buckets=LATENCY_BUCKETS_S)
        self.texts_tagged = make(Counter, "ner_texts_tagged", "texts tagged")
        self.words_tagged = make(Counter, "ner_words_tagged", "words tagged")
        self.shed_requests = make(Counter, "ner_shed_requests", "requests refused with 503: the queue was full")
        self.shed_texts = make(Counter, "ner_shed_texts", "texts in requests refused with 503")
        self.timeouts = make(Counter, "ner_timeouts", "requests answered 504: not done within --request-timeout")
        self.dropped = make(Counter, "ner_dropped_disconnected", "requests dropped before their batch: client gone")
        self.text_failures = make(Counter, "ner_text_failures", "texts the model failed on (answered 500)")

    # ---- the batcher's events (ner.serving.batcher.BatcherEvents)
    def batch(self, texts: int, words: int, seconds: float) -> None:
        self.batch_texts.observe(texts)
        self.batch_words.observe(words)
        self.batch_seconds.observe(seconds)
        self.texts_tagged.inc(texts)
        self.words_tagged.inc(words)
        self.refresh_queue()

    def shed(self, texts: int) -> None:
        self.shed_requests.inc()
        self.shed_texts.inc(texts)

    def timed_out(self, texts: int) -> None:
        self.timeouts.inc()

    def dropped_disconnected(self, texts: int) -> None:
        self.dropped.inc()

    def text_failed(self) -> None:
        self.text_failures.inc()

    # ---- requests and scrapes
    def refresh_queue(self) -> None:
        """The queue gauge is set, not computed at scrape time, so that in multiprocess mode every worker's
        last value is in its file; the worker answering a scrape refreshes its own first (render)."""
        self.queue_texts.set(self.queued_texts())

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "other"  # a client's token must not make a series each
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def process_ended(self) -> None:
        """With --workers: this worker's live gauges leave the sum (prometheus-client's mark_process_dead)."""
        if self.multiproc_dir is not None:
            prometheus_multiprocess.mark_process_dead(os.getpid(), self.multiproc_dir)

    def render(self) -> bytes:
        """The Prometheus text format: this app's registry, or the sum over every worker's files."""
        self.refresh_queue()
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry, path=self.multiproc_dir)
        return generate_latest(registry)


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-ID when it is short visible ASCII; otherwise a new one (uuid4, hex)."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            given = value.decode("latin-1")
            if REQUEST_ID.fullmatch(given):
                return given
    return uuid.uuid4().hex


class RequestLog:
    """Pure ASGI middleware, outermost: gives every request an id (X-Request-ID on every answer, errors
    included), writes one access-log line, counts the request. It never reads the body, so the
    --max-request-bytes cap still refuses a streamed body part-way. An exception nothing else caught is
    logged with the request id and answered 500 {"error": ...} here, so that answer carries the id too."""

    def __init__(self, app, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        status: list[int | None] = [None]

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", request_id.encode("ascii"))]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s failed", request_id)
            if status[0] is not None:
                raise  # the answer has started: nothing else can be sent
            await internal_error(send_with_id, request_id)
        finally:
            self.done(scope, status[0] or 500, time.perf_counter() - started, request_id)

    def done(self, scope, status: int, seconds: float, request_id: str) -> None:
        # the route's template, never the raw path: unknown paths would make one time series each
        route = getattr(scope.get("route"), "path", "other")
        self.metrics.request(route, scope["method"], status, seconds)
        texts = scope.get("state", {}).get("texts")
        access_log.info("%s %s %d texts=%s ms=%.1f id=%s", scope["method"], scope["path"], status,
                        "-" if texts is None else texts, seconds * 1000, request_id)


async def internal_error(send, request_id: str) -> None:
    import json

    body = json.dumps({"error": f"internal error (see the server log, request id {request_id})"}).encode()
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
