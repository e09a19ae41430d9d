"""Accelerate: model placement, DDP wrapping, sampler sharding and autocast in `prepare`.

    accelerate launch ner/train.py --train-file train.conll
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml ner/train.py --train-file train.conll
"""

from __future__ import annotations

import importlib.util
import logging
import os
from datetime import timedelta
from pathlib import Path

import accelerate.utils
import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, gather_object

from ner.backends import BF16, FP16, resolve_precision, scale_held, scale_on_device
from ner.backends.trackers import TRACKERS, TRACKERS_DIR, report_trackers
from ner.errors import UserError
from ner.extras import install_hint

log = logging.getLogger("ner")


def tracker_installed(name: str) -> bool:
    return getattr(accelerate.utils, f"is_{name}_available")()


def chosen_trackers(report_to: str) -> list[str]:
    """--report-to as tracker names; `all` is every installed one, a named one must be installed."""
    names = report_trackers(report_to)
    if names == ["all"]:
        installed = [name for name in TRACKERS if tracker_installed(name)]
        if not installed:
            log.warning("--report-to all: no tracker is installed; only metrics.jsonl is written")
        return installed
    missing = [name for name in names if not tracker_installed(name)]
    if missing:
        raise UserError(f"--report-to {report_to}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        f"not installed ({install_hint(*missing)}), or drop "
                        f"{'it' if len(missing) == 1 else 'them'}: metrics.jsonl has the same numbers")
    return names


def offline_tracker_kwargs(names: list[str], folder: Path, resuming: bool) -> dict:
    """Keep every tracker's files in `folder`, offline unless the tracker's own setting names a server.

    Some trackers read their mode only from the environment, hence setdefault: a value the user
    exported wins. docs/backends.md has the table of where each writes and how to go online.
    """
    kwargs: dict[str, dict] = {}
    if "wandb" in names:
        kwargs["wandb"] = {"dir": str(folder)} | ({} if "WANDB_MODE" in os.environ else {"mode": "offline"})
    if "mlflow" in names and "MLFLOW_TRACKING_URI" not in os.environ:
        if importlib.util.find_spec("sqlalchemy"):  # mlflow's own default store, in our folder
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        else:  # mlflow-skinny has no database driver: its file store, which it now asks to opt into
            os.environ["MLFLOW_TRACKING_URI"] = (folder / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # mlflow 3 reports usage online otherwise
    if "comet_ml" in names:
        os.environ.setdefault("COMET_OFFLINE_DIRECTORY", str(folder / "comet_ml"))
        kwargs["comet_ml"] = {} if "COMET_START_ONLINE" in os.environ else {"online": False}
    if "clearml" in names and not (os.environ.get("CLEARML_API_HOST") or os.environ.get("CLEARML_CONFIG_FILE")
                                   or Path("~/clearml.conf").expanduser().is_file()):
        os.environ.setdefault("CLEARML_OFFLINE_MODE", "1")
        os.environ.setdefault("CLEARML_CACHE_DIR", str(folder / "clearml"))  # the offline session goes there
    if "clearml" in names:  # its framework hooks re-log what we log, and break matplotlib (our plots)
        kwargs["clearml"] = {"auto_connect_frameworks": False}
    if "dvclive" in names:  # resume=True: a resumed run appends instead of clearing the folder
        kwargs["dvclive"] = {"dir": str(folder / "dvclive"), "resume": resuming, "save_dvc_exp": False}
    if "swanlab" in names:
        kwargs["swanlab"] = {"log_dir": str(folder / "swanlog")} | (
            {} if "SWANLAB_MODE" in os.environ else {"mode": "offline"})
    if "trackio" in names:
        os.environ.setdefault("TRACKIO_DIR", str(folder / "trackio"))
    return kwargs


class AccelerateBackend:
    def __init__(self, cfg) -> None:
        precision = cfg.mixed_precision
        if precision == "auto":  # a launch config asking for bf16/fp16 wins, else what the device supports
            from_config = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
            precision = from_config if from_config in (BF16, FP16) else "auto"
        if precision == "auto":
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            precision = resolve_precision("auto", device)
        trackers = chosen_trackers(cfg.report_to)
        try:
            # cpu=True on machines without an accelerator: Accelerate only treats a multi-process
            # launch as MULTI_CPU (gloo) when told the job is CPU-only.
            self.accelerator = Accelerator(
                cpu=not torch.accelerator.is_available(),
                mixed_precision=precision,
                log_with=trackers or None,
                project_dir=str(Path(cfg.output_dir) / TRACKERS_DIR),
                kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.dist_timeout))])
        except ValueError as exc:
            raise UserError(f"--mixed-precision {precision}: {exc}") from None
        self.device = self.accelerator.device
        self.num_processes = self.accelerator.num_processes
        self.process_index = self.accelerator.process_index
        self.mixed_precision = self.accelerator.mixed_precision
        self._batch_sampler = None
        self._trackers = trackers
        self._trackers_dir = Path(cfg.output_dir) / TRACKERS_DIR
        self._tracker_kwargs = offline_tracker_kwargs(trackers, self._trackers_dir, resuming=cfg.resume is not None)
        self._config = cfg.to_dict()

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def prepare(self, model, optimizer, train_loader):
        # The scheduler is deliberately not prepared: a prepared scheduler steps once per
        # process per update, which would make its schedule differ from raw DDP's.
        self._batch_sampler = train_loader.batch_sampler
        # The loader's batches stay on the CPU: the loop counts tokens on them before it moves them itself, as the
        # other backends' loaders give them (device_placement=False for the loader only).
        return self.accelerator.prepare(model, optimizer, train_loader, device_placement=[None, None, False])

    def set_epoch(self, train_loader, epoch: int, skip_batches: int) -> None:
        # Our sampler is a pure function of (seed, epoch); Accelerate's BatchSamplerShard then
        # hands batch i to rank i % world, so skipping resumes mid-epoch on the exact batch.
        train_loader.set_epoch(epoch)
        self._batch_sampler.set_epoch(epoch, skip_batches * self.num_processes)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def no_sync(self, model):
        return self.accelerator.no_sync(model)

    def autocast(self):
        return self.accelerator.autocast()

    def clip_grad_norm_(self, parameters, max_norm: float):
        return self.accelerator.clip_grad_norm_(parameters, max_norm)  # unscales first under fp16

    def step(self, optimizer) -> bool:
        """The prepared optimizer runs Accelerate's own GradScaler under fp16 on GPUs. Its `step_was_skipped`
        misses the skip of a fused optimizer (GradScaler hands it found_inf and it skips inside its own step,
        so the step Accelerate watches is called): a loss scale that fell is the one sign every optimizer gives."""
        scaler = self.accelerator.scaler
        scale_before = scale_on_device(scaler) if scaler is not None else None
        optimizer.step()
        if scaler is None:
            return not optimizer.step_was_skipped
        return scale_held(scaler, scale_before)

    @property
    def grad_scaler(self):
        return self.accelerator.scaler  # None unless fp16 on an accelerator

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum")

    def gather_object(self, obj):
        return gather_object([obj]) if self.num_processes > 1 else [obj]

    def unwrap_model(self, model):
        return self.accelerator.unwrap_model(model)

    def wait_for_everyone(self) -> None:
        self.accelerator.wait_for_everyone()

    def log_metrics(self, values: dict, step: int) -> None:
        if self._trackers:
            if not self.accelerator.trackers:  # after the output folder exists and holds no other run
                if self.is_main_process:
                    self._trackers_dir.mkdir(parents=True, exist_ok=True)  # mlflow's sqlite file needs its folder
                    log.info("--report-to: %s, local files in %s", ", ".join(self._trackers), self._trackers_dir)
                config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in self._config.items()}
                self.accelerator.init_trackers("ner", config=config, init_kwargs=self._tracker_kwargs)
            self.accelerator.log(values, step=step)

    def end(self) -> None:
        self.accelerator.end_training()
        if self.num_processes == 1:
            # Accelerate keeps its state (precision included) per process; a later run in the same process (a
            # notebook, tests) may ask for another precision. A multi-process state keeps its process group.
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)
