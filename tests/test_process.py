"""An entry point's process (ner/process.py): its rank from the launcher's environment, its fast exit, its logging."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading

import pytest

from ner.process import log_to_stderr, process_rank_from_env


@pytest.mark.parametrize(("env", "rank", "world"), [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 3, (3, 1, 4)),  # a launcher's process
    ({}, 0, None),  # nothing launched it
])
def test_one_reading_of_the_rank_for_the_entry_points_and_the_raw_ddp_backend(monkeypatch, env, rank, world):
    from ner.backends.raw_ddp import _world

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (process_rank_from_env(), _world(None)) == (rank, world)


def run_until_exit(code: str, answer: str | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; `answer`, if given, goes to its stdin once it has printed 'exiting'."""
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": ""})
    try:
        first = child.stdout.readline()
        if answer is not None and first == "exiting\n":
            try:
                child.stdin.write(answer)
                child.stdin.flush()
            except BrokenPipeError:
                pass  # it has ended without waiting for the answer: the assertions say so
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the process never ended (exit_now waited forever): {err[-2000:]}")
    return subprocess.CompletedProcess(child.args, child.returncode, first + out, err)


def test_the_private_apis_exit_now_leans_on_are_still_there():
    assert callable(getattr(threading, "_shutdown", None)), (
        "threading._shutdown is gone: exit_now (ner/process.py) used it to wait for the threads that are not daemons"
        " (and wake idle ThreadPoolExecutor workers first) as the interpreter does at exit; find what replaced it")
    assert callable(getattr(atexit, "_run_exitfuncs", None)), (
        "atexit._run_exitfuncs is gone: exit_now (ner/process.py) used it to run the atexit handlers before"
        " os._exit; find what replaced it, or end with sys.exit (and its 1-2 s teardown)")


def test_exit_now_runs_the_exit_handlers_and_flushes_what_was_buffered():
    code = ("import atexit, sys; from ner.process import exit_now\n"
            "atexit.register(lambda: print('exit handler ran', file=sys.stderr))\n"  # stderr: line-buffered
            "sys.stdout.write('buffered, no newline'); exit_now(3)")
    result = run_until_exit(code)
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stderr == "exit handler ran\n", (
        "atexit._run_exitfuncs no longer runs the handlers registered with atexit.register: exit_now"
        " (ner/process.py) needs another way to run them before os._exit, or must end with sys.exit")
    assert result.stdout == "buffered, no newline"


def test_exit_now_waits_for_a_thread_that_is_not_a_daemon_to_finish_its_work():
    """The thread's work can end only after exit_now has begun (the answer comes once 'exiting' is out)."""
    code = ("import sys, threading; from ner.process import exit_now\n"
            "started = threading.Event()\n"
            "def work():\n"
            "    started.set(); line = sys.stdin.readline(); print('thread finished ' + line.strip(), flush=True)\n"
            "threading.Thread(target=work).start(); started.wait()\n"
            "print('exiting', flush=True); exit_now(3)")
    result = run_until_exit(code, answer="after exit_now began\n")
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stdout == "exiting\nthread finished after exit_now began\n", (
        "exit_now did not wait for a thread that is not a daemon (threading._shutdown in ner/process.py)")


def test_exit_now_ends_while_a_thread_pool_waits_for_work_and_finishes_the_work_queued():
    """A ThreadPoolExecutor left open (a library's, or a runtime's) has idle workers that are not daemons: a normal
    exit wakes them, finishes the work queued and ends. exit_now must too, not wait for them forever (as a join of
    every thread that is not a daemon would: threading._shutdown wakes them first)."""
    code = ("import sys; from concurrent.futures import ThreadPoolExecutor; from ner.process import exit_now\n"
            "pool = ThreadPoolExecutor(2); pool.submit(int).result()\n"  # a worker started, now idle
            "pool.submit(lambda: print('queued work ' + sys.stdin.readline().strip(), flush=True))\n"
            "print('exiting', flush=True); exit_now(4)")
    result = run_until_exit(code, answer="finished\n")
    assert result.returncode == 4, result.stderr[-2000:]
    assert result.stdout == "exiting\nqueued work finished\n"


def test_log_lines_go_to_the_stderr_of_the_moment_not_a_closed_one(monkeypatch, tmp_path):
    """A notebook or test that swaps sys.stderr (and closes the old one) after a training set logging up: later
    log lines reach the new stderr, with no '--- Logging error ---' traceback and no error in the caller."""
    streams = [open(tmp_path / f"stderr{i}.txt", "w", encoding="utf-8") for i in range(3)]  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", streams[0])
    log_to_stderr(logging.INFO)  # conftest's root_logging_as_it_was removes it after the test
    for previous, current in zip(streams, streams[1:]):
        previous.close()  # a real file raises on any use once closed (io.StringIO does not on flush)
        monkeypatch.setattr(sys, "stderr", current)
        logging.getLogger("ner").warning("after the swap")
    streams[-1].close()
    assert [(tmp_path / f"stderr{i}.txt").read_text().count("WARNING after the swap") for i in range(3)] == [0, 1, 1]
