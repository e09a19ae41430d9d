"""Plain-torch DistributedDataParallel: the classic recipe, step by step, no Accelerate.

    torchrun --nproc_per_node=4 -m ner.train --raw-ddp --train-file train.conll
    python -m ner.train --raw-ddp --nproc 2 --train-file train.conll        # starts 2 workers itself
    python -m torch.distributed.launch --use-env ...                        # legacy; --local_rank accepted

Each step of the recipe is one function here: `_world()` reads RANK / LOCAL_RANK / WORLD_SIZE,
`_init()` calls init_process_group (nccl on CUDA, gloo on CPU) and set_device(local_rank),
`prepare()` wraps in DistributedDataParallel and shards batches with a DistributedSampler,
`set_epoch()` calls DistributedSampler.set_epoch, `wait_for_everyone()` is the barrier, and
`launch()` calls destroy_process_group in a `finally`. Under --mixed-precision fp16, `backward()`,
`clip_grad_norm_()` and `step()` run the AMP recipe's GradScaler (LossScaler, ner/backends/__init__.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ner.backends import LossScaler, RawPrecisionSteps, resolve_precision
from ner.errors import USAGE_EXIT_CODE, UserError, report
from ner.process import process_rank_from_env


class _EpochBatches(Dataset):
    """Item i is the collated i-th micro-batch of the epoch's global plan."""

    def __init__(self, features, batch_sampler, collate_fn) -> None:
        self.features, self.batch_sampler, self.collate_fn = features, batch_sampler, collate_fn
        self.plan: list[list[int]] = []

    def set_epoch(self, epoch: int, skip_batches: int) -> None:
        self.plan = self.batch_sampler.plan(epoch)[skip_batches:]

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int):
        return self.collate_fn([self.features[j] for j in self.plan[i]])


class _ShardedLoader:
    """A DataLoader rebuilt each epoch over a DistributedSampler of batches.

    The batch plan is already shuffled by (seed, epoch) and padded to a multiple of the world
    size, so the sampler only shards (shuffle=False, nothing to drop or repeat): rank r gets
    batches r, r+W, ... exactly as Accelerate's BatchSamplerShard gives them.
    """

    def __init__(self, loader: DataLoader, rank: int, world_size: int) -> None:
        self.batches = _EpochBatches(loader.dataset, loader.batch_sampler, loader.collate_fn)
        self.rank, self.world_size = rank, world_size
        self.loader: DataLoader | None = None

    def set_epoch(self, epoch: int, skip_batches: int) -> None:
        self.batches.set_epoch(epoch, skip_batches * self.world_size)
        sampler = DistributedSampler(self.batches, num_replicas=self.world_size, rank=self.rank, shuffle=False)
        sampler.set_epoch(epoch)
        self.loader = DataLoader(self.batches, sampler=sampler, batch_size=None, generator=torch.Generator())

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class _Collectives:
    """What every process group here offers, under Accelerate's names (needs process_index, num_processes)."""

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def wait_for_everyone(self) -> None:
        dist.barrier()

    def gather_object(self, obj):
        gathered = [None] * self.num_processes
        dist.all_gather_object(gathered, obj)
        return gathered

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor


class RawDDPBackend(_Collectives, RawPrecisionSteps):
    def __init__(self, cfg, rank: int, local_rank: int, world_size: int) -> None:
        self.process_index, self.local_rank, self.num_processes = rank, local_rank, world_size
        self.device = _init(cfg, rank, local_rank, world_size)
        self.mixed_precision = resolve_precision(cfg.mixed_precision, self.device)
        self.amp = LossScaler(self.device, self.mixed_precision)

    def prepare(self, model, optimizer, train_loader):
        # CPU (gloo): no device_ids; GPU: one device per process.
        device_ids = [self.local_rank] if self.device.type == "cuda" else None
        ddp_model = DistributedDataParallel(model, device_ids=device_ids)
        self.amp.optimizer = optimizer
        return ddp_model, optimizer, _ShardedLoader(train_loader, self.process_index, self.num_processes)

    def set_epoch(self, train_loader, epoch: int, skip_batches: int) -> None:
        train_loader.set_epoch(epoch, skip_batches)

    def backward(self, loss: torch.Tensor) -> None:
        self.amp.backward(loss)

    def no_sync(self, model):
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()

    def unwrap_model(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model

    def log_metrics(self, values: dict, step: int) -> None:
        pass  # trackers come with Accelerate; metrics.jsonl has the same numbers


class InferenceGroup(_Collectives):
    """The processes a launcher started for inference (ner/corpus/tagging.py): one model copy each on its own
    device, no DDP wrapper; the collectives are the ones corpus tagging needs."""

    def __init__(self, timeout_s: float) -> None:
        self.process_index, self.local_rank, self.num_processes = _world(None)
        self.device = _init(SimpleNamespace(dist_timeout=timeout_s), self.process_index, self.local_rank,
                            self.num_processes)

    def end(self) -> None:
        dist.destroy_process_group()


def _world(local_rank_arg: int | None) -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) from torchrun's environment, or None without a launcher."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", local_rank_arg if local_rank_arg is not None else 0))
    return process_rank_from_env(), local_rank, int(os.environ["WORLD_SIZE"])


def _init(cfg, rank: int, local_rank: int, world_size: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before init: NCCL binds this process to its GPU
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=cfg.dist_timeout)
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    # A torchrun restart can reuse the previous attempt's store, whose keys still hold the dead
    # workers' addresses; a per-attempt prefix makes the new ones meet only each other.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout,
                            store=dist.PrefixStore(f"ner/attempt_{attempt}", store))
    return device


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawned_worker(index: int, cfg, worker, world_size: int, port: int) -> None:
    os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    try:
        _run_rank(cfg, worker, index, index, world_size)
    except UserError as exc:
        sys.exit(report(exc, rank=index))


def _run_rank(cfg, worker, rank: int, local_rank: int, world_size: int) -> None:
    backend = RawDDPBackend(cfg, rank, local_rank, world_size)
    try:
        worker(backend)
    finally:
        dist.destroy_process_group()


def launch(cfg, worker, local_rank_arg: int | None) -> None:
    world = _world(local_rank_arg)
    if world is not None:  # started by torchrun / torch.distributed.launch
        _run_rank(cfg, worker, *world)
        return
    nproc = cfg.nproc or max(torch.cuda.device_count(), 1)
    if nproc == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        _run_rank(cfg, worker, 0, 0, 1)
        return
    try:
        mp.start_processes(_spawned_worker, args=(cfg, worker, nproc, _free_port()), nprocs=nproc,
                           start_method="spawn")
    except mp.ProcessExitedException as exc:
        if exc.exit_code == USAGE_EXIT_CODE:
            sys.exit(USAGE_EXIT_CODE)
        raise
