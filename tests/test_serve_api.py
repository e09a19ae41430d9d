"""`python -m ner.serve` for an operator: /metrics, request ids and the access log, the typed API (OpenAPI +
schemathesis), the API key, CORS, and --workers."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from conftest import ROOT, resolve  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ner.backends import NO_MIXED_PRECISION  # noqa: E402
from ner.serving.app import create_app  # noqa: E402
from ner.serving.metrics import ServeMetrics  # noqa: E402
from ner.serving.requests import Limits  # noqa: E402
from ner.testing import free_local_port, wait_until_healthy  # noqa: E402

TEXTS = ["Ada Lovelace visited London on Monday.", "Shares of Acme Corp rose in Paris."]
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def tagger(random_model):
    from ner.inference.tagger import Tagger

    return Tagger(random_model, precision=NO_MIXED_PRECISION)


@pytest.fixture(scope="module")
def client(tagger, random_model):
    with TestClient(create_app(tagger, random_model, Limits(max_request_bytes=2000, max_texts=4))) as test_client:
        yield test_client


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, ((label, value), ...)): value} from the Prometheus text format."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


# ----------------------------------------------------------------------------- metrics

def test_metrics_count_requests_batches_texts_and_words(client):
    from ner.data.text import split_words

    before = scrape(client)
    assert client.post("/predict", json={"texts": TEXTS}).status_code == 200
    assert client.post("/predict", json={"text": 5}).status_code == 422
    assert client.get("/nowhere").status_code == 404
    for method in ("FOO1", "FOO2", "X" * 40):  # any token is a method in HTTP: each must not make a series
        client.request(method, "/health")
    after = scrape(client)
    requests = "ner_requests_total"
    assert moved(before, after, requests, route="/predict", method="POST", status="200") == 1
    assert moved(before, after, requests, route="/predict", method="POST", status="422") == 1
    assert moved(before, after, requests, route="other", method="GET", status="404") == 1  # never the raw path
    assert moved(before, after, requests, route="/metrics", method="GET", status="200") == 1  # the first scrape
    assert moved(before, after, "ner_request_seconds_count", route="/predict") == 2
    assert moved(before, after, "ner_texts_tagged_total") == 2
    assert moved(before, after, "ner_words_tagged_total") == sum(len(split_words(t)) for t in TEXTS)
    assert moved(before, after, "ner_batch_texts_count") == 1 and moved(before, after, "ner_batch_texts_sum") == 2
    assert moved(before, after, "ner_batch_seconds_count") == 1
    assert after[("ner_queue_texts", ())] == 0
    methods = {dict(labels)["method"] for (name, labels) in after if name == requests}
    assert methods <= {"GET", "POST", "other"} and "other" in methods


def test_a_worker_that_ends_leaves_the_queue_gauge(tmp_path):
    """With --workers, each worker's queue gauge is a file of its pid; an ended worker's goes (mark_process_dead),
    so the live sum no longer counts it. In a process of its own: prometheus-client reads the folder at import."""
    worker = ("import json, os, sys; from ner.serving.metrics import ServeMetrics; "
              "m = ServeMetrics(queued_texts=lambda: 3); m.refresh_queue(); before = sorted(os.listdir(sys.argv[1])); "
              "m.process_ended(); print(json.dumps([os.getpid(), before, sorted(os.listdir(sys.argv[1]))]))")
    ran = subprocess.run([sys.executable, "-c", worker, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}, timeout=120)
    assert ran.returncode == 0, ran.stderr
    pid, files_before, files_after = json.loads(ran.stdout)
    gauge = f"gauge_livesum_{pid}.db"
    assert gauge in files_before, files_before  # the worker's gauge was there: its going is what is tested
    assert gauge not in files_after and files_after, files_after  # its counters stay: they count what it did


class Gate:
    """A tagger that holds every batch after the warm-up pass until `release` is set."""

    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}

    def __init__(self) -> None:
        self.release = threading.Event()
        self.warmed_up = False

    def predict(self, texts: list[str], words=None) -> list[dict]:
        if self.warmed_up:
            assert self.release.wait(60)
        self.warmed_up = True
        return [{"entities": []} for _ in texts]


def test_queue_depth_is_the_texts_waiting(random_model):
    gate = Gate()
    with TestClient(create_app(gate, random_model, Limits(max_wait_ms=1, max_batch_texts=1))) as test_client:
        senders = [threading.Thread(target=test_client.post, args=("/predict",), kwargs={"json": {"texts": texts}})
                   for texts in (["a"], ["b", "c"], ["d", "e"])]
        try:
            deadline = time.monotonic() + 30
            while test_client.get("/ready").status_code != 200:  # the warm-up pass has run
                assert time.monotonic() < deadline
                time.sleep(0.01)
            senders[0].start()  # its batch holds the model
            while test_client.get("/health").json()["in_flight"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            for sender in senders[1:]:
                sender.start()
            while scrape(test_client)[("ner_queue_texts", ())] != 4:  # 2 requests of 2 texts wait behind it
                assert time.monotonic() < deadline, "the queue never held the 4 waiting texts"
                time.sleep(0.01)
        finally:  # answered before the app stops, even when the test fails
            gate.release.set()
            for sender in senders:
                if sender.is_alive():
                    sender.join(30)
        assert scrape(test_client)[("ner_queue_texts", ())] == 0


def test_the_batcher_events_move_their_counters():
    """What the batcher reports on load shedding, timeouts and failures (ner.serving.batcher.BatcherEvents)."""
    metrics = ServeMetrics()
    metrics.shed(3)
    metrics.shed(2)
    metrics.timed_out(4)
    metrics.dropped_disconnected(1)
    metrics.text_failed()
    after = samples(metrics.render().decode())
    assert after[("ner_shed_requests_total", ())] == 2 and after[("ner_shed_texts_total", ())] == 5
    assert after[("ner_timeouts_total", ())] == 1
    assert after[("ner_dropped_disconnected_total", ())] == 1 and after[("ner_text_failures_total", ())] == 1


def test_each_app_has_its_own_registry(tagger, random_model):
    with TestClient(create_app(tagger, random_model)) as other:
        other.post("/predict", json={"text": "x"})
        assert moved({}, scrape(other), "ner_requests_total", route="/predict", method="POST", status="200") == 1


# ----------------------------------------------------------------------------- request ids, access log

def test_request_id_is_echoed_or_made_on_every_answer(client):
    given = client.post("/predict", json={"text": "Ada"}, headers={"X-Request-ID": "req-42"})
    assert given.headers["x-request-id"] == "req-42"
    made = {client.get("/health").headers["x-request-id"] for _ in range(2)}
    assert len(made) == 2 and all(re.fullmatch("[0-9a-f]{32}", m) for m in made)
    for bad in ("has space", "x" * 129, "caf\u00e9"):
        answer = client.get("/health", headers={"X-Request-ID": bad.encode("utf-8")})
        assert re.fullmatch("[0-9a-f]{32}", answer.headers["x-request-id"]), bad  # replaced, not trusted
    for response in (client.post("/predict", content=b"{", headers={"X-Request-ID": "e1"}),
                     client.get("/nowhere", headers={"X-Request-ID": "e1"})):
        assert response.status_code in (404, 422) and response.headers["x-request-id"] == "e1"


def test_access_log_has_one_line_per_request(client, caplog):
    with caplog.at_level(logging.INFO, logger="ner.access"):
        client.post("/predict", json={"texts": TEXTS}, headers={"X-Request-ID": "log-1"})
        client.post("/predict", content=b"{", headers={"X-Request-ID": "log-2"})
    lines = [r.getMessage() for r in caplog.records if r.name == "ner.access"]
    assert len(lines) == 2
    assert re.fullmatch(r"POST /predict 200 texts=2 ms=\d+\.\d id=log-1", lines[0])
    assert re.fullmatch(r"POST /predict 422 texts=- ms=\d+\.\d id=log-2", lines[1])


def test_an_unexpected_exception_is_a_json_500_with_the_request_id(tagger, random_model, caplog):
    app = create_app(tagger, random_model)

    @app.get("/broken")
    async def broken():
        raise RuntimeError("bug")

    with TestClient(app) as test_client:
        response = test_client.get("/broken", headers={"X-Request-ID": "bug-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "bug-1"
    assert response.json() == {"error": "internal error (see the server log, request id bug-1)"}
    assert "request bug-1 failed" in caplog.text and "RuntimeError: bug" in caplog.text


# ----------------------------------------------------------------------------- the typed API

def answer_schema(spec: dict, path: str, method: str, status: int) -> dict:
    response = spec["paths"][path][method]["responses"][str(status)]
    return resolve(spec, response["content"]["application/json"]["schema"])


def test_openapi_describes_every_body_and_error_exactly(client, tagger, random_model):
    spec = client.get("/openapi.json").json()
    health = answer_schema(spec, "/health", "get", 200)
    assert set(health["required"]) == set(client.get("/health").json()) and health["additionalProperties"] is False
    error = {"type": "object", "title": "Error", "additionalProperties": False, "required": ["error"]}
    for path, status in [("/predict", 413), ("/predict", 422), ("/predict", 500), ("/predict", 503),
                         ("/predict", 504)]:
        schema = answer_schema(spec, path, "post", status)
        assert {k: schema[k] for k in error} == error and schema["properties"]["error"]["type"] == "string"
    failed = answer_schema(spec, "/health", "get", 503)  # the health body, with status "failed" and the error
    assert failed["title"] == "Health" and "error" in failed["properties"] and "error" not in failed["required"]
    many = next(s for s in resolve(spec, spec["paths"]["/predict"]["post"]["requestBody"]["content"]
                                   ["application/json"]["schema"])["oneOf"] if "texts" in s["properties"])
    assert many["properties"]["texts"]["maxItems"] == 4  # the server's --max-texts
    assert "Retry-After" in spec["paths"]["/predict"]["post"]["responses"]["503"]["headers"]
    assert "401" not in spec["paths"]["/predict"]["post"]["responses"] and "security" not in spec["paths"]["/predict"]
    if "/ready" not in spec["paths"]:
        pytest.skip("GET /ready comes with the readiness change")
    ready = answer_schema(spec, "/ready", "get", 200)
    assert ready["required"] == ["status"] and ready["additionalProperties"] is False


def test_openapi_documents_the_key_where_one_is_required(tagger, random_model):
    spec = TestClient(create_app(tagger, random_model, api_key=KEY)).get("/openapi.json").json()
    post = spec["paths"]["/predict"]["post"]
    assert post["security"] == [{"HTTPBearer": []}] and spec["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "description": "--api-key or NER_API_KEY"}
    assert "WWW-Authenticate" in post["responses"]["401"]["headers"]
    assert "security" not in spec["paths"]["/health"]["get"]


schemathesis = pytest.importorskip("schemathesis")


def schema_of(app):
    from schemathesis.config import SchemathesisConfig

    # schemathesis' list for invalid requests, plus 413: more texts than the document's maxItems (--max-texts)
    # are refused with 413, as they always were
    rejected = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
    config = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": rejected}}})
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


@pytest.fixture
def served_schema(tagger, random_model, monkeypatch):  # an app per test: its executor ends with the app's lifespan
    for name in ("LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY"):  # a generated START_TRAINING starts nothing
        monkeypatch.delenv(name, raising=False)
    return schema_of(create_app(tagger, random_model, Limits(max_texts=4), label_studio=True))


def documented_operations(schema) -> list:
    """Every route, /label-studio/* included (their bodies are open JSON objects, checked by meaning)."""
    return [result.ok() for result in schema.get_all_operations()]


def by_meaning(case) -> bool:
    return case.operation.path.startswith("/label-studio/") and case.operation.path != "/label-studio/health"


# Hypothesis drives schemathesis' strategies directly rather than through schemathesis' pytest plugin
# (`from_fixture(...).parametrize()`), which reads pytest internals that pytest 9 removed (`_nodeid`): this
# works on pytest 8 and 9 alike.
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_answer_matches_the_document(served_schema, mode):
    """Generated requests (valid and invalid) on every route: no 5xx, every status, header and body as
    documented. Derandomised and bounded: it explores the same cases each run, in seconds."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import positive_data_acceptance

    operations = documented_operations(served_schema)
    assert {op.path for op in operations} >= {"/predict", "/health", "/label-studio/predict", "/label-studio/train",
                                             "/label-studio/setup", "/label-studio/webhook"}
    checked = 0
    for operation in operations:
        @given(case=operation.as_strategy(GenerationMode(mode)))
        @settings(max_examples=25, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def answers_as_documented(case):
            # Label Studio's bodies are checked by meaning (a label config is XML with a <Labels> over a <Text>):
            # a schema-valid body may still be refused with 422, so that check is off there; every other holds
            case.call_and_validate(excluded_checks=[positive_data_acceptance] if by_meaning(case) else None)

        try:
            answers_as_documented()
            checked += 1
        except Unsatisfiable:  # negative: a route with no inputs has no invalid request to make
            assert mode == "negative", operation.label
    assert checked == len(operations) if mode == "positive" else checked >= 1  # /predict takes a body


def test_no_route_that_tags_or_trains_answers_without_the_key(tagger, random_model, monkeypatch):
    """Generated requests to every route of a server with --api-key, sent without a key: each route that tags
    or trains answers 401, never 200 and never 5xx; the open ones (/, /health, /ready, /metrics) hold no text."""
    from hypothesis import given
    from schemathesis import GenerationMode

    monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    schema = schema_of(create_app(tagger, random_model, Limits(max_texts=4), api_key=KEY, label_studio=True))
    open_routes = {"/", "/health", "/ready", "/metrics", "/openapi.json", "/label-studio/health"}
    guarded = [op for op in documented_operations(schema) if op.path not in open_routes]
    assert {op.path for op in guarded} == {"/predict", "/label-studio/predict", "/label-studio/train",
                                           "/label-studio/setup", "/label-studio/webhook"}
    for operation in guarded:
        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        @settings(max_examples=15, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def refused_without_the_key(case):
            case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
            assert case.call().status_code == 401, case.operation.label

        refused_without_the_key()


# ----------------------------------------------------------------------------- API key, CORS

def test_api_key_guards_predict_only(tagger, random_model):
    with TestClient(create_app(tagger, random_model, api_key=KEY)) as test_client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": KEY}):
            refused = test_client.post("/predict", json={"text": "Ada"}, headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"] == "Bearer"
            assert refused.json() == {"error": "missing or wrong API key: send Authorization: Bearer KEY"}
        allowed = test_client.post("/predict", json={"text": "Ada"}, headers={"Authorization": f"Bearer {KEY}"})
        assert allowed.status_code == 200 and "entities" in allowed.json()
        assert [test_client.get(path).status_code for path in ("/", "/health", "/metrics")] == [200] * 3


def test_cors_lets_the_named_origins_call_the_api(tagger, random_model):
    origin = "https://app.example.com"
    with TestClient(create_app(tagger, random_model, cors_origins=[origin], api_key=KEY)) as test_client:
        preflight = test_client.options("/predict", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200  # answered before the key is checked: preflights carry none
        assert preflight.headers["access-control-allow-origin"] == origin
        assert {"authorization", "content-type"} <= set(preflight.headers["access-control-allow-headers"].lower()
                                                        .replace(" ", "").split(","))
        assert "POST" in preflight.headers["access-control-allow-methods"]
        other = test_client.options("/predict", headers={"Origin": "https://evil.example",
                                                         "Access-Control-Request-Method": "POST"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        answer = test_client.post("/predict", json={"text": "Ada"},
                                  headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
        assert answer.headers["access-control-allow-origin"] == origin
        assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()
    with TestClient(create_app(tagger, random_model)) as closed:
        assert "access-control-allow-origin" not in closed.get("/health", headers={"Origin": origin}).headers


# ----------------------------------------------------------------------------- --workers

def predict_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(value for (name, labels), value in samples(text).items()
               if name == "ner_requests_total" and ("route", "/predict") in labels)


def start_two_workers(model, port: int, tmp_path) -> subprocess.Popen:
    """`ner.serve MODEL --workers 2` on `port`, its temporary folders under `tmp_path`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TMPDIR": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "ner.serve", str(model), "--port", str(port),
                             "--mixed-precision", NO_MIXED_PRECISION, "--workers", "2"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_workers_share_the_port_and_their_metrics(random_model, tagger, tmp_path):
    port = free_local_port()
    process = start_two_workers(random_model, port, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until_healthy(url, process, timeout_s=180), process.stdout.read() if process.poll() else ""
        pids: set[int] = set()
        deadline = time.monotonic() + 120
        while len(pids) < 2:  # each new connection goes to whichever worker accepts it
            assert time.monotonic() < deadline, f"only worker(s) {pids} ever answered"
            pids.add(httpx.get(f"{url}/health", timeout=10).json()["pid"])
        assert process.pid not in pids
        expected = tagger.predict(TEXTS)
        for _ in range(6):
            assert httpx.post(f"{url}/predict", json={"texts": TEXTS}, timeout=60).json() == {"results": expected}
        assert [predict_count(url) for _ in range(4)] == [6] * 4  # whichever worker answers: the sum of both
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, process.stdout.read()
        assert not list(tmp_path.glob("ner-serve-metrics-*"))  # the metrics folder made for the run is gone
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow
def test_workers_that_fail_make_the_command_exit_non_zero(random_model, tmp_path):
    """--workers 2 with a setting each worker refuses when it loads the model (--max-seq-length 4): uvicorn stops
    its workers and returns, and the command says so with its status (it exited 0), for a supervisor to see."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TMPDIR": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    ran = subprocess.run([sys.executable, "-m", "ner.serve", str(random_model), "--port", str(free_local_port()),
                          "--mixed-precision", NO_MIXED_PRECISION, "--workers", "2", "--max-seq-length", "4"],
                         cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1, ran.stderr
    assert "--max-seq-length 4 is too small" in ran.stderr and "did not end cleanly" in ran.stderr, ran.stderr
    assert not list(tmp_path.glob("ner-serve-*"))  # the folders made for the run are gone


@pytest.mark.slow
def test_a_worker_killed_while_serving_makes_the_command_exit_non_zero(random_model, tmp_path):
    """A worker dies (SIGKILL, as the OOM killer does); uvicorn starts another and serves on; at SIGTERM the
    command exits 1 and names the dead worker, where a clean stop exits 0 (test_two_workers_share_the_port...)."""
    port = free_local_port()
    process = start_two_workers(random_model, port, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until_healthy(url, process, timeout_s=180), process.stdout.read() if process.poll() else ""
        killed = httpx.get(f"{url}/health", timeout=10).json()["pid"]
        os.kill(killed, signal.SIGKILL)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read()
    assert returncode == 1, output
    assert re.search(rf"worker process\(es\) [0-9, ]*\b{killed}\b[0-9, ]* did not end cleanly", output), output
