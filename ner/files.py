"""Writing files and folders whole or not at all, under temporary names that are ours beyond doubt.

The one home of write-to-temp-then-rename. A temporary name is created here, exclusively (a file with
O_EXCL, a folder with mkdir), beside its final name and starting with a dot, so no name that existed
before, a user's included, is ever reused, overwritten or removed. Readers see the old file or the new,
never half of one; a failure removes only what was created here.

    atomic_write_text(path, text)          # small files: JSON, model cards
    with staged_file(path) as tmp: ...     # a writer that wants a path (np.savez, savefig, torch.onnx.export)
    with staged_folder(path) as tmp: ...   # a whole folder, renamed onto `path` when the block succeeds
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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


def _beside(path: Path, role: str, suffix: str = "") -> Path:
    return path.with_name(f".{path.name}.{role}-{secrets.token_hex(4)}{suffix}")


def new_file_beside(path: Path, suffix: str = "") -> Path:
    """A new, empty file `.NAME.tmp-RANDOM<suffix>` beside `path`, created here (mode as the umask says)."""
    while True:
        candidate = _beside(path, "tmp", suffix)
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return candidate
        except FileExistsError:
            continue


def new_folder_beside(path: Path, role: str) -> Path:
    """A new, empty folder `.NAME.ROLE-RANDOM` beside `path`, created here."""
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


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = False) -> Path:
    with staged_file(path, fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


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
    finally:
        shutil.rmtree(container, ignore_errors=True)


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
        aside.rmdir()
        raise
    fsync_path(path.parent)
    shutil.rmtree(aside, ignore_errors=True)
