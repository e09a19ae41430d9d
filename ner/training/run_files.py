"""The names a training run gives what it writes in its --output-dir, declared once.

    OUTPUT_DIR/checkpoints/step_N/           resumable checkpoints (training/checkpoint.py names what is inside)
    OUTPUT_DIR/final/                        the export of the run's best (or last) checkpoint
    OUTPUT_DIR/metrics.jsonl                 every logged interval, evaluation and why training stopped
    OUTPUT_DIR/predictions/validation.conll  word / gold / predicted of the exported model on the validation set
    OUTPUT_DIR/loss_lr.png ...               the plots (--plots, python -m ner.plot): PLOTS
    OUTPUT_DIR/trackers/                     --report-to's trackers (backends/trackers.py)

The run, its hooks and plots, `python -m ner.plot` and the check of who owns the folder (training/output_dir.py)
read these names here. Nothing heavy is imported: `python -m ner.plot` and `ner.evaluate` read them without torch.
"""

from __future__ import annotations

FINAL_DIR = "final"
METRICS_FILE = "metrics.jsonl"
PREDICTIONS_DIR = "predictions"
VALIDATION_PREDICTIONS = "validation.conll"  # in PREDICTIONS_DIR; its temporary names are ner/files.py's

LOSS_LR_PLOT = "loss_lr.png"  # training loss and learning rate against the step
VALIDATION_F1_PLOT = "validation_f1.png"  # validation F1 against the step
PER_TYPE_PLOT = "per_type_f1.png"  # precision, recall, F1 per entity type at the best evaluation
CONFUSION_PLOT = "confusion.png"  # the final model's confusion matrix on the validation set
# Every plot training/plots.py draws into a run's folder; --overwrite-output-dir removes these names and no other.
PLOTS = (LOSS_LR_PLOT, VALIDATION_F1_PLOT, PER_TYPE_PLOT, CONFUSION_PLOT)
