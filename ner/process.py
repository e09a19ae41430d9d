"""What an entry point does to its process: which rank it is, its logging to stderr, and its exit."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn


def process_rank_from_env() -> int:
    """This process's global rank as its launcher set it in RANK (torchrun, accelerate launch, and raw DDP's own
    spawn all do); 0 when nothing launched it. The one reader of RANK: the raw DDP backend takes its rank here too."""
    return int(os.environ.get("RANK") or 0)


def exit_now(code: int) -> NoReturn:
    """End a command's process the way the interpreter would, less its teardown: after torch and transformers,
    freeing every module and object one at a time takes seconds (docs/performance.md, "Start-up and tear-down"),
    for memory the OS frees at once anyway. Other
    threads are waited for and the exit handlers run (logging, trackers, temporary folders), as at a normal exit."""
    # Private APIs, each the Python face of a step the interpreter takes at exit, with no public equivalent
    # (tests/test_process.py fails if either goes or changes). threading._shutdown first runs the hooks registered
    # with threading._register_atexit, by which concurrent.futures wakes the idle workers of every ThreadPoolExecutor
    # still open, then joins every thread that is not a daemon. Joining threading.enumerate()'s non-daemon threads
    # instead would wait forever on the first idle pool a library (or an inference runtime) left open.
    threading._shutdown()
    atexit._run_exitfuncs()  # the atexit module has no public call that runs its handlers
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
