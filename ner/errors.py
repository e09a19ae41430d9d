"""One exception type for mistakes a user can fix, and the one place that turns it into an exit."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """Bad input or configuration: printed as one line, exit code 2, never a traceback."""


def at(path: object, line: int | None, message: str) -> UserError:
    """`path:line: message`, the shape compilers use, so editors can jump to it."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return UserError(f"{where}: {message}")


def process_rank_from_env() -> int:
    """This process's global rank as a launcher set it (0 when not launched)."""
    return int(os.environ.get("RANK", os.environ.get("ACCELERATE_PROCESS_INDEX", "0")) or 0)


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


def exit_now(code: int) -> NoReturn:
    """End a command's process the way the interpreter would, less its teardown: after torch and transformers,
    freeing every module and object one at a time takes 1-2 s on 2 cores, memory the OS frees at once anyway. Other
    threads are waited for and the exit handlers run (logging, trackers, temporary folders), as at a normal exit."""
    threading._shutdown()  # what the interpreter does first at exit: wait for the threads that are not daemons
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record comes, not as it was when logging was set up: a notebook or a
    test that swaps stderr (and closes the old one) must not turn every later log line into a logging error."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # not setStream: it flushes the old stream, which may be closed (emit flushed it)
        super().emit(record)


def log_to_stderr(level: int, fmt: str = "%(asctime)s %(levelname)s %(message)s") -> None:
    """The entry points' one logging setup: replaces the root logger's handlers (a second run in one process sets
    its own level rather than keeping the first's)."""
    logging.basicConfig(format=fmt, datefmt="%H:%M:%S", level=level, force=True, handlers=[_CurrentStderr()])
