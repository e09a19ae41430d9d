"""One exception type for mistakes a user can fix, and the one place that turns it into an exit code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from ner.process import process_rank_from_env

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """Bad input or configuration: printed as one line, exit code 2, never a traceback."""


def at(path: object, line: int | None, message: str) -> UserError:
    """`path:line: message`, the shape compilers use, so editors can jump to it."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return UserError(f"{where}: {message}")


def report(exc: UserError, rank: int | None = None) -> int:
    """`error: ...` on stderr, once per job (rank 0 only); returns the exit code."""
    if (process_rank_from_env() if rank is None else rank) == 0:
        print(f"error: {exc}", file=sys.stderr)
    return USAGE_EXIT_CODE


def cli(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap an entry point's `main(argv)`: a UserError becomes one line and exit code 2."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UserError as exc:
            return report(exc)

    return wrapped
