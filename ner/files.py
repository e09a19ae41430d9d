"""Writing files and folders whole or not at all, under temporary names that are ours beyond doubt.

The one home of write-to-temp-then-rename. A temporary name is created here, exclusively (a file with
O_EXCL, a folder with mkdir), beside its final name and starting with a dot, so no name that existed
before, a user's included, is ever reused, overwritten or removed. Readers see the old file or the new,
never half of one; a failure removes only what was created here.

    atomic_write_text(path, text)          # small files: JSON, model cards
    with staged_file(path) as tmp: ...     # a writer that wants a path (np.savez, savefig, torch.onnx.export)
    with staged_folder(path) as tmp: ...   # a whole folder, renamed onto `path` when the block succeeds
    temporary_of(name)                     # the final name of a temporary name made here, else None

And the one record of what the tool wrote into a folder (exports, checkpoints, trackers/, retraining runs, corpus
output), so that nothing else there is ever removed or replaced:

    write_record(folder, tool, entries)    # .ner-record.json (or a manifest that is also the record)
    read_record(folder, tool)              # its entries, or None: no record of `tool` there
    read_whole_record(folder, tool)        # the record as written, the writer's own keys included
    unrecorded(folder, entries)            # what the record does not vouch for, each with whether it was edited
    tree_paths(folder)                     # every path under a folder, as a record names them: the one walk

And the one function that removes files (checkpoint rotation, --overwrite-output-dir, export --overwrite, the
retrainer's prune, corpus --overwrite, static-export clean-up, the serve workers' folders): given a record of what
this tool wrote, it removes only what the record lists, as it was recorded, and returns the rest for the caller to
report or refuse. tests/test_deletion_owner.py fails on a module that removes files any other way.

    remove_recorded(folder, entries)       # the record's paths, unchanged since; returns what it left
    made_here(folder)                      # the record of a folder made here whole (a temporary, a killed save's)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath, PurePosixPath


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks (checkpoint manifests, corpus manifests, model versions)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Every temporary name made here, and the only spelling temporary_of recognises: hidden (a leading dot), the final
# name whole, a role, a random token, then nothing or the final name's own suffix (for writers that pick the
# format by it). ROLES: "tmp" a file; "new" a folder being filled, "old" one moved aside (replace_folder).
TEMPORARY_NAME = ".{name}.{role}-{token}{suffix}"
ROLES = ("tmp", "new", "old")
TOKEN_BYTES = 4  # 8 hex digits


def _temporary_pattern() -> re.Pattern:
    """TEMPORARY_NAME as a regular expression: its literal parts as they are, each field as what fills it."""
    fields = {"name": "(?P<name>.+)", "role": f"(?P<role>{'|'.join(ROLES)})",
              "token": f"[0-9a-f]{{{2 * TOKEN_BYTES}}}", "suffix": r"(?P<suffix>(?:\.[^.]*)?)"}  # a suffix: none or one
    return re.compile("".join(re.escape(literal) + (fields[field] if field else "")
                              for literal, field, _, _ in string.Formatter().parse(TEMPORARY_NAME)), re.DOTALL)


_TEMPORARY = _temporary_pattern()


def temporary_of(name: str, roles: tuple[str, ...] = ROLES) -> str | None:
    """The final name that `name` is a temporary name of, where this module could have made it in one of `roles`
    ("tmp": a file); None for any other name (a user's `notes.tmp-x` or `.notes.tmp`). So what a killed writer
    left can be told from a user's file."""
    match = _TEMPORARY.fullmatch(name)
    if match is None or match["role"] not in roles or match["suffix"] not in ("", PurePath(match["name"]).suffix):
        return None
    return match["name"]


def _beside(path: Path, role: str, suffix: str = "") -> Path:
    if role not in ROLES or suffix not in ("", path.suffix):
        raise ValueError(f"{role!r}, {suffix!r}: temporary_of would not recognise the name")
    return path.with_name(TEMPORARY_NAME.format(name=path.name, role=role, token=secrets.token_hex(TOKEN_BYTES),
                                                suffix=suffix))


def new_file_beside(path: Path, suffix: str = "") -> Path:
    """A new, empty file `.NAME.tmp-RANDOM<suffix>` beside `path`, created here (mode as the umask says);
    `suffix`: none or `path`'s own."""
    while True:
        candidate = _beside(path, "tmp", suffix)
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return candidate
        except FileExistsError:
            continue


def new_folder_beside(path: Path, role: str) -> Path:
    """A new, empty folder `.NAME.ROLE-RANDOM` beside `path`, created here; `role`: "new" or "old" (ROLES)."""
    while True:
        candidate = _beside(path, role)
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue


@contextmanager
def staged_file(path: Path, fsync: bool = False) -> Iterator[Path]:
    """A new temporary file beside `path` (same suffix, for writers that pick the format by it), renamed onto
    `path` when the block ends without error and removed when it fails. `fsync`: durable before and after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_file_beside(path, path.suffix)
    try:
        yield tmp
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_path(path.parent)


def atomic_write_text(path: Path, text: str, fsync: bool = False) -> Path:
    """UTF-8, `\\n` line ends on every platform."""
    with staged_file(path, fsync) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    return Path(path)


@contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """An empty folder to fill, renamed onto `path` (see replace_folder) when the block ends without error;
    removed whole when it fails. The caller decides beforehand whether what is at `path` may be replaced."""
    path = Path(os.path.abspath(path))  # `.` and `..` have no name to stage beside; links stay links
    path.parent.mkdir(parents=True, exist_ok=True)
    # The staged folder sits inside a container created here: mkdtemp-style folders are private (0700),
    # and the export must get the usual permissions.
    container = new_folder_beside(path, "new")
    try:
        staged = container / path.name
        staged.mkdir()
        yield staged
        replace_folder(staged, path)
    finally:  # made here: what is left of it (the staged folder, where the block failed) is ours whole
        remove_recorded(container.parent, made_here(container.parent, container.name))


def replace_folder(new: Path, path: Path) -> None:
    """Rename folder `new` onto `path`. What was at `path` is first moved aside into a folder created here and
    removed only once `new` is in place: a crash at any point leaves the old folder or the new one complete
    (between the two renames, both sit beside `path` under dotted names)."""
    if not path.exists() and not path.is_symlink():
        os.rename(new, path)
        fsync_path(path.parent)
        return
    aside = new_folder_beside(path, "old")
    os.rename(path, aside / path.name)
    try:
        os.rename(new, path)
    except BaseException:
        os.rename(aside / path.name, path)
        remove_recorded(aside.parent, {aside.name: {}})
        raise
    fsync_path(path.parent)
    remove_recorded(aside.parent, made_here(aside.parent, aside.name))  # the old folder, replaced: its caller's call


# The record, one format on disk: {"tool": "ner.export", "files": {PATH: ENTRY, ...}} and whatever else its writer
# keeps there (a checkpoint's step, a corpus run's pins). PATH is relative and `/`-separated. ENTRY {"size": N,
# "sha256": HEX} vouches for those bytes only (a file edited since is no longer the tool's); {} for a path whose
# contents the tool does not pin (a tracker's growing files, its folders, a part not yet written).
RECORD = ".ner-record.json"


def file_entry(path: Path) -> dict:
    """A record's entry pinning the file at `path` as it is now."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def write_record(folder: Path, tool: str, entries: dict[str, dict], name: str = RECORD, fsync: bool = False,
                 **more: object) -> None:
    """Write `folder/name`: what `tool` wrote in `folder` (`more`: the writer's own keys beside it)."""
    record = {**more, "tool": tool, "files": entries}
    atomic_write_text(Path(folder) / name, json.dumps(record, indent=1, sort_keys=True) + "\n", fsync)


def read_record(folder: Path, tool: str, name: str = RECORD) -> dict[str, dict] | None:
    """The entries of `tool`'s record in `folder`; None when there is none (or it is unreadable, or another's)."""
    record = read_whole_record(folder, tool, name)
    if record is None:
        return None
    return {path: entry for path, entry in record["files"].items() if isinstance(entry, dict)}


def read_whole_record(folder: Path, tool: str, name: str = RECORD) -> dict | None:
    """`tool`'s record in `folder` as written, the writer's own keys included; None as read_record."""
    try:
        record = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("tool") != tool or not isinstance(record.get("files"), dict):
        return None
    return record


def unrecorded(folder: Path, entries: dict[str, dict] | None, names: set[str] | None = None,
               contents: bool = True, name: str = RECORD) -> list[tuple[Path, bool]]:
    """What `folder` holds, at any depth, that `entries` (a record's; None: no record) does not vouch for, each with
    whether it is recorded but edited since: a path not recorded (a folder named once, unless it holds a recorded
    path) and, with `contents`, a pinned file whose bytes changed. `names`: only these; the record `name` is ours."""
    entries = entries or {}
    holders = {parent.as_posix() for path in entries for parent in PurePosixPath(path).parents} - {"."}

    def asked(relative: str) -> bool:
        return relative != name and (names is None or relative in names)

    def edited(relative: str) -> bool | None:
        """None: the tool's as it is (a folder of the tool's is walked); else whether it is recorded but edited."""
        if relative not in entries and relative not in holders:
            return False
        entry = entries.get(relative, {})
        if contents and "sha256" in entry and not same_bytes(folder / relative, entry):
            return True
        return None

    found = []
    for relative in tree_paths(folder, into=lambda relative: asked(relative) and edited(relative) is None):
        why = edited(relative) if asked(relative) else None  # a file's bytes are hashed once
        if why is not None:
            found.append((Path(folder) / relative, why))
    return sorted(found)


def tree_paths(folder: Path, into: Callable[[str], bool] | None = None) -> set[str]:
    """Every path under `folder` (files, folders, links; links not followed), relative and `/`-separated: the one
    walk of a folder. `into`: whether to walk into a folder found there, given its relative path (default: all)."""
    found: set[str] = set()
    for root, dirs, files in os.walk(folder):
        base = PurePosixPath(Path(root).relative_to(folder).as_posix())
        found |= {(base / name).as_posix() for name in dirs + files}
        if into is not None:
            dirs[:] = [name for name in dirs if into((base / name).as_posix())]
    return found


def same_bytes(path: Path, entry: dict) -> bool:
    """`path` is a plain file holding the bytes `entry` pins."""
    return (path.is_file() and not path.is_symlink() and path.stat().st_size == entry.get("size")
            and sha256_file(path) == entry["sha256"])


def made_here(folder: Path, name: str = "") -> dict[str, dict]:
    """The record of folder `folder/name` (or `folder` itself) as a whole, contents not pinned: for a folder this
    tool made and alone writes (mkdtemp, a staging name of this module's), so everything in it is the tool's."""
    root = Path(folder) / name
    prefix = PurePosixPath(name) if name else None
    entries = {str(prefix / path) if prefix else path: {} for path in tree_paths(root)} if root.is_dir() else {}
    return {**({name: {}} if name else {}), **entries}


def remove_recorded(folder: Path, entries: dict[str, dict], contents: bool = True, whole: bool = False) -> list[Path]:
    """Remove from `folder` what `entries` (a record of what this tool wrote there: relative paths) lists, deepest
    first: a file (or link) while it is as recorded (pinned bytes compared by sha256 with `contents`, else by size),
    a folder once it is empty (one that only holds listed paths is listed implicitly). `whole`: `folder` too, once
    empty. Everything else stays, and is returned with what could not be removed: the caller reports or refuses it.
    A missing path is no error (removed already)."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return []
    kept = [path for path, _ in unrecorded(folder, entries, contents=contents, name="")]
    holding = {parent for path in kept for parent in path.parents}
    implicit = {parent.as_posix() for path in entries for parent in PurePosixPath(path).parents} - {"."}
    for name in sorted(set(entries) | implicit, key=lambda name: (name.count("/"), name), reverse=True):
        path = folder / name
        if path in holding or path in kept or not (path.exists() or path.is_symlink()):
            continue
        entry = entries.get(name, {})
        try:
            if not contents and "size" in entry and path.is_file() and path.stat().st_size != entry["size"]:
                raise OSError("edited since: no longer the tool's")
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError:  # or a folder that something unlisted entered meanwhile: it stays, and so does what holds it
            kept.append(path)
            holding |= set(path.parents)
    if whole and not kept:
        try:
            folder.rmdir()
        except OSError:
            kept.append(folder)
    return sorted(kept)
