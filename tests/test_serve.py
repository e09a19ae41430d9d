"""`python -m ner.serve`: the routes, every bad request, micro-batching, and a real uvicorn process."""

from __future__ import annotations

import asyncio
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

from conftest import ROOT  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from ner.serve import Limits, MicroBatcher, create_app  # noqa: E402
from ner.testing import free_local_port, wait_until_healthy  # noqa: E402

TEXTS = ["Ada Lovelace visited London on Monday.", "", "Café \U0001F600 北京 a\u200bb\tc",
         "Shares of Acme Corp rose in Paris after Alan Turing spoke."]


@pytest.fixture(scope="module")
def tagger(random_model):
    from ner.infer import Tagger

    return Tagger(random_model, precision="no")


@pytest.fixture(scope="module")
def client(tagger, random_model):
    app = create_app(tagger, random_model, Limits(max_request_bytes=2000, max_texts=4))
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

    def predict(self, texts: list[str]) -> list[dict]:
        if "boom" in texts:
            raise RuntimeError("boom")
        return [{"entities": []} for _ in texts]


def test_a_failing_batch_answers_500_and_the_server_goes_on(random_model, caplog):
    with TestClient(create_app(FailsOnBoom(), random_model, Limits(max_wait_ms=1))) as test_client:
        failed = test_client.post("/predict", json={"text": "boom"})
        assert failed.status_code == 500
        assert failed.json() == {"error": "prediction failed (see the server log)"}
        assert "prediction failed" in caplog.text and "RuntimeError: boom" in caplog.text
        assert not test_client.app.state.batcher.task.done()  # the batching loop goes on
        after = test_client.post("/predict", json={"texts": ["fine", "also fine"]})
        assert after.status_code == 200 and after.json() == {"results": [{"entities": []}] * 2}
        assert test_client.get("/health").json()["in_flight"] == 0


def resolve(spec: dict, schema: dict) -> dict:
    """`schema` with its $ref into the document's components followed, recursively."""
    if "$ref" in schema:
        return resolve(spec, spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
    return {k: [resolve(spec, s) for s in v] if k in ("oneOf", "anyOf") else
            {name: resolve(spec, p) for name, p in v.items()} if k == "properties" else
            resolve(spec, v) if k == "items" else v for k, v in schema.items()}


def test_openapi_documents_the_predict_body_and_answers(client):
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/predict"]["post"]
    body = resolve(spec, post["requestBody"]["content"]["application/json"]["schema"])
    assert post["requestBody"]["required"] is True
    shapes = {tuple(s["required"]): s for s in body["oneOf"]}
    assert shapes[("text",)]["properties"]["text"]["type"] == "string"
    assert shapes[("texts",)]["properties"]["texts"] == {**shapes[("texts",)]["properties"]["texts"],
                                                         "type": "array", "items": {"type": "string"}}
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

    def predict(texts):
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


# ----------------------------------------------------------------------------- a real uvicorn process

def start_server(model_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_local_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen([sys.executable, "-m", "ner.serve", str(model_dir), "--port", str(port),
                                "--mixed-precision", "no", *extra], cwd=ROOT, env=env,
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


def post_all(url: str, payloads: list[dict], clients: list[httpx.Client] | None = None) -> list[httpx.Response]:
    """Every payload at once, one thread (one client, connected beforehand) each."""
    clients = clients or connected_clients(url, len(payloads))
    responses: list = [None] * len(payloads)

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


@pytest.mark.parametrize("precision", ("bf16", "auto"))
def test_uvicorn_16_concurrent_answers_equal_answers_alone_in_the_default_precision(random_model, precision):
    """bf16 (autocast runs on any CPU) and the default: each text answered alone (one request at a time), then
    under 16 concurrent clients sharing batches (--max-wait-ms 1500): the same answers, scores included."""
    process, url = start_server(random_model, "--max-wait-ms", "1500", "--mixed-precision", precision)
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

    from ner.infer import Tagger
    from ner.serve import build_parser

    trained = tmp_path / "trained"
    shutil.copytree(random_model, trained)
    (trained / "training_args.json").write_text(json.dumps({"max_seq_length": 32, "decode": "argmax"}))
    tagger = Tagger.from_args(build_parser().parse_args([str(trained), "--mixed-precision", "no"]))
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
    from ner.infer import Tagger
    from ner.serve import build_parser

    def tagger_with(length: str) -> Tagger:
        return Tagger.from_args(build_parser().parse_args([str(random_model), "--max-seq-length", length,
                                                           "--mixed-precision", "no"]))

    with pytest.raises(UserError) as info:
        tagger_with(value)
    assert str(info.value) == says
    assert tagger_with("128").max_seq_length == 128
