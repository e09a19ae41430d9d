"""Helpers for tests and scripts that start `python -m ner.serve` in a subprocess (not used by the server).

    from ner.testing import free_local_port, wait_until_healthy
"""

from __future__ import annotations

import socket
import time


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
