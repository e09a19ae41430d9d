"""Testing aids: helpers for tests and scripts that start `python -m ner.serve` in a subprocess, and the fault
injection (NER_FAULT_INJECT) that training and corpus tagging call at each step so tests can kill them there.

    from ner.testing import free_local_port, wait_until_healthy
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

log = logging.getLogger("ner")


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server started by a script or a test."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, process, timeout_s: float) -> bool:
    """True once GET {url}/health answers 200; False if `process` (the server, a Popen) exits or
    `timeout_s` passes first. For scripts and tests that start `python -m ner.serve`; each fails its own way."""
    import httpx  # the serve extra's client: imported only by those that start a server

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.2)
    return False


def inject_fault(global_step: int, rank: int) -> None:
    """Testing aid: NER_FAULT_INJECT="kill:STEP[:RANK]" SIGKILLs, "hang:STEP[:RANK]" stalls forever.

    Fires after the update (and any checkpoint) of STEP, on RANK (default: every rank), and only
    in a job's first attempt, so a restarted job (torchrun --max-restarts) can recover.
    """
    spec = os.environ.get("NER_FAULT_INJECT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    action, step, *target = spec.split(":")
    if int(step) != global_step or (target and int(target[0]) != rank):
        return
    log.warning("NER_FAULT_INJECT: %s at step %d on rank %d", action, global_step, rank)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while action == "hang":
        time.sleep(3600)
