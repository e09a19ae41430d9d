"""Who owns a run's --output-dir: one run a folder, and nothing removed or replaced that a run did not write.

    claim_output_dir(cfg, backend, trackers, resume_from)   # before a run writes there, on every rank
    write_run_record(out)                                    # at the run's end: OUTPUT_DIR/.ner-record.json
    MetricsLog(out).append(line)                             # metrics.jsonl, pinned in that record at each line

A folder that holds a run (RUN_MARKERS) is refused unless told: --overwrite-output-dir removes the run's own entries
and nothing else, and only once no record shows a file of yours among them (the checkpoints' manifests, the export's
and the trackers' records, ner/files.py); --resume continues the run, if its export in final/ is the export's own.
What a run writes is named in training/run_files.py. At its end a run records what it wrote (write_run_record), from
its own records where it keeps them, so that a retraining's prune (serving/retrain.py) removes exactly that.
metrics.jsonl is pinned there (size, sha256) as each line is appended: one you edited is yours, and neither removed by
--overwrite-output-dir nor appended to by a resume (both refused, naming it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ner.backends import Backend
from ner.backends.trackers import TRACKERS_DIR, TRACKERS_TOOL, TrackerClaim, unrecorded_tracker_files
from ner.errors import UserError
from ner.files import (
    RECORD,
    read_record,
    read_whole_record,
    remove_recorded,
    same_bytes,
    temporary_of,
    tree_paths,
    write_record,
)
from ner.training import checkpoint as ckpt
from ner.training.config import TrainConfig
from ner.training.export import EXPORT_TOOL, checkpoint_export_names, export_unrecorded, is_export, not_the_exports
from ner.training.run_files import FINAL_DIR, METRICS_FILE, PLOTS, PREDICTIONS_DIR, VALIDATION_PREDICTIONS

# What a finished or running job leaves; --overwrite-output-dir removes these and nothing else.
RUN_MARKERS = (ckpt.CHECKPOINTS, FINAL_DIR, METRICS_FILE, PREDICTIONS_DIR, *PLOTS, TRACKERS_DIR)
RUN_FILES = {METRICS_FILE, *PLOTS}  # the markers that are files; the others are folders
RUN_TOOL = "ner.train"  # the tool of OUTPUT_DIR/.ner-record.json (ner/files.py), the run's record of what it wrote


def claim_output_dir(cfg: TrainConfig, backend: Backend, trackers: TrackerClaim,
                     resume_from: Path | None = None) -> None:
    """Refuse to mix two runs in one folder unless told to overwrite or resume (a run starts afresh, `--resume auto`
    that found no complete checkpoint included, only where no run wrote); refuse, before anything is removed, to
    remove or replace anything no record shows a run wrote. A resume continues only the run of its checkpoint: a
    checkpoint of another folder is resumed only into a folder that holds no run (or, told to, replaces it).
    Claimed, the main process takes the run's `trackers`."""
    out = cfg.output_path
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --output-dir exists and is not a folder")
    taken = run_markers(out)
    # --resume auto finds its checkpoint in `out` only; a PATH may name another folder's
    own = resume_from is not None and (cfg.resume == "auto" or is_own_checkpoint(out, resume_from))
    if not own and cfg.overwrite_output_dir:
        replace_previous_run(out, backend)
    elif taken and resume_from is not None and not own:
        raise UserError(f"{out}: holds another run ({', '.join(taken)}), not the run of --resume {resume_from}; "
                        "pass --overwrite-output-dir to replace it, or choose another --output-dir")
    elif taken and cfg.resume is None:
        raise UserError(f"{out}: holds another run ({', '.join(taken)}); pass --resume auto to continue it, "
                        "--overwrite-output-dir to replace it, or choose another --output-dir")
    elif taken and resume_from is None:
        raise UserError(f"{out}: --resume auto found no complete checkpoint, and the folder holds a run "
                        f"({', '.join(taken)}); pass --overwrite-output-dir to start afresh there, or choose another "
                        "--output-dir")
    elif FINAL_DIR in taken:
        check_final_for_resume(out / FINAL_DIR, resume_from)  # on every rank: a resume removes nothing
    if own:  # on every rank too: a save of a step found here again replaces its folder whole
        ckpt.resaves_refused(out, resume_from)
        metrics = out / METRICS_FILE
        if (metrics.exists() or metrics.is_symlink()) and not metrics_are_the_runs(out):
            raise UserError(f"{metrics}: changed since the run wrote it (or no record shows a run did), so it is yours "
                            "now, and the resumed run would append to it: move it away (nothing was changed)")
    backend.wait_for_everyone()  # no rank looks at the folder any more when rank 0 starts writing there
    if backend.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        trackers.take(out)


def is_own_checkpoint(out: Path, checkpoint: Path) -> bool:
    """`checkpoint` is one of `out`'s own (OUTPUT_DIR/checkpoints/step_N): resuming it continues the run there. Any
    other (--resume PATH of another folder) would let rotation, the export and metrics.jsonl take over a run there."""
    return Path(checkpoint).resolve().parent == ckpt.checkpoint_root(out).resolve()


def marker_paths(out: Path, marker: str) -> list[str]:
    """Every path under run marker `marker` of `out`, relative to `out`."""
    path = out / marker
    return [f"{marker}/{name}" for name in tree_paths(path)] if path.is_dir() and not path.is_symlink() else []


def run_markers(out: Path) -> list[str]:
    return [m for m in RUN_MARKERS if (out / m).exists() or (out / m).is_symlink()]


def replace_previous_run(out: Path, backend: Backend) -> None:
    """--overwrite-output-dir: rank 0 alone inspects the old run and removes it (another rank walking final/ while
    it goes would meet files gone, or take them for a user's). A refusal removes nothing, so after the barrier the
    other ranks see the run still there and stop too, rather than wait for rank 0 at the next one."""
    refusal = None
    if backend.is_main_process:
        taken = run_markers(out)
        try:
            refuse_foreign(out, not_written_by_a_run(out, taken))
        except UserError as exc:
            refusal = exc
        else:  # every path under the markers was just found to be the run's, by the run's records
            run_record = {RECORD: {}} if read_record(out, RUN_TOOL) is not None else {}
            remove_recorded(out, {**run_record, **{path: {} for marker in taken
                                                   for path in [marker, *marker_paths(out, marker)]}}, contents=False)
    backend.wait_for_everyone()
    if refusal is not None:
        raise refusal
    left = run_markers(out)
    if left:
        raise UserError(f"{out}: process 0 did not replace the run there ({', '.join(left)} left; its error says "
                        "why)")


def write_run_record(out: Path) -> None:
    """OUTPUT_DIR/.ner-record.json: every path the run wrote there, at its end. Read from the run's own records where it
    keeps them (each checkpoint's manifest, final/'s export record, trackers/'s record: their pins carried over, nothing
    hashed again: gigabytes of optimizer state) and by name for the files it keeps none for (metrics.jsonl, the
    validation predictions, the plots: unpinned). A file of yours in the folder is in none of them."""
    entries: dict[str, dict] = {}
    for marker in run_markers(out):
        path = out / marker
        if path.is_symlink():
            continue
        if marker == METRICS_FILE:  # its pin as the run left it (MetricsLog), never the file as it is now
            entries[marker] = (read_record(out, RUN_TOOL) or {}).get(METRICS_FILE, {})
        elif marker in RUN_FILES and path.is_file():
            entries[marker] = {}
        elif marker == PREDICTIONS_DIR and (path / VALIDATION_PREDICTIONS).is_file():
            entries[f"{marker}/{VALIDATION_PREDICTIONS}"] = {}
        elif marker == ckpt.CHECKPOINTS:
            for step in ckpt.list_checkpoints(out):
                entries |= recorded_in(out, step, read_record(step, ckpt.CHECKPOINT_TOOL, ckpt.MANIFEST), ckpt.MANIFEST)
        elif marker == FINAL_DIR:
            entries |= recorded_in(out, path, read_record(path, EXPORT_TOOL))
        elif marker == TRACKERS_DIR:
            entries |= recorded_in(out, path, read_record(path, TRACKERS_TOOL))
    write_record(out, RUN_TOOL, entries)


def recorded_in(out: Path, folder: Path, entries: dict[str, dict] | None, name: str = RECORD) -> dict[str, dict]:
    """A sub-folder's record as entries of `out`'s (the record file included); none without one."""
    if entries is None:
        return {}
    prefix = folder.relative_to(out).as_posix()
    return {f"{prefix}/{path}": entry for path, entry in {**entries, name: {}}.items()}


def check_final_for_resume(final: Path, resume_from: Path | None) -> None:
    """A resumed run exports into final/ at its end: it must be an export, and what the new export would replace
    there must be the old export's own (not a README.md of yours, nor a model card you edited)."""
    if final.is_symlink() or not final.is_dir() or (any(final.iterdir()) and not is_export(final)):
        refuse_foreign(final.parent, [final])
    unsure = export_unrecorded(final, checkpoint_export_names(resume_from))
    if unsure:
        path, edited = unsure[0]
        raise UserError(f"{path}: {not_the_exports(edited)}; the resumed run's export would replace it: move it "
                        "away (nothing was changed)")


def not_written_by_a_run(out: Path, markers: list[str]) -> list[Path]:
    """What a run would not have written among `markers` in `out`, at any depth, or what changed since (a model
    card edited in final/): a user's file that happens to share a name or a folder."""
    foreign = []
    for marker in markers:
        path = out / marker
        if path.is_symlink() or (path.is_dir() == (marker in RUN_FILES)):
            foreign.append(path)
        elif marker == METRICS_FILE and not metrics_are_the_runs(out):
            foreign.append(path)
        elif marker == FINAL_DIR:
            foreign += foreign_in_final(path)
        elif marker == ckpt.CHECKPOINTS:
            foreign += foreign_in_checkpoints(path)
        elif marker == PREDICTIONS_DIR:
            foreign += [p for p in sorted(path.iterdir()) if not (is_prediction_name(p.name) and p.is_file())]
        elif marker == TRACKERS_DIR:
            foreign += unrecorded_tracker_files(out)
    return foreign


def is_prediction_name(name: str) -> bool:
    """predictions/validation.conll, or a temporary file ner/files.py wrote it through (a run killed meanwhile)."""
    return name == VALIDATION_PREDICTIONS or temporary_of(name, roles=("tmp",)) == VALIDATION_PREDICTIONS


def foreign_in_final(final: Path) -> list[Path]:
    """final/ itself when it is not an export; else its entries that no record shows its export wrote as they are."""
    if not any(final.iterdir()):
        return []
    if not is_export(final):
        return [final]
    return [p for p, _ in export_unrecorded(final)]


def foreign_in_checkpoints(root: Path) -> list[Path]:
    foreign = []
    for entry in sorted(root.iterdir()):
        if ckpt.CHECKPOINT_NAME.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            foreign += ckpt.not_in_manifest(entry)
        elif not (ckpt.is_staging_name(entry.name) and entry.is_dir()):
            foreign.append(entry)
    return foreign


def refuse_foreign(out: Path, foreign: list[Path]) -> None:
    if foreign:
        named = ", ".join(str(p) for p in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"{out}: holds files a training run did not write or that changed since ({named}); nothing "
                        "was removed: move them away or choose another --output-dir")


class MetricsLog:
    """OUTPUT_DIR/metrics.jsonl, appended to by the main process, and its pin in the run's record (RUN_TOOL): the
    bytes after each line, hashed as they are appended (the file is read once, when a resume first appends), with the
    bytes before it (`before`) so that a run killed between the pin and the append leaves a file that is still the
    run's. Written before the line, the pin never vouches for what the user may have appended after it."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = Path(out), Path(out) / METRICS_FILE
        self.digest, self.size = None, 0

    def append(self, line: str) -> None:
        data = line.encode("utf-8")
        if self.digest is None:  # claim_output_dir found it the run's (a resume), or there was none
            self.digest = hashlib.sha256(self.path.read_bytes() if self.path.is_file() else b"")
            self.size = self.path.stat().st_size if self.path.is_file() else 0
        before = {"size": self.size, "sha256": self.digest.hexdigest()}
        self.digest.update(data)
        self.size += len(data)
        record = read_whole_record(self.out, RUN_TOOL) or {"files": {}}
        more = {key: value for key, value in record.items() if key not in ("tool", "files")}
        write_record(self.out, RUN_TOOL, {**record["files"], METRICS_FILE: {
            "size": self.size, "sha256": self.digest.hexdigest(), "before": before}}, **more)
        with open(self.path, "ab") as handle:
            handle.write(data)


def metrics_are_the_runs(out: Path) -> bool:
    """OUTPUT_DIR/metrics.jsonl holds the bytes the run's record pins (or those before its last line: killed between
    the pin and the append)."""
    entry = (read_record(out, RUN_TOOL) or {}).get(METRICS_FILE, {})
    path = Path(out) / METRICS_FILE
    return any("sha256" in pinned and same_bytes(path, pinned) for pinned in (entry, entry.get("before") or {}))
