"""Code-review supervisor on a 300-line diff, happy path: model calls and wall time.

    python -m bench.bench_code_review [--lines 300] [--latency-ms 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from bench.common import bench_env
from refloop.contract.code_review import CodeReviewInput, CodeReviewResult
from refloop.workflows.code_review import CodeReviewWorkflow


def diff_of(lines: int, files: int = 5) -> str:
    per_file = lines // files
    parts = []
    for f in range(files):
        body = "\n".join(f"+value_{f}_{n} = {n}" for n in range(per_file))
        parts.append(f"diff --git a/m{f}.py b/m{f}.py\n--- /dev/null\n+++ b/m{f}.py\n"
                     f"@@ -0,0 +1,{per_file} @@\n{body}")
    return "\n".join(parts) + "\n"


def scenario(latency_ms: int) -> dict:
    issues = [{"id": f"ISSUE-{n:03d}", "relevantFile": f"m{n}.py", "existingCode": "x",
               "suggestionContent": "naming", "improvedCode": "y", "label": "Quality",
               "suggestionLine": 3, "severity": "Low"} for n in range(5)]
    return {"latency_ms": latency_ms, "responses": {
        "code_review": [{"json": {"task_id": "b", "issues": issues, "summary": {}}}],
        "code_verify": [{"json": {"task_id": "b", "verification_result": {
            "accuracy_check": [], "rule_compliance_check": [],
            "quality_assessment": {"overall_score": 80}}}}],
    }}


async def main(lines: int, latency_ms: int) -> None:
    async with bench_env() as env:
        timings = []
        for label in ("warmup", "measured"):
            env.llm.load(label, scenario(latency_ms))
            started = time.perf_counter()
            result = await env.client.execute_workflow(
                CodeReviewWorkflow.run,
                CodeReviewInput(review_type="diff", working_directory=str(env.root),
                                content=diff_of(lines), model=label),
                id=f"bench-review-{uuid.uuid4().hex[:6]}", task_queue=env.queue,
                result_type=CodeReviewResult)
            timings.append(time.perf_counter() - started)
        calls = len(env.llm.requests(model="measured"))
    assert result.status == "completed"
    model_time = calls * latency_ms / 1000
    print(f"diff lines={lines} model calls={calls} latency={latency_ms}ms")
    findings = len(result.output["review_results"]["issues"])
    print(f"wall={timings[-1]:.2f}s, sum of model latency={model_time:.2f}s, "
          f"ratio={timings[-1] / model_time:.3f}, findings={findings}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--latency-ms", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.lines, args.latency_ms))
