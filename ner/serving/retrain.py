"""Retraining from Label Studio: on START_TRAINING (or every NER_RETRAIN_EVERY new annotations) the project's
export is fetched from LABEL_STUDIO_URL, `python -m ner.train` fine-tunes the served model on it in a process of
its own, and the new export is swapped in, in every worker. RetrainOptions and Retrainer say how it is bounded
(one training at a time across workers, a timeout, a minimum interval, a run folder per training, pruning).
Starts ner.train as a process: serving never imports training."""

import asyncio
import importlib.util
import json
import logging
import os
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ner.errors import UserError
from ner.extras import install_hint
from ner.files import RECORD, atomic_write_text, file_entry, read_record, tree_paths, unrecorded, write_record
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


# The tool of the record (ner/files.py) in each run folder the retrainer makes, whole: the only folders it removes.
RETRAIN_TOOL = "ner.serve"


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
            write_record(run_dir, RETRAIN_TOOL, {})
            export = await self.fetch_export(project, run_dir / "export.json")
            returncode = await self.train(export, run_dir)
            if returncode != 0:
                raise RuntimeError(f"ner.train exited with {returncode}; see {run_dir / 'train.log'}")
            await self.load_and_swap(run_dir / "final")
            self.publish(run_dir / "final")
            outcome = {"status": "done", "model_version": self.served.version}
        except Exception as exc:  # the served model stays; the reason is logged (public_status says only "failed")
            log.exception("training for project %s failed", project)
            outcome = {"status": "failed", "error": str(exc)}
        finally:
            try:  # in a thread: hashing and removing runs takes a while; under the lock: one prune at a time
                await asyncio.to_thread(self.record_and_prune, run_dir)
            finally:
                self.lock.release()
        self.last = {**self.last, **outcome}

    def public_status(self) -> dict:
        """The last training as the open /label-studio/health shows it: its state, never its error text or run
        folder (an httpx error names LABEL_STUDIO_URL; paths describe the server): run() logs those."""
        shown = {key: value for key, value in self.last.items() if key in ("status", "project", "model_version")}
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

    async def load_and_swap(self, model_dir: Path) -> None:
        def load():  # in a thread: the served model keeps answering while the new one loads
            return self.served.load_tagger(model_dir), model_version(model_dir)

        tagger, version = await asyncio.to_thread(load)
        self.served.swap(tagger, model_dir, version)

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
        """Keep the newest NER_RETRAIN_KEEP run folders this retrainer made (by when their record was written: when
        their training ended), and the served one."""
        runs = sorted((p for p in self.options.runs_dir.glob("project*-*") if read_record(p, RETRAIN_TOOL) is not None),
                      key=lambda p: (p / RECORD).stat().st_mtime, reverse=True)
        served = self.served.model_dir.resolve()
        for old in runs[self.options.keep_runs:]:
            if old.resolve() not in (served, served.parent):
                remove_run(old)
                log.info("removed the old training run %s (NER_RETRAIN_KEEP=%d)", old, self.options.keep_runs)


def record_run(run_dir: Path) -> None:
    """List in the run folder's record everything it holds once its training has ended: the retrainer made the
    folder, empty, and wrote there (export.json, train.log) or had ner.train write there; files pinned by their
    bytes, so one edited since is no longer the retrainer's to remove."""
    entries = {}
    for name in sorted(tree_paths(run_dir) - {RECORD}):
        path = run_dir / name
        entries[name] = file_entry(path) if path.is_file() and not path.is_symlink() else {}
    write_record(run_dir, RETRAIN_TOOL, entries)


def remove_run(run_dir: Path) -> None:
    """Remove what the run folder's record lists, as it was recorded; anything else there (a file of yours, one you
    edited) stays, with the folders that hold it, and the folder is no longer counted as a run."""
    import shutil

    entries = read_record(run_dir, RETRAIN_TOOL) or {}
    kept = [path for path, _ in unrecorded(run_dir, entries)]
    if not kept:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    holding = {parent for path in kept for parent in path.parents}
    for name in sorted(entries, key=lambda name: name.count("/"), reverse=True):  # a folder after what it holds
        path = run_dir / name
        if path in holding or path in kept:
            continue
        try:
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        except OSError:  # a folder that something unlisted entered meanwhile: it stays
            continue
    (run_dir / RECORD).unlink(missing_ok=True)
    log.warning("%s: kept %s (not the retraining's, or changed since); removed the rest of the run", run_dir,
                ", ".join(str(path.relative_to(run_dir)) for path in kept[:3]) + (" ..." if len(kept) > 3 else ""))
