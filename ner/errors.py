"""One exception type for mistakes a user can fix, and the exit code that goes with it."""

from __future__ import annotations

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """Bad input or configuration: printed as one line, exit code 2, never a traceback."""


def at(path: object, line: int | None, message: str) -> UserError:
    """`path:line: message`, the shape compilers use, so editors can jump to it."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return UserError(f"{where}: {message}")
