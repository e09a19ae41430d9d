"""Plots of a training run, written as PNG files into its output folder.

    python -m ner.plot runs/ner        # any run, live or finished; rerun it to refresh a live run

Writes, into the folder:
    loss_lr.png          training loss and learning rate against optimizer step
    validation_f1.png    validation F1 (overall and per type) against step, best step marked
    per_type_f1.png      precision / recall / F1 per entity type at the best evaluation
    confusion.png        entity-type confusion matrix of the final model on the validation set
                         (from predictions/validation.conll), with missed and spurious entities

`python -m ner.evaluate MODEL FILE --plots DIR` draws confusion.png for that file, with
precision_recall.png and reliability.png (docs/evaluation.md). `python -m ner.train --plots` draws a run's
plots at its end. A plot without data (no evaluation, no predictions file yet) is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ner.errors import UserError, cli
from ner.process import log_to_stderr
from ner.training.plots import write_plots
from ner.training.run_files import METRICS_FILE, PREDICTIONS_DIR, VALIDATION_PREDICTIONS


@cli
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ner.plot", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path, help="a training run's --output-dir (holds metrics.jsonl)")
    args = parser.parse_args(argv)
    log_to_stderr(logging.INFO, "%(message)s")
    predictions = f"{PREDICTIONS_DIR}/{VALIDATION_PREDICTIONS}"
    if args.output_dir.is_dir() and not any((args.output_dir / name).exists() for name in (METRICS_FILE, predictions)):
        raise UserError(f"{args.output_dir}: no {METRICS_FILE} or {predictions} (expected the --output-dir of a "
                        "training run)")
    for path in write_plots(args.output_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
