"""The experiment trackers --report-to names (Accelerate's, checked without importing Accelerate), and the record of
what they wrote.

OUTPUT_DIR/trackers/.ner-record.json (ner/files.py) lists every path the trackers wrote in trackers/: brought up to
date at each checkpoint and when the run ends (trackers write their last files as they close), by the process
whose run claimed the folder, and never listing what was there, unlisted, when that run began.
"""

from __future__ import annotations

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


# Output folders whose run this process holds -> the paths in their trackers/ that were not the run's when it began
_tracker_runs: dict[Path, frozenset[str]] = {}


def recorded_tracker_paths(output_dir: Path) -> set[str] | None:
    entries = read_record(Path(output_dir) / TRACKERS_DIR, TRACKERS_TOOL)
    return None if entries is None else set(entries)


def claim_tracker_files(output_dir: Path, claimed: bool) -> None:
    """A run starts in `output_dir` (claimed) or was refused it: from now on, and only if claimed, this process
    adds what the trackers write to the record; what trackers/ holds unlisted now never joins it."""
    key = Path(output_dir).resolve()
    _tracker_runs.pop(key, None)
    if claimed:
        folder = Path(output_dir) / TRACKERS_DIR
        present = tree_paths(folder) if folder.is_dir() else set()
        _tracker_runs[key] = frozenset(present - (recorded_tracker_paths(output_dir) or set()) - {RECORD})


def record_tracker_files(output_dir: Path, release: bool = False) -> None:
    """Write trackers/.ner-record.json if this process's run holds `output_dir` (`release`: the run is over)."""
    key = Path(output_dir).resolve()
    not_ours = _tracker_runs.pop(key, None) if release else _tracker_runs.get(key)
    folder = Path(output_dir) / TRACKERS_DIR
    if not_ours is None or not folder.is_dir():
        return
    write_record(folder, TRACKERS_TOOL, {path: {} for path in tree_paths(folder) - not_ours - {RECORD}})


def unrecorded_tracker_files(output_dir: Path) -> list[Path]:
    """What trackers/ holds that its record does not list (all of it without a record: a run killed before its first
    checkpoint)."""
    folder = Path(output_dir) / TRACKERS_DIR
    return [path for path, _ in unrecorded(folder, read_record(folder, TRACKERS_TOOL))]
