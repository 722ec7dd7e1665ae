"""Loopback load test of ``kvpools serve``: N clients for T seconds against 127.0.0.1, then requests/s, p50/p99.

The server runs in its own process (``kvpools serve``: one uvicorn process, ``--workers`` planning threads, the
machine's cores shared with the clients); each client is a thread with one keep-alive connection sending the same
request in a
loop until the time is up.  Every loop is bounded by the deadline and by ``--max-requests`` per client, so the run
stops by itself; the only address it talks to is 127.0.0.1.

    python benchmarks/serve_load.py --clients 8 --seconds 20 --endpoint capacity

prints one JSON object: requests, errors (any status but 200, or a refused connection), requests per second,
latency p50 / p90 / p99 / max in milliseconds, and the server's limits.  Needs the serve extra.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

REQUESTS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "plan": ("POST", "/api/v1/plan", {"model": "llama-3.1-8b", "gpu": "h100"}),
    "capacity": (
        "POST",
        "/api/v1/capacity",
        {"model": "gpt-oss-20b", "gpu": "h100", "contexts": ["8k", "32k", "128k"]},
    ),
    "record": ("POST", "/api/v1/capacity-record", {"model": "llama-3.1-8b", "memory": "40GiB", "shape": "dynamo"}),
    "presets": ("GET", "/api/v1/presets", None),
    "page": ("GET", "/", None),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(port: int, workers: int) -> subprocess.Popen[bytes]:
    """``kvpools serve`` itself (its console entry point), quiet but for errors."""
    command = [sys.executable, "-c", "from kvpools_core.cli import main; main()", "serve"]
    server = subprocess.Popen(
        [*command, "--port", str(port), "--workers", str(workers)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start within 60 s")


def client(port: int, name: str, stop_at: float, max_requests: int, out: list[tuple[float, int]]) -> None:
    method, path, body = REQUESTS[name]
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if payload is not None else {}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(max_requests):
        if time.monotonic() >= stop_at:
            break
        started = time.perf_counter()
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            response.read()
            status = response.status
        except OSError:
            status, connection = 0, http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        out.append((time.perf_counter() - started, status))
    connection.close()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--endpoint", choices=sorted(REQUESTS), default="capacity")
    parser.add_argument("--max-requests", type=int, default=100_000, help="per client, a bound besides the time")
    parser.add_argument("--workers", type=int, default=2, help="the server's planning workers (--workers)")
    args = parser.parse_args()
    if not (1 <= args.clients <= 256 and 0 < args.seconds <= 600):
        raise SystemExit("--clients in 1..256 and --seconds in (0, 600]: the test is bounded")
    port = free_port()
    server = start_server(port, args.workers)
    try:
        warm: list[tuple[float, int]] = []
        client(port, args.endpoint, time.monotonic() + 2, 5, warm)  # plugins and presets loaded, caches warm
        results: list[list[tuple[float, int]]] = [[] for _ in range(args.clients)]
        stop_at = time.monotonic() + args.seconds
        started = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(port, args.endpoint, stop_at, args.max_requests, results[i]))
            for i in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    samples = [sample for per_client in results for sample in per_client]
    latencies = [seconds * 1000 for seconds, status in samples if status == 200]
    statuses: dict[str, int] = {}
    for _, status in samples:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    print(
        json.dumps(
            {
                "endpoint": args.endpoint,
                "clients": args.clients,
                "seconds": round(elapsed, 2),
                "cores": os.cpu_count(),
                "requests": len(samples),
                "errors": len(samples) - len(latencies),
                "statuses": statuses,
                "requests_per_s": round(len(samples) / elapsed, 1),
                "latency_ms": {
                    "p50": round(percentile(latencies, 0.50), 1),
                    "p90": round(percentile(latencies, 0.90), 1),
                    "p99": round(percentile(latencies, 0.99), 1),
                    "max": round(max(latencies, default=float("nan")), 1),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
