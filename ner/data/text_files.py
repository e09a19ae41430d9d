"""UTF-8 text files as every reader and writer of examples takes them: read with an error a user can act on,
written whole or not at all."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ner.errors import UserError, at
from ner.files import staged_file


def read_utf8(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise UserError(f"{path}: file is empty")
    if b"\x00" in data[:65536]:
        raise UserError(f"{path}: looks like a binary file (NUL bytes); expected UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise at(path, line, f"not UTF-8 (byte 0x{data[exc.start]:02x}); re-save the file as UTF-8") from None


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    """UTF-8 lines (each ending in \\n) written to a temporary name, then renamed: whole or not at all."""
    path = Path(path)
    with staged_file(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)
    return path
