"""Never delete or change what the tool did not write, over sequences of the real commands (a stateful property test).

Hypothesis runs random sequences of `ner.train` (fresh, `--resume auto`, `--resume` a checkpoint of the folder's own run
or of another folder's, `--overwrite-output-dir`), `ner.export` (with and without `--overwrite`, in place too), corpus
tagging (`ner.predict ... --output-dir`, its rerun, `--overwrite`, `--merge`), a Label Studio retraining (the server's
Retrainer.run, ner.train in-process) and the retrainer's prune, in-process through their `main(argv)`, on a tiny random
BERT, interleaved with what a user does: a file of theirs put into any of these folders (a run's, its final/ and
checkpoints/, beside an export, a corpus output, the runs folder and its runs), or a file the tool wrote edited (the
model card, a metrics file, a corpus part, a retraining's log), which is theirs from then on. After every step:

  (a) every file and folder the user owns is there, with the same bytes;
  (b) a command exits 0, or refuses at start: exit code 2, its error the last line of stderr and one line, and not
      one byte changed anywhere under the folders (the whole tree compared, nothing ignored);
  (c) a command changes nothing outside the folder it was given (no staging or set-aside folder left beside it);
  (d) ner.train changes a folder that holds a run only to continue that run (`--resume auto`, or a checkpoint of
      that folder's own) or when told to replace it (`--overwrite-output-dir`): one run a folder;
  (e) a retraining ends "done", and no prune removes the run whose model is served.

What must hold is checked, never which of several right answers a command gives (refusing or working). Deterministic:
derandomized, no example database, fixed seeds; nothing timed.
    NER_STATEFUL_EXAMPLES=300 pytest tests/test_deletion_state.py   # a longer search (default: the CI size, 60)
    NER_STATEFUL_SHRINK=0 ...                                        # the first failing sequence, unshrunk (faster)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

httpx = pytest.importorskip("httpx")  # the retraining steps fetch a Label Studio export (the serve extra brings it)

from conftest import build_tiny_bert, make_sentences, write_conll  # noqa: E402
from hypothesis import HealthCheck, Phase, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ner.backends import NO_MIXED_PRECISION  # noqa: E402
from ner.data.batching import NO_TOKEN_BUDGET  # noqa: E402
from ner.export import main as export_main  # noqa: E402
from ner.predict import main as predict_main  # noqa: E402
from ner.serving.retrain import Retrainer, RetrainOptions  # noqa: E402
from ner.train import main as train_main  # noqa: E402

EXAMPLES = int(os.environ.get("NER_STATEFUL_EXAMPLES", "60"))  # the CI size: about 60 s of 2 CPU cores
STEPS = int(os.environ.get("NER_STATEFUL_STEPS", "8"))
# NER_STATEFUL_SHRINK=0: report the first failing sequence as found (shrinking one runs it again and again, minutes)
PHASES = [Phase.explicit, Phase.generate] + [Phase.shrink] * (os.environ.get("NER_STATEFUL_SHRINK", "1") != "0")

RUNS = ("A", "B")  # training --output-dir folders
EXPORTS = ("E1", "E2", "A/final")  # ner.export OUT folders (the last: into a run's final/)
CORPUS = ("C",)  # corpus tagging --output-dir
LS_RUNS = "L"  # the retrainer's runs folder (NER_RETRAIN_DIR)
# What a training run leaves in its folder, named here (not imported): the test's own view of "holds a run".
RUN_ENTRIES = ("checkpoints", "final", "metrics.jsonl", "predictions", "trackers")
USER_NAMES = ("notes.txt", "README.md", ".git/HEAD", "data/keep.bin", "step_99/notes.txt")
EDITABLE = ("final/README.md", "final/metrics.json", "README.md", "metrics.json", "train.log", "metrics.jsonl",
            "part-00000.jsonl", "predictions.jsonl")


def make_assets(folder: Path) -> SimpleNamespace:
    """The encoder, the data and the corpus input, outside the folders the machine looks at; and the names an
    export writes (from one export made here), which `ner.export --overwrite` may replace even when they are yours."""
    bert = build_tiny_bert(folder / "bert", dropout=0.0, hidden_size=16)
    train = write_conll(folder / "train.conll", make_sentences(6, seed=1))
    texts = folder / "texts.txt"
    texts.write_text("Ada Lovelace visited London .\nGrace Hopper hired Alan Turing .\nNothing happened .\n")
    assets = SimpleNamespace(bert=bert, train=train, texts=texts)
    with quiet_output():
        assert train_main(train_args(assets, folder / "reference", 2)) == 0
    assets.export_names = {p.name for p in (folder / "reference" / "final").iterdir()}
    return assets


def train_args(assets: SimpleNamespace, out: Path, max_steps: int, *extra: str) -> list[str]:
    return ["--model", str(assets.bert), "--train-file", str(assets.train), "--validation-file", str(assets.train),
            "--output-dir", str(out), "--max-seq-length", "32", "--batch-size", "4", "--max-tokens",
            str(NO_TOKEN_BUDGET), "--max-steps", str(max_steps), "--save-steps", "1", "--save-total-limit", "2",
            "--learning-rate", "1e-3", "--mixed-precision", NO_MIXED_PRECISION, "--quiet", "--seed", "7", *extra]


@contextlib.contextmanager
def quiet_output():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield SimpleNamespace(out=out, err=err)


def tree(root: Path) -> dict[str, str]:
    """Every path under `root`: a file by its SHA-256 and inode, a folder, a link by its target; nothing skipped."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[relative] = "link " + os.readlink(path)
            elif path.is_dir():
                found[relative] = "folder"
            else:  # the inode too: a file replaced by the same bytes is still a file replaced
                found[relative] = f"{hashlib.sha256(path.read_bytes()).hexdigest()} inode {path.stat().st_ino}"
    return found


def under(relative: str, folder: str) -> bool:
    return relative == folder or relative.startswith(folder + "/")


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


class ServedModel:
    """What the retrainer needs of the served model (label_studio.LabelStudioModel), without a model loaded."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir, self.version, self.runtime = Path(model_dir), "start", None

    def load_tagger(self, model_dir: Path) -> None:
        return None

    def swap(self, tagger: None, model_dir: Path, version: str) -> None:
        self.model_dir, self.version = Path(model_dir), version


class InProcessRetrainer(Retrainer):
    """The server's Retrainer, its one process step (ner.train) run in-process through the machine's checks, and the
    project's export answered by a stand-in for Label Studio."""

    def __init__(self, machine: DeletionMachine, runs_dir: Path) -> None:
        # predict_max_tasks 0: no predictions written back after a swap (deletion is what this test is about)
        options = RetrainOptions(url="http://label-studio.invalid", api_key="key", runs_dir=runs_dir, keep_runs=2,
                                 predict_max_tasks=0)
        super().__init__(ServedModel(machine.assets.bert), options, session="stateful")
        self.transport = httpx.MockTransport(lambda request: httpx.Response(200, json=[]))
        self.machine, self.max_steps, self.failure = machine, 2, None

    async def train(self, export: Path, run_dir: Path) -> int:
        try:
            code, _, _ = self.machine.command(train_main, train_args(self.machine.assets, run_dir, self.max_steps),
                                              run_dir.relative_to(self.machine.root).as_posix())
        except AssertionError as failure:  # run() would log it as a failed training and go on
            self.failure = failure
            raise
        (run_dir / "train.log").write_text(f"ner.train exited with {code}\n")
        return code


class DeletionMachine(RuleBasedStateMachine):
    """The folders under a fresh root, and `user`: every path the user owns there (bytes; None: a folder)."""

    def __init__(self, assets: SimpleNamespace, base: Path) -> None:
        super().__init__()
        self.assets = assets
        self.root = Path(tempfile.mkdtemp(dir=base))
        self.user: dict[str, bytes | None] = {}
        self.written = 0  # user files and edits so far: each one's bytes differ
        self.retrainer = InProcessRetrainer(self, self.root / LS_RUNS)

    def teardown(self) -> None:
        self.retrainer.served_run.release()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ what the user does

    def put_user_file(self, relative: str) -> None:
        path = self.root / relative
        for parent in reversed(Path(relative).parents[:-1]):
            if not (self.root / parent).exists():
                (self.root / parent).mkdir()
                self.user[parent.as_posix()] = None
        self.written += 1
        content = f"the user's file {self.written}\n".encode()
        path.write_bytes(content)
        self.user[relative] = content
        note(f"user: wrote {relative}")

    def user_places(self) -> list[str]:
        """Folders a user may put a file into: the run folders (before any run too), their final/, checkpoints/ and
        each checkpoint, beside and inside exports, the corpus output, the runs folder and each retraining run."""
        places = ["."]
        for run in RUNS:
            places.append(run)
            for sub in ("final", "checkpoints", "predictions"):
                if (self.root / run / sub).is_dir():
                    places.append(f"{run}/{sub}")
            places += sorted(f"{run}/checkpoints/{p.name}" for p in (self.root / run).glob("checkpoints/step_*"))
        places += [*EXPORTS[:2], *CORPUS, LS_RUNS, f"{LS_RUNS}/project9-mine"]
        places += sorted(f"{LS_RUNS}/{p.name}" for p in (self.root / LS_RUNS).glob("project1-*"))
        return places

    @initialize(seeds=st.lists(st.tuples(st.integers(0, 30), st.integers(0, len(USER_NAMES) - 1)), max_size=3),
                trained=st.lists(st.sampled_from(RUNS), max_size=2, unique=True))
    def seed_folders(self, seeds: list[tuple[int, int]], trained: list[str]) -> None:
        """Folders that start with the user's files (a run folder, an export folder, the runs folder), and runs
        trained there already (the user's files seeded first: they may be in a run folder)."""
        self.put_user_file("inputs/keep.txt")
        for place, name in seeds:
            self.seed_user_file(place, name)
        for run in trained:
            self.train_fresh(run, max_steps=3)

    @rule(place=st.integers(0, 30), name=st.integers(0, len(USER_NAMES) - 1))
    def seed_user_file(self, place: int, name: int) -> None:
        places = self.user_places()
        relative = (Path(places[place % len(places)]) / USER_NAMES[name]).as_posix()
        if not any((self.root / parent).is_file() for parent in Path(relative).parents) and not (
                self.root / relative).exists():
            self.put_user_file(relative)

    def editable(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                      if p.is_file() and any(p.relative_to(self.root).as_posix().endswith("/" + name)
                                             for name in EDITABLE))

    @precondition(lambda self: self.editable())
    @rule(pick=st.integers(0, 30))
    def edit_a_file_the_tool_wrote(self, pick: int) -> None:
        """After the edit, the file is the user's."""
        candidates = self.editable()
        relative = candidates[pick % len(candidates)]
        self.written += 1
        content = (self.root / relative).read_bytes() + f"\nedited by the user ({self.written})\n".encode()
        (self.root / relative).write_bytes(content)
        self.user[relative] = content
        note(f"user: edited {relative}")

    # ------------------------------------------------------------------ the commands

    def command(self, main, argv: list[str], target: str) -> tuple[int, dict, dict]:
        """Run one command; check (b) and (c); return its exit code and the trees before and after."""
        before = tree(self.root)
        with quiet_output() as output:
            code = main(argv)
        shown = " ".join(a.replace(str(self.root) + "/", "").replace(str(self.assets.bert), "BERT") for a in argv
                         if not a.startswith(str(self.assets.train)))
        note(f"{main.__module__} {shown} -> {code}")
        after = tree(self.root)
        assert code in (0, 2), f"exit code {code}:\n{output.err.getvalue()[-3000:]}"
        if code == 2:
            lines = output.err.getvalue().strip().splitlines()
            errors = [line for line in lines if line.startswith("error: ")]
            assert errors == lines[-1:], f"the refusal is not one line at the end of stderr: {lines[-5:]}"
            assert changes(before, after) == [], f"refused ({lines[-1]}) but changed {changes(before, after)}"
        else:
            made = {parent.as_posix() for parent in Path(target).parents} - set(before)  # mkdir -p of the target
            outside = [p for p in changes(before, after) if not under(p, target) and p not in made]
            assert outside == [], f"asked to write {target}, changed {outside}"
        return code, before, after

    def holds_a_run(self, run: str) -> bool:
        return any((self.root / run / entry).exists() for entry in RUN_ENTRIES)

    def train(self, run: str, max_steps: int, *extra: str, continues: bool = False) -> int:
        """(d): a folder holding a run changes only when the command continues that run or replaces it."""
        held = self.holds_a_run(run)
        code, before, after = self.command(train_main, train_args(self.assets, self.root / run, max_steps, *extra),
                                           run)
        if held and not continues:
            changed = [p for p in changes(before, after) if under(p, run)]
            assert changed == [], (f"ner.train {' '.join(extra)} changed {run}, which holds another run that it "
                                   f"neither continued nor was told to replace: {changed[:6]}")
        return code

    def checkpoints(self, run: str) -> list[str]:
        return sorted(f"{run}/checkpoints/{p.name}" for p in (self.root / run / "checkpoints").glob("step_*")
                      if (p / "manifest.json").is_file())

    @rule(run=st.sampled_from(RUNS), max_steps=st.integers(2, 4))
    def train_fresh(self, run: str, max_steps: int) -> None:
        self.train(run, max_steps)

    @rule(run=st.sampled_from(RUNS), max_steps=st.integers(2, 4))
    def train_resume_auto(self, run: str, max_steps: int) -> None:
        self.train(run, max_steps, "--resume", "auto", continues=bool(self.checkpoints(run)))

    def runs_with_checkpoints(self) -> list[str]:
        return [run for run in RUNS if self.checkpoints(run)]

    @precondition(lambda self: self.runs_with_checkpoints())
    @rule(which=st.integers(0, 1), pick=st.integers(0, 9), max_steps=st.integers(2, 4))
    def train_resume_own_checkpoint(self, which: int, pick: int, max_steps: int) -> None:
        run = self.runs_with_checkpoints()[which % len(self.runs_with_checkpoints())]
        own = self.checkpoints(run)
        self.train(run, max_steps, "--resume", str(self.root / own[pick % len(own)]), continues=True)

    @precondition(lambda self: self.runs_with_checkpoints())
    @rule(which=st.integers(0, 1), pick=st.integers(0, 9), max_steps=st.integers(2, 4))
    def train_resume_another_runs_checkpoint(self, which: int, pick: int, max_steps: int) -> None:
        """Into the other run folder, whatever it holds (nothing, the user's files, a run of its own)."""
        source = self.runs_with_checkpoints()[which % len(self.runs_with_checkpoints())]
        theirs = self.checkpoints(source)
        run = next(other for other in RUNS if other != source)
        self.train(run, max_steps, "--resume", str(self.root / theirs[pick % len(theirs)]))

    @precondition(lambda self: self.runs_with_checkpoints())
    @rule(which=st.integers(0, 1), max_steps=st.integers(2, 4))
    def train_resume_with_other_settings(self, which: int, max_steps: int) -> None:
        """Refused (the math would differ): in one line, as every refusal."""
        run = self.runs_with_checkpoints()[which % len(self.runs_with_checkpoints())]
        assert self.train(run, max_steps, "--resume", "auto", "--learning-rate", "2e-3", continues=True) == 2

    @rule(run=st.sampled_from(RUNS), max_steps=st.integers(2, 4))
    def train_overwrite_output_dir(self, run: str, max_steps: int) -> None:
        self.train(run, max_steps, "--overwrite-output-dir", continues=True)

    def sources(self) -> list[str]:
        """Exports and checkpoints to export from."""
        found = [f"{run}/final" for run in RUNS] + list(EXPORTS[:2])
        return [s for s in found if (self.root / s / "config.json").is_file()] + [
            c for run in RUNS for c in self.checkpoints(run)]

    @precondition(lambda self: self.sources())
    @rule(pick=st.integers(0, 30), out=st.sampled_from(EXPORTS), overwrite=st.booleans())
    def export(self, pick: int, out: str, overwrite: bool) -> None:
        sources = self.sources()
        source = sources[pick % len(sources)]
        code, _, _ = self.command(export_main, [str(self.root / source), str(self.root / out)]
                                  + ["--overwrite"] * overwrite, out)
        if code == 0 and overwrite:  # --overwrite replaces a file of yours that an export writes (the log names it)
            for name in self.assets.export_names:
                relative = f"{out}/{name}"
                if relative in self.user and (self.root / relative).read_bytes() != self.user[relative]:
                    del self.user[relative]

    def models(self) -> list[str]:
        return [s for s in self.sources() if (self.root / s / "config.json").is_file()]

    @precondition(lambda self: self.models())
    @rule(pick=st.integers(0, 30), chunk_texts=st.integers(1, 2), merge=st.booleans(), overwrite=st.booleans())
    def tag_corpus(self, pick: int, chunk_texts: int, merge: bool, overwrite: bool) -> None:
        models = self.models()
        argv = [str(self.root / models[pick % len(models)]), str(self.assets.texts), "--output-dir",
                str(self.root / CORPUS[0]), "--mixed-precision", NO_MIXED_PRECISION, "--quiet",
                "--chunk-texts", str(chunk_texts)] + ["--merge"] * merge + ["--overwrite"] * overwrite
        self.command(predict_main, argv, CORPUS[0])

    @rule(max_steps=st.integers(2, 3))
    def retrain(self, max_steps: int) -> None:
        """A Label Studio retraining as the server runs it (Retrainer.run: a run folder made and recorded, the project's
        export fetched into it, ner.train there, the new model swapped in and published, the run recorded, then the
        old runs pruned), with ner.train in-process."""
        self.retrainer.max_steps = max_steps
        before = tree(self.root)
        asyncio.run(self.retrainer.run(project=1))
        if self.retrainer.failure is not None:
            raise self.retrainer.failure
        assert self.retrainer.last["status"] == "done", self.retrainer.last
        outside = [p for p in changes(before, tree(self.root)) if not under(p, LS_RUNS)]
        assert outside == [], f"the retraining in {LS_RUNS} changed {outside}"
        self.served_model_is_there()

    @precondition(lambda self: list((self.root / LS_RUNS).glob("project1-*")))
    @rule(keep=st.integers(1, 2))
    def prune_retraining_runs(self, keep: int) -> None:
        self.retrainer.options = dataclasses.replace(self.retrainer.options, keep_runs=keep)
        before = tree(self.root)
        self.retrainer.prune()
        note(f"Retrainer.prune() over {LS_RUNS}, NER_RETRAIN_KEEP={keep}")
        outside = [p for p in changes(before, tree(self.root)) if not under(p, LS_RUNS)]
        assert outside == [], f"the prune of {LS_RUNS} changed {outside}"
        self.served_model_is_there()

    def served_model_is_there(self) -> None:
        """A prune never removes the run whose model is served."""
        served = self.retrainer.served.model_dir
        assert (served / "config.json").is_file() and (served / "model.safetensors").is_file(), f"{served} is gone"

    # ------------------------------------------------------------------ (a)

    @invariant()
    def users_files_are_all_there(self) -> None:
        lost = [p for p, content in sorted(self.user.items())
                if (not (self.root / p).is_dir() if content is None else
                    not (self.root / p).is_file() or (self.root / p).read_bytes() != content)]
        assert lost == [], f"the user's files lost or changed: {lost}"


@pytest.mark.slow
def test_nothing_of_the_users_is_lost_over_any_sequence_of_commands(tmp_path_factory):
    assets = make_assets(tmp_path_factory.mktemp("stateful_assets"))
    base = tmp_path_factory.mktemp("stateful_roots")

    class Machine(DeletionMachine):
        def __init__(self) -> None:
            super().__init__(assets, base)

    run_state_machine_as_test(Machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), print_blob=False, phases=PHASES))
