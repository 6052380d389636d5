"""The endpoint client's own overhead per request, against a stand-in server that answers at once.

A stand-in OpenAI-compatible server (engine.engines.endpoint.standin: stdlib, HTTP/1.1 keep-alive, chunked SSE) runs
in a separate process on 127.0.0.1 and streams `--tokens` chunks per request with no delay, so nearly all the
time is the client's (and the stand-in's own Python). The client (engine.service.endpoint_sessions.probe_endpoint:
the one sweep driver and the endpoint engine a real session uses: rounds of threads, keep-alive connections, SSE
parsing, per-chunk timing, /metrics read around each round) drives it at concurrency 32 (and
1 for reference). Reported per request: the client process's CPU time (what the load generator costs the
host it runs on), the wall time per request at that concurrency, and the server process's CPU for scale.

Usage: python bench/bench_endpoint.py [--requests 2000] [--tokens 64] [--concurrency 32]
Writes bench/results/endpoint.json and prints a Markdown table (copied into bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.service.endpoint_sessions import probe_endpoint  # noqa: E402

SERVER = (
    "import sys\n"
    "from engine.engines.endpoint.standin import StandIn\n"
    "s = StandIn(flavor='vllm', tokens=int(sys.argv[1])).start()\n"
    "print(s.url, flush=True)\n"
    "sys.stdin.read()\n"
)


def measure(url: str, server: psutil.Process, concurrency: int, requests: int, tokens: int) -> dict:
    rounds = max(requests // concurrency, 1)
    endpoint = {"url": url, "concurrency": [concurrency], "max_requests": rounds * concurrency,
                "max_duration_s": 600, "warmup_requests": 1}  # fmt: skip
    cpu0, srv0, wall0 = time.process_time(), sum(server.cpu_times()[:2]), time.perf_counter()
    report = probe_endpoint(endpoint, ["Write a loop in Python."] * rounds, tokens)
    cpu1, srv1, wall1 = time.process_time(), sum(server.cpu_times()[:2]), time.perf_counter()
    assert report["stopped"] is None, report["stopped"]
    level = report["endpoints"][0]["levels"][0]
    n = level["requests"]
    return {
        "concurrency": concurrency,
        "requests": n,
        "errors": level["errors"],
        "tokens_per_request": tokens,
        "client_cpu_ms_per_request": 1000 * (cpu1 - cpu0) / n,
        "client_cpu_us_per_chunk": 1e6 * (cpu1 - cpu0) / (n * tokens),
        "server_cpu_ms_per_request": 1000 * (srv1 - srv0) / n,
        "wall_ms_per_request": 1000 * level["wall_s"] / n,
        "requests_per_s": n / level["wall_s"],
        "ttft_p50_ms": 1000 * level["ttft_p50_s"],
        "total_wall_s": wall1 - wall0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(args.tokens)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    try:
        url = proc.stdout.readline().strip()
        server = psutil.Process(proc.pid)
        rows = [
            measure(url, server, 1, max(args.requests // 4, 50), args.tokens),
            measure(url, server, args.concurrency, args.requests, args.tokens),
        ]
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(10)
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "rows": rows,
    }
    out = ROOT / "bench" / "results" / "endpoint.json"
    out.write_text(json.dumps(doc, indent=2))
    print(f"Run {doc['when']}, load average {doc['load_average'][0]:.1f} on {os.cpu_count()} CPUs.\n")
    print(
        "| concurrency | requests | errors | client CPU / request | client CPU / chunk | stand-in CPU / request "
        "| wall / request | requests/s | TTFT p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['client_cpu_ms_per_request']:.2f} ms | "
              f"{r['client_cpu_us_per_chunk']:.1f} µs | {r['server_cpu_ms_per_request']:.2f} ms | "
              f"{r['wall_ms_per_request']:.2f} ms | {r['requests_per_s']:.0f} | "
              f"{r['ttft_p50_ms']:.1f} ms |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
