"""Export a checkpoint as a standard Hugging Face model folder."""

from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from ner.data.examples import Example
from ner.errors import UserError
from ner.files import RECORD, file_entry, read_record, staged_folder, unrecorded, write_record
from ner.inference.runtimes import (
    EXPORT_RUNTIME_FLAG,
    FAST_RUNTIMES,
    FAST_RUNTIMES_FLAG,
    REGISTRY,
    RUNTIME_FILES,
)
from ner.metrics import best_evaluation
from ner.training.checkpoint import CHECKPOINT_TOOL, MANIFEST, read_state, verify
from ner.training.model_card import model_card

log = logging.getLogger("ner")
EXPORT_TOOL = "ner.export"  # the tool of OUT/.ner-record.json (ner/files.py): what a replacement may replace
DESCRIPTION = ("training_args.json", "metrics.json", "README.md")  # what an export adds to the checkpoint's model


def export_checkpoint(checkpoint: Path, out_dir: Path, metrics: dict | None = None, runtimes: tuple[str, ...] = (),
                      overwrite: bool = False, update: bool = False,
                      sealed_here: bool = False, calibrate: list[Example] | None = None,
                      refused: dict[str, str] | None = None) -> Path:
    """Copy the checkpoint's model folder and describe it; `metrics` defaults to its evals. `overwrite` (the user's
    --overwrite): OUT may be an export, replaced whole but for what was never its own. `update` (OUTPUT_DIR/final at
    the end of a run): the same, but a file no record shows the export wrote is refused instead of replaced.
    `sealed_here`: the caller sealed the checkpoint a moment ago (a run's last save), so it is not read again to
    verify it (every file hashed, the optimizer state too: a cost at every run's end, docs/performance.md,
    "Start-up and tear-down"). `runtimes`, `refused`: see add_onnx."""
    problem = None if sealed_here else verify(checkpoint)
    if problem is not None:
        raise UserError(f"{checkpoint}: not a complete checkpoint: {problem}")
    out_dir = Path(out_dir)
    names = checkpoint_export_names(checkpoint) | onnx_names(runtimes)
    check_out_dir(out_dir, overwrite, update, names)
    state = read_state(checkpoint)
    if metrics is None:
        best = best_evaluation(state.get("eval_history", []))
        metrics = {"validation": best["scores"] if best else None}
    training_args = {**state["config"], "label_list": state["label_list"], "tag_scheme": state["tag_scheme"],
                     "global_step": state["global_step"], "versions": state["versions"],
                     "source_checkpoint": str(checkpoint)}
    with staged_folder(out_dir) as tmp:
        shutil.copytree(checkpoint / "model", tmp, dirs_exist_ok=True)
        (tmp / "training_args.json").write_text(json.dumps(training_args, indent=2, sort_keys=True) + "\n")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(model_card(training_args, metrics), encoding="utf-8")
        add_onnx(tmp, runtimes, calibrate, refused)
        check_out_dir(out_dir, overwrite, update)  # again: the ONNX check takes a while
        keep_what_is_not_ours(out_dir, tmp, overwrite, known=copied_entries(checkpoint))
    return out_dir


def copied_entries(checkpoint: Path) -> dict[str, dict]:
    """The record entries of the model files an export copies, from the checkpoint's manifest (just verified, or
    sealed by the caller), so the copies are not hashed again for the export's record."""
    entries = read_record(checkpoint, CHECKPOINT_TOOL, MANIFEST) or {}
    return {name[len("model/"):]: entry for name, entry in entries.items()
            if name.startswith("model/") and name.count("/") == 1 and name[len("model/"):] not in DESCRIPTION}


def export_folder(model_dir: Path, out_dir: Path, runtimes: tuple[str, ...] = (), overwrite: bool = False,
                  calibrate: list[Example] | None = None, refused: dict[str, str] | None = None) -> Path:
    """The files of an exported model folder copied to `out_dir`, the files of `runtimes` added (see add_onnx). In place
    when they are the same folder: allowed without `overwrite`, since naming the folder twice asks for it, and its
    files are copied onto themselves; what is not the export's stays."""
    out_dir = Path(out_dir)
    in_place = same_folder(model_dir, out_dir)
    files, unvouched = files_of_export(model_dir, in_place)
    names = onnx_names(runtimes) | (set() if in_place else {p.name for p in files})
    check_out_dir(out_dir, overwrite, in_place, names)
    with staged_folder(out_dir) as tmp:
        for path in files:
            shutil.copy2(path, tmp / path.name)
        add_onnx(tmp, runtimes, calibrate, refused)
        check_out_dir(out_dir, overwrite, in_place)
        keep_what_is_not_ours(out_dir, tmp, overwrite, unvouched)
    return out_dir


RUNTIME_ONLY = {name for names in RUNTIME_FILES.values() for name in names}  # written again by an export that asks


def files_of_export(folder: Path, in_place: bool) -> tuple[list[Path], set[str]]:
    """The files an export of `folder` copies (its recorded ones; from a model folder without a record, every plain
    file but dotted and ONNX ones), and the names among them the new export's record must not vouch for: those its
    record does not (edited since, or not in it). A model folder no export wrote, copied elsewhere, is the user's to
    hand in whole: its copies are the new export's writing; in place, nothing was written."""
    listed = read_record(folder, EXPORT_TOOL)
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
             and p.name not in RUNTIME_ONLY and not p.name.endswith(".onnx") and (listed is None or p.name in listed)]
    if listed is None and not in_place:
        return files, set()
    return files, {p.name for p, _ in unrecorded(folder, listed, {p.name for p in files})}


def checkpoint_export_names(checkpoint: Path | None) -> set[str]:
    """The names an export of `checkpoint` writes (without ONNX files): its model's files and the description."""
    model = Path(checkpoint) / "model" if checkpoint is not None else None
    return set(DESCRIPTION) | ({p.name for p in model.iterdir() if p.is_file()} if model and model.is_dir() else set())


def onnx_names(runtimes: tuple[str, ...]) -> set[str]:
    """The files add_onnx writes."""
    return {name for runtime in runtimes for name in RUNTIME_FILES[runtime]}


def export_any(source: Path, out_dir: Path, runtimes: tuple[str, ...] = (), overwrite: bool = False,
               calibrate: list[Example] | None = None, refused: dict[str, str] | None = None) -> Path:
    """A checkpoint (manifest.json) or an exported folder (config.json + training_args.json) to `out_dir`."""
    if (source / MANIFEST).is_file():
        return export_checkpoint(source, out_dir, runtimes=runtimes, overwrite=overwrite, calibrate=calibrate,
                                 refused=refused)
    if is_export(source):
        return export_folder(source, out_dir, runtimes, overwrite, calibrate, refused)
    raise UserError(f"{source}: neither a checkpoint (manifest.json) nor an exported model folder "
                    "(config.json + training_args.json)")


def keep_what_is_not_ours(old: Path, staged: Path, overwrite: bool, unvouched: set[str] = frozenset(),
                          known: dict[str, dict] | None = None) -> None:
    """Record the new export's files in `staged` (all but `unvouched`), then link in every entry of the export at
    `old` that was never its own, so the folder swap keeps them. Hard links, not moves: until the swap, `old`
    stays whole. The old export's own files that the new one does not write (ONNX files of other weights) are left
    behind with it. A file the new export also writes is replaced: if no record shows it is the old export's own,
    only with `overwrite`, and named in the log first. `known`: the entries of staged files copied from a source
    that records them."""
    known = known or {}
    new_files = {p.name: known.get(p.name) or file_entry(p) for p in sorted(staged.iterdir())
                 if p.is_file() and p.name not in unvouched}
    write_record(staged, EXPORT_TOOL, new_files)
    if not old.is_dir():
        return
    not_ours = dict(export_unrecorded(old))
    for entry in sorted(old.iterdir()):
        new = staged / entry.name
        if new.exists() or new.is_symlink():
            if entry in not_ours and not same_contents(entry, new):
                replace_unrecorded(entry, not_ours[entry], overwrite)
        elif entry in not_ours:
            link_tree(entry, new)


def export_unrecorded(folder: Path, names: set[str] | None = None) -> list[tuple[Path, bool]]:
    """files.unrecorded against export `folder`'s own record: its entries (those in `names`, or all) that no export
    wrote as they are now, each with whether it was edited since."""
    return unrecorded(folder, read_record(folder, EXPORT_TOOL), names)


def not_the_exports(edited: bool) -> str:
    """Why an entry of an export that files.unrecorded names is not the export's own, in words."""
    return "edited since it was exported" if edited else f"not written by an export (not in its {RECORD})"


def replace_unrecorded(path: Path, edited: bool, overwrite: bool) -> None:
    if not overwrite:
        raise UserError(refusal(path, edited))
    log.warning("%s: %s; replaced by the new export (--overwrite)", path, not_the_exports(edited))


def refusal(path: Path, edited: bool) -> str:
    return f"{path}: {not_the_exports(edited)}; nothing was changed: move it away, or pass --overwrite to replace it"


def same_contents(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and not a.is_symlink() and filecmp.cmp(a, b, shallow=False)


def link_tree(source: Path, target: Path) -> None:
    """`source` (a file, a link or a folder) at `target` too, by hard links where the file system has them."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(str(source), str(target))


def is_export(folder: Path) -> bool:
    """A model folder this tool wrote."""
    return (folder / "config.json").is_file() and (folder / "training_args.json").is_file()


def same_folder(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def check_out_dir(out_dir: Path, overwrite: bool, update: bool = False, names: set[str] = frozenset()) -> None:
    """Only a new or empty folder, or (with `overwrite` or `update`) one of our own exports, may be replaced; of an
    export, a file among `names` (what the new export writes) that no record shows it wrote only with `overwrite`."""
    if not out_dir.exists():
        if out_dir.is_symlink():
            raise UserError(f"{out_dir}: a link to nothing; remove it or choose another OUT")
        return
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a folder; choose a new or empty folder for OUT")
    if not any(out_dir.iterdir()):
        return
    if not is_export(out_dir):
        raise UserError(f"{out_dir}: exists and holds files that are not an exported model (no config.json + "
                        "training_args.json); nothing was changed: choose a new or empty folder for OUT")
    if not (overwrite or update):
        raise UserError(f"{out_dir}: already holds an exported model; pass --overwrite to replace it, "
                        "or choose another OUT")
    unsure = [] if overwrite else export_unrecorded(out_dir, names)
    if unsure:
        raise UserError(refusal(*unsure[0]))


def add_onnx(folder: Path, runtimes: tuple[str, ...], calibrate: list[Example] | None = None,
             refused: dict[str, str] | None = None) -> None:
    """The files of `runtimes` (OpenVINO's static int8 calibrated on the `calibrate` examples), checked against
    PyTorch, into the staged folder. `refused` (a dict): a file a gate refuses is named there by runtime and the others
    are kept (FAST_RUNTIMES_FLAG); without it a refusal fails the export."""
    if not runtimes:
        return
    from ner.inference.onnx_export import write_onnx  # torch.onnx loads only when asked for

    measured = write_onnx(folder, runtimes, calibrate, refused)
    print("ONNX check against PyTorch: " + ", ".join(f"{k} {v:.3g}" for k, v in measured.items()), file=sys.stderr)


def export_fast_runtimes(source: Path, out_dir: Path, calibrate: list[Example], overwrite: bool = False,
                         runtimes: tuple[str, ...] = FAST_RUNTIMES) -> str:
    """FAST_RUNTIMES_FLAG (or --export-runtime, for some of them): `source` exported to `out_dir` with every file the
    `runtimes` read, each past its gate; a refused file is left out and named, the others kept. `calibrate`: the text
    a calibrated runtime's files are calibrated on. Returns the report: what was written, what was refused and why,
    and what --runtime auto will run here."""
    refused: dict[str, str] = {}
    calibrate = calibrate if any(REGISTRY[runtime].calibrated for runtime in runtimes) else None
    export_any(source, out_dir, runtimes, overwrite=overwrite, calibrate=calibrate, refused=refused)
    for runtime, reason in refused.items():
        log.warning("%s: %s refused (--runtime %s): %s", out_dir, "/".join(RUNTIME_FILES[runtime]), runtime, reason)
    return fast_runtimes_report(Path(out_dir), refused, runtimes)


def fast_runtimes_report(model_dir: Path, refused: dict[str, str], runtimes: tuple[str, ...] = FAST_RUNTIMES) -> str:
    from ner.inference.runtime_choice import CPU_CLASS_HELP, choose, device_class_of

    flag = FAST_RUNTIMES_FLAG if runtimes == FAST_RUNTIMES else f"{EXPORT_RUNTIME_FLAG} {','.join(runtimes)}"
    # what the export's record says it wrote, not what was planned: a step that failed before a file leaves it out
    recorded = read_record(model_dir, EXPORT_TOOL) or {}
    written = sorted({name for runtime in runtimes for name in RUNTIME_FILES[runtime] if name in recorded})
    lines = [f"{flag}: wrote {', '.join(written) or 'no runtime file'} into {model_dir}"]
    for reason, refused_runtimes in group_by_reason(refused).items():
        names = sorted({name for runtime in refused_runtimes for name in RUNTIME_FILES[runtime]})
        lines.append(f"{flag}: refused {', '.join(names)} (--runtime {', '.join(refused_runtimes)}): {reason}")
    choice = choose(device_class_of(None), model_dir)
    lines.append(f"python -m ner.predict will run --runtime {choice.runtime} on this machine "
                 f"({CPU_CLASS_HELP[choice.device_class]}: {choice.figure})")
    return "\n".join(lines)


def group_by_reason(refused: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for runtime, reason in refused.items():
        grouped.setdefault(reason, []).append(runtime)
    return grouped
