"""Cost of quality review per edit, review on vs off, measured in one run.

Five document edits; the scripted model answers after a fixed latency. Prints the added
wall time and model calls per edit; a reviewed edit must cost exactly one review call and
a deterministic failure (invalid JSON) none.

    python -m bench.bench_review [--edits 5] [--latency-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio

from bench.common import bench_env

PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}}


def scenario(edits: int, latency_ms: int, reviewed: bool, bad_json: bool = False) -> dict:
    acts = [
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": f"doc{n}.json" if bad_json else f"doc{n}.md",
            "content": '{"broken": ' if bad_json else f"# Doc {n}\n\ntext\n"}}]}
        for n in range(edits)
    ]
    responses = {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "creation",
                           "steps": [{"goal": "write docs", "tool": "write_file"}]}}],
        "act": [*acts, {"content": "done"}],
        "summary": [{"content": "wrote docs"}],
    }
    if reviewed and not bad_json:
        responses["quality_review"] = [PASS] * edits
    return {"latency_ms": latency_ms, "responses": responses}


async def main(edits: int, latency_ms: int) -> None:
    async with bench_env() as env:
        await env.run("warmup", scenario(edits, latency_ms, False))
        runs = {}
        for label, reviewed, bad in (("off", False, False), ("on", True, False),
                                     ("deterministic", True, True)):
            result, seconds, _ = await env.run(
                label, scenario(edits, latency_ms, reviewed, bad),
                enable_quality_review=reviewed, quality_review_rules="be clear",
            )
            review_calls = len(env.llm.requests(model=label, purpose="quality_review"))
            runs[label] = (seconds, result.stats.llm_calls, review_calls, result)
    off_s, off_calls, _, _ = runs["off"]
    on_s, on_calls, on_reviews, on_result = runs["on"]
    det_s, _, det_reviews, det_result = runs["deterministic"]
    print(f"edits={edits} latency={latency_ms}ms")
    print(f"review off: wall={off_s:.2f}s model_calls={off_calls}")
    print(f"review on:  wall={on_s:.2f}s model_calls={on_calls} "
          f"reviews={on_result.stats.reviews.total}")
    print(f"added per edit: {(on_s - off_s) / edits * 1000:.0f} ms, "
          f"{(on_calls - off_calls) / edits:.2f} model calls "
          f"(review calls per reviewed edit: {on_reviews / on_result.stats.reviews.total:.2f})")
    print(f"deterministic failures: {det_result.stats.reviews.failed} reviews, "
          f"{det_reviews} review model calls, wall={det_s:.2f}s")
    assert on_reviews == on_result.stats.reviews.total == edits
    assert det_reviews == 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--latency-ms", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.edits, args.latency_ms))
