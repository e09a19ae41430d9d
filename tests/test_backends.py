"""The three backends train the same model: per-step losses, weights and learning rates agree.

Each run is a real subprocess (`python -m ner.train ...`, `accelerate launch ...`), on the tiny
random BERT, in fp32 on the CPU.
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from conftest import python_module, read_state, run_cli, tiny_args
from safetensors.torch import load_file

from ner.backends import ACCELERATE, BACKENDS, RAW_DDP
from ner.training.checkpoint import list_checkpoints


def train(args: list[str], launcher: list[str] | None = None, env: dict | None = None) -> dict:
    command = (launcher or python_module("ner.train")) + args
    result = run_cli(command, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out_dir = args[args.index("--output-dir") + 1]
    last = list_checkpoints(out_dir)[-1]
    return {"losses": read_state(last)["train_state"]["step_losses"], "checkpoint": last, "state": read_state(last),
            "weights": load_file(last / "model" / "model.safetensors")}


def max_weight_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


BACKEND_FLAGS = {name: ["--backend", name] for name in BACKENDS}  # a new backend gets its runs here too


@pytest.fixture(scope="module")
def one_process_runs(tiny_bert, tiny_data, tmp_path_factory):
    """Same seed, data and hyperparameters on each backend, dropout on, 2 epochs."""
    runs = {}
    for name, flags in BACKEND_FLAGS.items():
        out = tmp_path_factory.mktemp(name)
        runs[name] = train(tiny_args(tiny_bert, tiny_data, out, "--save-steps", "7", "--save-total-limit", "0", *flags))
    return runs


def test_backends_give_identical_losses_and_weights(one_process_runs):
    reference = one_process_runs[ACCELERATE]
    assert len(reference["losses"]) > 20
    assert reference["losses"][-1] < reference["losses"][0] * 0.8  # it learns
    for name in set(BACKENDS) - {ACCELERATE}:
        run = one_process_runs[name]
        assert run["losses"] == pytest.approx(reference["losses"], abs=1e-6), name
        assert max_weight_difference(run["weights"], reference["weights"]) <= 1e-5, name


def test_saved_weights_have_no_wrapper_prefixes(one_process_runs):
    for run in one_process_runs.values():
        assert not [k for k in run["weights"] if k.startswith(("module.", "_orig_mod."))]


def learning_rate_at(checkpoint) -> float:
    return torch.load(checkpoint / "scheduler.pt", weights_only=True)["_last_lr"][0]


def linear_schedule(step: int, total: int, warmup: int, peak: float) -> float:
    """transformers' linear schedule with warmup, written out."""
    return peak * step / warmup if step < warmup else peak * (total - step) / (total - warmup)


@pytest.mark.slow
@pytest.mark.parametrize("accumulation", [1, 4])
def test_mid_schedule_learning_rate_follows_the_formula_on_every_backend(tiny_bert, tiny_data, tmp_path,
                                                                          accumulation):
    """After update 6 of 10 (2 warmup): a scheduler stepped per micro-batch or per process would be ahead."""
    for name, flags in BACKEND_FLAGS.items():
        args = tiny_args(tiny_bert, tiny_data, tmp_path / name, "--gradient-accumulation-steps", str(accumulation),
                         "--max-steps", "10", "--warmup-ratio", "0.2", "--no-eval", "--save-steps", "6",
                         "--save-total-limit", "0", *flags)
        train(args)
        step6 = learning_rate_at(tmp_path / name / "checkpoints" / "step_6")
        assert step6 == pytest.approx(linear_schedule(6, 10, 2, 1e-3), rel=1e-9), name


@pytest.fixture(scope="module")
def reference_two_micro_batches(tiny_bert_no_dropout, tiny_data, tmp_path_factory):
    """One process, 2 micro-batches per update: the same global batch as 2 ranks x 1.

    7 updates stay inside the first epoch: its 15 batches are an odd number, so at the epoch's
    end 2 ranks repeat a batch (as DistributedSampler does) where 1 rank takes a short update.
    """
    out = tmp_path_factory.mktemp("one_rank")
    return train(tiny_args(tiny_bert_no_dropout, tiny_data, out, f"--{RAW_DDP}", "--gradient-accumulation-steps", "2",
                           "--max-steps", "7"))


def test_raw_ddp_two_processes_equal_one_process_at_the_same_global_batch(
        tiny_bert_no_dropout, tiny_data, tmp_path, reference_two_micro_batches):
    two = train(tiny_args(tiny_bert_no_dropout, tiny_data, tmp_path / "two", f"--{RAW_DDP}", "--nproc", "2",
                          "--max-steps", "7", "--save-steps", "4", "--save-total-limit", "0"))
    # 7 updates, warmup ceil(0.1 * 7) = 1: one scheduler step per update, not one per process
    assert learning_rate_at(tmp_path / "two" / "checkpoints" / "step_4") == pytest.approx(
        linear_schedule(4, 7, 1, 1e-3), rel=1e-9)
    assert two["losses"] == pytest.approx(reference_two_micro_batches["losses"], abs=1e-5)
    assert max_weight_difference(two["weights"], reference_two_micro_batches["weights"]) <= 1e-5
    assert two["state"]["world_size"] == 2


def test_accelerate_launch_cpu_ddp_equals_one_process_and_counts_each_sentence_once(
        tiny_bert_no_dropout, tiny_data, tmp_path, reference_two_micro_batches):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                "accelerate_configs/cpu_ddp.yaml", "--main_process_port", "0", "ner/train.py"]
    two = train(tiny_args(tiny_bert_no_dropout, tiny_data, tmp_path / "acc2", "--max-steps", "7",
                          "--eval-steps", "7", "--save-steps", "4", "--save-total-limit", "0"), launcher=launcher)
    assert learning_rate_at(tmp_path / "acc2" / "checkpoints" / "step_4") == pytest.approx(
        linear_schedule(4, 7, 1, 1e-3), rel=1e-9)
    assert two["state"]["world_size"] == 2
    assert two["losses"] == pytest.approx(reference_two_micro_batches["losses"], abs=1e-5)
    assert max_weight_difference(two["weights"], reference_two_micro_batches["weights"]) <= 1e-5
    # 13 validation sentences over 2 ranks: seqeval's support is the number of gold entities, once each.
    gold_entities = sum(line.split()[-1].startswith("B-") for line in tiny_data["validation"].read_text().splitlines()
                        if line.strip() and not line.startswith("-DOCSTART-"))
    (evaluation,) = two["state"]["eval_history"]
    assert evaluation["scores"]["support"] == gold_entities


@pytest.mark.parametrize("first, second", list(zip(BACKENDS, BACKENDS[1:] + BACKENDS[:1])))  # each resumes another's
def test_checkpoint_from_one_backend_resumes_under_another(tiny_bert, tiny_data, tmp_path, one_process_runs,
                                                         first, second):
    """Resume mid-epoch (step 21 of 2 epochs) from `first`'s checkpoint under `second`."""
    source = one_process_runs[first]["checkpoint"].parent / "step_21"
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(source, resumed_dir / "checkpoints" / "step_21")
    run = train(tiny_args(tiny_bert, tiny_data, resumed_dir, "--save-steps", "7", "--resume", "auto",
                          *BACKEND_FLAGS[second]))
    reference = one_process_runs[ACCELERATE]
    assert run["losses"] == pytest.approx(reference["losses"], abs=1e-6)
    assert max_weight_difference(run["weights"], reference["weights"]) <= 1e-5


# An InferenceGroup meets torch.distributed.nn only after init_process_group (transformers' from_pretrained
# imports it then). Its functions' `group=group.WORLD` defaults must not keep the group alive past end(): gloo's
# threads would then free a tensor while Python shuts down, and the process aborts after its work is done.
RELEASE_CHECK = """
import os, sys, weakref
from ner.backends.raw_ddp import InferenceGroup, _free_port
import torch.distributed as dist
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
group = InferenceGroup(timeout_s=60)
world = weakref.ref(dist.group.WORLD)
import torch.distributed.nn.functional
group.end()
sys.exit(0 if world() is None else 'the process group outlived end()')
"""


def test_the_inference_group_is_freed_at_end_though_torch_distributed_nn_comes_after_it():
    released = run_cli([sys.executable, "-c", RELEASE_CHECK], timeout=120)
    assert released.returncode == 0, released.stderr[-2000:]


# ner.backends imports torch only when used (ner.evaluate must not load it), so each way a backend starts imports
# torch.distributed.nn itself before a group can exist: launch() (Accelerate makes its group in Accelerator()),
# and raw_ddp's module (a worker it spawns starts there); the check above covers the second.
LAUNCH_CHECK = """
import sys, types
import ner.backends, ner.backends.hf_accelerate as hf
class Probe:
    def __init__(self, cfg):
        self.ready = 'torch.distributed.nn' in sys.modules
    def end(self):
        pass
hf.AccelerateBackend = Probe
ner.backends.launch(types.SimpleNamespace(backend=ner.backends.ACCELERATE), lambda backend: print(backend.ready))
"""


def test_launch_imports_torch_distributed_nn_before_it_builds_the_accelerate_backend():
    probed = run_cli([sys.executable, "-c", LAUNCH_CHECK], timeout=120)
    assert probed.returncode == 0, probed.stderr[-2000:]
    assert probed.stdout.strip() == "True"
