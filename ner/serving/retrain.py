"""Retraining from Label Studio: on START_TRAINING (or every NER_RETRAIN_EVERY new annotations) the project's
export is fetched from LABEL_STUDIO_URL, `python -m ner.train` fine-tunes the served model on it in a process of
its own, and the new export is swapped in, in every worker. RetrainOptions and Retrainer say how it is bounded
(one training at a time across workers, a timeout, a minimum interval, a run folder per training, pruning).
Starts ner.train as a process: serving never imports training."""

import asyncio
import hashlib
import importlib.util
import json
import logging
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ner.errors import UserError
from ner.extras import install_hint
from ner.files import (
    RECORD,
    atomic_write_text,
    file_entry,
    read_record,
    read_whole_record,
    remove_recorded,
    write_record,
)
from ner.inference.model_folder import model_version
from ner.inference.runtimes import RUNTIME_PACKAGES, RUNTIME_TRAIN_FLAGS, TORCH, export_packages

log = logging.getLogger("ner.serving.retrain")

SESSION_ENV = "NER_SERVE_SESSION"  # one server start: its workers share it (Retrainer.watch)


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
    # NER_RETRAIN_PREDICT_MAX: after a swap, at most this many unlabelled tasks get a prediction of the new model, for
    # uncertainty sampling (the pool's clusters hold a 2,048-wide vector per task: 8 KiB); 0: none
    predict_max_tasks: int = 10_000

    @classmethod
    def from_env(cls, model_dir: Path) -> "RetrainOptions":
        env = os.environ
        return cls(url=env.get("LABEL_STUDIO_URL") or None, api_key=env.get("LABEL_STUDIO_API_KEY") or None,
                   runs_dir=Path(env.get("NER_RETRAIN_DIR") or Path(model_dir).parent / "label-studio-runs"),
                   extra_args=tuple(shlex.split(env.get("NER_RETRAIN_ARGS", ""))),
                   every=_env_number("NER_RETRAIN_EVERY", 0, int, minimum=0),
                   timeout_s=_env_number("NER_RETRAIN_TIMEOUT_S", cls.timeout_s, float, minimum=1),
                   min_interval_s=_env_number("NER_RETRAIN_MIN_INTERVAL_S", cls.min_interval_s, float, minimum=0),
                   keep_runs=_env_number("NER_RETRAIN_KEEP", cls.keep_runs, int, minimum=1),
                   predict_max_tasks=_env_number("NER_RETRAIN_PREDICT_MAX", cls.predict_max_tasks, int, minimum=0))


def check_can_retrain(runtime: str | None, options: RetrainOptions) -> None:
    """Where retraining is configured (LABEL_STUDIO_URL), a server whose install cannot train (PyTorch) and write the
    files `runtime` reads is refused when it starts, in one line, rather than failing at every training. Refused, not
    warned: the URL asks for retraining, and a warning in the server's log would leave Label Studio's Start Training
    failing unseen; unsetting the URL serves the model as it is."""
    if runtime is None or not options.url:
        return
    needed = dict.fromkeys((*RUNTIME_PACKAGES[TORCH], *export_packages((runtime,))))
    lacking = [package for package in needed if importlib.util.find_spec(package) is None]
    if lacking:
        raise UserError(f"Label Studio retraining under --runtime {runtime} needs {' and '.join(lacking)} to train and "
                        f"write the files it serves: {install_hint(*lacking)} (or unset LABEL_STUDIO_URL to serve "
                        "without retraining)")


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


# The record (ner/files.py) in each run folder the retrainer makes, whole: the only folders it removes. Its own name:
# the folder's .ner-record.json is the record ner.train keeps of what it wrote there (training/output_dir.py).
RETRAIN_TOOL = "ner.serve"
RETRAIN_RECORD = ".ner-retrain.json"
TRAIN_TOOL = "ner.train"  # the command the retrainer starts, and the tool of its run record


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


SERVED_LOCK = ".served.lock"  # in a run folder: held (shared) by every process that serves the run's model


class ServedRun:
    """A shared flock on SERVED_LOCK in the run folder of the model this process serves, while it serves it. A prune,
    of any server and any model folder, removes a run only while it holds that lock exclusively (exclusive_run), which
    it cannot while some process serves the run; the kernel drops the lock of a server that died, so no stale marker
    keeps a run forever. A model folder outside a retrainer's run folder takes none."""

    def __init__(self) -> None:
        self.handle = None

    def hold(self, model_dir: Path) -> None:
        """Serve `model_dir` from now on (before loading it: a run being removed is refused, not half loaded)."""
        import fcntl

        run_dir = Path(model_dir).resolve().parent
        handle = None
        if read_record(run_dir, RETRAIN_TOOL, RETRAIN_RECORD) is not None:
            handle = open(run_dir / SERVED_LOCK, "a+", encoding="utf-8")
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise RuntimeError(f"{run_dir}: being removed by a prune; not served") from None
        self.release()
        self.handle = handle

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing drops the flock
            self.handle = None


@contextmanager
def exclusive_run(run_dir: Path) -> Iterator[bool]:
    """Whether no process serves the run (ServedRun), holding that true until the block ends."""
    import fcntl

    with open(run_dir / SERVED_LOCK, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


class Retrainer:
    """Fetch a project's export, fine-tune the served model on it in another process, swap the result in.

    Bounded: one training at a time across workers (TrainingLock), a minimum interval between starts, a
    timeout, the child killed when the server stops, the last NER_RETRAIN_KEEP run folders of its model folder kept
    (prune: never another model folder's, nor one any server serves: ServedRun). The new model
    reaches every worker: the one that trained writes runs/serving.json, and each worker watches it (watch)."""

    def __init__(self, served, options: RetrainOptions, session: str) -> None:  # label_studio.LabelStudioModel
        self.served = served
        self.options = options
        self.session = session  # the server's start: workers adopt a retrained model of their own server only
        self.lock = TrainingLock(options.runs_dir)
        self.task: asyncio.Task | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.new_annotations: Counter = Counter()
        self.last: dict = {"status": "idle"}
        self.transport = None  # an httpx transport, for tests
        self.seen_serving: float | None = None  # mtime of serving.json when last read
        check_can_retrain(served.runtime, options)
        # The model folder the server started with, which every run it makes records: the runs folder may be shared
        # (by default MODEL_DIR/../label-studio-runs: every sibling model folder's server uses it), and a prune
        # touches the runs of its own model folder only, never one another server serves or trained from.
        self.origin = str(Path(served.model_dir).resolve())
        self.served_run = ServedRun()  # and whatever server serves a run, its prune never removes it
        self.served_run.hold(served.model_dir)

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
        run_dir = None
        try:
            run_dir = self.new_run_dir(project)
            self.last["output_dir"] = str(run_dir)
            write_retrain_record(run_dir, {}, self.origin)
            export = await self.fetch_export(project, run_dir / "export.json")
            returncode = await self.train(export, run_dir)
            if returncode != 0:
                raise RuntimeError(f"ner.train exited with {returncode}; see {run_dir / 'train.log'}")
            await self.load_and_swap(run_dir / "final")
            self.publish(run_dir / "final")
            outcome = {"status": "done", "model_version": self.served.version,
                       "predicted_tasks": await self.predict_unlabelled(project)}
        except Exception as exc:  # the served model stays; the reason is logged (public_status says only "failed")
            log.exception("training for project %s failed", project)
            outcome = {"status": "failed", "error": str(exc)}
        finally:
            try:  # in a thread: removing runs takes a while; under the lock: one prune at a time
                await asyncio.to_thread(self.record_and_prune, run_dir)
            except Exception as exc:  # the status must end: a training that stays "training" blocks nothing but lies
                log.exception("recording or pruning the runs of project %s failed", project)
                outcome = {"status": "failed", "error": str(exc)}
            finally:
                self.lock.release()
        self.last = {**self.last, **outcome}

    def public_status(self) -> dict:
        """The last training as the open /label-studio/health shows it: its state, never its error text or run
        folder (an httpx error names LABEL_STUDIO_URL; paths describe the server): run() logs those."""
        shown = {key: value for key, value in self.last.items()
                 if key in ("status", "project", "model_version", "predicted_tasks")}
        if shown["status"] == "failed":
            shown["error"] = "the training failed; the server's log says why"
        return shown

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

    def label_studio_client(self):
        """An HTTP client for LABEL_STUDIO_URL with LABEL_STUDIO_API_KEY: the one address the key is sent to."""
        import httpx

        return httpx.AsyncClient(base_url=self.options.url, transport=self.transport, timeout=300,
                                 headers={"Authorization": f"Token {self.options.api_key}"})

    async def predict_unlabelled(self, project: int) -> int | None:
        """The project's unlabelled tasks get predictions of the model just swapped in (LabelStudioModel.
        predict_project): how many, or None where Label Studio's API failed, which is logged in one line; the new
        model is served either way."""
        if not self.options.predict_max_tasks:
            return 0
        try:
            async with self.label_studio_client() as client:
                return await self.served.predict_project(client, project, self.options.predict_max_tasks)
        except Exception as exc:  # Label Studio down, a project deleted: sampling waits for the next swap
            log.warning("project %s: no predictions of %s written for uncertainty sampling: %s: %s", project,
                        self.served.version, type(exc).__name__, " ".join(str(exc).split()))  # one line
            return None

    async def fetch_export(self, project: int, path: Path) -> Path:
        async with self.label_studio_client() as client:
            response = await client.get(f"/api/projects/{project}/export", params={"exportType": "JSON"})
            response.raise_for_status()
        path.write_bytes(response.content)
        pinned = {"size": len(response.content), "sha256": hashlib.sha256(response.content).hexdigest()}
        write_retrain_record(path.parent, {path.name: pinned}, self.origin)  # from the bytes it wrote
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
        """ner.train from the served model, with the flags that write the served runtime's files (so the swap can
        load what it trains), then NER_RETRAIN_ARGS."""
        return [sys.executable, "-m", "ner.train", "--model", str(self.served.model_dir), "--train-file",
                str(export), "--output-dir", str(run_dir), "--quiet",
                *(RUNTIME_TRAIN_FLAGS[self.served.runtime] if self.served.runtime else ()), *self.options.extra_args]

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
        self.served_run.release()

    async def load_and_swap(self, model_dir: Path) -> None:
        def load():  # in a thread: the served model keeps answering while the new one loads
            return self.served.load_tagger(model_dir), model_version(model_dir)

        previous, self.served_run.handle = self.served_run.handle, None  # the old run's, until the new one is served
        try:
            self.served_run.hold(model_dir)
            tagger, version = await asyncio.to_thread(load)
        except BaseException:
            self.served_run.release()
            self.served_run.handle = previous
            raise
        self.served.swap(tagger, model_dir, version)
        if previous is not None:
            previous.close()

    def publish(self, model_dir: Path) -> None:
        """Tell the other workers (watch) which model this server serves now."""
        served = {"session": self.session, "model_dir": str(model_dir), "model_version": self.served.version}
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
        if served.get("session") == self.session and served.get("model_version") != self.served.version:
            await self.load_and_swap(Path(served["model_dir"]))

    def record_and_prune(self, run_dir: Path | None) -> None:
        if run_dir is not None:
            record_run(run_dir)
        self.prune()

    def prune(self) -> None:
        """Keep the newest NER_RETRAIN_KEEP run folders made for this server's model folder (by when their record was
        written: when their training ended), and the served one. Another model folder's runs are not counted nor
        touched: they are another server's, which may serve one of them."""
        runs = sorted((p for p in self.options.runs_dir.glob("project*-*") if self.is_own_run(p)),
                      key=lambda p: (p / RETRAIN_RECORD).stat().st_mtime, reverse=True)
        served = self.served.model_dir.resolve()
        for old in runs[self.options.keep_runs:]:
            if old.resolve() in (served, served.parent):
                continue
            with exclusive_run(old) as free:
                if not free:
                    log.info("kept the old training run %s: another server serves it", old)
                    continue
                remove_run(old, also={SERVED_LOCK: {}})  # the lock file, made by a server; held here meanwhile
                log.info("removed the old training run %s (NER_RETRAIN_KEEP=%d)", old, self.options.keep_runs)

    def is_own_run(self, run_dir: Path) -> bool:
        """A run folder a retrainer made for this server's model folder (its record says which)."""
        record = read_whole_record(run_dir, RETRAIN_TOOL, RETRAIN_RECORD)
        return record is not None and record.get("model_dir") == self.origin


def write_retrain_record(run_dir: Path, entries: dict[str, dict], model_dir: str) -> None:
    """The retrainer's record of a run folder: what it holds of the retraining's, and the model folder it was made for
    (the server's at its start: Retrainer.origin)."""
    write_record(run_dir, RETRAIN_TOOL, entries, RETRAIN_RECORD, model_dir=model_dir)


def record_run(run_dir: Path) -> None:
    """Bring the run folder's record up to date once its training has ended: what the retrainer wrote itself
    (export.json, pinned as it was fetched; train.log, pinned now) and what ner.train's own record lists (pinned by the
    checkpoint manifests and the export's record: nothing hashed again here, on the serving host). A file of yours
    dropped in the folder meanwhile is in neither, so a prune leaves it."""
    record = read_whole_record(run_dir, RETRAIN_TOOL, RETRAIN_RECORD) or {"files": {}}
    entries = {path: entry for path, entry in record["files"].items() if isinstance(entry, dict)}
    log_file = run_dir / "train.log"
    if log_file.is_file() and not log_file.is_symlink():
        entries[log_file.name] = file_entry(log_file)
    trained = read_record(run_dir, TRAIN_TOOL)
    if trained is not None:
        entries |= {**trained, RECORD: {}}
    write_retrain_record(run_dir, entries, record.get("model_dir"))


def remove_run(run_dir: Path, also: dict[str, dict] | None = None) -> None:
    """Remove what the run folder's record lists, as it was recorded; anything else there (a file of yours, one you
    edited) stays, with the folders that hold it, and the folder is no longer counted as a run."""
    entries = {**(read_record(run_dir, RETRAIN_TOOL, RETRAIN_RECORD) or {}), **(also or {})}
    kept = [path for path in remove_recorded(run_dir, entries) if path != run_dir / RETRAIN_RECORD]
    # last: what is left is no run of the retrainer's any more
    remove_recorded(run_dir, {RETRAIN_RECORD: {}}, whole=not kept)
    if kept:
            log.warning("%s: kept %s (not the retraining's, or changed since); removed the rest of the run", run_dir,
                    ", ".join(str(path.relative_to(run_dir)) for path in kept[:3]) + (" ..." if len(kept) > 3 else ""))
