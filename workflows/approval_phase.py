"""Human approval of writes and commands, resolved by a workflow update."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.contract.activity_io import ApprovalDecision, ToolResult
    from refloop.contract.mcp import McpToolInfo
    from refloop.contract.messages import ToolCall
    from refloop.contract.tool_properties import ToolProperties

from refloop.workflows.agent_base import AgentBase
from refloop.workflows.calls import InterruptNow
from refloop.workflows.logic import tool_call_summary


def needs_approval(mode: str, call: ToolCall, properties: ToolProperties | None) -> bool:
    """The tool's properties decide: by default confirm_writes stops writes and commands,
    confirm_all every call but control ones; an MCP tool its server lists under `confirm`
    waits in every mode. A tool nobody knows (None) waits only under confirm_all."""
    if properties is None:
        return mode == "confirm_all"
    return properties.needs_approval(mode, call.arguments)


def validate_decision(pending: dict[str, ApprovalDecision | None],
                      decision: ApprovalDecision) -> None:
    """The update validator's rule: only a pending, undecided call can be decided."""
    if decision.call_id not in pending:
        raise ValueError(f"no pending approval for call_id {decision.call_id!r}")
    if pending[decision.call_id] is not None:
        raise ValueError(f"call_id {decision.call_id!r} is already decided")


def take_decision(pending: dict[str, ApprovalDecision | None], call_key: str,
                  forget: bool) -> ApprovalDecision:
    """The decision on a call that waited, read by the call; `forget`: it leaves the state
    (so a task's state does not grow with every approval it ever had), and a decision sent
    again for the call is refused as not pending."""
    decision = pending.pop(call_key) if forget else pending[call_key]
    assert decision is not None
    return decision


def approval_label(call: ToolCall, mcp_tools: dict[str, McpToolInfo]) -> str:
    """The waiting call as its activity's summary names it: an MCP tool as `server: tool`
    (its registered name `server__tool` is the model's, not a person's)."""
    tool = mcp_tools.get(call.name)
    if tool is None:
        return tool_call_summary(call)
    return tool_call_summary(call.model_copy(update={"name": f"{tool.server}: {tool.tool}"}))


class ApprovalPhase(AgentBase):
    def _decide(self, decision: ApprovalDecision) -> None:
        """The `decide_approval` update: a validated decision for a waiting call."""
        self.state.approvals.waiting[decision.call_id] = decision

    async def _await_approval(self, call: ToolCall, call_key: str) -> ToolResult | None:
        """None when the call may run; a denied tool result when it was rejected."""
        inp = self.state.input
        if not needs_approval(inp.approval_mode, call, self._tool_properties(call.name)):
            return None
        pending = self.state.approvals.waiting
        if call_key not in pending:  # else asked before a hand-over: still the same call
            pending[call_key] = None
            self._emit("approval_required",
                       {"call_id": call_key, "tool": call.name, "args": call.arguments})
        self._show()
        await self._record(self._visible_status())
        try:
            await workflow.wait_condition(
                lambda: pending[call_key] is not None or self.interrupt_due(),
                timeout=timedelta(seconds=inp.approval_timeout_s),
                # The Web UI shows the timer by this name (else an unlabelled 10 minutes).
                timeout_summary="waiting for approval: "
                                f"{approval_label(call, self.state.mcp.tools)}",
            )
        except TimeoutError:
            pending[call_key] = ApprovalDecision(
                call_id=call_key, approved=False,
                comment=f"no decision within {inp.approval_timeout_s:g}s")
        if pending[call_key] is None:  # handed over while it waits: asked again after
            raise InterruptNow()
        decision = take_decision(pending, call_key, forget=True)
        self._emit("approval_decided", decision.model_dump(mode="json"))
        self._show()
        # Another call may still wait (its own wait writes again when it ends).
        await self._record(self._visible_status())
        if decision.approved:
            return None
        reason = f": {decision.comment}" if decision.comment else ""
        return ToolResult(ok=False, error=f"E_DENIED: the user rejected this call{reason}")
