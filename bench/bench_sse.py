"""SSE latency of the HTTP API, measured in one run against a real uvicorn server.

For each event: the time from the workflow recording it (its `ts`) to the client reading
it off the stream; plus the time from the task POST to the first event.

    python -m bench.bench_sse [--tasks 5] [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from datetime import datetime

import httpx
import uvicorn

from bench.common import bench_env
from refloop.api.main import create_app


def scenario(latency_ms: int) -> dict:
    act = [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}] * 5
    return {"latency_ms": latency_ms, "responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "other", "steps": [{"goal": "look", "tool": "list_dir"}]}}],
        "act": [*act, {"content": "done"}],
        "summary": [{"content": "done"}],
    }}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_task(http: httpx.AsyncClient, env, n: int, latency_ms: int
                   ) -> tuple[float, list[float]]:
    """(seconds from POST to the first event, per-event lag from recording to receipt)."""
    name = f"sse{n}"
    env.llm.load(name, scenario(latency_ms))
    workspace = env.root / name
    workspace.mkdir()
    session = (await http.post("/agent/interactive/start", json={
        "workspace": str(workspace), "model": name})).json()["session_id"]
    received: dict[int, float] = {}
    posted = time.time()
    async with http.stream("POST", "/agent/interactive/task/stream",
                           json={"session_id": session, "task": "look"}) as stream:
        task_id = stream.headers["x-task-id"]
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                received[int(line[4:])] = time.time()
    events = (await http.get(f"/tasks/{task_id}")).json()["result"]["events"]
    recorded = {e["seq"]: datetime.fromisoformat(e["ts"]).timestamp() for e in events}
    lags = [received[seq] - recorded[seq] for seq in received]
    return min(received.values()) - posted, lags


async def main(tasks: int, latency_ms: int) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with bench_env() as env:
        settings = env.settings.model_copy(update={"refloop_task_queue": env.queue,
                                                   "enable_reflection": False,
                                                   "refloop_workspace_roots": str(env.root)})
        server = uvicorn.Server(uvicorn.Config(create_app(settings, client=env.client),
                                               port=port, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no started event)
            await asyncio.sleep(0.05)
        firsts, lags = [], []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            await one_task(http, env, -1, latency_ms)  # warm-up
            for n in range(tasks):
                first, task_lags = await one_task(http, env, n, latency_ms)
                firsts.append(first)
                lags += task_lags
        server.should_exit = True
        await serving
    ms = [lag * 1000 for lag in lags]
    print(f"tasks={tasks} events={len(ms)} model latency={latency_ms}ms")
    print(f"SSE event latency: p50={percentile(ms, 0.5):.0f}ms p95={percentile(ms, 0.95):.0f}ms "
          f"max={max(ms):.0f}ms")
    print(f"POST to first event: median={statistics.median(firsts) * 1000:.0f}ms "
          f"max={max(firsts) * 1000:.0f}ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--latency-ms", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.latency_ms))
