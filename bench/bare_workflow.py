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
        # bench_payload_cost adds a third argument: bytes of padding carried by every
        # activity's input and result (the history grows; the model's prompts do not)
        name, workspace, *padding = args
        self.pad = "x" * int(padding[0]) if padding else ""
        for purpose in ("intent", "plan"):
            await self._model(name, purpose)
        output = ""
        for step in range(STEPS + 1):
            content = await self._model(name, "act", output)
            if step < STEPS:
                output = await self._activity("bare.tool", [workspace, f"s{step}", content])
        await self._model(name, "summary")
        return STEPS

    async def _model(self, name: str, purpose: str, last_output: str = "") -> str:
        return await self._activity("bare.model", [name, purpose, last_output])

    async def _activity(self, name: str, args: list[str]) -> str:
        if not self.pad:
            return await workflow.execute_activity(name, args, **OPTIONS)
        value, _ = await workflow.execute_activity(name, [*args, self.pad], **OPTIONS)
        return value
