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
one assignment, in every worker (RetrainOptions and Retrainer say how it is bounded).

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
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ner.errors import UserError
from ner.files import atomic_write_text
from ner.inference.tagger import model_version

log = logging.getLogger("ner.serving.label_studio")
PREFIX = "/label-studio"
SESSION_ENV = "NER_SERVE_SESSION"  # one server start: its workers share it (Retrainer.watch)


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

    def __init__(self, tag, model_dir: Path, model_types: list[str], swap_predict=None, check_texts=None,
                 load_tagger=None, retrain: "RetrainOptions | None" = None) -> None:
        self.tag = tag
        self.check_texts = check_texts  # (texts) -> None, raising for more or longer texts than the server takes
        self.model_dir = Path(model_dir)
        self.model_types = model_types
        self.version = model_version(self.model_dir)
        self.swap_predict = swap_predict  # (Tagger) -> None: where the batcher's model is replaced
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
        from ner.data.examples import entity_types

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


@dataclass(frozen=True)
class RetrainOptions:
    """What bounds retraining (environment variables, read once when the server starts; docs/label_studio.md)."""

    url: str | None  # LABEL_STUDIO_URL: the one address exports are fetched from
    api_key: str | None  # LABEL_STUDIO_API_KEY: sent there only
    runs_dir: Path  # NER_RETRAIN_DIR
    extra_args: tuple[str, ...] = ()  # NER_RETRAIN_ARGS
    every: int = 0  # NER_RETRAIN_EVERY: a training per N new annotations; 0: only on START_TRAINING
    timeout_s: float = 3600.0  # NER_RETRAIN_TIMEOUT_S: ner.train is killed after this
    min_interval_s: float = 60.0  # NER_RETRAIN_MIN_INTERVAL_S: from one training's start to the next one's
    keep_runs: int = 3  # NER_RETRAIN_KEEP: run folders kept (the served one always)

    @classmethod
    def from_env(cls, model_dir: Path) -> "RetrainOptions":
        env = os.environ
        return cls(url=env.get("LABEL_STUDIO_URL") or None, api_key=env.get("LABEL_STUDIO_API_KEY") or None,
                   runs_dir=Path(env.get("NER_RETRAIN_DIR") or Path(model_dir).parent / "label-studio-runs"),
                   extra_args=tuple(shlex.split(env.get("NER_RETRAIN_ARGS", ""))),
                   every=_env_number("NER_RETRAIN_EVERY", 0, int, minimum=0),
                   timeout_s=_env_number("NER_RETRAIN_TIMEOUT_S", cls.timeout_s, float, minimum=1),
                   min_interval_s=_env_number("NER_RETRAIN_MIN_INTERVAL_S", cls.min_interval_s, float, minimum=0),
                   keep_runs=_env_number("NER_RETRAIN_KEEP", cls.keep_runs, int, minimum=1))


def _env_number(name: str, default, kind, minimum):
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise UserError(f"{name}={text!r}: expected a number of at least {minimum}")
    return value


RUN_MARK = ".ner-retrain"  # in each run folder the retrainer makes: the only folders it ever removes
SERVING_FILE = "serving.json"  # the model the server's workers serve: {"session", "model_dir", "model_version"}
LOCK_FILE = ".training.lock"  # held while a training runs; holds when the last one started


class TrainingLock:
    """One training at a time across every worker (and server) sharing the runs folder: an exclusive flock
    on runs/.training.lock, taken without waiting; the file holds the time the last training started."""

    def __init__(self, runs_dir: Path) -> None:
        self.path = runs_dir / LOCK_FILE
        self.handle = None

    def acquire(self, min_interval_s: float) -> str | None:
        """None when taken; else why not (another training runs, or the last one started too recently)."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return "a training is running already"
        handle.seek(0)
        last = handle.read().strip()
        since_s = time.time() - float(last) if last.replace(".", "", 1).isdigit() else None
        if since_s is not None and since_s < min_interval_s:
            handle.close()
            return f"the last training started {since_s:.0f} s ago (NER_RETRAIN_MIN_INTERVAL_S={min_interval_s:g})"
        handle.seek(0)
        handle.truncate()
        handle.write(f"{time.time():.3f}\n")
        handle.flush()
        self.handle = handle
        return None

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing drops the flock
            self.handle = None


class Retrainer:
    """Fetch a project's export, fine-tune the served model on it in another process, swap the result in.

    Bounded: one training at a time across workers (TrainingLock), a minimum interval between starts, a
    timeout, the child killed when the server stops, the last NER_RETRAIN_KEEP run folders kept. The new model
    reaches every worker: the one that trained writes runs/serving.json, and each worker watches it (watch)."""

    def __init__(self, backend: "Backend", options: RetrainOptions, session: str) -> None:
        self.backend = backend
        self.options = options
        self.session = session  # the server's start: workers adopt a retrained model of their own server only
        self.lock = TrainingLock(options.runs_dir)
        self.task: asyncio.Task | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.new_annotations: Counter = Counter()
        self.last: dict = {"status": "idle"}
        self.transport = None  # an httpx transport, for tests
        self.seen_serving: float | None = None  # mtime of serving.json when last read

    def confirm(self, payload: dict) -> None:
        """/setup names Label Studio's address: it is never taken (a request must not choose where the server's
        key goes or where its training data comes from); a different one is logged."""
        hostname = payload.get("hostname")
        if isinstance(hostname, str) and hostname and hostname.rstrip("/") != (self.options.url or "").rstrip("/"):
            log.warning("/setup names Label Studio at %r; exports are fetched from LABEL_STUDIO_URL (%s) only",
                        hostname[:200], self.options.url or "not set: retraining is off")

    def on_event(self, action: object, project: int | None) -> bool:
        """Start a training for START_TRAINING, or the NER_RETRAIN_EVERY-th new annotation; True if started."""
        if action in ("ANNOTATION_CREATED", "ANNOTATIONS_CREATED", "ANNOTATION_UPDATED") and self.options.every:
            self.new_annotations[project] += 1
            if self.new_annotations[project] < self.options.every:
                return False
            self.new_annotations[project] = 0
        elif action != "START_TRAINING":
            return False
        return self.start(project)

    def start(self, project: int | None) -> bool:
        if project is None or not self.options.url or not self.options.api_key:
            log.warning("cannot train for project %s: set LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY where "
                        "ner.serve starts", project)
            return False
        why_not = "a training is running already" if self.task is not None and not self.task.done() \
            else self.lock.acquire(self.options.min_interval_s)
        if why_not is not None:
            log.info("project %s's training request is skipped: %s", project, why_not)
            return False
        self.new_annotations[project] = 0
        self.task = asyncio.get_running_loop().create_task(self.run(project))
        return True

    async def run(self, project: int) -> None:
        self.last = {"status": "training", "project": project}
        try:
            run_dir = self.new_run_dir(project)
            self.last["output_dir"] = str(run_dir)
            (run_dir / RUN_MARK).write_text("made by ner.serve's retraining; removed when older runs are\n")
            export = await self.fetch_export(project, run_dir / "export.json")
            returncode = await self.train(export, run_dir)
            if returncode != 0:
                raise RuntimeError(f"ner.train exited with {returncode}; see {run_dir / 'train.log'}")
            await self.load_and_swap(run_dir / "final")
            self.publish(run_dir / "final")
            self.last = {**self.last, "status": "done", "model_version": self.backend.version}
        except Exception as exc:  # the served model stays; the reason is logged and shown by /health
            log.exception("training for project %s failed", project)
            self.last = {**self.last, "status": "failed", "error": str(exc)}
        finally:
            self.lock.release()
            self.prune()

    def new_run_dir(self, project: int) -> Path:
        """runs/projectID-TIME, made here (-2, -3, ... where that second has one already)."""
        self.options.runs_dir.mkdir(parents=True, exist_ok=True)
        name = f"project{project}-{time.strftime('%Y%m%d-%H%M%S')}"
        for attempt in range(1, 1000):
            run_dir = self.options.runs_dir / (name if attempt == 1 else f"{name}-{attempt}")
            try:
                run_dir.mkdir()
                return run_dir
            except FileExistsError:
                continue
        raise RuntimeError(f"{self.options.runs_dir}: no free run folder name for {name}")

    async def fetch_export(self, project: int, path: Path) -> Path:
        import httpx

        async with httpx.AsyncClient(base_url=self.options.url, transport=self.transport, timeout=300,
                                     headers={"Authorization": f"Token {self.options.api_key}"}) as client:
            response = await client.get(f"/api/projects/{project}/export", params={"exportType": "JSON"})
            response.raise_for_status()
        path.write_bytes(response.content)
        log.info("project %s: %d tasks exported to %s", project, len(response.json()), path)
        return path

    async def train(self, export: Path, run_dir: Path) -> int:
        """`python -m ner.train` from the served model, in its own process group; killed (with whatever it
        started) after NER_RETRAIN_TIMEOUT_S or when the server stops."""
        command = self.command(export, run_dir)
        log.info("training: %s", shlex.join(command))
        with open(run_dir / "train.log", "wb") as log_file:
            self.process = await asyncio.create_subprocess_exec(*command, stdout=log_file, stderr=log_file,
                                                                start_new_session=True)
            try:
                return await asyncio.wait_for(self.process.wait(), self.options.timeout_s)
            except asyncio.TimeoutError:
                raise RuntimeError(f"ner.train ran past NER_RETRAIN_TIMEOUT_S={self.options.timeout_s:g} s "
                                   "and was stopped") from None
            finally:
                await self.kill_training()

    def command(self, export: Path, run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "ner.train", "--model", str(self.backend.model_dir), "--train-file",
                str(export), "--output-dir", str(run_dir), "--quiet", *self.options.extra_args]

    async def kill_training(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        import signal

        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()

    async def stop(self) -> None:
        """The server is stopping: the training in flight ends with it (no orphaned ner.train)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.kill_training()
        self.lock.release()

    async def load_and_swap(self, model_dir: Path) -> None:
        def load():  # in a thread: the served model keeps answering while the new one loads
            return self.backend.load_tagger(model_dir), model_version(model_dir)

        tagger, version = await asyncio.to_thread(load)
        self.backend.swap(tagger, model_dir, version)

    def publish(self, model_dir: Path) -> None:
        """Tell the other workers (watch) which model this server serves now."""
        served = {"session": self.session, "model_dir": str(model_dir), "model_version": self.backend.version}
        atomic_write_text(self.options.runs_dir / SERVING_FILE, json.dumps(served) + "\n")

    async def watch(self, poll_s: float = 2.0) -> None:
        """Each worker: adopt the model another worker of this server published, loaded off the event loop."""
        while True:
            try:
                await self.adopt_published()
            except Exception:  # a half-visible or unreadable file: the next poll tries again
                log.exception("could not load the model in %s", self.options.runs_dir / SERVING_FILE)
            await asyncio.sleep(poll_s)

    async def adopt_published(self) -> None:
        path = self.options.runs_dir / SERVING_FILE
        mtime = path.stat().st_mtime if path.is_file() else None
        if mtime is None or mtime == self.seen_serving:
            return
        self.seen_serving = mtime
        served = json.loads(path.read_text(encoding="utf-8"))
        if served.get("session") == self.session and served.get("model_version") != self.backend.version:
            await self.load_and_swap(Path(served["model_dir"]))

    def prune(self) -> None:
        """Keep the newest NER_RETRAIN_KEEP run folders this retrainer made, and the served one."""
        import shutil

        runs = sorted((p for p in self.options.runs_dir.glob("project*-*") if (p / RUN_MARK).is_file()),
                      key=lambda p: p.stat().st_mtime, reverse=True)
        served = self.backend.model_dir.resolve()
        for old in runs[self.options.keep_runs:]:
            if old.resolve() not in (served, served.parent):
                shutil.rmtree(old, ignore_errors=True)
                log.info("removed the old training run %s (NER_RETRAIN_KEEP=%d)", old, self.options.keep_runs)


def router(backend: Backend, guard: list | None = None, read_body=None, model_class: str = "ner.serve",
           openapi: dict[str, dict] | None = None):
    """The APIRouter ner.serve mounts under PREFIX; `guard`: the dependencies of every route but /health
    (ner.serve's API key); `read_body`: (request) -> bytes under the server's byte limit; `openapi`: route
    name -> how the document describes it (serve_api.label_studio_openapi)."""
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse

    api = APIRouter()
    read = read_body or (lambda request: request.body())
    guard = guard or []
    documented = openapi or {}

    def refused(exc: ConfigError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.get("/health", **documented.get("health", {}))
    async def health() -> dict:
        return {"status": "UP", "model_class": model_class, "model_version": backend.version,
                "training": backend.retrainer.last}

    @api.post("/setup", dependencies=guard, **documented.get("setup", {}))
    async def setup(request: Request):
        try:
            payload = read_json(await read(request))
            if payload.get("schema"):  # a project's config that cannot work is refused when it connects
                parse_label_config(payload["schema"])
        except ConfigError as exc:
            return refused(exc)
        backend.retrainer.confirm(payload)
        return {"model_version": backend.version}

    @api.post("/predict", dependencies=guard, **documented.get("predict", {}))
    async def predict(request: Request):
        try:
            return await backend.predict(read_json(await read(request)))
        except ConfigError as exc:
            return refused(exc)

    @api.post("/webhook", dependencies=guard, **documented.get("webhook", {}))
    async def webhook(request: Request):
        try:
            payload = read_json(await read(request))
        except ConfigError as exc:
            return refused(exc)
        project = project_id(payload.get("project"))
        log.info("webhook %s (project %s)", payload.get("action"), project)
        return {"status": "ok", "training": backend.retrainer.on_event(payload.get("action"), project)}

    @api.post("/train", dependencies=guard, **documented.get("train", {}))
    async def train(request: Request):  # Label Studio's *Start Training* where its webhook flag is off
        try:
            payload = read_json(await read(request))
        except ConfigError as exc:
            return refused(exc)
        return {"status": "ok", "training": backend.retrainer.start(project_id(payload.get("project")))}

    return api
