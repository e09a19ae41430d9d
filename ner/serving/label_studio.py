"""ner.serve as a Label Studio ML backend: the routes Label Studio 1.2x calls (label-studio-ml 2.x protocol).

    python -m ner.serve runs/ner/final --label-studio --host 0.0.0.0 --api-key KEY
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

Retraining (docs/label_studio.md): on the webhook's START_TRAINING (Label Studio's *Start Training*; POST /train
from versions that post there), and every NER_RETRAIN_EVERY new annotations where that is set, the project's
JSON export is fetched from LABEL_STUDIO_URL with LABEL_STUDIO_API_KEY (both from the environment only: /setup
never changes where the key goes), `python -m ner.train` fine-tunes the served model on it in a separate
process, and the new export is loaded off the event loop with the server's own options and swapped in with
one assignment, in every worker (retrain.py: RetrainOptions and Retrainer say how it is bounded).

Uncertainty sampling: after each swap, the worker that trained gives every task of the project without an
annotation a prediction of the new model (predict_project: score = the text's confidence, cluster = the pool's),
written through Label Studio's API at LABEL_STUDIO_URL, and makes it the project's model_version; Label Studio's
*Uncertainty sampling* then hands out the least confident task under the model now served.

The label config is parsed with defusedxml where it is installed, else with the standard library's
ElementTree after refusing any <!DOCTYPE>/<!ENTITY> (a label config needs neither, and entity
definitions are what entity-expansion attacks need).
"""


import asyncio
import json
import logging
import os
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ner.data.spans import label_studio_prediction
from ner.data.text import split_words
from ner.inference.model_folder import model_version
from ner.inference.selection import pool_clusters
from ner.serving.requests import Limits, check_texts, read_body
from ner.serving.retrain import SESSION_ENV, Retrainer, RetrainOptions

log = logging.getLogger("ner.serving.label_studio")
PREFIX = "/label-studio"


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


def task_result(result: dict, target: Target, mapping: dict[str, str], model_version: str,
                dropped: Counter, cluster: int | None = None) -> dict:
    """One task's prediction from Tagger.predict's `result`: the entities whose type the project has, as Label
    Studio `labels` regions, scored by the text's confidence, in `cluster` where given."""
    kept = []
    for entity in result["entities"]:
        label = mapping.get(entity["type"])
        if label is None:
            dropped[entity["type"]] += 1
        else:
            kept.append({**entity, "type": label})
    return label_studio_prediction(kept, result["confidence"], model_version, target.from_name, target.to_name,
                                   cluster)


def parse_json_object(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"body is not JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ConfigError("body must be a JSON object")
    return payload


class LabelStudioModel:
    """What the routes share: the served model's version and types, and how texts are tagged.

    `tag(texts)` is a coroutine returning Tagger.predict's results (ner.serve passes its micro-batcher's
    submit, so Label Studio's requests share batches and limits with the others)."""

    def __init__(self, tag, model_dir: Path, model_types: list[str], on_swap=None, limits: Limits = Limits(),
                 load_tagger=None, retrain: "RetrainOptions | None" = None, runtime: str | None = None) -> None:
        self.tag = tag
        self.runtime = runtime  # the served tagger's (--runtime): a retraining writes its files; None: not a Tagger
        self.limits = limits  # the server's: as many and as long texts as POST /predict takes, no more
        self.model_dir = Path(model_dir)
        self.model_types = model_types
        self.version = model_version(self.model_dir)
        self.on_swap = on_swap  # (Tagger, model_dir) -> None: the server serves it (its batcher, its /health)
        self.load_tagger = load_tagger  # (model_dir) -> Tagger with the server's options (Tagger.like)
        session = os.environ.get(SESSION_ENV) or uuid.uuid4().hex  # set by ner.serve for its --workers
        self.retrainer = Retrainer(self, retrain or RetrainOptions.from_env(self.model_dir), session)

    async def tag_consistently(self, texts: list[str]) -> tuple[list[dict], str, list[str]]:
        """(results, the version that made them, its types): tagged again if a swap happened meanwhile."""
        while True:
            version, types = self.version, self.model_types
            results = await self.tag(texts) if texts else []
            if self.version == version:  # no swap since the batch was queued: the old model made it
                return results, version, types

    def swap(self, tagger, model_dir: Path, version: str) -> None:
        """Serve a fully loaded `tagger` from now on; on the event loop, so no request sees half of it."""
        from ner.data.tags import entity_types

        self.on_swap(tagger, Path(model_dir))
        self.model_dir, self.version = Path(model_dir), version
        self.model_types = entity_types([tagger.id2label[i] for i in sorted(tagger.id2label)])
        log.info("now serving %s (model_version %s)", model_dir, version)

    async def predict(self, payload: dict) -> dict:
        """POST /predict. No `cluster`: Label Studio keeps only a prediction's result, score and model_version from
        a backend's answer, and clusters of one request's texts would not be the pool's (predict_project's)."""
        target = parse_label_config(payload.get("label_config"))
        return {"results": await self.predict_tasks(payload.get("tasks"), target, payload.get("project"))}

    async def predict_tasks(self, tasks: object, target: Target, project: object,
                            clusters: list[int] | None = None) -> list[dict]:
        """One prediction per task, in order, under the server's limits; `clusters`: one per task, or none."""
        texts = task_texts(tasks, target.field)
        check_texts(texts, self.limits.max_texts, self.limits.max_text_chars)
        results, version, types = await self.tag_consistently(texts)
        mapping = map_types(types, target.labels)
        dropped: Counter = Counter()
        answer = [task_result(r, target, mapping, version, dropped, None if clusters is None else clusters[i])
                  for i, r in enumerate(results)]
        if dropped:
            log.info("project %s: dropped %d entities of types the project's <Labels %s> lacks: %s",
                     project, sum(dropped.values()), target.from_name, dict(dropped))
        return answer

    async def predict_project(self, client, project: int, max_tasks: int) -> int:
        """Uncertainty sampling under the served model: a prediction of it (score: the text's confidence; cluster:
        the pool's, pool_clusters) for each of the first `max_tasks` tasks of `project` that have no annotation,
        written into Label Studio through `client` (LABEL_STUDIO_URL's, with its key), then the project's
        model_version made the served one, which Label Studio's next-task choice filters predictions by. Returns
        the number of tasks given a prediction; raises on any failure of Label Studio's API."""
        version = self.version
        settings = await label_studio_json(client, "GET", f"/api/projects/{project}")
        target = parse_label_config(settings.get("label_config") if isinstance(settings, dict) else None)
        export = await label_studio_json(client, "GET", f"/api/projects/{project}/export",
                                         params={"exportType": "JSON", "download_all_tasks": "true"})
        tasks, left_out = pool_tasks(export, target.field, self.limits.max_text_chars, max_tasks)
        clusters = await asyncio.to_thread(text_clusters, [task["data"][target.field] for task in tasks])
        for start in range(0, len(tasks), self.limits.max_texts):  # as many texts as one POST /predict takes
            chunk = tasks[start:start + self.limits.max_texts]
            predictions = await self.predict_tasks(chunk, target, project, clusters[start:start + len(chunk)])
            if any(p["model_version"] != version for p in predictions):
                raise RuntimeError(f"the served model changed from {version} while its predictions were written")
            for task, prediction in zip(chunk, predictions):
                await label_studio_json(client, "POST", "/api/predictions", json={**prediction, "task": task["id"]})
        if tasks:  # Label Studio refuses a model_version that no prediction and no backend title has
            await label_studio_json(client, "PATCH", f"/api/projects/{project}", json={"model_version": version})
        log.info("project %s: %d unlabelled tasks predicted by %s for uncertainty sampling%s", project, len(tasks),
                 version, "".join(f"; {count} {why}" for why, count in left_out.items() if count))
        return len(tasks)


async def label_studio_json(client, method: str, path: str, **kwargs):
    """Label Studio's JSON answer to one API call; an HTTP error raises with its status, path and answer."""
    response = await client.request(method, path, **kwargs)
    if response.is_error:
        answer = " ".join(response.text.split())[:200]
        raise RuntimeError(f"Label Studio answered {response.status_code} to {method} {path}: {answer}")
    return response.json()


def pool_tasks(export: object, field: str, max_text_chars: int, max_tasks: int) -> tuple[list[dict], Counter]:
    """The tasks of a Label Studio JSON export that no annotation covers (a skipped one, `was_cancelled`, counts as
    none: Label Studio hands the task out again), whose data[field] is a text of at most `max_text_chars`, the first
    `max_tasks` by id; and how many were left out and why (never silently)."""
    if not isinstance(export, list):
        raise ValueError(f"the project's export is a {type(export).__name__}, not a list of tasks")
    left_out: Counter = Counter()
    kept = []
    for task in sorted(export, key=lambda t: t.get("id") or 0):
        if any(not a.get("was_cancelled") for a in task.get("annotations") or []):
            continue
        text = (task.get("data") or {}).get(field)
        if not isinstance(text, str):
            left_out[f"without a text in data.{field}"] += 1
        elif len(text) > max_text_chars:
            left_out["over --max-text-chars"] += 1
        elif len(kept) >= max_tasks:
            left_out["over NER_RETRAIN_PREDICT_MAX"] += 1
        else:
            kept.append(task)
    return kept, left_out


def text_clusters(texts: list[str]) -> list[int]:
    """pool_clusters over the texts' words: one cluster id per text, the same for the same texts in any process."""
    return [int(c) for c in pool_clusters([[word for word, _, _ in split_words(text)] for text in texts])]


def project_id(project: object) -> int | None:
    """The project's id from a webhook's {"id": ...} or Label Studio's "ID.TIMESTAMP" string."""
    if isinstance(project, dict):
        project = project.get("id")
    text = str(project).split(".")[0] if project is not None else ""
    return int(text) if text.isdigit() else None


def router(served: LabelStudioModel, guard: list | None = None, model_class: str = "ner.serve",
           openapi: dict[str, dict] | None = None):
    """The APIRouter ner.serve mounts under PREFIX; `guard`: the dependencies of every route but /health
    (ner.serve's API key); bodies are read under served.limits' byte limit; `openapi`: route name -> how the
    document describes it (api.label_studio_openapi)."""
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse

    api = APIRouter()

    def read(request: Request):
        return read_body(request, served.limits.max_request_bytes)

    guard = guard or []
    documented = openapi or {}

    def refused(exc: ConfigError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.get("/health", **documented.get("health", {}))
    async def health() -> dict:
        return {"status": "UP", "model_class": model_class, "model_version": served.version,
                "training": served.retrainer.public_status()}

    @api.post("/setup", dependencies=guard, **documented.get("setup", {}))
    async def setup(request: Request):
        try:
            payload = parse_json_object(await read(request))
            if payload.get("schema"):  # a project's config that cannot work is refused when it connects
                parse_label_config(payload["schema"])
        except ConfigError as exc:
            return refused(exc)
        served.retrainer.confirm(payload)
        return {"model_version": served.version}

    @api.post("/predict", dependencies=guard, **documented.get("predict", {}))
    async def predict(request: Request):
        try:
            return await served.predict(parse_json_object(await read(request)))
        except ConfigError as exc:
            return refused(exc)

    @api.post("/webhook", dependencies=guard, **documented.get("webhook", {}))
    async def webhook(request: Request):
        try:
            payload = parse_json_object(await read(request))
        except ConfigError as exc:
            return refused(exc)
        project = project_id(payload.get("project"))
        log.info("webhook %s (project %s)", payload.get("action"), project)
        return {"status": "ok", "training": served.retrainer.on_event(payload.get("action"), project)}

    @api.post("/train", dependencies=guard, **documented.get("train", {}))
    async def train(request: Request):  # Label Studio's *Start Training* where its webhook flag is off
        try:
            payload = parse_json_object(await read(request))
        except ConfigError as exc:
            return refused(exc)
        return {"status": "ok", "training": served.retrainer.start(project_id(payload.get("project")))}

    return api
