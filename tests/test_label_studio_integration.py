"""ner.serve as the ML backend of a real Label Studio: predictions retrieved by Label Studio, annotations
made and exported through its API, then `ner.train` and `ner.evaluate` on that export.

Label Studio pins many packages of its own, so it lives in a virtual environment beside ours, as a team
would run it; this test finds it through NER_LABEL_STUDIO_BIN (what .ci/run sets) or `label-studio` on PATH:

    python -m venv /tmp/lsvenv && /tmp/lsvenv/bin/pip install label-studio label-studio-sdk "sentry-sdk<3"
    NER_LABEL_STUDIO_BIN=/tmp/lsvenv/bin/label-studio python -m pytest -q -m integration

Its first start creates a SQLite database (migrations): about 1-2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")

from conftest import ROOT, make_sentences, python_module, run_cli  # noqa: E402

from ner.backends import NO_MIXED_PRECISION  # noqa: E402
from ner.data.batching import NO_TOKEN_BUDGET  # noqa: E402
from ner.testing import free_local_port, wait_until_healthy  # noqa: E402

pytestmark = pytest.mark.integration
TOKEN = "0123456789abcdef0123456789abcdef01234567"  # a test's own user, in a throw-away data dir
LABEL_CONFIG = """<View>
  <Header value="Tag the names"/>
  <Labels name="label" toName="text">
    <Label value="PER" background="red"/><Label value="ORG" background="darkorange"/>
    <Label value="LOC" background="orange"/><Label value="MISC" background="green"/>
  </Labels>
  <Text name="text" value="$text"/>
</View>"""
TINY_TRAINING = f"--max-seq-length 32 --batch-size 8 --max-tokens {NO_TOKEN_BUDGET} --num-epochs 1 " \
                "--learning-rate 1e-3 --mixed-precision no --seed 7"
START_TIMEOUT_S = 900  # the first start migrates a new database: minutes on a loaded 2-core machine


def label_studio_bin() -> str | None:
    return os.environ.get("NER_LABEL_STUDIO_BIN") or shutil.which("label-studio")


def start_label_studio(data_dir: Path, port: int, log_file) -> subprocess.Popen:
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
           "LABEL_STUDIO_USERNAME": "annotator@example.com", "LABEL_STUDIO_PASSWORD": "annotator-password",
           "LABEL_STUDIO_USER_TOKEN": TOKEN, "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
           # a backend on 127.0.0.1: allowed for predictions (ML_BLOCK_LOCAL_IP) and for the webhook Label
           # Studio creates beside it (SSRF_PROTECTION_ENABLED; without it POST /api/ml answers 403)
           "ML_BLOCK_LOCAL_IP": "false", "SSRF_PROTECTION_ENABLED": "false"}
    command = [label_studio_bin(), "start", "--no-browser", "--port", str(port), "--internal-host", "127.0.0.1",
               "--data-dir", str(data_dir)]
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=data_dir)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    """(client with the test user's token, base URL) of a Label Studio started for this module."""
    if label_studio_bin() is None:
        pytest.skip("Label Studio not found: set NER_LABEL_STUDIO_BIN (python -m venv V && V/bin/pip install "
                    "label-studio label-studio-sdk \"sentry-sdk<3\"; NER_LABEL_STUDIO_BIN=V/bin/label-studio), "
                    "as .ci/run does")
    data_dir = tmp_path_factory.mktemp("label_studio")
    port = free_local_port()
    url = f"http://127.0.0.1:{port}"
    with open(data_dir / "label_studio.log", "w") as log_file:
        process = start_label_studio(data_dir, port, log_file)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(1)
            else:
                pytest.fail(f"Label Studio did not start: {(data_dir / 'label_studio.log').read_text()[-3000:]}")
            with httpx.Client(base_url=url, headers={"Authorization": f"Token {TOKEN}"}, timeout=300) as client:
                yield client, url
        finally:
            stop(process)


@pytest.fixture(scope="module")
def backend(random_model, tmp_path_factory, label_studio):
    """(URL to paste into Label Studio, the server's log file) of `python -m ner.serve --label-studio` on the tiny
    model, told where Label Studio is and its token (exports come from there only)."""
    port = free_local_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "NER_RETRAIN_DIR": str(log_path.parent / "retrained"), "NER_RETRAIN_ARGS": TINY_TRAINING,
           "NER_RETRAIN_MIN_INTERVAL_S": "0",  # the sampling test retrains again within a minute
           "LABEL_STUDIO_URL": label_studio[1], "LABEL_STUDIO_API_KEY": TOKEN}
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(python_module("ner.serve", str(random_model), "--port", str(port),
                                                 "--label-studio"),
                                   stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            assert wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout_s=120), log_path.read_text()
            yield f"http://127.0.0.1:{port}/label-studio", log_path
        finally:
            stop(process)


def gold_text(sentences: list[list[tuple[str, str]]], separator: str) -> tuple[str, list[tuple[int, int, str]]]:
    """The sentences as one text (words joined by spaces) and its entity spans (start, end, type)."""
    text, spans = "", []
    for s, sentence in enumerate(sentences):
        if s:
            text += separator
        for i, (word, tag) in enumerate(sentence):
            start = len(text) + (i > 0)
            text += (" " if i else "") + word
            if tag.startswith("B-"):
                spans.append([start, len(text), tag[2:]])
            elif tag.startswith("I-"):
                spans[-1][1] = len(text)
    return text, [tuple(span) for span in spans]


def make_tasks() -> list[tuple[str, list[tuple[int, int, str]]]]:
    sentences = make_sentences(300, seed=11)
    short = [gold_text(sentences[i:i + 3], "\n") for i in range(0, 18, 3)]
    short.append(("Café \U0001F600 北京 " + short[0][0], [(s + 10, e + 10, k) for s, e, k in short[0][1]]))
    long = gold_text(sentences[18:], " ")  # one line of ~2,300 words: tagged whole, window by window
    assert len(long[0].split()) > 2000
    return [*short, long]


def region(start: int, end: int, label: str, text: str) -> dict:
    return {"from_name": "label", "to_name": "text", "type": "labels",
            "value": {"start": start, "end": end, "text": text[start:end], "labels": [label]}}


def test_label_studio_gets_predictions_from_ner_serve_then_its_export_trains(label_studio, backend, tiny_bert,
                                                                            tmp_path):
    gold = make_tasks()
    client, _ = label_studio
    backend_url, serve_log = backend
    version = httpx.get(f"{backend_url}/health").json()["model_version"]

    project = client.post("/api/projects", json={"title": "ner", "label_config": LABEL_CONFIG})
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    imported = client.post(f"/api/projects/{project_id}/import", json=[{"text": text} for text, _ in gold])
    assert imported.status_code == 201 and imported.json()["task_count"] == len(gold), imported.text
    connected = client.post("/api/ml", json={"url": backend_url, "project": project_id, "title": "ner.serve"})
    assert connected.status_code == 201, connected.text
    assert connected.json()["readable_state"] == "Connected" and connected.json()["model_version"] == version

    retrieve_predictions(client, project_id)
    tasks = client.get("/api/tasks", params={"project": project_id, "fields": "all", "page_size": 100}).json()
    tasks = sorted(tasks["tasks"], key=lambda t: t["id"])
    assert [t["data"]["text"] for t in tasks] == [text for text, _ in gold]
    regions = 0
    for task in tasks:
        [prediction] = task["predictions"]
        assert prediction["model_version"] == version
        text = task["data"]["text"]
        for found in prediction["result"]:
            value = found["value"]
            assert value["text"] == text[value["start"]:value["end"]]
            assert value["labels"][0] in {"PER", "ORG", "LOC", "MISC"} and len(value["labels"]) == 1
            assert (found["from_name"], found["to_name"], found["type"]) == ("label", "text", "labels")
            regions += 1
    assert regions
    assert max(r["value"]["end"] for r in tasks[-1]["predictions"][0]["result"]) > len(gold[-1][0]) * 0.9

    for task, (text, spans) in zip(tasks, gold):
        made = client.post(f"/api/tasks/{task['id']}/annotations",
                           json={"result": [region(s, e, k, text) for s, e, k in spans], "lead_time": 1.0})
        assert made.status_code == 201, made.text
    export = client.get(f"/api/projects/{project_id}/export", params={"exportType": "JSON"})
    assert export.status_code == 200, export.text
    export_file = tmp_path / "export.json"
    export_file.write_text(export.text, encoding="utf-8")
    assert len(json.loads(export.text)) == len(gold)
    assert "webhook ANNOTATION_CREATED" in serve_log.read_text()  # Label Studio's webhook reached ner.serve

    status = retrain_through_label_studio(client, project_id, backend_url, version)
    assert status["predicted_tasks"] == 0  # every task is annotated: none is left for uncertainty sampling
    for task in tasks:
        versions = [p["model_version"] for p in client.get(f"/api/tasks/{task['id']}").json()["predictions"]]
        assert status["model_version"] not in versions, versions  # labelled tasks are left alone
    retrieve_predictions(client, project_id)
    for task in tasks:
        versions = [p["model_version"] for p in client.get(f"/api/tasks/{task['id']}").json()["predictions"]]
        assert status["model_version"] in versions, versions

    out = tmp_path / "run"
    trained = run_cli(python_module("ner.train", "--model", str(tiny_bert), "--train-file", str(export_file),
                                    "--validation-file", str(export_file), "--output-dir", str(out),
                                    "--max-seq-length", "32", "--batch-size", "8", "--max-tokens", str(NO_TOKEN_BUDGET),
                                    "--num-epochs", "1", "--learning-rate", "1e-3",
                                    "--mixed-precision", NO_MIXED_PRECISION, "--quiet", "--seed", "7"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    report = tmp_path / "report.json"
    evaluated = run_cli(python_module("ner.evaluate", str(out / "final"), str(export_file), "--json", str(report)))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores = json.loads(report.read_text())
    assert scores["support"] == sum(len(spans) for _, spans in gold), scores  # every annotated entity scored


def retrieve_predictions(client, project_id: int) -> None:
    """The data manager's *Actions > Retrieve Predictions* on every task: Label Studio calls /label-studio/predict."""
    action = client.post("/api/dm/actions", params={"id": "retrieve_tasks_predictions", "project": project_id},
                         json={"selectedItems": {"all": True, "excluded": []}})
    assert action.status_code == 200, action.text


def retrain_through_label_studio(client, project_id: int, backend_url: str, version: str) -> dict:
    """*Start Training* in Label Studio: ner.serve fetches the export from LABEL_STUDIO_URL with its token,
    fine-tunes, swaps, and writes predictions of the new version for the unlabelled tasks; its training status."""
    [ml] = client.get("/api/ml", params={"project": project_id}).json()
    started = client.post(f"/api/ml/{ml['id']}/train", json={})
    assert started.status_code == 200, started.text
    deadline = time.monotonic() + 300
    while True:  # until this training ends (an earlier one's "done" names `version`)
        status = httpx.get(f"{backend_url}/health").json()["training"]
        if status["status"] == "failed" or (status["status"] == "done" and status["model_version"] != version):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert status["status"] == "done", status
    assert status["model_version"] != version
    return status


def scores_of(backend_url: str, tasks: list[dict]) -> dict[int, float]:
    """Task id -> the score ner.serve gives its text (its confidence), asked of ner.serve itself."""
    answer = httpx.post(f"{backend_url}/predict", json={"tasks": tasks, "label_config": LABEL_CONFIG}, timeout=120)
    assert answer.status_code == 200, answer.text
    scores = {task["id"]: result["score"] for task, result in zip(tasks, answer.json()["results"])}
    assert len(set(scores.values())) > len(scores) // 2, scores  # a random pick would rarely be the least sure
    return scores


def next_task(client, project_id: int) -> dict:
    """The task Label Studio hands the annotator next (and locks for them until they annotate it)."""
    answer = client.get(f"/api/projects/{project_id}/next")
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_uncertainty_sampling_hands_out_the_task_ner_serve_is_least_sure_of_before_and_after_a_retrain(
        label_studio, backend):
    """A project with `sampling` "Uncertainty sampling" (set through the API): GET /api/projects/ID/next, as the
    annotator, returns the unlabelled task whose prediction ner.serve scored least confident; after *Start
    Training*, ner.serve has written predictions of the new model for every unlabelled task (with a cluster) and
    made it the project's model_version, and /next follows the new model's scores, with no click in between."""
    client, _ = label_studio
    backend_url, _ = backend
    sentences = make_sentences(60, seed=23)
    gold = [gold_text(sentences[i:i + 2], "\n") for i in range(0, 24, 2)]  # 12 texts of 2 sentences each
    project = client.post("/api/projects", json={"title": "sampling", "label_config": LABEL_CONFIG})
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    sampling = client.patch(f"/api/projects/{project_id}", json={"sampling": "Uncertainty sampling"})
    assert sampling.status_code == 200 and sampling.json()["sampling"] == "Uncertainty sampling", sampling.text
    imported = client.post(f"/api/projects/{project_id}/import", json=[{"text": text} for text, _ in gold])
    assert imported.status_code == 201, imported.text
    tasks = client.get("/api/tasks", params={"project": project_id, "page_size": 100}).json()["tasks"]
    tasks = sorted(({"id": t["id"], "data": t["data"]} for t in tasks), key=lambda t: t["id"])
    spans = {task["id"]: spans for task, (_, spans) in zip(tasks, gold)}
    connected = client.post("/api/ml", json={"url": backend_url, "project": project_id, "title": "ner.serve"})
    assert connected.status_code == 201, connected.text
    version = connected.json()["model_version"]

    # The model served before any retraining here: Label Studio's own *Retrieve Predictions*, then the project
    # pointed at that version (Settings > Annotation > Live predictions: the model version; connecting names the
    # backend's title instead, which no prediction carries, and uncertainty sampling then falls back to random).
    retrieve_predictions(client, project_id)
    pointed = client.patch(f"/api/projects/{project_id}", json={"model_version": version})
    assert pointed.status_code == 200, pointed.text
    scores = scores_of(backend_url, tasks)
    assert scores[next_task(client, project_id)["id"]] == min(scores.values()), scores  # (a tie: either is right)

    # The annotator labels half the tasks, in the order Label Studio hands them out; then *Start Training*.
    labelled = set()
    for _ in range(len(tasks) // 2):
        task_id = next_task(client, project_id)["id"]
        text = next(t["data"]["text"] for t in tasks if t["id"] == task_id)
        made = client.post(f"/api/tasks/{task_id}/annotations",
                           json={"result": [region(s, e, k, text) for s, e, k in spans[task_id]], "lead_time": 1.0})
        assert made.status_code == 201, made.text
        labelled.add(task_id)
    assert len(labelled) == len(tasks) // 2
    status = retrain_through_label_studio(client, project_id, backend_url, version)
    new_version = status["model_version"]
    unlabelled = [t for t in tasks if t["id"] not in labelled]
    assert status["predicted_tasks"] == len(unlabelled)
    assert client.get(f"/api/projects/{project_id}").json()["model_version"] == new_version

    scores = scores_of(backend_url, unlabelled)
    for task in tasks:
        predictions = client.get(f"/api/tasks/{task['id']}").json()["predictions"]
        new = [p for p in predictions if p["model_version"] == new_version]
        if task["id"] in labelled:
            assert new == []  # left alone
        else:
            [prediction] = new
            assert abs(prediction["score"] - scores[task["id"]]) < 1e-6 and isinstance(prediction["cluster"], int)
    assert scores[next_task(client, project_id)["id"]] == min(scores.values()), scores
