"""What completeness reflection adds, measured in one run: nothing (off), one judge call
(complete), and one supplement child (incomplete, then complete).

    python -m bench.bench_reflection [--latency-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio

from bench.common import bench_env

COMPLETE = {"json": {"is_complete": True, "analysis": "done", "missing_aspects": [],
                     "supplements": []}}
INCOMPLETE = {"json": {"is_complete": False, "analysis": "not saved", "missing_aspects": ["save"],
                       "supplements": [{"action": "save out.md", "reason": "asked",
                                        "suggested_tools": ["write_file"]}]}}


def scenario(latency_ms: int, judge: list, supplement: bool) -> dict:
    acts = [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
            {"content": "looked"}]
    responses = {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "other",
                           "steps": [{"goal": "look", "tool": "list_dir"}]}}],
        "act": acts,
        "summary": [{"content": "done"}],
    }
    if judge:
        responses["completeness"] = judge
    if supplement:
        responses["supplement_plan"] = [{"json": {"task_type": "creation", "steps": [
            {"goal": "save out.md", "tool": "write_file"}]}}]
        responses["act"] = acts + [
            {"tool_calls": [{"name": "write_file",
                             "arguments": {"path": "out.md", "content": "x"}}]},
            {"content": "saved"}]
    return {"latency_ms": latency_ms, "responses": responses}


async def main(latency_ms: int) -> None:
    async with bench_env() as env:
        await env.run("warmup", scenario(latency_ms, [], False))
        cases = {
            "off": (scenario(latency_ms, [], False), False),
            "complete": (scenario(latency_ms, [COMPLETE], False), True),
            "one_supplement": (scenario(latency_ms, [INCOMPLETE, COMPLETE], True), True),
        }
        measured = {}
        for label, (spec, enabled) in cases.items():
            result, seconds, _ = await env.run(label, spec, enable_reflection=enabled)
            assert result.status == "completed", result.answer
            measured[label] = (seconds, result.stats.llm_calls)
    base_s, base_calls = measured["off"]
    print(f"latency={latency_ms}ms; reflection off: wall={base_s:.2f}s calls={base_calls}")
    for label in ("complete", "one_supplement"):
        seconds, calls = measured[label]
        print(f"{label:15s} +{calls - base_calls} model calls, +{seconds - base_s:.2f}s wall "
              f"({seconds / base_s:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=int, default=100)
    asyncio.run(main(parser.parse_args().latency_ms))
