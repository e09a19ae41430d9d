"""Resumable checkpoints: written atomically, verified by a manifest, rotated safely.

Layout of `OUTPUT_DIR/checkpoints/step_<N>/`:
    model/              config.json (labels), model.safetensors, tokenizer files
    optimizer.pt        optimizer state (tensors and numbers only: loads with weights_only=True)
    scheduler.pt        LR scheduler state
    scaler.pt           fp16 gradient scaler state (loss scale, growth tracker), when there is one
    rng_rank<R>.pt      python, numpy, torch and CUDA RNG states of rank R
    trainer_state.json  step, epoch, batch position, best F1, config, labels, library versions
    manifest.json       size and sha256 of every file above, as ner/files.py records them; written last

A checkpoint is complete only when its manifest exists and matches: the folder is written under a temporary
name of ner/files.py (`.step_<N>.new-<random>`), every file fsynced, the manifest
written last, and only then renamed into place, so a `step_<N>` folder always has its manifest. The manifest
is also the record of what the run wrote there (ner/files.py's one format): rotation and --overwrite-output-dir
remove a checkpoint only when it holds nothing else, and a save of the same step again (a resume) never replaces one
that does (resaves_refused at the start, refuse_to_replace at the save).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from ner.backends import Backend
from ner.backends.trackers import TrackerClaim
from ner.errors import UserError
from ner.files import (
    file_entry,
    fsync_path,
    made_here,
    new_folder_beside,
    read_record,
    remove_recorded,
    replace_folder,
    sha256_file,
    temporary_of,
    tree_paths,
    unrecorded,
    write_record,
)
from ner.training.config import MAY_CHANGE, AddedLater, StoredResolvedLater, TrainConfig, resume_rule

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
CHECKPOINT_TOOL = "ner.train"  # the tool of a checkpoint's manifest, ner/files.py's record of its folder
CHECKPOINT_NAME = re.compile(r"step_\d+")
STATE = "trainer_state.json"
# How resume treats each option is declared with the option (TrainConfig's fields, `resume=`); derived here.
RESUME_MAY_CHANGE = frozenset(spec.name for spec in dataclasses.fields(TrainConfig) if resume_rule(spec) == MAY_CHANGE)
# Options added after checkpoints were first written: a checkpoint without one ran with this value.
ADDED_LATER = {spec.name: rule.value for spec in dataclasses.fields(TrainConfig)
               if isinstance(rule := resume_rule(spec), AddedLater)}
# Options stored as they ran, by the value older checkpoints hold instead (which says nothing of what ran).
UNRESOLVED_BEFORE = {spec.name: rule.unresolved for spec in dataclasses.fields(TrainConfig)
                     if isinstance(rule := resume_rule(spec), StoredResolvedLater)}
SCALER = "scaler.pt"
SEAL_THREADS = 4  # files fsynced and hashed at once when a checkpoint is sealed


def checkpoint_root(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def rng_state() -> dict:
    """Every RNG as tensors and plain numbers, so torch.load(weights_only=True) can read it."""
    version, mt_state, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(("MT19937", npy["key"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(backend: Backend, output_dir: Path, step: int, model, tokenizer, optimizer, scheduler,
                    trainer_state: dict, trackers: TrackerClaim) -> Path:
    """Collective: every rank calls it. Returns the final folder. `trackers`: the run's claim, whose record the
    checkpoint brings up to date."""
    root = checkpoint_root(output_dir)
    final, tmp = root / f"step_{step}", None
    if backend.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in stale_folders(root):  # staging names ner/files.py gave: made here, whole
            remove_recorded(root, made_here(root, stale.name))
        tmp = new_folder_beside(final, "new")
    tmp = backend.gather_object(tmp)[0]  # a random name: every rank learns it from rank 0 (and waits for it)
    save_state(rng_state(), tmp / f"rng_rank{backend.process_index}.pt")
    if backend.is_main_process:
        bare = backend.unwrap_model(model)
        bare.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        save_state(optimizer.state_dict(), tmp / "optimizer.pt")
        save_state(scheduler.state_dict(), tmp / "scheduler.pt")
        if backend.grad_scaler is not None:  # the same on every rank: overflow is checked after the all-reduce
            save_state(backend.grad_scaler.state_dict(), tmp / SCALER)
        (tmp / STATE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    backend.wait_for_everyone()
    refusal = None
    if backend.is_main_process:
        refusal = refuse_to_replace(final, step)
        if refusal is None:
            _seal(tmp, final, step)
            trackers.record()
        else:  # the old step_<N> stays as it is, the file of yours in it too; only the staged copy goes
            remove_recorded(tmp.parent, made_here(tmp.parent, tmp.name))
    refusal = backend.gather_object(refusal)[0]  # every rank stops, none waits at the next collective
    if refusal is not None:
        raise UserError(refusal)
    return final


def refuse_to_replace(final: Path, step: int) -> str | None:
    """Why a save must not replace the folder `final` of step `step` (a file of yours in it, which the folder's
    replacement would remove: names only, as rotation checks), else None."""
    foreign = not_in_manifest(final) if final.is_dir() and not final.is_symlink() else []
    if not foreign:
        return None
    return (f"{final}: holds {foreign[0].relative_to(final).as_posix()}, which the checkpoint does not, and the run "
            f"would save step {step} again there (replacing the folder): move it away and resume (nothing of yours "
            "was changed)")


def resaves_refused(output_dir: Path, resume_from: Path) -> None:
    """Before a resume of `output_dir`'s own run from `resume_from`: it may save its step, or any later one, again,
    replacing that checkpoint folder whole; refuse where such a folder holds a file of yours (names only, as rotation
    checks), before anything is written."""
    for folder in list_checkpoints(output_dir):
        foreign = not_in_manifest(folder) if step_of(folder) >= step_of(resume_from) else []
        if foreign:
            raise UserError(f"{foreign[0]}: not the checkpoint's (its manifest does not list it), and the resumed run "
                            f"may save step {step_of(folder)} again, which replaces {folder} whole: move it away "
                            "(nothing was changed)")


def save_state(state: dict, path: Path) -> None:
    """torch.save without the zip format's CRC-32 of each record: the manifest's SHA-256 of every file is what
    verify() checks, and the CRCs cost time in proportion to the optimizer state (docs/performance.md, "The floor,
    and what is above it")."""
    crc32 = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(crc32)


def _seal(tmp: Path, final: Path, step: int) -> None:
    names = sorted(name for name in tree_paths(tmp) if (tmp / name).is_file())
    with ThreadPoolExecutor(SEAL_THREADS) as pool:  # fsync and hashlib release the GIL: files overlap
        entries = dict(zip(names, pool.map(durable_entry, (tmp / name for name in names))))
    write_record(tmp, CHECKPOINT_TOOL, entries, MANIFEST, fsync=True, step=step)
    replace_folder(tmp, final)  # over an older incomplete or superseded copy of the same step, if any


def durable_entry(path: Path) -> dict:
    """The manifest's entry of `path`, once its data is on disk."""
    fsync_path(path)
    return file_entry(path)


def stale_folders(root: Path) -> list[Path]:
    """Left in OUTPUT_DIR/checkpoints/ by a run killed while saving: its staging folders, and a superseded
    copy moved aside by replace_folder. Names only this tool gives, in a folder only it writes."""
    return sorted(p for p in root.iterdir() if is_staging_name(p.name) and p.is_dir())


def is_staging_name(name: str) -> bool:
    """A name a save gives a folder in checkpoints/ while it works: ner/files.py's temporary names of a step_<N>
    (being filled, or a superseded copy moved aside)."""
    final = temporary_of(name, roles=("new", "old"))
    return final is not None and bool(CHECKPOINT_NAME.fullmatch(final))


def verify(folder: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    if not (folder / MANIFEST).is_file():
        return "no manifest.json (the save did not finish)"
    entries = read_record(folder, CHECKPOINT_TOOL, MANIFEST)
    if entries is None or not all({"size", "sha256"} <= entry.keys() for entry in entries.values()):
        return "manifest.json is unreadable"
    for name, expected in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} has {path.stat().st_size} bytes, manifest says {expected['size']}"
        if sha256_file(path) != expected["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def step_of(folder: Path) -> int:
    return int(folder.name.split("_", 1)[1])


def list_checkpoints(output_dir: Path) -> list[Path]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name.split("_", 1)[1].isdigit()]
    return sorted(found, key=step_of)


def find_resume_checkpoint(output_dir: Path) -> Path | None:
    """Newest complete checkpoint; incomplete or corrupt ones are named and skipped."""
    for folder in reversed(list_checkpoints(output_dir)):
        problem = verify(folder)
        if problem is None:
            return folder
        log.warning("skipping checkpoint %s: %s", folder, problem)
    return None


def resolve_resume(resume: str | None, output_dir: Path) -> Path | None:
    if resume is None:
        return None
    if resume == "auto":
        found = find_resume_checkpoint(output_dir)
        if found is None:
            log.info("--resume auto: no complete checkpoint in %s (a fresh run, where no run wrote before)",
                     checkpoint_root(output_dir))
        return found
    folder = Path(resume)
    if not folder.is_dir():
        raise UserError(f"{folder}: --resume checkpoint folder not found")
    problem = verify(folder)
    if problem is not None:
        raise UserError(f"{folder}: not a complete checkpoint: {problem}")
    return folder


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE).read_text(encoding="utf-8"))


def check_compatible(saved: dict, config: dict, label_list: list[str], world_size: int, folder: Path) -> None:
    """Refuse to resume into different math, naming every difference, in one line."""
    saved_config = {**ADDED_LATER, **saved["config"]}
    differences = [f"{key}: checkpoint {saved_config.get(key)!r}, now {value!r}"
                   for key, value in config.items()
                   if key not in RESUME_MAY_CHANGE and saved_config.get(key) != value
                   and not (key in UNRESOLVED_BEFORE and saved_config.get(key) == UNRESOLVED_BEFORE[key])]
    if saved["label_list"] != label_list:
        differences.append(f"labels: checkpoint {saved['label_list']}, now {label_list}")
    if saved["world_size"] != world_size:
        differences.append(f"processes: checkpoint {saved['world_size']}, now {world_size} "
                           "(the data position is per rank: resume with the same number)")
    if differences:  # one line, as every refusal (CONVENTIONS): the differences side by side
        raise UserError(f"{folder}: cannot resume: {'; '.join(differences)}")


def load_weights(backend: Backend, folder: Path, model) -> None:
    weights = load_file(folder / "model" / "model.safetensors", device="cpu")
    missing, unexpected = backend.unwrap_model(model).load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UserError(f"{folder}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def load_checkpoint(backend: Backend, folder: Path, model, optimizer, scheduler) -> dict:
    """Restore weights, optimizer, scheduler and this rank's RNG; returns the trainer state."""
    load_weights(backend, folder, model)
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    load_scaler(backend, folder)
    rng_file = folder / f"rng_rank{backend.process_index}.pt"
    set_rng_state(torch.load(rng_file, weights_only=True))
    return read_state(folder)


def load_scaler(backend: Backend, folder: Path) -> None:
    """fp16: the loss scale the run had reached, or a fresh one for a checkpoint saved without scaling."""
    if backend.grad_scaler is None:
        return
    if (folder / SCALER).is_file():
        backend.grad_scaler.load_state_dict(torch.load(folder / SCALER, weights_only=True))
    else:
        log.warning("%s: no %s (saved without fp16 loss scaling); the loss scale starts afresh", folder, SCALER)


def rotate(output_dir: Path, keep_newest: int, best_step: int | None) -> None:
    """Delete all but the newest `keep_newest` complete checkpoints and the best one; a checkpoint that holds
    anything its manifest does not list (a file of yours) is kept whole, and the log says so."""
    if keep_newest <= 0:
        return
    complete = [p for p in list_checkpoints(output_dir) if (p / MANIFEST).is_file()]
    keep = {p for p in complete[-keep_newest:]}
    keep |= {p for p in complete if best_step is not None and step_of(p) == best_step}
    for folder in complete:
        if folder in keep:
            continue
        foreign = not_in_manifest(folder)
        if foreign:
            log.warning("%s: not rotated: it holds %s, which the checkpoint does not", folder, foreign[0])
            continue
        # Sizes, not hashes: the manifest pins gigabytes of optimizer state, and rehashing an old checkpoint at every
        # save would cost as much as sealing it; a file of yours or one changed in size is still left (and named).
        entries = {**(read_record(folder, CHECKPOINT_TOOL, MANIFEST) or {}), MANIFEST: {}}
        left = remove_recorded(folder, entries, contents=False, whole=True)
        if left:
            log.warning("%s: rotated but for %s, which changed since the checkpoint was saved", folder, left[0])


def not_in_manifest(folder: Path) -> list[Path]:
    """What checkpoint `folder` holds that its manifest does not list (all of it when it has no readable one); the
    contents of what it lists are verify()'s to check."""
    entries = read_record(folder, CHECKPOINT_TOOL, MANIFEST)
    record_name = MANIFEST if entries is not None else ""  # an unreadable manifest is not the tool's either
    return [path for path, _ in unrecorded(folder, entries, contents=False, name=record_name)]
