"""/healthz under large-body abuse: 10 clients send 1 MB JSON bodies of 90,000 unknown keys
to `POST /prompts` as fast as they are answered, while a probe asks /healthz every 50 ms.
Measured in one run against `refloop api` in its own process: the probe's p50/p99 idle,
then under the load, and their ratio; how each abusive request was answered; the server's
CPU time per abusive request (a figure a loaded machine does not inflate as it does the
latencies); and the load average around the run (the probe's idle figures show the
machine's own noise).

    python -m bench.bench_large_bodies [--clients 10] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.bench_sse import percentile
from bench.common import bench_env
from refloop.runtime.net import free_port, wait_for_port

KEYS = 90_000


def abusive_body() -> bytes:
    """Just under the 1 MB limit, 90,000 keys: what took 3.6 s each on the event loop."""
    width = 1_000_000 // KEYS - 6  # '"k…":0,' per key
    return json.dumps({f"k{i:0{width}d}": 0 for i in range(KEYS)},
                      separators=(",", ":")).encode()


def abuse(base_url: str, clients: int, seconds: float, answers: multiprocessing.Queue) -> None:
    """The attackers, in their own process: the probe's timings are the server's alone."""
    body = abusive_body()

    async def one() -> Counter:
        seen: Counter = Counter()
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            while time.monotonic() < deadline:
                response = await http.post("/prompts", content=body,
                                           headers={"Content-Type": "application/json"})
                seen[response.status_code] += 1
        return seen

    async def all_of_them() -> Counter:
        total: Counter = Counter()
        for seen in await asyncio.gather(*(one() for _ in range(clients))):
            total.update(seen)
        return total

    answers.put(dict(asyncio.run(all_of_them())))


async def probe(base_url: str, seconds: float) -> list[float]:
    """/healthz every 50 ms: each answer's latency in ms."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        # From here: making the client (its TLS context) can take a second under load.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            await http.get("/healthz")
            latencies.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.05)
    return latencies


async def warm_up(base_url: str, patience_s: float = 120) -> None:
    """Until a whole second of probes answers promptly: the first answers wait for the
    server's start (its imports, the database opened; 10-15 s on a loaded machine), which
    is not what the idle figure measures."""
    deadline = time.monotonic() + patience_s
    while max(await probe(base_url, 1)) > 500 and time.monotonic() < deadline:
        pass


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(clients: int, seconds: float) -> None:
    load_before = os.getloadavg()
    async with bench_env(agent_worker=False) as env:
        port = free_port()
        address = env.client.service_client.config.target_host
        process_env = {**os.environ, "TEMPORAL_ADDRESS": address,
                       "REFLOOP_DATA_DIR": str(env.settings.refloop_data_dir),
                       "REFLOOP_WORKSPACE_ROOTS": str(env.root)}
        command = [sys.executable, "-m", "refloop", "api", "--port", str(port)]
        api = subprocess.Popen(command, env=process_env, cwd=env.root)  # noqa: ASYNC220
        try:
            await asyncio.to_thread(wait_for_port, port, 60, lambda: api.poll() is None)
            base_url = f"http://127.0.0.1:{port}"
            await warm_up(base_url)
            idle = await probe(base_url, min(seconds, 5))
            answers: multiprocessing.Queue = multiprocessing.Queue()
            attackers = multiprocessing.Process(target=abuse,
                                                args=(base_url, clients, seconds, answers))
            attackers.start()
            cpu_began = cpu_seconds(api.pid)
            await asyncio.sleep(1)  # the attack under way
            loaded = await probe(base_url, seconds - 2)
            attackers.join(seconds + 60)
            cpu_used = cpu_seconds(api.pid)
            statuses = answers.get(timeout=5)
        finally:
            api.terminate()
            api.wait(30)
    print(f"large bodies: {clients} clients, 1 MB bodies of {KEYS:,} keys to POST /prompts "
          f"for {seconds:g} s; answered {statuses}")
    for name, values in (("idle", idle), ("under load", loaded)):
        print(f"  /healthz {name:10}: n={len(values):4d} p50 {percentile(values, 0.5):7.1f} ms"
              f"  p99 {percentile(values, 0.99):7.1f} ms  max {max(values):7.1f} ms")
    print(f"  p99 ratio under load / idle: {percentile(loaded, 0.99) / percentile(idle, 0.99):.2f}")
    if cpu_began is not None and cpu_used is not None:
        refused = sum(statuses.values())
        print(f"  server CPU under load: {cpu_used - cpu_began:.1f} s, "
              f"{(cpu_used - cpu_began) / max(refused, 1) * 1000:.2f} ms per abusive request")
    print("  load average (1, 5, 15 min) before: {:.1f} {:.1f} {:.1f}, after: {:.1f} {:.1f} "
          "{:.1f}".format(*load_before, *os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.seconds))
