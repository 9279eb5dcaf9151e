"""A phase of the agent workflow: keeping the conversation within the model's window.

Each model turn fits its conversation to the endpoint's window in its activity (where the
window and the prompt's size are known: refloop.llm.fitting) and reports how. The workflow
shows what was masked or folded as a `compacted` event and, when the turn says a summary is
due, runs it as its own activity (`refloop.llm.compact`, purpose `compact`): a durable
step, in the history and the Web UI, whose summary is in the blob store. The stored
conversation of every earlier step stays as it was, so a rewind or fork to a step before a
compaction reads the conversation of that step.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract import activity_calls
    from refloop.contract.activity_io import ActResult, ContextReport
    from refloop.contract.messages import Plan
    from refloop.contract.window import CompactInput

from refloop.workflows.agent_base import AgentBase


def fit_event(report: ContextReport) -> dict[str, Any] | None:
    """The `compacted` event of a turn's fit without a model (None: nothing changed)."""
    if not report.masked and not report.folded:
        return None
    return {"kind": "folded" if report.folded else "masked", "masked": report.masked,
            "turns_folded": report.folded, "tokens_before": report.tokens_before,
            "tokens_after": report.tokens, "window": report.window}


def plan_progress(plan: Plan | None, completed: list[int]) -> str:
    """The plan's progress in words, kept verbatim by a compaction."""
    if plan is None:
        return ""
    done = [n for n in range(1, len(plan.steps) + 1) if n in completed]
    rest = [n for n in range(1, len(plan.steps) + 1) if n not in completed]
    text = f"steps done: {', '.join(map(str, done)) or 'none'} of {len(plan.steps)}"
    if rest:
        text += f"; next: step {rest[0]}: {plan.steps[rest[0] - 1].goal}"
    return text


class CompactPhase(AgentBase):
    async def _keep_within_window(self, act: ActResult) -> None:
        """After a model turn: its fit shown, and the summary it found due run."""
        report = act.context
        if report is None:  # a turn recorded before windows were fitted
            return
        event = fit_event(report)
        if event is not None:
            self._emit("compacted", event)
        if not report.compact_due or self.state.conversation.ref is None:
            return
        inp, planning = self.state.input, self.state.planning
        result = await self.activities.call(
            activity_calls.COMPACT,
            CompactInput(conversation_ref=self.state.conversation.ref, budget=report.budget,
                         task=inp.task,
                         progress=plan_progress(planning.plan, planning.completed_steps),
                         model=inp.model, endpoint=inp.endpoint),
            summary=f"compact the conversation ({report.tokens} of {report.window} tokens)",
        )
        if result.usage is not None:
            self._account(result.usage)
        if not result.folded:
            return
        self.state.conversation.ref = result.conversation_ref
        spent = result.usage.usage if result.usage is not None else None
        self._emit("compacted", {
            "kind": "summary", "turns_folded": result.folded,
            "tokens_before": result.tokens_before, "tokens_after": result.tokens_after,
            "summary_ref": result.summary_ref, "by_model": result.by_model,
            "window": report.window,
            # what the summary cost, beside what it saves every later turn
            "summary_tokens": spent.prompt_tokens + spent.completion_tokens if spent else 0,
            "summary_cost_usd": spent.cost_usd if spent else 0.0})
