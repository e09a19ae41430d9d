"""A server process's life: warm-up, readiness, failure, and the drain that SIGTERM / SIGINT start."""

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ner.serving.batcher import MicroBatcher

log = logging.getLogger("ner.serve")

WARM_UP_TEXT = "Ada Lovelace met Charles Babbage in London."


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

    `on_failure` is how the process stops itself after a failure (main sets it to stop uvicorn and exit 1);
    `on_clean_stop` runs when the app shut down without one (a --workers process removes its mark)."""

    def __init__(self, batcher: MicroBatcher, options: ServeOptions) -> None:
        self.batcher = batcher
        self.options = options
        self.ready = False
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.on_failure: Callable[[str], None] | None = None
        self.on_clean_stop: Callable[[], None] | None = None
        batcher.on_failure = self._failed

    @property
    def failure(self) -> str | None:
        return self.batcher.failure

    def _failed(self, reason: str) -> None:
        if self.on_failure is not None:
            self.on_failure(reason)

    def stopped(self) -> None:
        """The app has shut down (its batcher stopped): a clean stop unless the batcher failed."""
        if self.failure is None and self.on_clean_stop is not None:
            self.on_clean_stop()

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
