"""The micro-batcher behind `python -m ner.serve`: a bounded queue, timeouts, isolation of failing texts, drain.

    batcher = MicroBatcher(tagger.predict, BatchLimits(max_queue_texts=256, request_timeout_s=30))
    batcher.start()                                  # in a running event loop
    results = await batcher.submit(["Ada Lovelace visited London."])
    batcher.drain(budget_s=19)                       # SIGTERM: finish what fits, refuse the rest
    await batcher.stop()

Texts of concurrent requests wait in one queue; one worker takes the first waiting request, then more for up
to `max_wait_ms`, while the batch stays within `max_batch_texts` and `max_batch_words` (a request is never
split; one over the caps runs alone), and tags them in one call on one model thread. What can go wrong has
an exception of its own, which the HTTP layer turns into a status: Overloaded (503 + Retry-After), TimedOut
(504), TextFailed (500, only the request that holds the failing text), Draining (503). No HTTP here.
A running batch stops at its next window boundary (Tagger.predict's `progress`) at the drain deadline, and
once every request in it has timed out or left: the model then takes the next batch. Whether a client left is
asked at batch start and again at every window boundary of its batch.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ner.data.text import Word, split_words

log = logging.getLogger("ner.serve")

Predict = Callable[..., list[dict]]  # predict(texts, words=[[(word, start, end), ...], ...]) -> one dict per text


@dataclass
class BatchLimits:
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    max_batch_texts: int = 64
    max_batch_words: int = 8192
    max_queue_texts: int = 256  # texts admitted and not yet started; more -> Overloaded (docs/serving.md)
    request_timeout_s: float | None = 30.0  # admission to answer; None waits for ever


class Overloaded(Exception):
    """The queue holds `max_queue_texts` texts already: answer 503 with Retry-After: `retry_after_s`."""

    def __init__(self, retry_after_s: int, message: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TimedOut(Exception):
    """No answer within `request_timeout_s` (504); the request's texts left the queue if they had not started."""


class TextFailed(Exception):
    """The model raised on one of this request's texts, tagged alone (500); the other requests were answered."""


class Draining(Exception):
    """The server is stopping (SIGTERM past its deadline, or the batcher died): 503, try another instance."""


class Cut(BaseException):
    """The running batch stopped at a window boundary: the drain deadline passed, or every request it served
    timed out or left. A BaseException, as asyncio's CancelledError is: it stops a computation, so no `except
    Exception` on its way (the text-by-text retry, a model's own handlers) can take it for a failing text."""


class ClientGone(Exception):
    """The client disconnected: before its batch started (its texts were dropped, not computed), or while it ran
    (noticed at a window boundary; the batch stops there once nobody else in it waits)."""


class BatcherEvents:
    """What the batcher reports, for metrics; every method is a no-op here. Subclass it (e.g. with
    prometheus-client counters) and pass an instance as `MicroBatcher(..., events=...)`.

    All hooks run on the event loop thread, never concurrently, and must return quickly (no I/O).
    Queue depth is not an event: read `MicroBatcher.queued_texts()` when scraped (a Gauge's set_function)."""

    def batch(self, texts: int, words: int, seconds: float) -> None:
        """A batch ran: `texts` texts with `words` words in all, in `seconds` of wall time (the model call,
        including any text-by-text retry after a failure). Texts and words tagged are the sums of these."""

    def shed(self, texts: int) -> None:
        """A request of `texts` texts was refused at admission with 503 (queue full); 0 when it was refused
        before its body was read, so its texts were never counted."""

    def timed_out(self, texts: int) -> None:
        """A request of `texts` texts got 504 (request_timeout_s passed)."""

    def dropped_disconnected(self, texts: int) -> None:
        """A request of `texts` texts was dropped at batch start because its client had gone away."""

    def text_failed(self) -> None:
        """One text failed when tagged alone after its batch failed; its request gets 500."""


@dataclass(eq=False)
class _Pending:
    texts: list[str]
    future: asyncio.Future = field(repr=False)
    is_disconnected: Callable[[], Awaitable[bool]] | None = field(default=None, repr=False)
    words: list[list[Word]] = field(default_factory=list, repr=False)
    word_count: int = 0
    state: str = "splitting"  # splitting -> queued -> started; or withdrawn (timed out, cancelled, refused)


def _split_all(split: Callable[[str], list[Word]], texts: list[str]) -> list[list[Word]]:
    return [split(text) for text in texts]


def _until_cut(cut: threading.Event, at_window: Callable[[], None], batches, **_):
    """Tagger.predict's forward passes, one by one, while `cut` is clear (its `progress`): the one place a
    batch stops early, whoever asked (the drain deadline, stop(), requests that all left). `at_window` runs at
    each boundary: it asks whether the batch's clients are still there (_ClientsWatch)."""
    for batch in batches:
        if cut.is_set():
            raise Cut("the batch was stopped at a window boundary")
        at_window()
        yield batch


def _cut_when_abandoned(batch: list[_Pending]) -> threading.Event:
    """The batch's cut, set once every request in it is settled before its answers exist (timed out, its
    client's task cancelled, or its client gone: _ClientsWatch): nobody waits for them, so the model stops at its
    next window and takes the next batch (docs/serving.md: a client that left costs no more model time). Set
    again when the answers arrive: harmless then."""
    cut = threading.Event()

    def settled(_) -> None:
        if all(item.future.done() for item in batch):
            cut.set()

    for item in batch:
        item.future.add_done_callback(settled)
    return cut


class _ClientsWatch:
    """Whether a running batch's clients are still there, asked at each window boundary: called on the model
    thread, it has the event loop check each request's `is_disconnected()` (one check at a time). A request whose
    client left is settled with ClientGone; once every request of the batch is settled, _cut_when_abandoned
    stops the batch at its next window. The model thread never waits for the answer."""

    def __init__(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        self.watched = [item for item in batch if item.is_disconnected is not None]
        self.loop = loop
        self.checking: asyncio.Task | None = None  # touched on the event loop only

    def __call__(self) -> None:
        if self.watched:
            self.loop.call_soon_threadsafe(self._check_once)

    def _check_once(self) -> None:
        if self.checking is None or self.checking.done():
            self.checking = self.loop.create_task(self._check())

    async def _check(self) -> None:
        for item in self.watched:
            if not item.future.done() and await item.is_disconnected() and not item.future.done():
                item.future.set_exception(ClientGone("the client disconnected while its batch ran"))


class MicroBatcher:
    """Gathers the texts of concurrent requests for a few milliseconds and tags them in one call.

    The model runs in one worker thread, and texts are split into words in another, so the event loop keeps
    accepting requests meanwhile. `queued_texts()` is the queue depth that `max_queue_texts` bounds."""

    def __init__(self, predict: Predict, limits: BatchLimits, events: BatcherEvents | None = None,
                 split: Callable[[str], list[Word]] = split_words) -> None:
        self.predict = predict
        self.limits = limits
        self.events = events or BatcherEvents()
        self.split = split
        self.queue: deque[_Pending] = deque()
        self.arrived = asyncio.Event()
        self.admitted_texts = 0  # splitting or queued: what max_queue_texts bounds
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ner-model")
        self.task: asyncio.Task | None = None
        self.closed = False
        self.draining = False
        self.drain_deadline: float | None = None  # loop time after which no batch starts
        self.running_cut: threading.Event | None = None  # the running batch's: set, it stops at its next window
        self.failure: str | None = None  # why the worker task ended, when it ended unexpectedly
        self.on_failure: Callable[[str], None] | None = None
        self.seconds_per_text = 0.0  # moving averages of the batches' cost: Retry-After and the drain plan
        self.seconds_per_word = 0.0

    @property
    def predict(self) -> Predict:
        return self._predict

    @predict.setter
    def predict(self, predict: Predict) -> None:
        """Set at start and when retraining swaps the model in: whether it can stop between windows
        (Tagger.predict's `progress`) is read once here, not at every batch."""
        self._predict = predict
        self._stoppable = "progress" in inspect.signature(predict).parameters

    def queued_texts(self) -> int:
        """Texts admitted and not yet started (being split into words, or waiting in the queue)."""
        return self.admitted_texts

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())
        self.task.add_done_callback(self._ended)

    async def stop(self) -> None:
        self.closed = True
        self._cut_running()  # a batch still running stops at a window boundary: the process exits on time
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self._refuse_queued("the server is shutting down")
        self.executor.shutdown(wait=True)

    async def warm_up(self, text: str) -> list[dict]:
        """One forward pass on the model thread, outside the queue and the statistics."""
        words = _split_all(self.split, [text])
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._call, [text], words)

    def _call(self, texts: list[str], words: list[list[Word]], cut: threading.Event | None = None,
              at_window: Callable[[], None] = lambda: None) -> list[dict]:
        if self._stoppable and cut is not None:
            return self.predict(texts, words=words, progress=functools.partial(_until_cut, cut, at_window))
        return self.predict(texts, words=words)

    def _ended(self, task: asyncio.Task) -> None:
        """Supervision: the worker only ends through stop(); any other end is a failure the server must report."""
        if self.closed:
            return
        cause = "cancelled" if task.cancelled() else repr(task.exception())
        self.failure = f"the batching task ended unexpectedly ({cause})"
        log.error("%s; answering 503 from now on", self.failure)
        self._refuse_queued("the batcher stopped; the server is restarting")
        if self.on_failure is not None:
            self.on_failure(self.failure)

    # ------------------------------------------------------------------------------------------ admission

    def check_open(self, texts: int = 0) -> None:
        """Raise Draining or Overloaded unless `texts` more texts fit now; texts=0 checks before the body is read."""
        if self.failure is not None:
            raise Draining("the batcher stopped; the server is restarting")
        if self.draining or self.closed:
            raise Draining("the server is shutting down; retry on another instance")
        limit = self.limits.max_queue_texts
        if self.admitted_texts + max(texts, 1) > limit:
            self.events.shed(texts)
            retry_after_s = self.retry_after_s()
            raise Overloaded(retry_after_s, f"overloaded: {self.admitted_texts} texts are waiting and the queue "
                                            f"holds {limit} (--max-queue); retry in {retry_after_s} s")

    def retry_after_s(self) -> int:
        """Seconds until the queue has drained at the recent pace, at least 1."""
        return max(1, math.ceil(self.admitted_texts * self.seconds_per_text))

    async def submit(self, texts: list[str],
                     is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> list[dict]:
        """One dict per text, in order; raises Overloaded, Draining, TimedOut, TextFailed or ClientGone."""
        self.check_open(len(texts))
        loop = asyncio.get_running_loop()
        item = _Pending(texts, loop.create_future(), is_disconnected)
        self.admitted_texts += len(texts)
        try:
            return await asyncio.wait_for(self._enqueue_and_wait(item), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            self.events.timed_out(len(texts))
            raise TimedOut(f"no answer within {self.limits.request_timeout_s:g} s (--request-timeout)") from None
        finally:
            self._withdraw(item)  # cancelled (the client's task) or failed while splitting: leave the queue
            if not item.future.done():  # nobody waits for it now: a batch that holds it skips it
                item.future.cancel()

    async def _enqueue_and_wait(self, item: _Pending) -> list[dict]:
        loop = asyncio.get_running_loop()
        item.words = await loop.run_in_executor(None, _split_all, self.split, item.texts)  # off the event loop
        item.word_count = sum(len(w) for w in item.words)
        if self.failure is not None or self.closed:
            raise Draining("the batcher stopped; the server is restarting")
        if item.state == "splitting":
            item.state = "queued"
            self.queue.append(item)
            self.arrived.set()
        return await asyncio.shield(item.future)

    def _withdraw(self, item: _Pending) -> None:
        """Take a request that has not started out of the queue and the count (idempotent)."""
        if item.state in ("splitting", "queued"):
            if item.state == "queued":
                self.queue.remove(item)
            item.state = "withdrawn"
            self.admitted_texts -= len(item.texts)

    def _refuse_queued(self, message: str) -> None:
        while self.queue:
            item = self.queue[0]
            self._withdraw(item)
            if not item.future.done():
                item.future.set_exception(Draining(message))

    # ------------------------------------------------------------------------------------------ drain

    def drain(self, budget_s: float | None) -> None:
        """Stop admitting; keep starting batches (without waiting for company) while each is expected to end
        within `budget_s` seconds from now; then answer what is still queued with Draining."""
        loop = asyncio.get_running_loop()
        self.draining = True
        self.arrived.set()
        if budget_s is not None:
            self.drain_deadline = loop.time() + max(0.0, budget_s)
            loop.call_at(self.drain_deadline, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._cut_running()
        self._refuse_queued("the server is shutting down; retry elsewhere")

    def _cut_running(self) -> None:
        if self.running_cut is not None:
            self.running_cut.set()

    def _fits_before_deadline(self, batch: list[_Pending]) -> bool:
        if self.drain_deadline is None:
            return True
        expected_s = max(self.seconds_per_text * sum(len(i.texts) for i in batch),
                         self.seconds_per_word * sum(i.word_count for i in batch))
        return asyncio.get_running_loop().time() + expected_s <= self.drain_deadline

    # ------------------------------------------------------------------------------------------ the worker

    async def _run(self) -> None:
        while not self.closed:
            batch: list[_Pending] = []
            try:
                batch = await self._next_batch()
                await self._start(await self._present(batch))
            except BaseException:  # the worker is ending: the requests in hand are answered, not left hanging
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(Draining("the batcher stopped; the server is restarting"))
                raise

    async def _start(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        if not self._fits_before_deadline(batch):
            self._answer_draining(batch)
            self._refuse_queued("the server is shutting down; retry elsewhere")
            return
        await self._compute(batch)

    @staticmethod
    def _answer_draining(batch: list[_Pending]) -> None:
        for item in batch:
            if not item.future.done():  # a timeout may have settled it meanwhile
                item.future.set_exception(Draining("the server is shutting down; retry elsewhere"))

    async def _next_batch(self) -> list[_Pending]:
        """The requests that start together: the first waiting, then later ones within max_wait_ms (none when
        draining) while the caps hold. Taken out of the queue and the count."""
        while not self.queue:
            self.arrived.clear()
            await self.arrived.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.max_wait_ms / 1000
        batch: list[_Pending] = []
        texts = words = 0
        while True:
            while self.queue:
                item = self.queue[0]
                if batch and (texts + len(item.texts) > self.limits.max_batch_texts
                              or words + item.word_count > self.limits.max_batch_words):
                    return batch  # it starts the next batch
                self._withdraw(item)
                item.state = "started"
                batch.append(item)
                texts, words = texts + len(item.texts), words + item.word_count
            remaining_s = deadline - loop.time()
            if remaining_s <= 0 or self.draining:
                return batch
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining_s)
            except asyncio.TimeoutError:
                return batch

    async def _present(self, batch: list[_Pending]) -> list[_Pending]:
        """The batch without requests whose client has gone away (or that timed out meanwhile)."""
        kept = []
        for item in batch:
            if item.future.done():
                continue
            if item.is_disconnected is not None and await item.is_disconnected():
                self.events.dropped_disconnected(len(item.texts))
                if not item.future.done():  # it may have timed out during the await
                    item.future.set_exception(ClientGone("the client disconnected before its batch started"))
                continue
            kept.append(item)
        return kept

    async def _compute(self, batch: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        texts = [t for item in batch for t in item.texts]
        words = [w for item in batch for w in item.words]
        word_count = sum(item.word_count for item in batch)
        started_s = loop.time()
        self.running_cut = _cut_when_abandoned(batch)
        try:
            outcomes = await loop.run_in_executor(self.executor, self._predict_isolated, texts, words,
                                                  self.running_cut, _ClientsWatch(batch, loop))
        except Cut:
            self._answer_draining(batch)  # the drain's cut; an abandoned batch has nobody left to answer
            return
        finally:
            self.running_cut = None
        seconds = loop.time() - started_s
        self._learn_pace(seconds, len(texts), word_count)
        self.events.batch(len(texts), word_count, seconds)
        start = 0
        for item in batch:
            mine = outcomes[start:start + len(item.texts)]
            start += len(item.texts)
            failed = [i for i, outcome in enumerate(mine) if isinstance(outcome, Exception)]
            for _ in failed:
                self.events.text_failed()
            if item.future.done():  # timed out while its batch ran
                continue
            if failed:
                item.future.set_exception(TextFailed(f"prediction failed on text {failed[0]} (see the server log)"))
            else:
                item.future.set_result(mine)

    def _predict_isolated(self, texts: list[str], words: list[list[Word]], cut: threading.Event,
                          at_window: Callable[[], None]) -> list[dict | Exception]:
        """The batch's answers; if the batch raises, each text alone, so one bad text fails only itself
        (alone, a text's answer is the one it gets in any batch). Cut, at a window boundary, once `cut` is set;
        `at_window` runs at every boundary."""
        try:
            return self._call(texts, words, cut, at_window)
        except Exception:
            log.exception("prediction failed on a batch of %d texts; retrying each text alone", len(texts))
        outcomes: list[dict | Exception] = []
        for text, text_words in zip(texts, words):
            try:
                outcomes.append(self._call([text], [text_words], cut, at_window)[0])
            except Exception as exc:
                log.exception("prediction failed on a text of %d characters", len(text))
                outcomes.append(exc)
        return outcomes

    def _learn_pace(self, seconds: float, texts: int, words: int) -> None:
        weight = 0.2 if self.seconds_per_text else 1.0  # the first batch sets the pace, later ones move it
        self.seconds_per_text += weight * (seconds / max(texts, 1) - self.seconds_per_text)
        self.seconds_per_word += weight * (seconds / max(words, 1) - self.seconds_per_word)
