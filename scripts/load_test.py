"""How does `ner.serve` hold up under concurrent clients? Requests/s and latency, loopback only.

    python scripts/load_test.py runs/ner/final                          # starts a server, 1 then 16 clients
    python scripts/load_test.py runs/ner/final --clients 1 4 16 --requests 100 --json load.json
    python scripts/load_test.py --url http://127.0.0.1:8000 --clients 16  # a server you started

N clients (threads, one keep-alive connection each) send M requests each, one {"text": ...} at a time,
right after the previous answer; bounded by --requests and --max-seconds per client count. Prints a
Markdown table: requests/s, p50/p95/p99 latency, errors (non-200 answers and failed connections).

Overload mode (--texts-per-request): every request is {"texts": [...]} of long texts, all clients at once,
answers counted by status (503 with and without Retry-After apart), latency of the accepted (200) ones,
and the server's resident memory sampled during the run (psutil, in the test extra):

    python scripts/load_test.py runs/ner/final --clients 64 --requests 2 --texts-per-request 20 \
        --words-per-text 300 --conll data/train.txt --server-args "--max-texts 20 --max-queue 64"
    ... --requests 1 --sigterm-after 20        # SIGTERM the server then: seconds to exit, statuses
    ... --fail-on XFAULTX                      # scripts/serve_with_fault.py: the model fails on one text
Only loopback addresses are accepted: this is a benchmark, not a load generator for other machines.
Results: docs/serving.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
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


def start_server(model_dir: Path, extra: list[str],
                 launcher: tuple[str, ...] = ("-m", "ner.serve")) -> tuple[subprocess.Popen, str]:
    port = free_local_port()
    process = subprocess.Popen([sys.executable, *launcher, str(model_dir), "--port", str(port), *extra],
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


# ------------------------------------------------------------------ overload mode: long requests, statuses, memory

@dataclass
class Outcome:
    """One request of the overload mode: its status (None: no answer, e.g. the connection was refused)."""
    status: int | None
    retry_after: bool
    seconds: float
    texts: list[str] = field(default_factory=list, repr=False)
    body: dict | None = field(default=None, repr=False)


def read_sentences(conll: Path | None, text_file: Path | None) -> list[str]:
    """Sentences to build texts from: a CoNLL file's sentences, a text file's non-empty lines, or TEXTS."""
    if conll is not None:
        from ner.data.conll import read_conll
        return [" ".join(example.words) for example in read_conll(conll) if example.words]
    if text_file is not None:
        return [line.strip() for line in text_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return list(TEXTS)


def build_texts(sentences: list[str], words_per_text: int, count: int) -> list[str]:
    """`count` texts of at least `words_per_text` words: consecutive sentences joined, cycling through them."""
    texts, next_sentence = [], 0
    for _ in range(count):
        words: list[str] = []
        while len(words) < words_per_text:
            words += sentences[next_sentence % len(sentences)].split()
            next_sentence += 1
        texts.append(" ".join(words))
    return texts


def status_class(outcome: Outcome) -> str:
    if outcome.status is None:
        return "no answer"
    if outcome.status == 503 and outcome.retry_after:
        return "503 + Retry-After"
    return str(outcome.status)


def summarize(outcomes: list[Outcome], seconds: float) -> dict:
    """Counts by status class; latency percentiles of the accepted (200) requests only, in seconds."""
    counts = Counter(status_class(o) for o in outcomes)
    accepted_s = [o.seconds for o in outcomes if o.status == 200]
    quantiles = {f"p{q}_s": round(float(np.percentile(accepted_s, q)), 2) if accepted_s else None
                 for q in (50, 95, 99)}
    return {"requests": len(outcomes), "seconds": round(seconds, 1), "statuses": dict(sorted(counts.items())),
            "errors_5xx": sum(n for name, n in counts.items() if name[0] == "5" and name[:3] not in ("503", "504")),
            **quantiles, "max_s": round(max(accepted_s), 2) if accepted_s else None}


class PeakRss:
    """The server's resident memory, sampled every `every_s` on a thread while in the `with` block."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        import psutil  # the test extra; only the overload mode needs it
        self.process, self.every_s, self.samples_b = psutil.Process(pid), every_s, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            try:
                self.samples_b.append(self.process.memory_info().rss)
            except Exception:  # the server exited (the SIGTERM run)
                return
            if self.stop.wait(self.every_s):
                return

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def mib(self) -> dict:
        to_mib = lambda b: round(b / 2**20)  # noqa: E731
        quarters = [part for part in np.array_split(self.samples_b, 4) if len(part)]  # flat, or still growing?
        return {"rss_start_mib": to_mib(self.samples_b[0]), "rss_peak_mib": to_mib(max(self.samples_b)),
                "rss_end_mib": to_mib(self.samples_b[-1]),
                "rss_peak_by_quarter_mib": [to_mib(int(part.max())) for part in quarters]} if self.samples_b else {}


def send_overload(url: str, payloads: list[list[list[str]]], max_seconds: float, honour_retry_after: bool) -> list:
    """Client k sends payloads[k] one after the other on its own connection, all clients at once; a client
    that honours Retry-After waits that long after a 503 before its next request."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + max_seconds

    def client(requests: list[list[str]]) -> None:
        with httpx.Client(base_url=url, timeout=max_seconds + 60) as session:
            for texts in requests:
                if time.monotonic() > stop_at:
                    return
                started = time.perf_counter()
                try:
                    response = session.post("/predict", json={"texts": texts})
                    outcome = Outcome(response.status_code, "retry-after" in response.headers,
                                      time.perf_counter() - started, texts,
                                      response.json() if response.status_code == 200 else None)
                except httpx.HTTPError:
                    outcome = Outcome(None, False, time.perf_counter() - started, texts)
                with lock:
                    outcomes.append(outcome)
                if honour_retry_after and outcome.retry_after:
                    time.sleep(min(int(response.headers["retry-after"]), max(0.0, stop_at - time.monotonic())))

    threads = [threading.Thread(target=client, args=(requests,)) for requests in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def answers_alone(url: str, outcomes: list[Outcome]) -> dict:
    """Each answered text sent again alone: how many accepted requests got exactly their answers alone."""
    equal = 0
    with httpx.Client(base_url=url, timeout=300) as session:
        for outcome in (o for o in outcomes if o.status == 200):
            alone = [session.post("/predict", json={"text": text}).json() for text in outcome.texts]
            equal += alone == outcome.body["results"]
    return {"accepted_equal_to_alone": equal}


def sigterm_after(process: subprocess.Popen, delay_s: float, result: dict) -> threading.Thread:
    """A thread that sends SIGTERM after `delay_s` and records the seconds to exit and the exit status."""
    def stop() -> None:
        time.sleep(delay_s)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        result["returncode"] = process.wait(120)
        result["exit_s"] = round(time.monotonic() - signalled, 2)
    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread


def wait_until_ready(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    sys.exit(f"error: {url}/ready did not answer 200 within {timeout_s:g} s")


def overload(args, process: subprocess.Popen | None, url: str) -> dict:
    clients, n = args.clients[0], args.texts_per_request
    texts = build_texts(read_sentences(args.conll, args.text_file), args.words_per_text, clients * args.requests * n)
    payloads = [[texts[(k * args.requests + i) * n:(k * args.requests + i + 1) * n] for i in range(args.requests)]
                for k in range(clients)]
    if args.fail_on:
        payloads[0][0] = [f"{args.fail_on} {payloads[0][0][0]}", *payloads[0][0][1:]]
    wait_until_ready(url)
    shutdown: dict = {}
    pid = process.pid if process is not None else args.server_pid
    memory = PeakRss(pid) if pid else None
    with memory or contextlib.nullcontext():
        if args.sigterm_after is not None:
            stopper = sigterm_after(process, args.sigterm_after, shutdown)
        started = time.perf_counter()
        outcomes = send_overload(url, payloads, args.max_seconds, args.honour_retry_after)
        row = summarize(outcomes, time.perf_counter() - started)
        if args.sigterm_after is not None:
            stopper.join(120)
    row = {"clients": clients, "requests_per_client": args.requests, "texts_per_request": n,
           "words_per_text": round(sum(len(t.split()) for t in texts) / len(texts)), **row,
           **(memory.mib() if memory else {}), **shutdown, "load_average_1min": round(os.getloadavg()[0], 1)}
    if args.fail_on:
        marked = [o for o in outcomes if o.texts and args.fail_on in o.texts[0]]
        row["failing_request_status"] = marked[0].status if marked else None
        row.update(answers_alone(url, outcomes))
    return row


def overload_table(row: dict) -> str:
    statuses = ", ".join(f"{name}: {count}" for name, count in row["statuses"].items())
    memory = f"{row.get('rss_start_mib')} / {row.get('rss_peak_mib')} / {row.get('rss_end_mib')}"
    return "\n".join([
        "| clients x requests | texts x words | seconds | statuses | other 5xx | accepted p50 / p95 / p99 / max s "
        "| RSS start / peak / end MiB |", "|" + "---:|" * 7,
        f"| {row['clients']} x {row['requests_per_client']} | {row['texts_per_request']} x {row['words_per_text']} "
        f"| {row['seconds']} | {statuses} | {row['errors_5xx']} | {row['p50_s']} / {row['p95_s']} / {row['p99_s']} / "
        f"{row['max_s']} | {memory} |"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, nargs="?", help="start `ner.serve MODEL_DIR` on a free loopback port")
    parser.add_argument("--url", help="load-test a running server instead (loopback only)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="client counts (default: 1 16)")
    parser.add_argument("--requests", type=int, default=50, help="requests per client (default: 50)")
    parser.add_argument("--max-seconds", type=float, default=60, help="time bound per client count (default: 60)")
    parser.add_argument("--server-args", default="", help='extra ner.serve flags, e.g. "--max-wait-ms 2"')
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    over = parser.add_argument_group("overload mode (--texts-per-request): one client count, long requests")
    over.add_argument("--texts-per-request", type=int, help='{"texts": [...]} of this many texts per request')
    over.add_argument("--words-per-text", type=int, default=300, help="sentences joined up to this (default: 300)")
    over.add_argument("--conll", type=Path, help="take the sentences from this CoNLL file (default: six news ones)")
    over.add_argument("--text-file", type=Path, help="or from this text file, one sentence a line")
    over.add_argument("--honour-retry-after", action="store_true", help="after a 503, wait Retry-After seconds")
    over.add_argument("--server-pid", type=int, help="with --url: the server's pid, to sample its memory")
    over.add_argument("--sigterm-after", type=float, help="SIGTERM the server this many seconds in")
    over.add_argument("--fail-on", metavar="MARKER", help="serve with scripts/serve_with_fault.py MARKER; the "
                      "first request's first text holds MARKER; answered texts are then sent again alone")
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (args.url is None):
        parser.error("pass MODEL_DIR or --url, not both")
    if not (1 <= max(args.clients) <= 256 and 1 <= args.requests <= 10_000):
        parser.error("--clients 1-256 and --requests 1-10000")
    if (args.sigterm_after is not None or args.fail_on) and (args.url or not args.texts_per_request):
        parser.error("--sigterm-after and --fail-on start the server (MODEL_DIR) in overload mode")
    launcher = (str(Path(__file__).with_name("serve_with_fault.py")), args.fail_on) if args.fail_on else None
    process, url = (None, args.url) if args.url else start_server(args.model_dir, args.server_args.split(),
                                                                  launcher or ("-m", "ner.serve"))
    check_loopback(url)
    try:
        if args.texts_per_request:
            result, printed = (row := overload(args, process, url)), overload_table(row)
        else:
            run_clients(url, 2, 5, 30)  # warm-up: first batches build kernels
            result = [run_clients(url, n, args.requests, args.max_seconds) for n in args.clients]
            printed = table(result)
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    print(printed)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
