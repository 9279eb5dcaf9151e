"""The floor for the concurrency benchmark, in a module the workflow sandbox can import."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

STEPS = 10
# A bench must fail loudly, not retry a broken call for ever.
OPTIONS = {"start_to_close_timeout": timedelta(minutes=1),
           "retry_policy": RetryPolicy(maximum_attempts=3)}


@workflow.defn(name="BareStepsWorkflow")
class BareStepsWorkflow:
    """The floor: the agent's model calls (intent, plan, one act per step plus the final
    answer, summary) and its tool calls, in the same order, with no agent logic; each act
    hands the model the previous tool output, as the agent's conversation does."""

    @workflow.run
    async def run(self, args: list[str]) -> int:
        name, workspace = args
        for purpose in ("intent", "plan"):
            await self._model(name, purpose)
        output = ""
        for step in range(STEPS + 1):
            content = await self._model(name, "act", output)
            if step < STEPS:
                output = await workflow.execute_activity(
                    "bare.tool", [workspace, f"s{step}", content], **OPTIONS)
        await self._model(name, "summary")
        return STEPS

    async def _model(self, name: str, purpose: str, last_output: str = "") -> str:
        return await workflow.execute_activity(
            "bare.model", [name, purpose, last_output], **OPTIONS)
