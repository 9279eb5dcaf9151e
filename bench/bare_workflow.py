"""The floor for the concurrency benchmark, in a module the workflow sandbox can import."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

STEPS = 10


@workflow.defn(name="BareStepsWorkflow")
class BareStepsWorkflow:
    """The floor: the same model and tool activities, no agent logic."""

    @workflow.run
    async def run(self, args: list[str]) -> int:
        name, workspace = args
        for step in range(STEPS + 1):
            content = await workflow.execute_activity(
                "bare.model", name, start_to_close_timeout=timedelta(minutes=1))
            if step < STEPS:
                await workflow.execute_activity(
                    "bare.tool", [workspace, f"s{step}", content],
                    start_to_close_timeout=timedelta(minutes=1))
        return STEPS
