"""Orchestration overhead of the durable agent loop, measured in one run.

A scripted model answers every call after a fixed 200 ms. The same 10-step task runs
(a) as AgentTaskWorkflow on the embedded Temporal dev server
(`BENCH_TEMPORAL=sqlite|memory`, see bench/common.py) and (b) as a plain asyncio
loop making the same gateway and tool calls. Both are divided by the sum of the model
latencies; history bytes per step come from the workflow's event history, and from a
second task that writes or reads a 1 MB file at every step.

    python -m bench.bench_core [--steps 10] [--latency-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.common import bench_env
from refloop.contract.activity_io import RunToolInput
from refloop.contract.messages import ChatMessage, IntentResult, Plan, Purpose
from refloop.contract.tool_catalog import tool_specs
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import intent_messages, plan_messages, summary_messages
from refloop.settings import Settings
from refloop.tools.registry import execute_tool


def scenario(steps: int, latency_ms: int) -> dict:
    acts = []
    for n in range(1, steps + 1):
        acts.append({"tool_calls": [{"name": "write_file",
                                     "arguments": {"path": f"f{n}.txt", "content": str(n)}}]})
    acts.append({"content": "all files written"})
    return {
        "latency_ms": latency_ms,
        "responses": {
            "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
            "plan": [{"json": {"task_type": "coding", "steps": [
                {"goal": f"write f{n}", "tool": "write_file"} for n in range(1, steps + 1)]}}],
            "act": acts,
            "summary": [{"content": "wrote the files"}],
        },
    }


def large_file_scenario(steps: int) -> dict:
    """Each step writes a 1 MB file or reads one back: history must stay lean anyway."""
    body = "".join(f"row {n:07d}\n" for n in range(80_000))  # ~1 MB
    acts = []
    for n in range(1, steps + 1):
        call = ({"name": "write_file", "arguments": {"path": f"big{n}.txt", "content": body}}
                if n % 2 else {"name": "read_file", "arguments": {"path": f"big{n - 1}.txt"}})
        acts.append({"tool_calls": [call]})
    return {"responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "coding",
                           "steps": [{"goal": "write and read", "tool": "write_file"}]}}],
        "act": [*acts, {"content": "done"}],
        "summary": [{"content": "done"}],
    }}


def stored_bytes(history) -> int:
    return sum(event.ByteSize() for event in history.events)  # what Temporal keeps


async def plain_loop(gateway: LLMGateway, model: str, workspace: Path, settings: Settings) -> None:
    """The same calls without Temporal: the baseline."""
    specs = tool_specs()
    await gateway.structured(Purpose.intent, intent_messages("task"), IntentResult, model=model)
    await gateway.structured(Purpose.plan, plan_messages("task", specs, None), Plan, model=model)
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="t")]
    for index in range(1000):
        out = await gateway.chat(Purpose.act, messages, model=model, tools=specs)
        if not out.tool_calls:
            break
        messages.append(ChatMessage(role="assistant", tool_calls=out.tool_calls))
        for call in out.tool_calls:
            result = await execute_tool(
                RunToolInput(call_id=f"plain-{index}", name=call.name,
                             arguments=call.arguments, workspace=str(workspace)),
                settings,
            )
            messages.append(ChatMessage(role="tool", tool_call_id=call.id, content=result.output))
    await gateway.chat(Purpose.summary, summary_messages("task", "x"), model=model)


async def main(steps: int, latency_ms: int, verbose: bool = False) -> None:
    model_calls = steps + 4  # intent, plan, steps + final act, summary
    model_time = max(model_calls * latency_ms / 1000, 1e-9)
    async with bench_env() as env:
        # Warm-up: the first workflow pays for sandbox imports and DB table creation.
        await env.run("warmup", scenario(steps, latency_ms))
        result, workflow_time, handle = await env.run("measured", scenario(steps, latency_ms))
        assert result.status == "completed", result.answer
        history = await handle.fetch_history()
        big, _, big_handle = await env.run("large", large_file_scenario(steps))
        assert big.status == "completed", big.answer
        big_bytes = stored_bytes(await big_handle.fetch_history())
        env.llm.load("plain", scenario(steps, latency_ms))
        plain_ws = env.root / "plain"
        plain_ws.mkdir()
        started = time.perf_counter()
        await plain_loop(LLMGateway(env.settings), "plain", plain_ws, env.settings)
        plain_time = time.perf_counter() - started
    history_bytes = len(history.to_json().encode())
    stored = stored_bytes(history)
    if verbose:
        previous = None
        for event in history.events:
            at = event.event_time.ToDatetime()
            gap = (at - previous).total_seconds() * 1000 if previous else 0
            print(f"{gap:7.1f}ms {event.WhichOneof('attributes')}")
            previous = at
    print(f"steps={steps} model_calls={model_calls} latency={latency_ms}ms "
          f"sum_model_latency={model_time:.2f}s")
    print(f"workflow      wall={workflow_time:.2f}s ratio={workflow_time / model_time:.3f}")
    print(f"plain asyncio wall={plain_time:.2f}s ratio={plain_time / model_time:.3f}")
    print(f"workflow/plain={workflow_time / plain_time:.3f}")
    print(f"history: {len(history.events)} events, {stored} bytes stored "
          f"({stored / steps:.0f} bytes/step); JSON export {history_bytes} bytes "
          f"({history_bytes / steps:.0f} bytes/step)")
    print(f"history with a 1 MB file written or read at every step: {big_bytes} bytes stored "
          f"({big_bytes / steps:.0f} bytes/step, target <= 8192)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--verbose", action="store_true", help="print event-time gaps")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.latency_ms, args.verbose))
