"""The cost curve of a long task with and without compaction: the prompt tokens each step
sends, for one 300-step scripted task (a read of a 2,400-character file a step) on a
16,000-token window (masked and summarised as it nears it) and on a window it never nears
(2,000,000 tokens: the whole conversation every step). The scripted model counts the
tokens (3.5 characters of JSON a token) and reports them, as an endpoint would.

    python -m bench.bench_window [--steps 300]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import BenchEnv, bench_env

WINDOWS = {"compacted": 16_000, "whole": 2_000_000}
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda",
         "sigma", "omega", "river")


def scenario(window: int, steps: int) -> dict[str, Any]:
    acts = [{"tool_calls": [{"name": "read_file", "arguments": {"path": f"f{n % 30}.txt"}}]}
            for n in range(steps)]
    return {"endpoint": {"context_tokens": window}, "responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "research",
                           "steps": [{"goal": "read", "tool": "read_file"}]}}],
        "act": [*acts, {"content": "done"}],
        "compact": [{"content": "Read the files in turn; nothing unexpected."}] * steps,
        "summary": [{"content": "done"}]}}


def write_files(workspace: Path) -> None:
    rng = random.Random(7)
    for n in range(30):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(40))
        (workspace / f"f{n}.txt").write_text(text[:2_400])


async def measure(env: BenchEnv, name: str, steps: int) -> dict[str, Any]:
    env.prepare(name, scenario(WINDOWS[name], steps))
    write_files(env.root / name)
    result, seconds, _ = await env.run(name, None, max_iterations=steps + 5)
    assert result.status == "completed", result.stop_reason
    # The whole-conversation run's log is some 100 MB of prompts: read without a hurry
    async with httpx.AsyncClient(timeout=600) as http:
        log = await http.get(f"{env.llm.root}/_admin/requests", params={"model": name})
    requests = [r for r in log.json() if r.get("status") == 200]
    acts = [r["prompt_tokens"] for r in requests if r["purpose"] == "act"]
    compacts = [r for r in requests if r["purpose"] == "compact"]
    return {"acts": acts, "compacts": len(compacts),
            "compact_tokens": sum(r["prompt_tokens"] for r in compacts), "seconds": seconds}


async def main(steps: int) -> None:
    async with bench_env() as env:
        runs = {name: await measure(env, name, steps) for name in WINDOWS}
    marks = sorted({1, *range(50, steps + 1, 50), steps})
    print(f"prompt tokens sent at step ({steps} steps, one read of 2,400 characters each)")
    print("| window | " + " | ".join(str(m) for m in marks) + " | most | total | "
          "compactions (their prompt tokens) | seconds |")
    print("| --- " * (len(marks) + 5) + "|")
    for name, run in runs.items():
        acts = run["acts"]
        print(f"| {WINDOWS[name]:,} | " + " | ".join(f"{acts[m - 1]:,}" for m in marks)
              + f" | {max(acts):,} | {sum(acts):,} | {run['compacts']} "
              f"({run['compact_tokens']:,}) | {run['seconds']:.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    started = time.perf_counter()
    asyncio.run(main(parser.parse_args().steps))
    print(f"({time.perf_counter() - started:.0f} s)")
