"""ner.serve as a Label Studio ML backend (/label-studio/*), offline: FastAPI's TestClient, the tiny model."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from ner.backends import NO_MIXED_PRECISION  # noqa: E402
from ner.data.batching import NO_TOKEN_BUDGET  # noqa: E402
from ner.inference.model_folder import model_version  # noqa: E402
from ner.serving.app import create_app  # noqa: E402
from ner.serving.label_studio import ConfigError, Target, map_types, parse_label_config  # noqa: E402
from ner.serving.requests import Limits  # noqa: E402

NER_CONFIG = """<View>
  <Labels name="label" toName="text">
    <Label value="PER" background="red"/><Label value="ORG" background="darkorange"/>
    <Label value="LOC" background="orange"/><Label value="MISC" background="green"/>
  </Labels>
  <Text name="text" value="$text"/>
</View>"""

TEXTS = ["Ada Lovelace visited London on Monday.", "", "Café \U0001F600 北京 Alan Turing met Grace Hopper in Paris.",
         "Shares of Acme Corp rose in Paris after Alan Turing spoke."]


def tasks_of(texts: list[str], field: str = "text") -> list[dict]:
    return [{"id": i + 10, "data": {field: text}} for i, text in enumerate(texts)]


@pytest.fixture(scope="module")
def tagger(random_model):
    from ner.inference.tagger import Tagger

    return Tagger(random_model, precision=NO_MIXED_PRECISION)


@pytest.fixture(scope="module")
def client(tagger, random_model):
    with TestClient(create_app(tagger, random_model, Limits(), label_studio=True)) as test_client:
        yield test_client


def predict(client, texts, config=NER_CONFIG, field="text"):
    response = client.post("/label-studio/predict", json={"tasks": tasks_of(texts, field), "label_config": config,
                                                          "project": "1.1700000000", "params": {}})
    assert response.status_code == 200, response.text
    return response.json()["results"]


# -- the label config ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "expected"), [
    (NER_CONFIG, Target("label", "text", "text", ("PER", "ORG", "LOC", "MISC"))),
    # other tags around it, a <Labels> over an image first, the text field named otherwise
    ("""<View><Header value="Tag the names"/><Image name="img" value="$image"/>
        <Labels name="boxes" toName="img"><Label value="Car"/></Labels>
        <Choices name="sentiment" toName="body"><Choice value="Positive"/></Choices>
        <Text name="body" value="$article"/><TextArea name="note" toName="body"/>
        <View><Labels name="ents" toName="body"><Label value="Person"/><Label value="Place"/></Labels></View>
     </View>""", Target("ents", "body", "article", ("Person", "Place"))),
    # toName listing several objects, one of them a <Text>; a <Label> without a value is skipped
    ("""<View><Text name="t2" value="$t2"/><Labels name="l" toName="other, t2"><Label value="ORG"/><Label/>
        </Labels></View>""", Target("l", "t2", "t2", ("ORG",))),
])
def test_label_config_finds_the_labels_over_a_text(config, expected):
    assert parse_label_config(config) == expected


@pytest.mark.parametrize(("config", "says"), [
    ("<View><Text name='text' value='$text'/><Choices name='c' toName='text'><Choice value='A'/></Choices></View>",
     "found no <Labels>"),
    ("<View><Image name='img' value='$img'/><Labels name='l' toName='img'><Label value='A'/></Labels></View>",
     "toName='img'"),
    ("<View><Text value='$text'/><Labels name='l' toName='text'><Label value='A'/></Labels></View>",
     "<Text> names none"),  # the <Text> has no name
    ("<View><Text name='text' value='text'/><Labels name='l' toName='text'><Label value='A'/></Labels></View>",
     "<Text> names none"),  # value without $: not a task field
    ("<View><Text name='text' value='$text'/><Labels toName='text'><Label value='A'/></Labels></View>",
     "name=None"),  # the <Labels> has no name
    ("<View><Text name='text' value='$text'/><Labels name='l' toName='text'></Labels></View>", "0 <Label value>"),
    ("<View><Text name='text'", "not valid XML"),
    ('<!DOCTYPE v [<!ENTITY a "aaaa">]><View>&a;</View>', "DOCTYPE"),
    ("", "got none"),
])
def test_label_config_without_labels_over_a_text_is_refused(config, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_label_config(config)


def test_types_map_exactly_then_ignoring_case_and_others_are_left_out():
    assert map_types(["PER", "LOC", "ORG", "MISC"], ("per", "Per", "LOC", "loc", "Organisation")) == {
        "PER": "per", "LOC": "LOC"}


# -- the routes -----------------------------------------------------------------------------------------------

def test_health_and_setup_name_the_model_version(client, random_model):
    health = client.get("/label-studio/health")
    assert health.status_code == 200
    assert health.json()["status"] == "UP" and health.json()["model_class"]
    setup = client.post("/label-studio/setup", json={"project": "1.1700000000", "schema": NER_CONFIG,
                                                     "hostname": "http://localhost:8080", "access_token": "x"})
    assert setup.status_code == 200, setup.text
    assert setup.json() == {"model_version": model_version(random_model)}
    assert model_version(random_model).startswith(random_model.name + "@")
    assert client.get("/health").json()["status"] == "ok"  # ner.serve's own routes are left as they were


def test_model_version_changes_with_the_weights(random_model, tmp_path):
    import shutil

    copy = shutil.copytree(random_model, tmp_path / "conll" / "final")
    assert model_version(copy).startswith("conll/final@")
    assert model_version(copy).split("@")[1] == model_version(random_model).split("@")[1]
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")
    assert model_version(copy).split("@")[1] != model_version(random_model).split("@")[1]


def test_predict_gives_one_entry_per_task_in_order_with_offsets_into_the_text(client, tagger, random_model):
    expected = tagger.predict(TEXTS)
    assert any(r["entities"] for r in expected)
    for texts in (TEXTS, TEXTS[::-1]):
        results = predict(client, texts)
        assert len(results) == len(texts)
        for text, answer in zip(texts, results):
            entities = expected[TEXTS.index(text)]["entities"]
            assert answer["model_version"] == model_version(random_model)
            # the text's confidence, which uncertainty sampling orders by: set with or without entities
            assert answer["score"] == expected[TEXTS.index(text)]["confidence"] and 0 < answer["score"] <= 1
            assert [(r["value"]["start"], r["value"]["end"], r["value"]["labels"]) for r in answer["result"]] == [
                (e["start"], e["end"], [e["type"]]) for e in entities]
            for region in answer["result"]:
                assert region["from_name"] == "label" and region["to_name"] == "text"
                assert region["type"] == "labels" and 0 <= region["score"] <= 1
                assert region["value"]["text"] == text[region["value"]["start"]:region["value"]["end"]]
    assert predict(client, [""])[0] == {"result": [], "score": 1.0, "model_version": model_version(random_model)}


def test_predict_maps_types_to_the_project_and_counts_the_dropped(client, tagger, caplog):
    config = """<View><Labels name="ner" toName="doc"><Label value="per"/><Label value="Location"/></Labels>
                <Text name="doc" value="$body"/></View>"""
    expected = tagger.predict(TEXTS)
    kept = sum(e["type"] == "PER" for r in expected for e in r["entities"])
    dropped = sum(e["type"] != "PER" for r in expected for e in r["entities"])
    assert kept and dropped
    with caplog.at_level(logging.INFO, logger="ner.serving.label_studio"):
        results = predict(client, TEXTS, config, field="body")
    regions = [region for answer in results for region in answer["result"]]
    assert len(regions) == kept
    assert {(r["from_name"], r["to_name"], *r["value"]["labels"]) for r in regions} == {("ner", "doc", "per")}
    assert f"dropped {dropped} entities" in caplog.text
    nothing = predict(client, TEXTS, config.replace('"per"', '"Person"'), field="body")
    assert [answer["result"] for answer in nothing] == [[] for _ in TEXTS]
    # the text's confidence in its whole tag sequence, whichever of its entities the project takes
    assert [answer["score"] for answer in nothing] == [r["confidence"] for r in expected]


def test_long_text_is_tagged_whole(client, tagger):
    text = " ".join(TEXTS[i % len(TEXTS)] for i in range(300))  # ~2,700 words: many windows
    assert len(text.split()) > 2000
    [answer] = predict(client, [text])
    [expected] = tagger.predict([text])
    assert [(r["value"]["start"], r["value"]["end"]) for r in answer["result"]] == [
        (e["start"], e["end"]) for e in expected["entities"]]
    assert max(r["value"]["end"] for r in answer["result"]) > len(text) * 0.9  # entities to the very end
    assert all(r["value"]["text"] == text[r["value"]["start"]:r["value"]["end"]] for r in answer["result"])


def with_config(tasks: object) -> bytes:
    return json.dumps({"tasks": tasks, "label_config": NER_CONFIG}).encode()


@pytest.mark.parametrize(("path", "body", "says"), [
    ("predict", b'{"tasks": ', "not JSON"),
    ("predict", b'[1, 2]', "JSON object"),
    ("predict", b'{"tasks": [], "label_config": "<View/>"}', "found no <Labels>"),
    ("predict", b'{"tasks": []}', "got none"),
    ("predict", with_config({"data": {}}), "must be a list"),
    ("predict", with_config([{"id": 7, "data": {"txt": "a"}}]), "task 0 (id 7): data.text must be a string"),
    ("predict", with_config([{"id": 7, "data": {"text": 5}}]), "data.text must be a string"),
    ("setup", b'{"project": "1.1", "schema": "<View><Text name=\\"t\\" value=\\"$t\\"/></View>"}',
     "found no <Labels>"),
    ("setup", b"\xff", "not JSON"),
    ("webhook", b"nope", "not JSON"),
])
def test_bad_bodies_get_422_with_a_json_error(client, path, body, says):
    response = client.post(f"/label-studio/{path}", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert says in response.json()["error"]


def test_webhook_is_accepted_and_logged(client, caplog):
    with caplog.at_level(logging.INFO, logger="ner.serving.label_studio"):
        response = client.post("/label-studio/webhook", json={"action": "ANNOTATION_CREATED", "project": {"id": 3}})
    assert response.status_code == 200
    assert "ANNOTATION_CREATED (project 3)" in caplog.text


# -- retraining: START_TRAINING -> export -> ner.train in another process -> swap ------------------------------

TINY_TRAINING = f"--max-seq-length 32 --batch-size 8 --max-tokens {NO_TOKEN_BUDGET} --num-epochs 1 " \
                "--learning-rate 1e-3 --mixed-precision no --seed 7"


def label_studio_export(sentences: list[list[tuple[str, str]]]) -> list[dict]:
    """Sentences as Label Studio's JSON export: one task each, one annotation with its entities."""
    tasks = []
    for index, sentence in enumerate(sentences):
        text, result = "", []
        for i, (word, tag) in enumerate(sentence):
            start = len(text) + (i > 0)
            text += (" " if i else "") + word
            if tag.startswith("B-"):
                result.append({"from_name": "label", "to_name": "text", "type": "labels",
                               "value": {"start": start, "end": len(text), "labels": [tag[2:]]}})
            elif tag.startswith("I-"):
                result[-1]["value"]["end"] = len(text)
        for region in result:
            region["value"]["text"] = text[region["value"]["start"]:region["value"]["end"]]
        tasks.append({"id": index + 1, "data": {"text": text}, "annotations": [{"id": index + 1, "result": result}]})
    return tasks


def retraining_environment(monkeypatch, runs_dir, train_args: str) -> None:
    """The retrainer's settings for a test: runs under `runs_dir`, no interval, a fake Label Studio and its key."""
    monkeypatch.setenv("NER_RETRAIN_DIR", str(runs_dir))
    monkeypatch.setenv("NER_RETRAIN_ARGS", train_args)
    monkeypatch.setenv("NER_RETRAIN_MIN_INTERVAL_S", "0")
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://label-studio.test")
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "tok")


@pytest.fixture
def retraining_app(tagger, random_model, tmp_path, monkeypatch):
    """(app, the requests the fake Label Studio got): the export is served by an httpx mock transport."""
    from conftest import make_sentences

    retraining_environment(monkeypatch, tmp_path / "runs", TINY_TRAINING)
    export = label_studio_export(make_sentences(24, seed=5))
    seen = []

    def label_studio(request):
        seen.append(request)
        return httpx.Response(200, json=export)

    app = create_app(tagger, random_model, Limits(), label_studio=True)
    app.state.label_studio.retrainer.transport = httpx.MockTransport(label_studio)
    return app, seen


def connect(client) -> None:
    setup = client.post("/label-studio/setup", json={"project": "5.1700000000", "schema": NER_CONFIG,
                                                     "hostname": "http://label-studio.test", "access_token": "its"})
    assert setup.status_code == 200


def wait_for_training(client, timeout_s: float = 300) -> dict:
    """Once the open /label-studio/health no longer says "training": the server's own record of the training
    (with its error and run folder, which that route does not show)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get("/label-studio/health").json()["training"]["status"] != "training":
            return client.app.state.label_studio.retrainer.last
        time.sleep(0.2)
    raise AssertionError("training did not finish")


def test_start_training_fine_tunes_the_served_model_and_swaps_it_in(retraining_app, random_model, tmp_path):
    app, seen = retraining_app
    with TestClient(app) as client:
        connect(client)
        before = client.get("/label-studio/health").json()["model_version"]
        started = client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": 5}})
        assert started.json() == {"status": "ok", "training": True}
        status = wait_for_training(client)
        assert status["status"] == "done", status
        request = seen[0]  # then the predictions for uncertainty sampling, which this stand-in cannot take
        assert str(request.url) == "http://label-studio.test/api/projects/5/export?exportType=JSON"
        assert all(r.url.host == "label-studio.test" and r.headers["authorization"] == "Token tok" for r in seen)
        new_dir = Path(status["output_dir"]) / "final"
        assert new_dir.parent.parent == tmp_path / "runs" and (new_dir.parent / "export.json").is_file()
        after = model_version(new_dir)
        assert status["model_version"] == after != before
        assert client.post("/label-studio/setup", json={}).json() == {"model_version": after}
        [answer] = predict(client, [TEXTS[0]])
        assert answer["model_version"] == after
        from ner.inference.tagger import Tagger

        expected = Tagger(new_dir).predict([TEXTS[0]])[0]["entities"]
        assert [(r["value"]["start"], r["value"]["end"]) for r in answer["result"]] == [
            (e["start"], e["end"]) for e in expected]


def test_server_answers_while_training_and_keeps_its_model_when_training_fails(retraining_app, random_model):
    app, _ = retraining_app
    retrainer = app.state.label_studio.retrainer
    release = threading.Event()

    async def blocked_training(export, run_dir):  # stands in for ner.train: runs until the test releases it
        await asyncio.to_thread(release.wait)
        return 1

    retrainer.train = blocked_training
    before = model_version(random_model)
    with TestClient(app) as client:
        connect(client)
        assert client.post("/label-studio/train", json={"project": "5.1700000000"}).json()["training"] is True
        try:
            [answer] = predict(client, [TEXTS[0]])  # answered while the training runs
            assert answer["model_version"] == before
            assert client.get("/label-studio/health").json()["training"]["status"] == "training"
            again = client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": 5}})
            assert again.json()["training"] is False  # one training at a time
        finally:
            release.set()
        status = wait_for_training(client)
        assert status["status"] == "failed" and "exited with 1" in status["error"]
        assert client.get("/label-studio/health").json()["model_version"] == before
        assert predict(client, [TEXTS[0]])[0]["model_version"] == before


def test_every_n_new_annotations_start_a_training(retraining_app):
    app, _ = retraining_app
    import dataclasses

    retrainer = app.state.label_studio.retrainer
    started = []
    retrainer.options = dataclasses.replace(retrainer.options, every=2)
    retrainer.start = lambda project: started.append(project) or True
    with TestClient(app) as client:
        for action in ("ANNOTATION_CREATED", "PROJECT_UPDATED", "ANNOTATION_UPDATED", "ANNOTATION_CREATED"):
            client.post("/label-studio/webhook", json={"action": action, "project": {"id": 9}})
    assert started == [9]


def test_a_swap_during_a_request_tags_it_again_with_the_new_model(tagger, random_model, tmp_path):
    from ner.serving.label_studio import LabelStudioModel

    calls = []

    async def tag(texts):
        calls.append(served.version)
        if len(calls) == 1:  # the model is replaced while this batch runs
            served.swap(tagger, tmp_path / "new", "new@00000000")
        return [{"entities": [], "confidence": 1.0} for _ in texts]

    served = LabelStudioModel(tag, random_model, ["PER"], on_swap=lambda new, model_dir: None)
    answer = asyncio.run(served.predict({"tasks": tasks_of(["a"]), "label_config": NER_CONFIG}))
    assert calls == [model_version(random_model), "new@00000000"]
    assert answer["results"][0]["model_version"] == "new@00000000"


class Renamed:
    """A tagger with other labels than the served model's, as a retraining on a renamed project swaps in."""

    id2label = {0: "O", 1: "B-MISC", 2: "I-MISC"}

    def predict(self, texts: list[str], words=None) -> list[dict]:
        return [{"entities": [], "confidence": 1.0} for _ in texts]


def test_health_names_the_model_a_retraining_swapped_in(tagger, random_model, tmp_path):
    """ner.serve's own /health after the swap: the new folder, its base model, labels and types (it used to
    name the model the server started with)."""
    new_dir = tmp_path / "final"
    new_dir.mkdir()
    (new_dir / "training_args.json").write_text(json.dumps({"model": "the-base-it-was-tuned-from"}))
    app = create_app(tagger, random_model, Limits(), label_studio=True)
    with TestClient(app) as client:
        before = client.get("/health").json()
        client.portal.call(app.state.label_studio.swap, Renamed(), new_dir, "new@00000000")  # as the retrainer does
        after = client.get("/health").json()
    assert (before["model"], before["types"]) == (str(random_model), ["LOC", "ORG", "PER"])
    assert (after["model"], after["base_model"], after["labels"], after["types"]) == (
        str(new_dir), "the-base-it-was-tuned-from", ["O", "B-MISC", "I-MISC"], ["MISC"])
    assert after["pid"] == before["pid"] and after["status"] == "ok"


def test_the_open_label_studio_health_shows_a_failed_trainings_state_not_its_error(tagger, random_model, tmp_path,
                                                                                  monkeypatch, caplog):
    """/label-studio/health is open to anyone who can reach the server; a failed training's error text can hold
    LABEL_STUDIO_URL (httpx names the address it fetched) and the server's paths. The route says that it failed;
    the log has the reason."""
    label_studio = Listener(status=500)
    monkeypatch.setenv("LABEL_STUDIO_URL", label_studio.url)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "server-key")
    monkeypatch.setenv("NER_RETRAIN_DIR", str(tmp_path / "runs"))
    try:
        with TestClient(create_app(tagger, random_model, Limits(), label_studio=True)) as client, \
                caplog.at_level(logging.ERROR, logger="ner.serving.retrain"):
            assert client.post("/label-studio/train", json={"project": 5}).json()["training"] is True
            wait_for_training(client, timeout_s=60)
            health = client.get("/label-studio/health")
    finally:
        label_studio.close()
    address = label_studio.url.split("//")[1]
    assert health.json()["training"]["status"] == "failed" and health.json()["training"]["project"] == 5
    assert address not in health.text and str(tmp_path) not in health.text, health.text
    assert address in caplog.text  # the operator still learns why


# ----------------------------------------------------------------------------- a hostile client

def test_every_label_studio_route_that_tags_or_trains_needs_the_key(tagger, random_model):
    import base64

    key = "s3cret-key"
    basic = lambda user, password: "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()  # noqa: E731
    bodies = {"setup": {"project": "1.1", "schema": NER_CONFIG},
              "predict": {"tasks": [{"data": {"text": "Ada"}}], "label_config": NER_CONFIG},
              "webhook": {"action": "PROJECT_UPDATED"}, "train": {"project": None}}
    with TestClient(create_app(tagger, random_model, Limits(), api_key=key, label_studio=True)) as client:
        for route, body in bodies.items():
            for refused in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": basic("ls", "wrong")},
                            {"Authorization": "Basic !!!"}, {"Authorization": key}):
                answer = client.post(f"/label-studio/{route}", json=body, headers=refused)
                assert answer.status_code == 401 and "API key" in answer.json()["error"], (route, refused)
            for allowed in ({"Authorization": f"Bearer {key}"}, {"Authorization": basic("label-studio", key)}):
                answer = client.post(f"/label-studio/{route}", json=body, headers=allowed)
                assert answer.status_code == 200, (route, answer.text)  # a 500 is no pass: the route must work
        assert client.get("/label-studio/health").status_code == 200  # tags and trains nothing, as /health


class Listener:
    """A local HTTP server standing for a host: it records every request's path and Authorization header and
    answers `status`."""

    def __init__(self, status: int = 500) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("configured", [True, False])
def test_no_key_ever_goes_to_an_address_a_request_named(tagger, random_model, tmp_path, monkeypatch, configured):
    """/setup naming another host (a local listener), with a token of its own, then a training request: the
    listener sees nothing. With LABEL_STUDIO_URL the export comes from there, with the server's key; without
    it nothing is fetched at all."""
    elsewhere, label_studio = Listener(), Listener()
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "server-key")
    if configured:
        monkeypatch.setenv("LABEL_STUDIO_URL", label_studio.url)
    else:
        monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    monkeypatch.setenv("NER_RETRAIN_DIR", str(tmp_path / "runs"))
    try:
        with TestClient(create_app(tagger, random_model, Limits(), label_studio=True)) as client:
            setup = client.post("/label-studio/setup", json={"hostname": elsewhere.url, "access_token": "its-own"})
            assert setup.status_code == 200
            assert client.post("/label-studio/train", json={"project": 5}).json()["training"] is configured
            deadline = time.monotonic() + 30
            while client.get("/label-studio/health").json()["training"]["status"] == "training":
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        elsewhere.close()
        label_studio.close()
    assert elsewhere.seen == []
    assert label_studio.seen == ([("/api/projects/5/export?exportType=JSON", "Token server-key")] if configured
                                 else [])


def test_setup_never_changes_where_exports_come_from(tagger, random_model, monkeypatch, caplog):
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://label-studio.internal")
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "server-key")
    app = create_app(tagger, random_model, Limits(), label_studio=True)
    retrainer = app.state.label_studio.retrainer
    with caplog.at_level(logging.WARNING, logger="ner.serving.retrain"):
        retrainer.confirm({"hostname": "http://elsewhere.test", "access_token": "other"})
    assert (retrainer.options.url, retrainer.options.api_key) == ("http://label-studio.internal", "server-key")
    assert "http://elsewhere.test" in caplog.text and "LABEL_STUDIO_URL" in caplog.text


def test_label_studio_routes_are_mounted_only_when_asked_for(tagger, random_model):
    with TestClient(create_app(tagger, random_model, Limits())) as client:
        assert client.get("/label-studio/health").status_code == 404
        assert client.post("/label-studio/predict", json={"tasks": []}).status_code == 404


def test_label_studio_routes_keep_the_servers_limits_and_go_on_serving(tagger, random_model):
    """Bodies over --max-request-bytes, more tasks than --max-texts and texts over --max-text-chars get 413
    (not a queue's 503 with Retry-After forever); the next request is answered."""
    tasks = lambda *texts: [{"id": i, "data": {"text": t}} for i, t in enumerate(texts)]  # noqa: E731
    limits = Limits(max_request_bytes=2000, max_texts=2, max_text_chars=50)
    with TestClient(create_app(tagger, random_model, limits, label_studio=True)) as client:
        for body in ({"label_config": NER_CONFIG, "tasks": tasks("Ada", "Alan", "Grace")},
                     {"label_config": NER_CONFIG, "tasks": tasks("Ada " * 20)},
                     {"label_config": NER_CONFIG, "tasks": tasks("x" * 3000)}):
            refused = client.post("/label-studio/predict", json=body)
            assert refused.status_code == 413 and "limit" in refused.json()["error"]
        for route in ("setup", "webhook", "train"):
            assert client.post(f"/label-studio/{route}", content=b"{" + b" " * 3000 + b"}").status_code == 413
        answered = client.post("/label-studio/predict", json={"label_config": NER_CONFIG, "tasks": tasks("Ada")})
        assert answered.status_code == 200 and len(answered.json()["results"]) == 1


# ----------------------------------------------------------------------------- retraining that cannot run away

@pytest.fixture
def retraining_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NER_RETRAIN_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://label-studio.test")
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "tok")
    monkeypatch.setenv("NER_RETRAIN_MIN_INTERVAL_S", "0")
    monkeypatch.setenv("NER_RETRAIN_KEEP", "2")
    monkeypatch.setenv("NER_SERVE_SESSION", "one-server")  # what ner.serve --workers gives its workers
    return tmp_path / "runs"


def records_as_ner_train_does(run_dir: Path) -> None:
    """For a fake ner.train: the records the real one leaves, final/'s export record and the run's own."""
    from ner import files
    from ner.training.export import EXPORT_TOOL
    from ner.training.output_dir import write_run_record

    final = run_dir / "final"
    files.write_record(final, EXPORT_TOOL, {p.name: files.file_entry(p) for p in final.iterdir() if p.is_file()})
    write_run_record(run_dir)


def worker_app(tagger, random_model, export: list[dict]):
    app = create_app(tagger, random_model, Limits(), label_studio=True)
    app.state.label_studio.retrainer.transport = httpx.MockTransport(lambda request: httpx.Response(200, json=export))
    return app


def test_a_flood_of_webhooks_on_two_workers_trains_one_at_a_time_keeps_few_runs_and_reaches_both(
        tagger, random_model, retraining_env):
    """Two apps on one runs folder stand for two --workers: a flood of START_TRAINING to both starts one training
    at a time across them (the lock file), old run folders are removed (NER_RETRAIN_KEEP=2, the served one kept),
    and the worker that did not train adopts the new model (runs/serving.json)."""
    import shutil

    running, most = [0], [0]

    async def fake_training(export, run_dir):  # stands in for ner.train: a new export with other weights
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            await asyncio.sleep(0.3)
            shutil.copytree(random_model, run_dir / "final")
            (run_dir / "final" / "model.safetensors").write_bytes(os.urandom(64))  # a new model_version
            records_as_ner_train_does(run_dir)
            return 0
        finally:
            running[0] -= 1

    apps = [worker_app(tagger, random_model, []) for _ in range(2)]
    for app in apps:
        app.state.label_studio.retrainer.train = fake_training
        app.state.label_studio.load_tagger = lambda model_dir: tagger  # the weights written above are not real
    with TestClient(apps[0]) as first, TestClient(apps[1]) as second:
        started = 0
        deadline = time.monotonic() + 60
        while started < 5:
            assert time.monotonic() < deadline
            for client in (first, second):
                answer = client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": 3}})
                started += answer.json()["training"]
            time.sleep(0.02)
        deadline = time.monotonic() + 60
        while any(c.get("/label-studio/health").json()["training"]["status"] == "training" for c in (first, second)):
            assert time.monotonic() < deadline, "a training never ended"
            time.sleep(0.05)
        served = json.loads((retraining_env / "serving.json").read_text())
        deadline = time.monotonic() + 30
        while {c.get("/label-studio/health").json()["model_version"] for c in (first, second)} != {
                served["model_version"]}:
            assert time.monotonic() < deadline, "a worker still serves another model"
            time.sleep(0.2)
    assert most[0] == 1
    runs = sorted(p.name for p in retraining_env.glob("project3-*"))
    # KEEP runs, and at most one more: a run the other worker still served when the last prune ran stays (its
    # served-run lock), however the workers' timing fell
    assert Path(served["model_dir"]).parent.name in runs and 2 <= len(runs) <= 3, runs


def test_a_prune_removes_only_what_the_old_run_folders_record_lists(tagger, random_model, retraining_env):
    """NER_RETRAIN_KEEP=2, three trainings: the oldest run goes but for a file of the user's in it and one of the
    run's that the user edited (with the folder holding them); the folder no longer counts as a run."""
    import shutil

    from ner.serving.retrain import RETRAIN_RECORD

    async def fake_training(export, run_dir):  # stands in for ner.train: a new export and a log
        shutil.copytree(random_model, run_dir / "final")
        (run_dir / "final" / "model.safetensors").write_bytes(os.urandom(64))  # a new model_version
        (run_dir / "train.log").write_text("trained\n")
        records_as_ner_train_does(run_dir)
        return 0

    app = worker_app(tagger, random_model, [])
    app.state.label_studio.retrainer.train = fake_training
    app.state.label_studio.load_tagger = lambda model_dir: tagger  # the weights written above are not real
    with TestClient(app) as client:
        def train(project: int) -> Path:
            assert client.post("/label-studio/train", json={"project": project}).json()["training"] is True
            status = wait_for_training(client)
            assert status["status"] == "done", status
            return Path(status["output_dir"])

        first = train(1)
        (first / "notes.txt").write_text("mine")
        (first / "final" / "my_scores.json").write_text("{}")
        with open(first / "train.log", "a") as log_file:
            log_file.write("my remark\n")
        second = train(2)
        assert (first / "final" / "config.json").is_file()  # two runs kept
        train(3)
    left = sorted(p.relative_to(first).as_posix() for p in first.rglob("*"))
    assert left == ["final", "final/my_scores.json", "notes.txt", "train.log"]
    assert (first / "notes.txt").read_text() == "mine" and "my remark" in (first / "train.log").read_text()
    assert sorted(p for p in retraining_env.glob("project*-*") if (p / RETRAIN_RECORD).is_file())[0] == second


def test_a_swapped_model_is_loaded_with_the_servers_own_options(random_model):
    """The retrained export is loaded as the served one was: runtime, precision, context, decode, window."""
    from ner.inference.tagger import Tagger

    served = Tagger(random_model, precision=NO_MIXED_PRECISION, max_seq_length=24, context="none", decode="argmax")
    app = create_app(served, random_model, Limits(), label_studio=True)
    swapped = app.state.label_studio.load_tagger(random_model)
    assert swapped is not served and swapped.options == served.options
    assert (swapped.max_seq_length, swapped.context, swapped.decoder.method) == (24, "none", "argmax")


def test_a_training_past_its_timeout_is_killed_and_the_served_model_stays(tagger, random_model, retraining_env,
                                                                          monkeypatch):
    """The training's pid is taken where the retrainer starts it, not written by the child: the child is killed
    at the 1 s timeout however long its interpreter takes to start (the test once needed it to start in 1 s)."""
    monkeypatch.setenv("NER_RETRAIN_TIMEOUT_S", "1")
    started: list[int] = []
    spawn = asyncio.create_subprocess_exec

    async def spawn_recorded(*args, **kwargs):
        process = await spawn(*args, **kwargs)
        started.append(process.pid)
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_recorded)
    app = worker_app(tagger, random_model, [])
    app.state.label_studio.retrainer.command = lambda export, run_dir: [sys.executable, "-c",
                                                                        "import time; time.sleep(120)"]
    with TestClient(app) as client:
        assert client.post("/label-studio/train", json={"project": 4}).json()["training"] is True
        status = wait_for_training(client, timeout_s=60)
        [pid] = started
        assert not alive(pid)  # killed at the timeout, while the server goes on
        assert len(predict(client, [TEXTS[0]])) == 1
    assert status["status"] == "failed" and "NER_RETRAIN_TIMEOUT_S=1" in status["error"], status
    assert status.get("model_version") is None and app.state.label_studio.version == model_version(random_model)


def test_the_training_in_flight_ends_with_the_server(tagger, random_model, retraining_env):
    app = worker_app(tagger, random_model, [])
    pid_file = retraining_env / "pid"
    app.state.label_studio.retrainer.command = lambda export, run_dir: [sys.executable, "-c", SLEEPER, str(pid_file)]
    with TestClient(app) as client:
        assert client.post("/label-studio/train", json={"project": 4}).json()["training"] is True
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the training never started"
            time.sleep(0.05)
    assert not alive(int(pid_file.read_text()))  # not orphaned: gone when the app's lifespan ended


def test_a_second_training_within_the_minimum_interval_is_refused(tagger, random_model, retraining_env,
                                                                  monkeypatch, caplog):
    monkeypatch.setenv("NER_RETRAIN_MIN_INTERVAL_S", "3600")
    app = worker_app(tagger, random_model, [])
    app.state.label_studio.retrainer.command = lambda export, run_dir: [sys.executable, "-c", "pass"]
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="ner.serving.retrain"):
        assert client.post("/label-studio/train", json={"project": 4}).json()["training"] is True
        wait_for_training(client)
        assert client.post("/label-studio/train", json={"project": 4}).json()["training"] is False
    assert "NER_RETRAIN_MIN_INTERVAL_S=3600" in caplog.text


@pytest.mark.parametrize(("name", "value"), [("NER_RETRAIN_TIMEOUT_S", "soon"), ("NER_RETRAIN_KEEP", "0"),
                                             ("NER_RETRAIN_EVERY", "-1"), ("NER_RETRAIN_PREDICT_MAX", "-1")])
def test_a_bad_retraining_setting_is_one_line_naming_it(tagger, random_model, monkeypatch, name, value):
    from ner.errors import UserError

    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"{name}={value!r}: expected a number"):
        create_app(tagger, random_model, Limits(), label_studio=True)


SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def fake_ner_train(random_model):
    """Stands in for ner.train in a retraining: a new export in run_dir/final (other weights: a new model_version)."""
    import shutil

    async def fake_training(export, run_dir):
        shutil.copytree(random_model, run_dir / "final")
        (run_dir / "final" / "model.safetensors").write_bytes(os.urandom(64))
        records_as_ner_train_does(run_dir)
        return 0

    return fake_training


@pytest.mark.parametrize("failing", ["record_run", "prune"])
def test_a_failure_to_record_or_prune_ends_the_training_as_failed_with_its_message(tagger, random_model,
                                                                                   retraining_env, monkeypatch,
                                                                                   failing):
    from ner.serving import retrain

    def fail(*args):
        raise OSError(f"{failing}: no space left on device")

    monkeypatch.setattr(*((retrain, "record_run") if failing == "record_run" else (retrain.Retrainer, "prune")), fail)
    app = worker_app(tagger, random_model, [])
    app.state.label_studio.retrainer.train = fake_ner_train(random_model)
    app.state.label_studio.load_tagger = lambda model_dir: tagger
    with TestClient(app) as client:
        assert client.post("/label-studio/train", json={"project": 4}).json()["training"] is True
        status = wait_for_training(client, timeout_s=20)
        assert client.get("/label-studio/health").json()["training"]["status"] == "failed"
    assert status["status"] == "failed" and status["error"] == f"{failing}: no space left on device", status


def test_a_run_is_recorded_from_the_runs_own_records_and_never_lists_a_file_dropped_in_it(tiny_bert, tiny_data,
                                                                                          tmp_path, monkeypatch):
    """What ner.train wrote is recorded from its records (checkpoint manifests, the export's, the run's own), not by
    hashing it again on the serving host (the optimizer state is gigabytes for BERT-base); a file of yours dropped in
    the run folder while it trained is never the run's, so a prune leaves it."""
    from conftest import tiny_args

    from ner import files
    from ner import train as train_cli
    from ner.serving import retrain

    run_dir = tmp_path / "runs" / "project1-20260101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "export.json").write_text("[]")
    files.write_record(run_dir, retrain.RETRAIN_TOOL, {"export.json": files.file_entry(run_dir / "export.json")},
                       retrain.RETRAIN_RECORD)  # as the retrainer's fetch records it
    (run_dir / "train.log").write_text("trained\n")
    assert train_cli.main(tiny_args(tiny_bert, tiny_data, run_dir, "--max-steps", "4", "--save-steps", "2")) == 0
    (run_dir / "notes.txt").write_text("mine")  # dropped in while it trained
    (run_dir / "final" / "my_scores.json").write_text("{}")
    hashed = []
    monkeypatch.setattr(files, "sha256_file", lambda path, real=files.sha256_file: hashed.append(path.name) or
                        real(path))
    retrain.record_run(run_dir)
    assert "optimizer.pt" not in hashed and "model.safetensors" not in hashed, hashed
    hashed.clear()
    retrain.remove_run(run_dir)
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == [
        "final", "final/my_scores.json", "notes.txt"]


def test_a_prune_never_removes_a_run_another_model_folders_server_serves(tagger, random_model, retraining_env,
                                                                         monkeypatch):
    """Two servers of two model folders share the default runs folder (MODEL_DIR/../label-studio-runs): the runs of
    one are never the other's to prune, the one it serves included (NER_RETRAIN_KEEP=2)."""
    import shutil

    monkeypatch.delenv("NER_RETRAIN_DIR")
    monkeypatch.delenv("NER_SERVE_SESSION")  # two servers, not two workers of one
    models = retraining_env.parent / "models"
    apps = {}
    for name in ("a", "b"):
        shutil.copytree(random_model, models / name)
        apps[name] = worker_app(tagger, models / name, [])
        apps[name].state.label_studio.retrainer.train = fake_ner_train(random_model)
        apps[name].state.label_studio.load_tagger = lambda model_dir: tagger

    def train(app, projects) -> list[Path]:
        runs = []
        with TestClient(app) as client:
            for project in projects:
                assert client.post("/label-studio/train", json={"project": project}).json()["training"] is True
                status = wait_for_training(client, timeout_s=60)
                assert status["status"] == "done", status
                runs.append(Path(status["output_dir"]))
        return runs

    [served_by_b] = train(apps["b"], [9])
    runs_of_a = train(apps["a"], [1, 2, 3])
    assert apps["b"].state.label_studio.model_dir == served_by_b / "final"
    assert (served_by_b / "final" / "config.json").is_file() and (served_by_b / "export.json").is_file()
    assert [run.exists() for run in runs_of_a] == [False, True, True]


def test_a_prune_never_removes_a_run_another_server_of_the_same_model_folder_serves(tagger, random_model,
                                                                                    retraining_env, monkeypatch):
    """Two servers (not two workers of one) of the same model folder share a runs folder: the run one serves is held
    (runs/RUN/.served.lock, a shared flock) and the other's prune leaves it; once no server serves it, it goes."""
    from ner.serving import retrain

    monkeypatch.delenv("NER_SERVE_SESSION")
    apps = [worker_app(tagger, random_model, []) for _ in range(2)]
    for app in apps:
        app.state.label_studio.retrainer.train = fake_ner_train(random_model)
        app.state.label_studio.load_tagger = lambda model_dir: tagger

    def train(client, project) -> Path:
        assert client.post("/label-studio/train", json={"project": project}).json()["training"] is True
        status = wait_for_training(client, timeout_s=60)
        assert status["status"] == "done", status
        return Path(status["output_dir"])

    with TestClient(apps[1]) as other:
        served_by_other = train(other, 9)
        with TestClient(apps[0]) as client:
            runs = [train(client, project) for project in (1, 2, 3)]
        assert apps[1].state.label_studio.model_dir == served_by_other / "final"
        assert (served_by_other / "final" / "config.json").is_file()
        assert [run.exists() for run in runs] == [False, True, True]
    apps[1].state.label_studio.retrainer.served_run.release()  # that server serves it no more
    apps[0].state.label_studio.retrainer.prune()
    assert not served_by_other.exists() and not (served_by_other / retrain.SERVED_LOCK).exists()


# -- uncertainty sampling: after a swap, the project's unlabelled tasks get predictions of the new model ----------

class FakeLabelStudio:
    """Label Studio's API as the retrainer uses it, over an httpx mock transport: a project's settings and export
    (every task, or the annotated ones only), POST /api/predictions and PATCH /api/projects/ID. Every request is
    kept; `failing`: a path answered 500."""

    def __init__(self, project: int, tasks: list[dict], failing: str | None = None) -> None:
        self.project, self.tasks, self.failing = project, tasks, failing
        self.requests: list[httpx.Request] = []
        self.predictions: list[dict] = []
        self.patches: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, project = request.url.path, f"/api/projects/{self.project}"
        if path == self.failing:
            return httpx.Response(500, text="Server Error")
        if (request.method, path) == ("GET", project):
            return httpx.Response(200, json={"id": self.project, "label_config": NER_CONFIG})
        if (request.method, path) == ("GET", f"{project}/export"):
            every = request.url.params.get("download_all_tasks") == "true"
            return httpx.Response(200, json=[t for t in self.tasks if every or t["annotations"]])
        if (request.method, path) == ("POST", "/api/predictions"):
            self.predictions.append(json.loads(request.content))
            return httpx.Response(201, json={"id": len(self.predictions), **self.predictions[-1]})
        if (request.method, path) == ("PATCH", project):
            self.patches.append(json.loads(request.content))
            return httpx.Response(200, json={"id": self.project, **self.patches[-1]})
        return httpx.Response(404, json={"detail": "Not found."})


def sampling_tasks() -> list[dict]:
    """An annotated export (ner.train's data) and, after it, tasks without annotations: one skipped by an annotator
    (a cancelled annotation: Label Studio hands it out again), one with no text in its data."""
    from conftest import make_sentences

    tasks = label_studio_export(make_sentences(8, seed=5))
    open_texts = [*TEXTS, "Alan Turing met Grace Hopper.", "Acme Corp hired Ada Lovelace in London."]
    for i, text in enumerate(open_texts):
        tasks.append({"id": 100 + i, "data": {"text": text}, "annotations": []})
    tasks[-1]["annotations"] = [{"id": 999, "was_cancelled": True, "result": []}]
    tasks.append({"id": 200, "data": {"image": "x.png"}, "annotations": []})
    return tasks


def sampling_app(tagger, random_model, label_studio: FakeLabelStudio):
    """A server whose training is fake (a copy of the model with other weights: a new model_version) and whose
    swap loads the same tagger, so a test runs in seconds."""
    app = create_app(tagger, random_model, Limits(max_texts=3), label_studio=True)
    app.state.label_studio.retrainer.transport = httpx.MockTransport(label_studio)
    app.state.label_studio.retrainer.train = fake_ner_train(random_model)
    app.state.label_studio.load_tagger = lambda model_dir: tagger
    return app


def retrain_through_webhook(client, project: int) -> dict:
    started = client.post("/label-studio/webhook", json={"action": "START_TRAINING", "project": {"id": project}})
    assert started.json()["training"] is True
    return wait_for_training(client, timeout_s=60)


def test_after_a_swap_every_unlabelled_task_gets_a_prediction_of_the_new_model(tagger, random_model,
                                                                               retraining_env):
    """Each task without an annotation (a skipped one included), and no other, gets one prediction of the model
    just swapped in: its score the text's confidence, its cluster the pool's; the project then names that
    model_version, which Label Studio's uncertainty sampling filters predictions by. Max 3 texts per request: the
    pool is tagged in parts, as POST /predict would take it."""
    from ner.serving.label_studio import text_clusters

    tasks = sampling_tasks()
    label_studio = FakeLabelStudio(5, tasks)
    with TestClient(sampling_app(tagger, random_model, label_studio)) as client:
        before = client.get("/label-studio/health").json()["model_version"]
        status = retrain_through_webhook(client, 5)
        health = client.get("/label-studio/health").json()
    after = status["model_version"]
    assert status["status"] == "done" and after != before and health["model_version"] == after
    open_tasks = [t for t in tasks if not any(not a.get("was_cancelled") for a in t["annotations"])
                  and "text" in t["data"]]
    assert len(open_tasks) == len(TEXTS) + 2
    assert status["predicted_tasks"] == health["training"]["predicted_tasks"] == len(open_tasks)
    assert [p["task"] for p in label_studio.predictions] == [t["id"] for t in open_tasks]  # labelled ones: none
    texts = [t["data"]["text"] for t in open_tasks]
    confidence = [r["confidence"] for r in tagger.predict(texts)]
    clusters = text_clusters(texts)
    assert len(set(clusters)) > 1
    for prediction, score, cluster in zip(label_studio.predictions, confidence, clusters):
        assert prediction["model_version"] == after
        assert prediction["score"] == score and isinstance(prediction["cluster"], int)
        assert prediction["cluster"] == cluster
        assert all((r["from_name"], r["to_name"]) == ("label", "text") for r in prediction["result"])
    assert any(p["result"] for p in label_studio.predictions)
    assert label_studio.patches == [{"model_version": after}]
    assert all(r.url.host == "label-studio.test" and r.headers["authorization"] == "Token tok"
               for r in label_studio.requests)


def test_the_pool_is_bounded_and_what_is_left_out_is_logged(tagger, random_model, retraining_env, monkeypatch,
                                                            caplog):
    monkeypatch.setenv("NER_RETRAIN_PREDICT_MAX", "2")
    tasks = sampling_tasks()
    tasks.append({"id": 300, "data": {"text": "x" * (Limits().max_text_chars + 1)}, "annotations": []})
    label_studio = FakeLabelStudio(5, tasks)
    with TestClient(sampling_app(tagger, random_model, label_studio)) as client, \
            caplog.at_level(logging.INFO, logger="ner.serving.label_studio"):
        status = retrain_through_webhook(client, 5)
    assert status["predicted_tasks"] == 2 and [p["task"] for p in label_studio.predictions] == [100, 101]
    assert "2 unlabelled tasks predicted" in caplog.text
    for why in ("1 without a text in data.text", "1 over --max-text-chars", "4 over NER_RETRAIN_PREDICT_MAX"):
        assert why in caplog.text


@pytest.mark.parametrize("failing", ["/api/projects/5", "/api/predictions"])
def test_a_failing_label_studio_is_logged_in_one_line_and_the_new_model_is_served(tagger, random_model,
                                                                                  retraining_env, caplog, failing):
    label_studio = FakeLabelStudio(5, sampling_tasks(), failing=failing)
    with TestClient(sampling_app(tagger, random_model, label_studio)) as client, \
            caplog.at_level(logging.WARNING, logger="ner.serving.retrain"):
        status = retrain_through_webhook(client, 5)
        [answer] = predict(client, [TEXTS[0]])
        health = client.get("/label-studio/health").json()
    assert status["status"] == "done" and status["predicted_tasks"] is None
    assert health["training"] == {"status": "done", "project": 5, "model_version": status["model_version"],
                                  "predicted_tasks": None}
    assert answer["model_version"] == status["model_version"]  # the swap stands: serving goes on
    assert label_studio.patches == []  # the project keeps naming the model whose predictions it holds
    [warning] = [r for r in caplog.records if "uncertainty sampling" in r.getMessage()]
    assert "500" in warning.getMessage() and "\n" not in warning.getMessage() and warning.exc_info is None
