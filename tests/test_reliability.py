"""Crash safety: SIGKILL then resume is bit-exact, a lost rank is restarted by torchrun, a hung
rank is bounded by --dist-timeout, and checkpoints are verified, rotated and pickle-free."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ONNX_PACKAGES, OPENVINO_PACKAGES, needs, python_module, read_state, run_cli, tiny_args
from safetensors.torch import load_file

from ner.backends import ACCELERATE, RAW_DDP
from ner.backends.trackers import TrackerClaim
from ner.errors import UserError
from ner.training import checkpoint as ckpt
from ner.training import output_dir as output_dir_module
from ner.training import run as run_module
from ner.training.config import MAY_CHANGE, MUST_MATCH, AddedLater, StoredResolvedLater, TrainConfig, resume_rule

KILL_STEP = 20  # epoch 1 (15 updates an epoch on 1 rank), in the middle of it


def last_checkpoint(out_dir):
    return ckpt.list_checkpoints(out_dir)[-1]


def outcome(out_dir) -> dict:
    last = last_checkpoint(out_dir)
    state = read_state(last)["train_state"]
    return {"losses": state["step_losses"], "batches": state["step_batches"], "step": state["global_step"],
            "lr": torch.load(last / "scheduler.pt", weights_only=True)["_last_lr"],
            "weights": load_file(last / "model" / "model.safetensors")}


def assert_same_run(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    assert a["batches"] == b["batches"]  # same batches, same order
    assert a["losses"] == b["losses"]  # bit-exact, not approximately
    assert a["lr"] == b["lr"]
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])


@pytest.mark.slow
@pytest.mark.parametrize("backend", [ACCELERATE, RAW_DDP])
def test_sigkill_mid_epoch_then_resume_is_bit_exact(tiny_bert, tiny_data, tmp_path, backend):
    args = ["--save-steps", "5", "--save-total-limit", "0", "--num-epochs", "3", "--backend", backend]
    reference = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, tmp_path / "ref", *args)))
    assert reference.returncode == 0, reference.stderr[-2000:]

    killed_dir = tmp_path / "killed"
    command = python_module("ner.train", *tiny_args(tiny_bert, tiny_data, killed_dir, *args, "--resume", "auto"))
    killed = run_cli(command, env={"NER_FAULT_INJECT": f"kill:{KILL_STEP}"})
    assert killed.returncode == -9  # SIGKILL: no cleanup ran
    assert not (killed_dir / "final").exists()
    assert read_state(last_checkpoint(killed_dir))["train_state"]["epoch"] == 1
    resumed = run_cli(command)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {killed_dir / 'checkpoints' / f'step_{KILL_STEP}'}" in resumed.stderr
    assert_same_run(outcome(killed_dir), outcome(tmp_path / "ref"))


def test_a_restart_before_the_first_complete_checkpoint_starts_afresh_only_until_the_run_wrote(tiny_bert, tiny_data,
                                                                                                 tmp_path, capsys):
    """What docs/training.md says of a torchrun restart (the same command again) before the first complete
    checkpoint: killed before its first metrics.jsonl record, it starts afresh; killed after, it stops, naming what
    the folder holds, unless the command has --overwrite-output-dir."""
    from ner.train import main as train_main

    args = ["--max-steps", "4", "--logging-steps", "2", "--no-eval", "--resume", "auto"]
    for kill_step, out in ((1, tmp_path / "early"), (3, tmp_path / "late")):
        command = tiny_args(tiny_bert, tiny_data, out, *args)
        assert run_cli(python_module("ner.train", *command), env={"NER_FAULT_INJECT": f"kill:{kill_step}"}
                       ).returncode == -9
        assert ckpt.list_checkpoints(out) == []
        capsys.readouterr()
        assert train_main(command) == (0 if kill_step == 1 else 2)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'late'}: --resume auto found no complete checkpoint, and the folder holds a run "
        "(metrics.jsonl); pass --overwrite-output-dir to start afresh there, or choose another --output-dir")
    assert train_main([*tiny_args(tiny_bert, tiny_data, tmp_path / "late", *args), "--overwrite-output-dir"]) == 0


def torchrun(*args: str) -> list[str]:
    return python_module("torch.distributed.run", "--standalone", "--nproc_per_node=2", *args)


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_from_the_last_checkpoint(tiny_bert_no_dropout, tiny_data, tmp_path):
    args = [f"--{RAW_DDP}", "--save-steps", "5", "--save-total-limit", "0", "--num-epochs", "3", "--no-eval",
            "--dist-timeout", "60"]
    reference = run_cli(python_module("ner.train", *tiny_args(tiny_bert_no_dropout, tiny_data, tmp_path / "ref",
                                                              *args, "--nproc", "2")))
    assert reference.returncode == 0, reference.stderr[-2000:]
    job = torchrun("--max-restarts=1", "-m", "ner.train",
                   *tiny_args(tiny_bert_no_dropout, tiny_data, tmp_path / "job", *args, "--resume", "auto"))
    result = run_cli(job, env={"NER_FAULT_INJECT": f"kill:{KILL_STEP}:1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NER_FAULT_INJECT: kill at step 20 on rank 1" in result.stderr
    assert f"resumed from {tmp_path / 'job' / 'checkpoints' / f'step_{KILL_STEP}'}" in result.stderr
    assert_same_run(outcome(tmp_path / "job"), outcome(tmp_path / "ref"))


@pytest.mark.slow
def test_a_hung_rank_is_bounded_by_dist_timeout(tiny_bert_no_dropout, tiny_data, tmp_path):
    job = torchrun("--max-restarts=0", "-m", "ner.train",
                   *tiny_args(tiny_bert_no_dropout, tiny_data, tmp_path / "job", f"--{RAW_DDP}", "--no-eval",
                              "--dist-timeout", "5"))
    start = time.monotonic()
    result = run_cli(job, env={"NER_FAULT_INJECT": "hang:3:1"}, timeout=240)
    assert result.returncode != 0
    assert time.monotonic() - start < 120  # torch's default would wait 30 minutes
    assert "NER_FAULT_INJECT: hang at step 3 on rank 1" in result.stderr
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower()


# ----------------------------------------------------------------------------- checkpoint files


@pytest.fixture(scope="module")
def saved_run(tiny_bert, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "run"
    result = run_cli(python_module("ner.train", *tiny_args(tiny_bert, tiny_data, out, "--save-steps", "10",
                                                           "--save-total-limit", "0", "--no-eval")))
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_checkpoint_files_load_with_weights_only_and_manifest_verifies(saved_run):
    folder = last_checkpoint(saved_run)
    assert ckpt.verify(folder) is None
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"model/model.safetensors", "model/config.json", "optimizer.pt",
                                      "scheduler.pt", "rng_rank0.pt", "trainer_state.json"}
    for pt in folder.glob("*.pt"):
        torch.load(pt, weights_only=True)  # raises on any pickled object
    state = read_state(folder)
    assert {"torch", "transformers", "accelerate"} <= set(state["versions"])
    assert state["config"]["learning_rate"] == 1e-3 and state["label_list"][0] == "O"


@pytest.mark.parametrize("crc32", [True, False])
def test_state_files_load_and_leave_the_callers_crc_setting_as_it_was(tmp_path, crc32):
    torch.serialization.set_crc32_options(crc32)
    try:
        state = {"exp_avg": torch.arange(6.0), "step": 3}
        ckpt.save_state(state, tmp_path / "state.pt")
        assert torch.serialization.get_crc32_options() is crc32
        loaded = torch.load(tmp_path / "state.pt", weights_only=True)
        assert torch.equal(loaded["exp_avg"], state["exp_avg"]) and loaded["step"] == 3
        with pytest.raises(RuntimeError):  # a failed save (no such folder) restores it too
            ckpt.save_state(state, tmp_path / "missing" / "state.pt")
        assert torch.serialization.get_crc32_options() is crc32
    finally:
        torch.serialization.set_crc32_options(True)


@pytest.mark.parametrize("damage, problem", [
    (lambda f: (f / "manifest.json").unlink(), "no manifest.json"),
    (lambda f: (f / "optimizer.pt").write_bytes(b"x"), "optimizer.pt has 1 bytes"),
    (lambda f: (f / "scheduler.pt").write_bytes(bytes(reversed((f / "scheduler.pt").read_bytes()))),
     "scheduler.pt does not match its sha256"),
    (lambda f: (f / "model" / "model.safetensors").unlink(), "model/model.safetensors is missing"),
])
def test_damaged_checkpoints_are_named_and_skipped_by_auto(saved_run, tmp_path, caplog, damage, problem):
    out = tmp_path / "copy"
    shutil.copytree(saved_run / "checkpoints", out / "checkpoints")
    newest = last_checkpoint(out)
    damage(newest)
    assert problem in ckpt.verify(newest)
    with caplog.at_level(logging.WARNING):
        found = ckpt.find_resume_checkpoint(out)
    assert found == ckpt.list_checkpoints(out)[-2]
    assert str(newest) in caplog.text and problem in caplog.text


def test_rotation_keeps_newest_complete_and_best_and_ignores_incomplete(saved_run, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(saved_run / "checkpoints", out / "checkpoints")
    steps = [ckpt.step_of(p) for p in ckpt.list_checkpoints(out)]
    assert steps == [10, 15, 20, 30]  # every 10 updates and at each epoch's end (15 updates an epoch)
    (out / "checkpoints" / "step_40").mkdir()  # a save in progress: no manifest yet
    ckpt.rotate(out, keep_newest=1, best_step=10)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_10", "step_30", "step_40"]


def test_a_checkpoint_is_judged_by_its_own_manifest_even_when_it_lists_no_file(tmp_path):
    from ner.files import write_record

    write_record(tmp_path, ckpt.CHECKPOINT_TOOL, {}, ckpt.MANIFEST, step=1)
    assert ckpt.not_in_manifest(tmp_path) == []  # its manifest is the tool's
    (tmp_path / "notes.txt").write_text("mine")
    assert ckpt.not_in_manifest(tmp_path) == [tmp_path / "notes.txt"]
    (tmp_path / ckpt.MANIFEST).write_text("{")
    assert ckpt.not_in_manifest(tmp_path) == [tmp_path / ckpt.MANIFEST, tmp_path / "notes.txt"]


def test_resume_check_reads_options_missing_from_older_checkpoints_as_their_old_behaviour(tmp_path):
    from ner.errors import UserError
    from ner.training.checkpoint import check_compatible
    from ner.training.config import TrainConfig

    config = TrainConfig().to_dict()
    older = {"config": {k: v for k, v in config.items() if k != "pad_to_multiple_of"}, "label_list": ["O"],
             "world_size": 1}
    check_compatible(older, {**config, "pad_to_multiple_of": 1}, ["O"], 1, tmp_path)  # what it ran with
    with pytest.raises(UserError, match=r"pad_to_multiple_of: checkpoint 1, now 4"):
        check_compatible(older, {**config, "pad_to_multiple_of": 4}, ["O"], 1, tmp_path)


def test_a_refused_resume_names_every_difference_in_one_line(tmp_path):
    """Before: a header line, then one line a difference (CONVENTIONS: a refusal is one line)."""
    from ner.training.checkpoint import check_compatible
    from ner.training.config import TrainConfig

    config = TrainConfig().to_dict()
    saved = {"config": {**config, "learning_rate": 0.001}, "label_list": ["O"], "world_size": 2}
    with pytest.raises(UserError) as refused:
        check_compatible(saved, {**config, "learning_rate": 0.002, "seed": config["seed"] + 1}, ["O", "B-PER"], 1,
                         tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: cannot resume: learning_rate: checkpoint 0.001, now 0.002; seed: checkpoint {config['seed']}, "
        f"now {config['seed'] + 1}; labels: checkpoint ['O'], now ['O', 'B-PER']; processes: checkpoint 2, now 1 "
        "(the data position is per rank: resume with the same number)")


def another_value(spec: dataclasses.Field, value: object) -> object:
    """A valid value of the field other than `value`."""
    choices = spec.metadata.get("choices")
    if choices:
        return next(choice for choice in choices if choice != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"{value}-other" if value is not None else "1"


@pytest.mark.parametrize("name", [spec.name for spec in dataclasses.fields(TrainConfig)])
def test_resume_accepts_or_refuses_each_option_as_the_option_declares(tmp_path, name):
    """Changed on resume: refused, naming the option, unless it declares MAY_CHANGE; left out of an older
    checkpoint: read as the value it declares with AddedLater (refused where it declares none). An option stored as
    it ran (StoredResolvedLater) is compared from a resolved value, and its older unresolved one matches any."""
    spec = next(spec for spec in dataclasses.fields(TrainConfig) if spec.name == name)
    rule, config = resume_rule(spec), TrainConfig().to_dict()
    if isinstance(rule, StoredResolvedLater):
        unresolved = {**config, name: rule.unresolved}
        ckpt.check_compatible({"config": unresolved, "label_list": ["O"], "world_size": 1},
                              {**config, name: another_value(spec, rule.unresolved)}, ["O"], 1, tmp_path)
        config = {**config, name: another_value(spec, rule.unresolved)}  # as a run stores it now
    saved = {"config": config, "label_list": ["O"], "world_size": 1}
    changed = {**config, name: another_value(spec, config[name])}
    if rule == MAY_CHANGE:
        ckpt.check_compatible(saved, changed, ["O"], 1, tmp_path)
    else:
        one_line = f"^{re.escape(str(tmp_path))}: cannot resume: {name}: checkpoint [^\\n]*$"
        with pytest.raises(UserError, match=one_line):
            ckpt.check_compatible(saved, changed, ["O"], 1, tmp_path)
    older = {**saved, "config": {key: value for key, value in config.items() if key != name}}
    if isinstance(rule, AddedLater):
        ckpt.check_compatible(older, {**config, name: rule.value}, ["O"], 1, tmp_path)
    elif rule == MUST_MATCH and config[name] is not None:
        with pytest.raises(UserError, match=f"{name}: checkpoint None, now "):
            ckpt.check_compatible(older, config, ["O"], 1, tmp_path)


@needs(*ONNX_PACKAGES, *OPENVINO_PACKAGES)
def test_a_resume_may_add_export_int8_which_changes_no_math(tiny_bert, tiny_data, tmp_path, monkeypatch):
    """A run resumed at its last step with --export-int8 added: accepted, and its end writes the int8 files (the
    export itself is recorded here, not run: test_openvino runs it)."""
    from ner.train import main as train_main

    exported = []
    monkeypatch.setattr(run_module, "export_fast_runtimes", lambda final, *args, **kwargs: exported.append(final) or "")
    args = tiny_args(tiny_bert, tiny_data, tmp_path / "run", "--max-steps", "2", "--no-eval", "--resume", "auto")
    assert train_main(args) == 0 and exported == []
    assert train_main([*args, "--export-int8"]) == 0
    assert exported == [tmp_path / "run" / "final"]


# ----------------------------------------------------------------------------- --overwrite-output-dir, 2 ranks

RANK = threading.local()  # which fake rank this thread is


class TwoRanks:
    """Ranks 0 and 1 of a run as threads of this process: wait_for_everyone is a barrier (a rank that never comes
    breaks it after 30 s, where a real one would wait for --dist-timeout). `arrived` is set when rank 1 first waits
    or inspects, so rank 0 starts after it; `removed` when a folder was removed."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)
        self.arrived, self.removed = threading.Event(), threading.Event()
        self.inspected_by: list[int] = []

    def backend(self, rank: int) -> SimpleNamespace:
        def wait_for_everyone() -> None:
            if rank == 1:
                self.arrived.set()
            self.barrier.wait()

        return SimpleNamespace(is_main_process=rank == 0, process_index=rank, num_processes=2,
                               wait_for_everyone=wait_for_everyone)

    def run(self, work) -> list[object]:
        """work(backend) as rank 1, then, once rank 1 waits, as rank 0: each rank's result or exception."""
        outcomes: list[object] = [None, None]

        def rank_main(rank: int) -> None:
            RANK.index = rank
            try:
                outcomes[rank] = work(self.backend(rank))
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                outcomes[rank] = exc

        second = threading.Thread(target=rank_main, args=(1,))
        second.start()
        assert self.arrived.wait(timeout=60)
        first = threading.Thread(target=rank_main, args=(0,))
        first.start()
        for thread in (first, second):
            thread.join(timeout=120)
        return outcomes


def a_previous_run(out: Path) -> None:
    (out / "predictions").mkdir(parents=True)
    (out / "predictions" / "validation.conll").write_text("Ada\tB-PER\tB-PER\n")
    output_dir_module.MetricsLog(out).append("{}\n")  # as a run writes it: pinned in the run's record


def overwrite_on_two_ranks(out: Path, monkeypatch, slow_rank_1: bool = True) -> tuple[TwoRanks, list[object]]:
    """claim_output_dir(--overwrite-output-dir) on two ranks. `slow_rank_1`: if rank 1 inspects the old run at all,
    it does so only after rank 0 has removed some of it (an order a slow rank can meet)."""
    ranks, real_inspect = TwoRanks(), output_dir_module.not_written_by_a_run
    real_remove = output_dir_module.remove_recorded

    def inspect(*args, **kwargs):
        ranks.inspected_by.append(RANK.index)
        if RANK.index == 1:
            ranks.arrived.set()
            assert not slow_rank_1 or ranks.removed.wait(timeout=60)
        return real_inspect(*args, **kwargs)

    def remove(*args, **kwargs):
        left = real_remove(*args, **kwargs)
        ranks.removed.set()
        return left

    monkeypatch.setattr(output_dir_module, "not_written_by_a_run", inspect)
    monkeypatch.setattr(output_dir_module, "remove_recorded", remove)
    cfg = SimpleNamespace(output_path=out, resume=None, overwrite_output_dir=True)
    return ranks, ranks.run(lambda backend: output_dir_module.claim_output_dir(cfg, backend, TrackerClaim()))


def test_overwrite_output_dir_on_two_ranks_lets_only_rank_0_inspect_and_remove(tmp_path, monkeypatch):
    out = tmp_path / "run"
    a_previous_run(out)
    ranks, outcomes = overwrite_on_two_ranks(out, monkeypatch)
    # before: rank 1 walked the old run as rank 0 removed it; here it took the vanished predictions/ for a user's
    # file and refused (in final/ or checkpoints/ it can meet FileNotFoundError), and rank 0 waited for it
    assert outcomes == [None, None], [repr(outcome) for outcome in outcomes]
    assert ranks.inspected_by == [0]
    assert sorted(p.name for p in out.iterdir()) == []


def test_overwrite_output_dir_refused_on_rank_0_stops_every_rank(tmp_path, monkeypatch):
    out = tmp_path / "run"
    a_previous_run(out)
    (out / "predictions" / "mine.txt").write_text("mine")
    ranks, outcomes = overwrite_on_two_ranks(out, monkeypatch, slow_rank_1=False)
    assert all(isinstance(outcome, UserError) for outcome in outcomes), outcomes
    assert f"({out / 'predictions' / 'mine.txt'}); nothing was removed" in str(outcomes[0])
    assert sorted(p.name for p in out.rglob("*")) == [".ner-record.json", "metrics.jsonl", "mine.txt", "predictions",
                                                      "validation.conll"]


def test_no_rank_waits_through_the_end_of_runs_export_of_every_runtimes_files(tmp_path, monkeypatch):
    """--export-int8 calibrates and gates for minutes on a large model: rank 0 does it after the last barrier, so
    the other ranks have left finish() (and are never held past --dist-timeout) while it runs. Before, rank 0
    calibrated before the barrier: rank 1 waited there, and this test's wait for it to leave timed out."""
    ranks, rank_1_left, seen = TwoRanks(), threading.Event(), {}

    def export_fast_runtimes(source, out_dir, calibrate, overwrite=False, runtimes=()):
        seen["rank 1 had left"] = rank_1_left.wait(timeout=20)
        return "--export-int8: wrote model.onnx"

    monkeypatch.setattr(run_module, "score_final_model", lambda *a: ({"validation": {"f1": 0.5}}, tmp_path, True))
    monkeypatch.setattr(run_module, "export_checkpoint", lambda *a, **k: None)
    monkeypatch.setattr(run_module, "export_fast_runtimes", export_fast_runtimes)
    cfg = SimpleNamespace(output_path=tmp_path, export_int8=True, export_runtime=None, test_file=None)
    state = SimpleNamespace(eval_history=[{"step": 5}], global_step=5)
    data = SimpleNamespace(splits=SimpleNamespace(train=[]))

    def work(backend):
        metrics = run_module.finish(cfg, backend, None, data, state, None)
        if backend.process_index == 1:
            rank_1_left.set()
        return metrics

    assert ranks.run(work) == [{"validation": {"f1": 0.5}}] * 2
    assert seen == {"rank 1 had left": True}
