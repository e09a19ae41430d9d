"""Train an NER model. Paste any of these:

    python -m ner.train                                             # shipped sample, packaged MiniLM
    python -m ner.train --train-file train.txt --validation-file valid.txt --test-file test.txt
    accelerate launch ner/train.py --train-file train.txt
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml ner/train.py --train-file train.txt
    torchrun --nproc_per_node=2 -m ner.train --raw-ddp --train-file train.txt
    python -m ner.train --raw-ddp --nproc 2 --train-file train.txt  # starts its own workers
    python -m ner.train --data-parallel --train-file train.txt
    python -m ner.train --config scripts/conll2003.yaml --learning-rate 3e-5   # flags override the YAML

Writes OUTPUT_DIR/checkpoints/step_N/ (resumable), OUTPUT_DIR/final/ (a Hugging Face model
folder) and OUTPUT_DIR/metrics.jsonl; with --plots its plots too (`python -m ner.plot OUTPUT_DIR` any time).
"""

from __future__ import annotations

import logging
import os
import sys

if __name__ == "__main__" and not __package__:
    # run as a file (`accelerate launch ner/train.py`), Python puts ner/ first on sys.path, where ner/select.py (the
    # ner.select command) would be imported as the standard library's select: ner is imported as installed instead
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != os.path.dirname(os.path.abspath(__file__))]

from pathlib import Path  # noqa: E402

from ner.backends import Backend, launch
from ner.backends.trackers import TrackerClaim
from ner.errors import cli
from ner.process import exit_now, process_rank_from_env
from ner.training.config import parse_config
from ner.training.output_dir import write_run_record
from ner.training.run import run


class Worker:
    """Picklable `run(cfg, backend, trackers)` for self-spawned raw-DDP processes; holds the run's claim on trackers/
    in this process (a spawned worker takes its own copy)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.trackers = TrackerClaim()

    def __call__(self, backend: Backend) -> None:
        run(self.cfg, backend, self.trackers)


@cli
def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_config(sys.argv[1:] if argv is None else argv)
    worker = Worker(cfg)
    try:
        launch(cfg, worker, getattr(args, "local_rank", None))
    finally:  # after the backend ended, since trackers write their last files as they close
        worker.trackers.release()
    if process_rank_from_env() == 0:
        if args.plots:
            draw_plots(cfg.output_path)
        write_run_record(cfg.output_path)  # last: the trackers closed, the plots drawn
    return 0


def draw_plots(output_dir: Path) -> None:
    """--plots, once the run has ended. On request only: matplotlib's import and the drawing would cost every run's
    end, beside inference or not (figures: docs/performance.md, "Start-up and tear-down")."""
    from ner.training.plots import write_plots

    logging.getLogger("ner").info("plots: %s", " ".join(path.name for path in write_plots(output_dir)))


def command() -> None:
    """The `ner-train` console script: main, then the same fast exit as `python -m ner.train`."""
    exit_now(main())


if __name__ == "__main__":
    command()
