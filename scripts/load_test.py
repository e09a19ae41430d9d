"""How does `ner.serve` hold up under concurrent clients? Requests/s and latency, loopback only.

    python scripts/load_test.py runs/ner/final                          # starts a server, 1 then 16 clients
    python scripts/load_test.py runs/ner/final --clients 1 4 16 --requests 100 --json load.json
    python scripts/load_test.py --url http://127.0.0.1:8000 --clients 16  # a server you started

N clients (threads, one keep-alive connection each) send M requests each, one {"text": ...} at a time,
right after the previous answer; bounded by --requests and --max-seconds per client count. Prints a
Markdown table: requests/s, p50/p95/p99 latency, errors (non-200 answers and failed connections).
Only loopback addresses are accepted: this is a benchmark, not a load generator for other machines.
Results: docs/serving.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np

from ner.testing import free_local_port, wait_until_healthy

TEXTS = [
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
    "Shares of Siemens rose 3.5 percent in Frankfurt after the company raised its forecast.",
    "The U.S. Federal Reserve left interest rates unchanged, Chairman Alan Greenspan said in Washington.",
    "Japan beat Syria 2-1 in the Asian Cup on Friday.",
    "Microsoft Corp. said it would buy a stake in the Seattle-based startup.",
    "Pope John Paul II will visit Poland and Germany next year, the Vatican said.",
]


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        sys.exit(f"error: {url}: only loopback addresses (127.0.0.1, ::1, localhost) are load-tested")


def start_server(model_dir: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_local_port()
    process = subprocess.Popen([sys.executable, "-m", "ner.serve", str(model_dir), "--port", str(port), *extra],
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    if wait_until_healthy(url, process, timeout_s=180):
        return process, url
    process.kill()
    sys.exit("error: the server did not come up within 180 s")


def run_clients(url: str, clients: int, requests: int, max_seconds: float) -> dict:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + max_seconds

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as session:
            for i in range(requests):
                if time.monotonic() > stop_at:
                    return
                started = time.perf_counter()
                try:
                    ok = session.post("/predict", json={"text": TEXTS[(k + i) % len(TEXTS)]}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    latencies.append(time.perf_counter() - started)
                    errors[0] += not ok

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "seconds": round(elapsed, 2),
            "requests_per_s": round(len(latencies) / elapsed, 1), "errors": errors[0],
            **{f"p{q}_ms": round(float(np.percentile(ms, q)), 1) for q in (50, 95, 99)}}


def table(rows: list[dict]) -> str:
    lines = ["| clients | requests | requests/s | p50 ms | p95 ms | p99 ms | errors |", "|" + "---:|" * 7]
    lines += [f"| {r['clients']} | {r['requests']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p95_ms']} | "
              f"{r['p99_ms']} | {r['errors']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, nargs="?", help="start `ner.serve MODEL_DIR` on a free loopback port")
    parser.add_argument("--url", help="load-test a running server instead (loopback only)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="client counts (default: 1 16)")
    parser.add_argument("--requests", type=int, default=50, help="requests per client (default: 50)")
    parser.add_argument("--max-seconds", type=float, default=60, help="time bound per client count (default: 60)")
    parser.add_argument("--server-args", default="", help='extra ner.serve flags, e.g. "--max-wait-ms 2"')
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (args.url is None):
        parser.error("pass MODEL_DIR or --url, not both")
    if not (1 <= max(args.clients) <= 256 and 1 <= args.requests <= 10_000):
        parser.error("--clients 1-256 and --requests 1-10000")
    process, url = (None, args.url) if args.url else start_server(args.model_dir, args.server_args.split())
    check_loopback(url)
    try:
        run_clients(url, 2, 5, 30)  # warm-up: first batches build kernels
        rows = [run_clients(url, n, args.requests, args.max_seconds) for n in args.clients]
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
