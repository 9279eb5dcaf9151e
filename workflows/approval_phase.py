"""Human approval of writes and commands, resolved by a workflow update."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from refloop.models import ApprovalDecision, ToolCall, ToolResult

from workflows.agent_base import AgentBase

WRITE_TOOLS = frozenset({"write_file", "apply_patch", "undo_patch", "run_cmd"})
READ_ONLY_COMMANDS = frozenset({"view"})


def needs_approval(mode: str, call: ToolCall, kind: str | None = None) -> bool:
    """confirm_writes: anything that changes files or runs a command; confirm_all: any tool.
    `kind` "write": an MCP tool its server's config lists under `confirm`, which waits for a
    decision in every mode (the operator asked for it)."""
    if kind == "write":
        return True
    if mode == "auto" or call.name == "complete_step":
        return False
    if mode == "confirm_all":
        return True
    if call.name in WRITE_TOOLS:
        return True
    operation = call.arguments.get("command", call.arguments.get("operation"))
    return call.name in ("str_replace_based_edit_tool", "json_edit_tool") and (
        operation not in READ_ONLY_COMMANDS
    )


def validate_decision(pending: dict[str, ApprovalDecision | None],
                      decision: ApprovalDecision) -> None:
    """The update validator's rule: only a pending, undecided call can be decided."""
    if decision.call_id not in pending:
        raise ValueError(f"no pending approval for call_id {decision.call_id!r}")
    if pending[decision.call_id] is not None:
        raise ValueError(f"call_id {decision.call_id!r} is already decided")


class ApprovalPhase(AgentBase):
    def _decide(self, decision: ApprovalDecision) -> None:
        """The `decide_approval` update: a validated decision for a waiting call."""
        self.state.approvals.waiting[decision.call_id] = decision

    async def _await_approval(self, call: ToolCall, call_key: str) -> ToolResult | None:
        """None when the call may run; a denied tool result when it was rejected."""
        inp = self.state.input
        if not needs_approval(inp.approval_mode, call, self._mcp_kind(call.name)):
            return None
        pending = self.state.approvals.waiting
        pending[call_key] = None
        self._emit("approval_required",
                   {"call_id": call_key, "tool": call.name, "args": call.arguments})
        self._show()
        try:
            await workflow.wait_condition(
                lambda: pending[call_key] is not None,
                timeout=timedelta(seconds=inp.approval_timeout_s),
            )
        except TimeoutError:
            pending[call_key] = ApprovalDecision(
                call_id=call_key, approved=False,
                comment=f"no decision within {inp.approval_timeout_s:g}s")
        decision = pending[call_key]
        assert decision is not None
        self._emit("approval_decided", decision.model_dump(mode="json"))
        self._show()
        if decision.approved:
            return None
        reason = f": {decision.comment}" if decision.comment else ""
        return ToolResult(ok=False, error=f"E_DENIED: the user rejected this call{reason}")
