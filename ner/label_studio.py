"""ner.serve as a Label Studio ML backend: the routes Label Studio 1.2x calls (label-studio-ml 2.x protocol).

    python -m ner.serve runs/ner/final --host 0.0.0.0
    curl -s localhost:8000/label-studio/health
    # Label Studio: project > Settings > Model > Connect Model > Backend URL  http://HOST:8000/label-studio

The routes live under the prefix /label-studio (the root already has /predict and /health with ner.serve's
own bodies); Label Studio joins its paths to the URL it was given, so it calls /label-studio/health,
/setup, /predict, /webhook and /train. docs/label_studio.md is the setup a team follows.

POST /predict {"tasks": [...], "label_config": "<View>...", ...} -> {"results": [...]}: one entry per task,
in order, {"result": [...], "score", "model_version"}, `result` empty where nothing is found. Each entity is
a `labels` region over the project's <Text>, with Python string offsets (what Label Studio's Text tag
counts) and value.text == text[start:end]. The task's text field, from_name and to_name come from the
project's label config; the model's types map to the project's <Label value>s, exactly, then ignoring
case; entities of other types are dropped and counted in the log. Texts are tagged whole by Tagger.predict
(windows, document context), as `ner.predict` does. Errors are {"error": "..."} with status 422.

Retraining: on the webhook's START_TRAINING (Label Studio's *Start Training*; POST /train from Label
Studio versions that post there), and every NER_RETRAIN_EVERY new annotations where that is set, the
project's JSON export is fetched through Label Studio's API (LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY,
else the hostname and token Label Studio sent to /setup), `python -m ner.train` fine-tunes the served model
on it in a separate process (output under NER_RETRAIN_DIR, default MODEL_DIR/../label-studio-runs; extra
flags in NER_RETRAIN_ARGS), and the new export is loaded off the event loop and then swapped in with one
assignment: requests never see a half-loaded model, the server answers throughout, and the new
model_version is what /setup reports next (so Label Studio retrieves predictions again).

The label config is parsed with defusedxml where it is installed, else with the standard library's
ElementTree after refusing any <!DOCTYPE>/<!ENTITY> (a label config needs neither, and entity
definitions are what entity-expansion attacks need).
"""


import asyncio
import json
import logging
import os
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ner.files import sha256_file

log = logging.getLogger("ner.label_studio")
PREFIX = "/label-studio"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.onnx")


class ConfigError(ValueError):
    """A label config or body this backend cannot serve: answered with 422 and the message."""


@dataclass(frozen=True)
class Target:
    """Where predictions go in a project: <Labels name=from_name toName=to_name> over <Text name=to_name
    value="$field">, with the project's label values."""

    from_name: str
    to_name: str
    field: str
    labels: tuple[str, ...]


def _parse_xml(config: str):
    try:
        import defusedxml.ElementTree as safe_tree
    except ImportError:
        safe_tree = None
    if safe_tree is not None:
        return safe_tree.fromstring(config)
    import xml.etree.ElementTree as tree

    if re.search(r"<!(DOCTYPE|ENTITY)", config, re.IGNORECASE):
        raise ConfigError("label_config: <!DOCTYPE>/<!ENTITY> are not accepted in a label config")
    return tree.fromstring(config)


def parse_label_config(config: str) -> Target:
    """The first <Labels> whose toName is a <Text> of the config; ConfigError says what is missing."""
    if not isinstance(config, str) or not config.strip():
        raise ConfigError("label_config: expected the project's labeling config (XML), got none")
    try:
        root = _parse_xml(config)
    except Exception as exc:  # ParseError, defusedxml's DTDForbidden/EntitiesForbidden
        raise ConfigError(f"label_config is not valid XML: {exc}") from None
    texts = {}
    for element in root.iter("Text"):
        name, value = element.get("name"), element.get("value", "")
        if name and value.startswith("$") and len(value) > 1:
            texts[name] = value[1:]
    found = []
    for labels in root.iter("Labels"):
        targets = [t.strip() for t in (labels.get("toName") or "").split(",")]
        values = tuple(v for v in (label.get("value") for label in labels.iter("Label")) if v)
        for to_name in targets:
            if labels.get("name") and to_name in texts and values:
                return Target(labels.get("name"), to_name, texts[to_name], values)
        found.append(f"<Labels name={labels.get('name')!r} toName={labels.get('toName')!r}> "
                     f"({len(values)} <Label value>)")
    described = "; found " + ", ".join(found) if found else "; found no <Labels>"
    raise ConfigError("label_config: this backend tags text spans and needs a <Labels name=... toName=...> with "
                      "<Label value=...> children over a <Text name=... value=\"$field\">" + described +
                      f" and <Text> names {sorted(texts) or 'none'}")


def map_types(model_types: list[str], project_labels: tuple[str, ...]) -> dict[str, str]:
    """Model type -> project label: the same name, else the same ignoring case; unmapped types are absent."""
    folded = {}
    for label in project_labels:
        folded.setdefault(label.casefold(), label)
    mapping = {}
    for kind in model_types:
        if kind in project_labels:
            mapping[kind] = kind
        elif kind.casefold() in folded:
            mapping[kind] = folded[kind.casefold()]
    return mapping


def task_texts(tasks: object, field: str) -> list[str]:
    """Each task's data[field]; ConfigError names the first task that lacks it."""
    if not isinstance(tasks, list):
        raise ConfigError('"tasks" must be a list of tasks ({"id": ..., "data": {...}})')
    texts = []
    for index, task in enumerate(tasks):
        data = task.get("data") if isinstance(task, dict) else None
        text = data.get(field) if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise ConfigError(f"task {index} (id {task.get('id') if isinstance(task, dict) else None}): "
                              f"data.{field} must be a string (the config's <Text value=\"${field}\">)")
        texts.append(text)
    return texts


def task_result(entities: list[dict], target: Target, mapping: dict[str, str], model_version: str,
                dropped: Counter) -> dict:
    """One task's prediction: the entities whose type the project has, as Label Studio `labels` regions."""
    result = []
    for entity in entities:
        label = mapping.get(entity["type"])
        if label is None:
            dropped[entity["type"]] += 1
            continue
        result.append({"from_name": target.from_name, "to_name": target.to_name, "type": "labels",
                       "value": {"start": entity["start"], "end": entity["end"], "text": entity["text"],
                                 "labels": [label]},
                       "score": entity["score"]})
    score = round(sum(r["score"] for r in result) / len(result), 4) if result else None
    return {"result": result, "score": score, "model_version": model_version}


def model_version(model_dir: Path) -> str:
    """The export's folder name (with its parent where it is OUTPUT_DIR/final) and a short hash of its weights,
    so Label Studio tells two models apart, and a retrained export in the same place gets a new version."""
    model_dir = Path(model_dir)
    weights = next((model_dir / name for name in WEIGHT_FILES if (model_dir / name).is_file()),
                   model_dir / "config.json")
    folder = model_dir.resolve()
    name = f"{folder.parent.name}/{folder.name}" if folder.name == "final" else folder.name
    return f"{name}@{sha256_file(weights)[:8]}"


def read_json(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"body is not JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ConfigError("body must be a JSON object")
    return payload


class Backend:
    """What the routes share: the served model's version and types, and how texts are tagged.

    `tag(texts)` is a coroutine returning Tagger.predict's results (ner.serve passes its micro-batcher's
    submit, so Label Studio's requests share batches and limits with the others)."""

    def __init__(self, tag, model_dir: Path, model_types: list[str], swap_predict=None, check_texts=None) -> None:
        self.tag = tag
        self.check_texts = check_texts  # (texts) -> None, raising for more or longer texts than the server takes
        self.model_dir = Path(model_dir)
        self.model_types = model_types
        self.version = model_version(self.model_dir)
        self.swap_predict = swap_predict  # (Tagger) -> None: where the batcher's model is replaced
        self.retrainer = Retrainer(self)

    async def tag_consistently(self, texts: list[str]) -> tuple[list[dict], str, list[str]]:
        """(results, the version that made them, its types): tagged again if a swap happened meanwhile."""
        while True:
            version, types = self.version, self.model_types
            results = await self.tag(texts) if texts else []
            if self.version == version:  # no swap since the batch was queued: the old model made it
                return results, version, types

    def swap(self, tagger, model_dir: Path, version: str) -> None:
        """Serve a fully loaded `tagger` from now on; on the event loop, so no request sees half of it."""
        from ner.data import entity_types

        self.swap_predict(tagger)
        self.model_dir, self.version = Path(model_dir), version
        self.model_types = entity_types([tagger.id2label[i] for i in sorted(tagger.id2label)])
        log.info("now serving %s (model_version %s)", model_dir, version)

    async def predict(self, payload: dict) -> dict:
        target = parse_label_config(payload.get("label_config"))
        texts = task_texts(payload.get("tasks"), target.field)
        if self.check_texts is not None:
            self.check_texts(texts)
        results, version, types = await self.tag_consistently(texts)
        mapping = map_types(types, target.labels)
        dropped: Counter = Counter()
        answer = [task_result(r["entities"], target, mapping, version, dropped) for r in results]
        if dropped:
            log.info("project %s: dropped %d entities of types the project's <Labels %s> lacks: %s",
                     payload.get("project"), sum(dropped.values()), target.from_name, dict(dropped))
        return {"results": answer}


def project_id(project: object) -> int | None:
    """The project's id from a webhook's {"id": ...} or Label Studio's "ID.TIMESTAMP" string."""
    if isinstance(project, dict):
        project = project.get("id")
    text = str(project).split(".")[0] if project is not None else ""
    return int(text) if text.isdigit() else None


class Retrainer:
    """Fetch a project's export, fine-tune the served model on it in another process, swap the result in."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # The configured key goes to the configured address only; without LABEL_STUDIO_URL, /setup's address and
        # token are taken together (remember), so no request can name where the server's own key is sent.
        self.url, key = os.environ.get("LABEL_STUDIO_URL"), os.environ.get("LABEL_STUDIO_API_KEY")
        self.configured = bool(self.url)
        self.api_key = key if self.configured else None
        if key and not self.configured:
            log.warning("LABEL_STUDIO_API_KEY is not used without LABEL_STUDIO_URL (the address it is for); "
                        "exports are fetched with the token Label Studio sends to /setup")
        self.every = int(os.environ.get("NER_RETRAIN_EVERY", "0"))  # 0: only on START_TRAINING
        self.extra_args = shlex.split(os.environ.get("NER_RETRAIN_ARGS", ""))
        self.out_dir = Path(os.environ.get("NER_RETRAIN_DIR") or backend.model_dir.parent / "label-studio-runs")
        self.task: asyncio.Task | None = None
        self.new_annotations: Counter = Counter()
        self.last: dict = {"status": "idle"}
        self.transport = None  # an httpx transport, for tests

    def remember(self, payload: dict) -> None:
        """/setup's hostname and token, as a pair, where LABEL_STUDIO_URL is not set (the latest connection's)."""
        hostname, token = payload.get("hostname"), payload.get("access_token")
        if not self.configured and isinstance(hostname, str) and isinstance(token, str) and hostname and token:
            self.url, self.api_key = hostname, token

    def on_event(self, action: object, project: int | None) -> bool:
        """Start a training for START_TRAINING, or the NER_RETRAIN_EVERY-th new annotation; True if started."""
        if action in ("ANNOTATION_CREATED", "ANNOTATIONS_CREATED", "ANNOTATION_UPDATED") and self.every:
            self.new_annotations[project] += 1
            if self.new_annotations[project] < self.every:
                return False
            self.new_annotations[project] = 0
        elif action != "START_TRAINING":
            return False
        return self.start(project)

    def start(self, project: int | None) -> bool:
        if project is None or not self.url or not self.api_key:
            log.warning("cannot train for project %s: set LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY (or connect "
                        "the model again, so /setup brings Label Studio's address and token)", project)
            return False
        if self.task is not None and not self.task.done():
            log.info("a training is running already; project %s's request is skipped", project)
            return False
        self.new_annotations[project] = 0
        self.task = asyncio.get_running_loop().create_task(self.run(project))
        return True

    async def run(self, project: int) -> None:
        run_dir = self.out_dir / f"project{project}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.last = {"status": "training", "project": project, "output_dir": str(run_dir)}
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            export = await self.fetch_export(project, run_dir / "export.json")
            returncode = await self.train(export, run_dir)
            if returncode != 0:
                raise RuntimeError(f"ner.train exited with {returncode}; see {run_dir / 'train.log'}")
            await self.load_and_swap(run_dir / "final")
            self.last = {**self.last, "status": "done", "model_version": self.backend.version}
        except Exception as exc:  # the served model stays; the reason is logged and shown by /health
            log.exception("training for project %s failed", project)
            self.last = {**self.last, "status": "failed", "error": str(exc)}

    async def fetch_export(self, project: int, path: Path) -> Path:
        import httpx

        async with httpx.AsyncClient(base_url=self.url, transport=self.transport, timeout=300,
                                     headers={"Authorization": f"Token {self.api_key}"}) as client:
            response = await client.get(f"/api/projects/{project}/export", params={"exportType": "JSON"})
            response.raise_for_status()
        path.write_bytes(response.content)
        log.info("project %s: %d tasks exported to %s", project, len(response.json()), path)
        return path

    async def train(self, export: Path, run_dir: Path) -> int:
        """`python -m ner.train` from the served model, in its own process; the event loop only waits."""
        command = [sys.executable, "-m", "ner.train", "--model", str(self.backend.model_dir), "--train-file",
                   str(export), "--output-dir", str(run_dir), "--quiet", *self.extra_args]
        log.info("training: %s", shlex.join(command))
        with open(run_dir / "train.log", "wb") as log_file:
            process = await asyncio.create_subprocess_exec(*command, stdout=log_file, stderr=log_file)
            return await process.wait()

    async def load_and_swap(self, model_dir: Path) -> None:
        from ner.infer import Tagger

        def load():  # in a thread: the served model keeps answering while the new one loads
            return Tagger(model_dir), model_version(model_dir)

        tagger, version = await asyncio.to_thread(load)
        self.backend.swap(tagger, model_dir, version)


def router(backend: Backend, guard: list | None = None, read_body=None, model_class: str = "ner.serve"):
    """The APIRouter ner.serve mounts under PREFIX; `guard`: the dependencies of every route but /health
    (ner.serve's API key); `read_body`: (request) -> bytes under the server's byte limit."""
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse

    api = APIRouter()
    read = read_body or (lambda request: request.body())
    guard = guard or []

    def refused(exc: ConfigError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.get("/health")
    async def health() -> dict:
        return {"status": "UP", "model_class": model_class, "model_version": backend.version,
                "training": backend.retrainer.last}

    @api.post("/setup", dependencies=guard)
    async def setup(request: Request):
        try:
            payload = read_json(await read(request))
            if payload.get("schema"):  # a project's config that cannot work is refused when it connects
                parse_label_config(payload["schema"])
        except ConfigError as exc:
            return refused(exc)
        backend.retrainer.remember(payload)
        return {"model_version": backend.version}

    @api.post("/predict", dependencies=guard)
    async def predict(request: Request):
        try:
            return await backend.predict(read_json(await read(request)))
        except ConfigError as exc:
            return refused(exc)

    @api.post("/webhook", dependencies=guard)
    async def webhook(request: Request):
        try:
            payload = read_json(await read(request))
        except ConfigError as exc:
            return refused(exc)
        project = project_id(payload.get("project"))
        log.info("webhook %s (project %s)", payload.get("action"), project)
        return {"status": "ok", "training": backend.retrainer.on_event(payload.get("action"), project)}

    @api.post("/train", dependencies=guard)
    async def train(request: Request):  # Label Studio's *Start Training* where its webhook flag is off
        try:
            payload = read_json(await read(request))
        except ConfigError as exc:
            return refused(exc)
        return {"status": "ok", "training": backend.retrainer.start(project_id(payload.get("project")))}

    return api
