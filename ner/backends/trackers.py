"""The experiment trackers --report-to names (Accelerate's, checked without importing Accelerate), and the record of
what they wrote.

OUTPUT_DIR/trackers/.ner-record.json (ner/files.py) lists every path the trackers wrote in trackers/: brought up to
date at each checkpoint and when the run ends (trackers write their last files as they close), through the run's
TrackerClaim, and never listing what was there, unlisted, when that run began.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ner.errors import UserError
from ner.files import RECORD, read_record, tree_paths, unrecorded, write_record

# Accelerate's trackers (accelerate.tracking.LOGGER_TYPE_TO_CLASS; a test keeps the two equal).
TRACKERS = ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
TRACKERS_DIR = "trackers"  # OUTPUT_DIR/trackers/: every tracker's local files
TRACKERS_TOOL = "ner.train"  # the tool of trackers/'s record


def report_trackers(report_to: str) -> list[str]:
    """--report-to as a list of tracker names: [] for none, ["all"] for all; anything else is an error."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    if names in ([], ["none"]):
        return []
    unknown = [name for name in names if name not in (*TRACKERS, "all")]
    if unknown or ("all" in names and len(names) > 1) or "none" in names:
        raise UserError(f"--report-to {report_to}: expected none, all, or trackers separated by commas "
                        f"from: {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


def recorded_tracker_paths(output_dir: Path) -> set[str] | None:
    entries = read_record(Path(output_dir) / TRACKERS_DIR, TRACKERS_TOOL)
    return None if entries is None else set(entries)


@dataclass
class TrackerClaim:
    """One run's claim on OUTPUT_DIR/trackers/, held by what runs it (ner.train's Worker) and handed to what records
    the trackers' files: each checkpoint, and the end of the run once the trackers closed. Taken (`take`) on the main
    process once the run holds the output folder; never taken (a refused run, the other ranks, a launcher whose
    workers run in other processes), it records nothing."""

    output_dir: Path | None = None  # the run's --output-dir once taken; None: not taken (or released)
    not_ours: frozenset[str] = frozenset()  # what trackers/ held, unlisted, when the run took it

    def take(self, output_dir: Path) -> None:
        """From now on the record lists what the trackers write; what trackers/ holds unlisted now never joins it."""
        folder = Path(output_dir) / TRACKERS_DIR
        present = tree_paths(folder) if folder.is_dir() else set()
        self.not_ours = frozenset(present - (recorded_tracker_paths(output_dir) or set()) - {RECORD})
        self.output_dir = Path(output_dir)

    def record(self) -> None:
        """Write trackers/.ner-record.json, if the run took its claim."""
        folder = self.output_dir / TRACKERS_DIR if self.output_dir is not None else None
        if folder is None or not folder.is_dir():
            return
        write_record(folder, TRACKERS_TOOL, {path: {} for path in tree_paths(folder) - self.not_ours - {RECORD}})

    def release(self) -> None:
        """The run is over and its trackers closed: record their last files, then nothing more."""
        self.record()
        self.output_dir = None


def unrecorded_tracker_files(output_dir: Path) -> list[Path]:
    """What trackers/ holds that its record does not list (all of it without a record: a run killed before its first
    checkpoint)."""
    folder = Path(output_dir) / TRACKERS_DIR
    return [path for path, _ in unrecorded(folder, read_record(folder, TRACKERS_TOOL))]
