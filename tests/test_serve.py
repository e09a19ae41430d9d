"""`python -m ner.serve`: the routes, every bad request, micro-batching, and a real uvicorn process."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import ROOT, resolve  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from ner.backends import NO_MIXED_PRECISION  # noqa: E402
from ner.serving.app import create_app  # noqa: E402
from ner.serving.batcher import BatcherEvents, MicroBatcher  # noqa: E402
from ner.serving.lifecycle import WARM_UP_TEXT, ServeOptions  # noqa: E402
from ner.serving.requests import Limits  # noqa: E402
from ner.testing import free_local_port, wait_until_healthy  # noqa: E402

TEXTS = ["Ada Lovelace visited London on Monday.", "", "Café \U0001F600 北京 a\u200bb\tc",
         "Shares of Acme Corp rose in Paris after Alan Turing spoke."]


@pytest.fixture(scope="module")
def tagger(random_model):
    from ner.inference.tagger import Tagger

    return Tagger(random_model, precision=NO_MIXED_PRECISION)


@pytest.fixture(scope="module")
def client(tagger, random_model):
    app = create_app(tagger, random_model, Limits(max_request_bytes=2000, max_texts=4, max_text_chars=60))
    with TestClient(app) as test_client:
        yield test_client


def test_health_names_the_model_and_labels(client, tagger, random_model):
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == str(random_model)
    assert body["labels"] == [tagger.id2label[i] for i in range(len(tagger.id2label))]
    assert body["types"] == ["LOC", "ORG", "PER"]


def test_page_is_self_contained(client):
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "<textarea" in page and 'fetch("predict"' in page and 'id="legend"' in page
    assert "http://" not in page and "https://" not in page  # no CDN, nothing from the network


def test_predict_one_text_and_many(client, tagger):
    expected = tagger.predict(TEXTS)
    assert any(r["entities"] for r in expected)
    one = client.post("/predict", json={"text": TEXTS[0]})
    assert one.status_code == 200 and one.json() == expected[0]
    many = client.post("/predict", json={"texts": TEXTS})
    assert many.status_code == 200 and many.json() == {"results": expected}
    assert client.post("/predict", json={"texts": []}).json() == {"results": []}


def chunks(data: bytes):
    yield from (data[i:i + 100] for i in range(0, len(data), 100))  # no Content-Length: sent chunked


@pytest.mark.parametrize(("body", "status", "says"), [
    (b'{"text": ', 422, "not JSON"),
    (b"\xff\xfe\x00", 422, "not JSON"),
    (b'["a"]', 422, "exactly one key"),
    (b'{"text": 5}', 422, "must be a string"),
    (b'{"texts": "abc"}', 422, "list of strings"),
    (b'{"texts": ["a", null]}', 422, "list of strings"),
    (b'{"text": "a", "texts": ["b"]}', 422, "exactly one key"),
    (b'{"txt": "a"}', 422, "exactly one key"),
    (b'{"text": "\\ud800"}', 422, "surrogate"),
    (b'{"texts": ["a", "b", "c", "d", "e"]}', 413, "--max-texts"),
    (json.dumps({"texts": ["a", "x" * 61]}).encode(), 413, "text 1 has 61 characters; the limit is 60 (--max-text"),
    # 3012 bytes: refused from Content-Length before reading, or (sent chunked) once the read passes the cap
    (json.dumps({"text": "x" * 3000}).encode(), 413, "request body is 3012 bytes; the limit is 2000 (--max-request"),
    (chunks(json.dumps({"text": "x" * 3000}).encode()), 413, "request body is over 2000 bytes (--max-request-bytes)"),
])
def test_bad_requests_get_a_json_error_and_the_server_goes_on(client, body, status, says):
    response = client.post("/predict", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert says in response.json()["error"]
    assert client.post("/predict", json={"text": "Ada Lovelace"}).status_code == 200


class FailsOnBoom:
    """A tagger whose batch fails when it holds the text "boom"."""

    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}

    def predict(self, texts: list[str], words=None) -> list[dict]:
        if "boom" in texts:
            raise RuntimeError("boom")
        return [{"entities": []} for _ in texts]


def test_a_failing_batch_answers_500_and_the_server_goes_on(random_model, caplog):
    with TestClient(create_app(FailsOnBoom(), random_model, Limits(max_wait_ms=1))) as test_client:
        failed = test_client.post("/predict", json={"text": "boom"})
        assert failed.status_code == 500
        assert failed.json() == {"error": "prediction failed on text 0 (see the server log)"}
        assert "prediction failed" in caplog.text and "RuntimeError: boom" in caplog.text
        assert not test_client.app.state.batcher.task.done()  # the batching loop goes on
        after = test_client.post("/predict", json={"texts": ["fine", "also fine"]})
        assert after.status_code == 200 and after.json() == {"results": [{"entities": []}] * 2}
        assert test_client.get("/health").json()["in_flight"] == 0


def test_openapi_documents_the_predict_body_and_answers(client):
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/predict"]["post"]
    body = resolve(spec, post["requestBody"]["content"]["application/json"]["schema"])
    assert post["requestBody"]["required"] is True
    shapes = {tuple(s["required"]): s for s in body["oneOf"]}
    assert shapes[("text",)]["properties"]["text"]["type"] == "string"
    assert shapes[("texts",)]["properties"]["texts"] == {**shapes[("texts",)]["properties"]["texts"],
                                                         "type": "array",
                                                         "items": {"type": "string", "maxLength": 60}}
    assert shapes[("text",)]["properties"]["text"]["maxLength"] == 60  # the fixture's --max-text-chars
    assert all(s["additionalProperties"] is False for s in body["oneOf"])  # exactly one key
    answers = resolve(spec, post["responses"]["200"]["content"]["application/json"]["schema"])["anyOf"]
    one = next(a for a in answers if "entities" in a["properties"])
    entity = one["properties"]["entities"]["items"]
    assert set(entity["required"]) == {"text", "type", "start", "end", "score"}
    assert entity["properties"]["start"]["type"] == "integer" and entity["properties"]["score"]["type"] == "number"
    many = next(a for a in answers if "results" in a["properties"])
    assert many["properties"]["results"]["items"] == one
    for status in ("413", "422", "500"):
        error = resolve(spec, post["responses"][status]["content"]["application/json"]["schema"])
        assert error["properties"]["error"]["type"] == "string"


def test_unknown_routes_and_methods_answer_json(client):
    assert client.get("/nowhere").json() == {"error": "Not Found"}
    assert client.get("/predict").status_code == 405 and "error" in client.get("/predict").json()


def test_concurrent_requests_share_a_batch_within_the_caps():
    calls: list[list[str]] = []

    def predict(texts, words):
        calls.append(list(texts))
        return [{"entities": [], "echo": t} for t in texts]

    async def scenario(limits: Limits):
        batcher = MicroBatcher(predict, limits)
        batcher.start()
        answers = await asyncio.gather(*[batcher.submit([f"t{i}", f"u{i}"]) for i in range(8)])
        await batcher.stop()
        return answers

    answers = asyncio.run(scenario(Limits(max_wait_ms=200)))
    assert len(calls) == 1 and len(calls[0]) == 16  # 8 requests, one call
    assert [[a["echo"] for a in answer] for answer in answers] == [[f"t{i}", f"u{i}"] for i in range(8)]
    calls.clear()
    asyncio.run(scenario(Limits(max_wait_ms=200, max_batch_texts=5)))
    assert [len(c) for c in calls] == [4, 4, 4, 4]  # a request is never split, never over the cap
    calls.clear()
    asyncio.run(scenario(Limits(max_wait_ms=200, max_batch_words=3)))
    assert [len(c) for c in calls] == [2] * 8  # each "t0 u0" is 2 words: one request per batch


# ----------------------------------------------------------------------------- limits and faults, in one event loop

class Gated:
    """A tagger whose batches wait for `gate` (the warm-up pass too, while `gate_warm_up`), record their texts,
    and fail on the text "boom"; answers come from `tagger` when given, else echo the text."""

    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}

    def __init__(self, tagger=None, gate_warm_up: bool = False) -> None:
        self.tagger = tagger
        self.gate = threading.Event()
        self.gate_warm_up = gate_warm_up
        self.calls: list[list[str]] = []  # every batch but the warm-up pass

    def predict(self, texts: list[str], words=None) -> list[dict]:
        warm_up = texts == [WARM_UP_TEXT]
        if not warm_up:
            self.calls.append(list(texts))
        if not warm_up or self.gate_warm_up:
            assert self.gate.wait(30), "the test never opened the gate"
        if "boom" in texts:
            raise RuntimeError("boom")
        if self.tagger is not None:
            return self.tagger.predict(texts, words=words)
        return [{"entities": [], "echo": text} for text in texts]


async def until(condition, what: str, timeout_s: float = 30) -> None:
    """Poll a state of the server (never a fixed sleep as synchronisation)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


def serving(model, model_dir, limits: Limits, options: ServeOptions = ServeOptions(), events=None):
    """(app, its lifespan, an httpx client over ASGI) for a test that runs in one event loop."""
    app = create_app(model, model_dir, limits, options, events)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ner")
    return app, app.router.lifespan_context(app), client


def run(coroutine, loop_factory=None):
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coroutine)


class SteppedClock(asyncio.SelectorEventLoop):
    """An event loop whose clock the test moves on: a timeout passes when the test says so (`advance`), not when
    the machine has been slow enough; until then the loop keeps real time, so nothing times out by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead_s = 0.0

    def time(self) -> float:
        return super().time() + self.ahead_s

    def advance(self, seconds: float) -> None:
        self.ahead_s += seconds


NEVER_BY_ITSELF_S = 3600.0  # a request timeout that passes only when a SteppedClock is advanced past it


class Counted(BatcherEvents):
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def shed(self, texts: int) -> None:
        self._add("shed")

    def timed_out(self, texts: int) -> None:
        self._add("timed_out", texts)

    def dropped_disconnected(self, texts: int) -> None:
        self._add("dropped_disconnected", texts)

    def text_failed(self) -> None:
        self._add("text_failed")

    def batch(self, texts: int, words: int, seconds: float) -> None:
        self._add("batch_texts", texts)


def test_a_full_queue_answers_503_with_retry_after_before_reading_the_body(random_model):
    model, events = Gated(), Counted()
    app, lifespan, client = serving(model, random_model, Limits(max_wait_ms=0, max_batch_texts=1, max_queue_texts=3,
                                                                max_texts=3), events=events)
    body_read: list[bool] = []

    async def body():
        body_read.append(True)
        yield b'{"text": "late"}'

    async def scenario():
        async with lifespan, client:
            await until(lambda: app.state.lifecycle.ready, "warmed up")
            running = asyncio.create_task(client.post("/predict", json={"text": "running"}))
            await until(lambda: model.calls == [["running"]], "the first batch runs")
            queued = asyncio.create_task(client.post("/predict", json={"texts": ["q1", "q2"]}))
            await until(lambda: app.state.batcher.queued_texts() == 2, "two texts queued")
            too_many = await client.post("/predict", json={"texts": ["a", "b"]})  # 2 + 2 > 3
            full = asyncio.create_task(client.post("/predict", json={"text": "fits"}))
            await until(lambda: app.state.batcher.queued_texts() == 3, "the queue is full")
            refused = await client.post("/predict", content=body(), headers={"content-type": "application/json"})
            model.gate.set()
            return too_many, refused, [await t for t in (running, queued, full)]

    too_many, refused, answered = run(scenario())
    for response in (too_many, refused):
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert "(--max-queue)" in response.json()["error"]
    assert body_read == []  # refused on the queue's state alone
    assert [r.status_code for r in answered] == [200, 200, 200]
    assert answered[1].json() == {"results": [{"entities": [], "echo": "q1"}, {"entities": [], "echo": "q2"}]}
    assert events.counts["shed"] == 2 and events.counts["batch_texts"] == 4


def test_a_request_past_its_timeout_gets_504_and_its_texts_leave_the_queue(random_model):
    """The clock moves past the timeout once one request runs and one waits (SteppedClock): both time out, whatever
    the machine's speed."""
    model, events = Gated(), Counted()
    app, lifespan, client = serving(model, random_model, Limits(max_wait_ms=0, request_timeout_s=NEVER_BY_ITSELF_S),
                                    events=events)

    async def scenario():
        async with lifespan, client:
            await until(lambda: app.state.lifecycle.ready, "warmed up")
            running = asyncio.create_task(client.post("/predict", json={"text": "running"}))
            await until(lambda: model.calls == [["running"]], "the first batch runs")
            waiting = asyncio.create_task(client.post("/predict", json={"texts": ["never", "computed"]}))
            await until(lambda: app.state.batcher.queued_texts() == 2, "its texts wait: the model is busy")
            asyncio.get_running_loop().advance(NEVER_BY_ITSELF_S)
            waiting = await waiting
            depth = app.state.batcher.queued_texts()
            model.gate.set()
            first = await running
            after = await client.post("/predict", json={"text": "after"})
            return waiting, depth, first, after

    waiting, depth, first, after = run(scenario(), SteppedClock)
    assert waiting.status_code == 504 and "(--request-timeout)" in waiting.json()["error"]
    assert depth == 0  # left the queue at once
    assert first.status_code == 504  # it had started: it cannot leave, but it is answered in time
    assert after.status_code == 200
    assert model.calls == [["running"], ["after"]]  # "never", "computed": never computed
    assert events.counts["timed_out"] == 3


def test_a_client_that_went_away_is_not_computed(random_model):
    model, events = Gated(), Counted()
    app, lifespan, client = serving(model, random_model, Limits(max_wait_ms=0), events=events)
    gone = asyncio.Event()

    async def post_then_leave(text: str) -> list[dict]:
        """POST /predict straight through ASGI; the client disconnects once `gone` is set."""
        body = json.dumps({"text": text}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/predict", "raw_path": b"/predict", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("ner", 80)}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict] = []

        async def receive():
            if messages:
                return messages.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent

    async def scenario():
        async with lifespan, client:
            await until(lambda: app.state.lifecycle.ready, "warmed up")
            running = asyncio.create_task(client.post("/predict", json={"text": "running"}))
            await until(lambda: model.calls == [["running"]], "the first batch runs")
            leaving = asyncio.create_task(post_then_leave("left"))
            await until(lambda: app.state.batcher.queued_texts() == 1, "its text queued")
            gone.set()
            model.gate.set()
            await leaving
            return (await running).status_code, (await client.post("/predict", json={"text": "next"})).status_code

    assert run(scenario()) == (200, 200)
    assert model.calls == [["running"], ["next"]]
    assert events.counts["dropped_disconnected"] == 1


def test_a_failing_text_fails_only_its_request_and_the_others_get_their_answers_alone(random_model, tagger):
    model, events = Gated(tagger), Counted()
    app, lifespan, client = serving(model, random_model, Limits(max_wait_ms=0), events=events)
    others = [[TEXTS[0]], ["boom", TEXTS[3]], [TEXTS[2], TEXTS[3]]]

    async def scenario():
        async with lifespan, client:
            await until(lambda: app.state.lifecycle.ready, "warmed up")
            running = asyncio.create_task(client.post("/predict", json={"text": "running"}))
            await until(lambda: len(model.calls) == 1, "the first batch runs")
            waiting = [asyncio.create_task(client.post("/predict", json={"texts": texts})) for texts in others]
            await until(lambda: app.state.batcher.queued_texts() == 5, "three requests queued")
            model.gate.set()
            await running
            return [await w for w in waiting]

    ok, failed, also_ok = run(scenario())
    assert model.calls[1] == [t for texts in others for t in texts]  # they shared one batch, which raised
    assert failed.status_code == 500 and failed.json() == {"error": "prediction failed on text 0 (see the server log)"}
    assert ok.status_code == also_ok.status_code == 200
    assert ok.json()["results"] == [tagger.predict([TEXTS[0]])[0]]
    assert also_ok.json()["results"] == [tagger.predict([t])[0] for t in (TEXTS[2], TEXTS[3])]
    assert events.counts["text_failed"] == 1


def test_ready_only_after_the_warm_up_pass_and_not_while_draining(random_model):
    model = Gated(gate_warm_up=True)
    app = create_app(model, random_model, Limits(max_wait_ms=0), ServeOptions(shutdown_timeout_s=60))
    with TestClient(app) as test_client:
        starting = test_client.get("/ready")
        assert starting.status_code == 503 and starting.json()["status"] == "starting"
        assert test_client.get("/health").status_code == 200  # alive while it warms up
        model.gate.set()
        deadline = time.monotonic() + 30
        while test_client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
        app.state.lifecycle.begin_drain()
        while test_client.get("/ready").status_code != 503:
            assert time.monotonic() < deadline, "still ready while draining"
        assert test_client.get("/ready").json()["status"] == "draining"
        health = test_client.get("/health")
        assert health.status_code == 200 and health.json()["draining"] is True
        refused = test_client.post("/predict", json={"text": "too late"})
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]


def test_a_drain_answers_the_batch_in_flight_and_refuses_the_queue_at_its_deadline(random_model):
    model = Gated()
    app, lifespan, client = serving(model, random_model, Limits(max_wait_ms=0), ServeOptions(shutdown_timeout_s=0.4))

    async def scenario():
        async with lifespan, client:
            await until(lambda: app.state.lifecycle.ready, "warmed up")
            running = asyncio.create_task(client.post("/predict", json={"text": "running"}))
            await until(lambda: model.calls == [["running"]], "the first batch runs")
            queued = asyncio.create_task(client.post("/predict", json={"text": "queued"}))
            await until(lambda: app.state.batcher.queued_texts() == 1, "one text queued")
            app.state.lifecycle.begin_drain()
            refused = await asyncio.wait_for(queued, 20)  # at the deadline, while the model is still busy
            model.gate.set()
            return await running, refused

    running, refused = run(scenario())
    assert running.status_code == 200 and running.json() == {"entities": [], "echo": "running"}
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    assert model.calls == [["running"]]


class EndlessWindows:
    """A tagger whose texts take forward passes until the batcher stops it at a window boundary (Tagger.predict's
    `progress`); `ended` is set when a call returns or raises. With `fail_batches`, a call of more than one text
    raises (the batcher then tags each text alone). `give_up` ends the passes when the batcher never does, so
    a test that fails does not hang."""

    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}

    def __init__(self, fail_batches: bool = False) -> None:
        self.fail_batches = fail_batches
        self.passes = 0
        self.ended = threading.Event()
        self.give_up = threading.Event()

    def predict(self, texts: list[str], words=None, progress=lambda batches, **_: batches) -> list[dict]:
        if self.fail_batches and len(texts) > 1:
            raise RuntimeError("the batch fails")
        try:
            for _ in progress(itertools.count(), desc="predict"):
                if self.give_up.wait(0.005):
                    break
                self.passes += 1
        finally:
            self.ended.set()
        return [{"entities": []} for _ in texts]


async def stopped_at_a_window(model: EndlessWindows, timeout_s: float = 60) -> bool:
    """Whether the model's passes end without the test's way out (only the batcher's cut ends them); the timeout
    is the way out of a batcher that never cuts, not a measure of its speed."""
    ended = await asyncio.to_thread(model.ended.wait, timeout_s)
    model.give_up.set()
    return ended


def window_scenario(model: EndlessWindows, texts: list[str], limits: Limits, act, is_disconnected=None,
                    loop_factory=None):
    """One request of `texts` runs on `model`; once its passes run, `act(batcher)` (a coroutine); returns (the
    request's outcome, whether the model stopped at a window boundary)."""

    async def scenario():
        batcher = MicroBatcher(model.predict, limits)
        batcher.start()
        try:
            running = asyncio.create_task(batcher.submit(texts, is_disconnected))
            await until(lambda: model.passes > 0, "the long text runs")
            await act(batcher)
            stopped = await stopped_at_a_window(model)
            return (await asyncio.gather(running, return_exceptions=True))[0], stopped
        finally:
            model.give_up.set()
            await batcher.stop()

    return run(scenario(), loop_factory)


async def drain_now(batcher: MicroBatcher) -> None:
    batcher.drain(budget_s=0)


def test_a_long_request_is_cut_at_a_window_boundary_when_the_drain_deadline_passes():
    """SIGTERM holds its promise for one long request: at the deadline the model stops between two forward
    passes and the request gets 503 (without the cut the passes would go on until the test gives up)."""
    from ner.serving.batcher import Draining

    outcome, stopped = window_scenario(EndlessWindows(), ["a very long text"],
                                       Limits(max_wait_ms=0, request_timeout_s=None), drain_now)
    assert stopped and isinstance(outcome, Draining), outcome


def test_a_cut_during_the_text_by_text_retry_answers_503_not_500():
    """The batch failed, so its texts are tagged alone; the drain deadline passes during that retry: the cut
    is a stop, not a failing text (the retry's `except Exception` once took it for one and answered 500)."""
    from ner.serving.batcher import Draining

    outcome, stopped = window_scenario(EndlessWindows(fail_batches=True), ["a long text", "another"],
                                       Limits(max_wait_ms=0, request_timeout_s=None), drain_now)
    assert stopped and isinstance(outcome, Draining), outcome


def test_a_request_that_timed_out_stops_its_batch_at_the_next_window():
    """The request gets 504 once its batch runs (the test moves the clock past the timeout then, SteppedClock),
    and its batch, which nobody waits for now, stops at the next window boundary, as a drain does, instead of
    keeping the model from the next."""
    from ner.serving.batcher import TimedOut

    async def time_passes(batcher):
        asyncio.get_running_loop().advance(NEVER_BY_ITSELF_S)

    outcome, stopped = window_scenario(EndlessWindows(), ["a very long text"],
                                       Limits(max_wait_ms=0, request_timeout_s=NEVER_BY_ITSELF_S), time_passes,
                                       loop_factory=SteppedClock)
    assert stopped and isinstance(outcome, TimedOut), outcome


def test_a_client_that_leaves_during_its_batch_stops_it_at_the_next_window():
    """docs/serving.md: a client that left costs no model time. It leaves once its batch runs (not before, where
    the batch start drops it): the batcher asks between windows, as the timeout and the drain stop it there, so
    the batch stops at a window boundary and the request is settled as ClientGone (499)."""
    from ner.serving.batcher import ClientGone

    gone = threading.Event()

    async def is_disconnected() -> bool:
        return gone.is_set()

    async def leave(batcher):
        gone.set()

    outcome, stopped = window_scenario(EndlessWindows(), ["a very long text"],
                                       Limits(max_wait_ms=0, request_timeout_s=None), leave, is_disconnected)
    assert stopped and isinstance(outcome, ClientGone), outcome


def test_a_batch_goes_on_while_one_of_its_requests_still_waits():
    """Two requests share a batch; the first one's client goes (its task cancelled): the passes go on for the
    second; when the second goes too, the batch stops at the next window."""
    model = EndlessWindows()

    async def scenario():
        batcher = MicroBatcher(model.predict, Limits(max_wait_ms=0, request_timeout_s=None))
        first, second = (asyncio.create_task(batcher.submit([text])) for text in ("first", "second"))
        try:
            await until(lambda: len(batcher.queue) == 2, "both requests queued")
            batcher.start()  # after both queued: they start in one batch
            await until(lambda: model.passes > 0, "their batch runs")
            first.cancel()
            passes = model.passes
            await until(lambda: model.passes > passes + 3, "the batch goes on for the second request")
            going_on = not model.ended.is_set()
            second.cancel()
            return going_on, await stopped_at_a_window(model)
        finally:
            model.give_up.set()
            await asyncio.gather(first, second, return_exceptions=True)
            await batcher.stop()

    assert run(scenario()) == (True, True)


def test_a_request_settled_by_its_timeout_is_not_answered_twice_at_the_drain():
    """The drain race: a batch refused at the deadline may hold a request whose timeout has already answered
    it; the worker must go on (InvalidStateError used to end it)."""
    from ner.serving.batcher import _Pending

    async def scenario():
        batcher = MicroBatcher(FailsOnBoom().predict, Limits(max_wait_ms=0))
        loop = asyncio.get_running_loop()
        settled, open_ = _Pending(["a"], loop.create_future()), _Pending(["b"], loop.create_future())
        settled.future.cancel()  # what submit's timeout does
        batcher.seconds_per_text = 10.0
        batcher.drain_deadline = loop.time() + 1  # the batch cannot fit before it
        await batcher._start([settled, open_])
        return open_.future.exception()

    from ner.serving.batcher import Draining

    assert isinstance(run(scenario()), Draining)


def test_a_dead_batcher_makes_health_503_and_stops_the_process(random_model):
    stopped: list[str] = []
    app = create_app(FailsOnBoom(), random_model, Limits(max_wait_ms=0))
    app.state.lifecycle.on_failure = stopped.append
    with TestClient(app) as test_client:
        assert test_client.get("/health").status_code == 200
        test_client.portal.call(app.state.batcher.task.cancel)
        deadline = time.monotonic() + 30
        while test_client.get("/health").status_code != 503:
            assert time.monotonic() < deadline, "/health still says ok"
        assert test_client.get("/health").json()["status"] == "failed"
        assert test_client.get("/ready").status_code == 503
        refused = test_client.post("/predict", json={"text": "anyone?"})
        assert refused.status_code == 503 and "restarting" in refused.json()["error"]
    assert len(stopped) == 1 and "ended unexpectedly" in stopped[0]


def test_each_text_is_split_once_off_the_event_loop(tagger):
    from ner.data.text import split_words

    split_in: list[tuple[str, threading.Thread]] = []
    received: list = []

    def split(text: str):
        split_in.append((text, threading.current_thread()))
        return split_words(text)

    def predict(texts, words):
        received.append(words)
        return tagger.predict(texts, words=words, splitter=None)  # None: Tagger must not split again

    async def scenario():
        batcher = MicroBatcher(predict, Limits(max_wait_ms=0), split=split)
        batcher.start()
        answers = await batcher.submit(TEXTS)
        await batcher.stop()
        return answers

    assert run(scenario()) == tagger.predict(TEXTS)
    assert [text for text, _ in split_in] == TEXTS  # once each
    assert all(thread is not threading.main_thread() for _, thread in split_in)  # the loop runs in this thread
    assert received == [[split_words(text) for text in TEXTS]]


def test_serve_flags_reach_uvicorn_and_the_batcher(random_model):
    from ner.errors import UserError
    from ner.serve import build_parser, limits_of, server_config

    args = build_parser().parse_args([str(random_model), "--max-queue", "300", "--request-timeout", "7",
                                      "--max-text-chars", "99", "--max-concurrency", "12", "--shutdown-timeout", "9"])
    limits, options = limits_of(args)
    assert (limits.max_queue_texts, limits.request_timeout_s, limits.max_text_chars) == (300, 7, 99)
    config = server_config(object(), args, options)
    assert (config.limit_concurrency, config.timeout_graceful_shutdown) == (12, 9)
    assert options.drain_budget_s() == 8
    with pytest.raises(UserError, match="--max-queue 100 is below --max-texts 256"):
        limits_of(build_parser().parse_args([str(random_model), "--max-queue", "100"]))


# ----------------------------------------------------------------------------- a real uvicorn process

HELD_MODEL_SERVER = """
import sys, threading
from pathlib import Path
import ner.inference.tagger
from ner.serving.batcher import MicroBatcher
from ner.serving.lifecycle import WARM_UP_TEXT, Lifecycle
from ner.serve import main

calls, real, drained = Path(sys.argv[1]), ner.inference.tagger.Tagger.predict, threading.Event()
begin_drain, learn_pace, hour_s = Lifecycle._drain, MicroBatcher._learn_pace, 3600.0

def an_hour_slower(self, seconds, texts, words):  # the pace the drain plans with: each batch as if it took an hour
    learn_pace(self, seconds + hour_s, texts, words)

def drain(self):  # SIGTERM's drain begins (its deadline set), then the held batch goes on
    begin_drain(self)
    drained.set()

def held(self, texts, *args, **kwargs):  # every batch but the warm-up: logged in `calls`, held until the drain
    if texts != [WARM_UP_TEXT]:
        with calls.open("a") as log:
            log.write(repr(texts) + "\\n")
        drained.wait()
    return real(self, texts, *args, **kwargs)

Lifecycle._drain, ner.inference.tagger.Tagger.predict, MicroBatcher._learn_pace = drain, held, an_hour_slower
sys.exit(main(sys.argv[2:]))
"""


def start_server(model_dir, *extra: str,
                 launcher: tuple[str, ...] = ("-m", "ner.serve")) -> tuple[subprocess.Popen, str]:
    port = free_local_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen([sys.executable, *launcher, str(model_dir), "--port", str(port),
                                "--mixed-precision", NO_MIXED_PRECISION, *extra], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    if wait_until_healthy(url, process, timeout_s=120):
        return process, url
    if process.poll() is not None:
        pytest.fail(f"server exited {process.returncode}: {process.stdout.read()}")
    process.kill()
    pytest.fail("server did not come up in 120 s")


def connected_clients(url: str, count: int) -> list[httpx.Client]:
    """Clients whose keep-alive connection is open already (httpx connects on the first request)."""
    clients = [httpx.Client(base_url=url, timeout=60) for _ in range(count)]
    for client in clients:
        assert client.get("/health").status_code == 200
    return clients


def post_all(url: str, payloads: list[dict], clients: list[httpx.Client] | None = None,
             responses: list | None = None) -> list[httpx.Response]:
    """Every payload at once, one thread (one client, connected beforehand) each; `responses`, when given,
    fills as answers arrive, so a caller in another thread can watch them."""
    clients = clients or connected_clients(url, len(payloads))
    responses = [None] * len(payloads) if responses is None else responses

    def send(i: int) -> None:
        responses[i] = clients[i].post("/predict", json=payloads[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for client in clients:
        client.close()
    return responses


def wait_for_in_flight(url: str, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5) as probe:
        while probe.get("/health").json()["in_flight"] < count:
            assert time.monotonic() < deadline, f"{count} requests were never in flight at once"
            time.sleep(0.01)


def test_uvicorn_concurrent_answers_equal_answers_alone_and_sigterm_drains(random_model, tagger):
    # --max-wait-ms 1500: concurrent requests surely share batches, and are surely in flight at SIGTERM.
    process, url = start_server(random_model, "--max-wait-ms", "1500")
    try:
        texts = [f"{TEXTS[i % len(TEXTS)]} Request {i} from Lisbon {'and Cairo ' * i}" for i in range(16)]
        alone = [tagger.predict([text])[0] for text in texts]
        assert sum(len(a["entities"]) for a in alone) > 16
        together = post_all(url, [{"text": text} for text in texts])
        assert [r.status_code for r in together] == [200] * 16
        assert [r.json() for r in together] == alone
        in_flight: list = []
        clients = connected_clients(url, 6)
        sender = threading.Thread(target=lambda: in_flight.extend(post_all(url, [{"text": t} for t in texts[:6]],
                                                                           clients)))
        sender.start()
        wait_for_in_flight(url, 6)  # all six received, and waiting out --max-wait-ms inside the server
        process.send_signal(signal.SIGTERM)
        sender.join(60)
        assert [r.status_code for r in in_flight] == [200] * 6
        assert [r.json() for r in in_flight] == alone[:6]
        assert process.wait(30) in (0, 128 + signal.SIGTERM, -signal.SIGTERM), process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()


def poll(url: str, route: str, until, timeout_s: float = 60) -> dict:
    """GET `route` until `until(status, body)` holds; its body."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5) as probe:
        while True:
            response = probe.get(route)
            if until(response.status_code, response.json()):
                return response.json()
            assert time.monotonic() < deadline, f"GET {route} never reached the state: {response.json()}"
            time.sleep(0.01)


def read_in_background(process: subprocess.Popen) -> tuple[threading.Thread, list[str]]:
    """The server's output, read as it comes (a full pipe would stall its logging); complete once joined."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    return reader, lines


@pytest.mark.slow
def test_sigterm_answers_the_batch_in_flight_refuses_the_queue_by_its_pace_and_needs_no_forced_exit(random_model,
                                                                                                    tmp_path):
    """One text a batch, 6 texts of queue, 12 requests: 1 runs (held until the drain begins), then 11 at once: 6
    wait, 5 are shed. SIGTERM with --shutdown-timeout 4 (a drain budget of 3 s): the batch in flight is answered;
    by the pace the drain plans with (each batch taken as an hour: the server's pace is declared, not measured on
    this machine) no other batch fits, so the queue gets 503 at once; only that batch was computed; the process
    exits with SIGTERM's status and uvicorn never had to force its shutdown. Events, not the machine's speed: the
    11 are sent once the first one's batch is held, and the hold ends when the drain begins; what must fit in the
    3 s is one short sentence's forward pass."""
    shutdown_timeout_s, calls = 4.0, tmp_path / "calls"
    process, url = start_server(random_model, "--max-wait-ms", "0", "--max-batch-texts", "1", "--max-texts", "1",
                                "--max-queue", "6", "--shutdown-timeout", str(shutdown_timeout_s),
                                "--request-timeout", "3600", launcher=("-c", HELD_MODEL_SERVER, str(calls)))
    reader, output = read_in_background(process)
    try:
        poll(url, "/ready", lambda status, _: status == 200)
        running, responses = [None], [None] * 11
        clients = connected_clients(url, 12)
        payloads = [{"text": f"Request {i} from Ada Lovelace in London."} for i in range(12)]
        senders = [threading.Thread(target=post_all, args=(url, payloads[:1], clients[:1], running))]
        senders[0].start()
        poll(url, "/health", lambda *_: calls.is_file() and calls.read_text().count("\n") == 1)  # its batch is held
        senders.append(threading.Thread(target=post_all, args=(url, payloads[1:], clients[1:], responses)))
        senders[1].start()
        # The 5 shed answers must be back before SIGTERM, or a late one meets "shutting down" instead.
        poll(url, "/health", lambda _, body: body["queued_texts"] == 6 and body["in_flight"] == 7
             and sum(r is not None for r in responses) == 5)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(60)
        for sender in senders:
            sender.join(60)
        reader.join(60)
        responses += running
    finally:
        if process.poll() is None:
            process.kill()
    log = "".join(output)
    assert returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM), log
    assert all(r is not None for r in responses) and len(responses) == 12  # every request answered, none dropped
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [503] * 11, statuses
    shed = [r for r in responses if r.status_code == 503 and "--max-queue" in r.json()["error"]]
    assert len(shed) == 5 and all(int(r.headers["retry-after"]) >= 1 for r in shed)
    assert sum("shutting down" in r.json()["error"] for r in responses if r.status_code == 503) == 6
    assert len(calls.read_text().splitlines()) == 1  # the queued texts were refused, never computed
    assert "timeout graceful shutdown exceeded" not in log, log


def test_a_dead_batcher_stops_the_server_with_exit_status_1(random_model, monkeypatch):
    """main() in this process: the batching task dies on the first request; the request gets 503, and
    uvicorn stops with status 1 for the supervisor."""
    from ner.serve import main
    from ner.serving.batcher import MicroBatcher

    async def dies(self, batch):
        raise RuntimeError("injected: the batching task dies")

    import uvicorn

    servers: list = []

    class Recorded(uvicorn.Server):
        def __init__(self, config) -> None:
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(MicroBatcher, "_present", dies)
    monkeypatch.setattr(uvicorn, "Server", Recorded)
    port = free_local_port()
    answers: list = []
    returned = threading.Event()

    def client() -> None:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        answers.append(httpx.post(f"{url}/predict", json={"text": "Ada Lovelace"}, timeout=30))
        if not returned.wait(30):  # the server did not stop itself: stop it, so the test fails instead of hanging
            servers[0].should_exit = True

    thread = threading.Thread(target=client)
    thread.start()
    status = main([str(random_model), "--port", str(port), "--mixed-precision", NO_MIXED_PRECISION,
                   "--shutdown-timeout", "5"])
    returned.set()
    thread.join(30)
    assert status == 1
    assert answers[0].status_code == 503 and "restarting" in answers[0].json()["error"]


@pytest.mark.parametrize("precision", ("bf16", "auto"))
def test_uvicorn_16_concurrent_answers_equal_answers_alone_in_the_default_precision(wide_random_model, precision):
    """bf16 (autocast runs on any CPU) and the default: each text answered alone (one request at a time), then
    under 16 concurrent clients sharing batches (--max-wait-ms 1500): the same answers, scores included. On the
    wide model, where a batch-shaped plan changes served scores (seen: the sorted plan fails this test)."""
    process, url = start_server(wide_random_model, "--max-wait-ms", "1500", "--mixed-precision", precision)
    try:
        texts = [f"{TEXTS[i % len(TEXTS)]} Request {i} from Lisbon {'and Cairo ' * i}" for i in range(16)]
        with httpx.Client(base_url=url, timeout=60) as client:
            alone = [client.post("/predict", json={"text": text}).json() for text in texts]
        assert sum(len(a["entities"]) for a in alone) > 16
        together = post_all(url, [{"text": text} for text in texts])
        assert [r.status_code for r in together] == [200] * 16
        assert [r.json() for r in together] == alone
    finally:
        process.kill()
        process.wait(30)


def test_taken_port_is_a_one_line_error(random_model):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "ner.serve", str(random_model), "--port", str(port)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_serve_runs_the_model_as_it_was_trained(random_model, tmp_path):
    """No --max-seq-length or --decode given: the window and decoding recorded in the export."""
    import shutil

    from ner.inference.tagger import Tagger
    from ner.serve import build_parser

    trained = tmp_path / "trained"
    shutil.copytree(random_model, trained)
    (trained / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "argmax"}))
    tagger = Tagger.from_args(build_parser().parse_args([str(trained), "--mixed-precision", NO_MIXED_PRECISION]))
    assert tagger.max_seq_length == 32 and tagger.decoder.method == "argmax"
    overridden = Tagger.from_args(build_parser().parse_args([str(trained), "--max-seq-length", "64"]))
    assert overridden.max_seq_length == 64


@pytest.mark.parametrize("value, says", [
    ("4", "--max-seq-length 4 is too small: a window needs [CLS], [SEP] and a few words (use 8 or more, up to 128)"),
    ("129", "--max-seq-length 129 is longer than the model's 128 positions (use 8 to 128)"),
])
def test_max_seq_length_outside_the_model_is_a_user_error(random_model, value, says):
    """Checked where every inference command (predict, evaluate, serve) builds its Tagger; the tiny BERT has
    128 positions. A UserError is one line and exit code 2 (ner/errors.py)."""
    from ner.errors import UserError
    from ner.inference.tagger import Tagger
    from ner.serve import build_parser

    def tagger_with(length: str) -> Tagger:
        return Tagger.from_args(build_parser().parse_args([str(random_model), "--max-seq-length", length,
                                                           "--mixed-precision", NO_MIXED_PRECISION]))

    with pytest.raises(UserError) as info:
        tagger_with(value)
    assert str(info.value) == says
    assert tagger_with("128").max_seq_length == 128
