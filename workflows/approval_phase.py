"""Human approval of writes and commands, resolved by a workflow update: approved as the
model asked, approved with arguments the person edited (checked like the model's own), or
rejected; a call nobody decides on in time ends the task incomplete, naming it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from refloop.contract.activity_io import ApprovalDecision, ToolResult
    from refloop.contract.errors import InvalidApprovalEdit
    from refloop.contract.mcp import McpToolInfo
    from refloop.contract.messages import ToolCall
    from refloop.contract.tool_catalog import TOOLS
    from refloop.contract.tool_properties import ToolProperties
    from refloop.workflows.state import TurnState

from refloop.workflows.agent_base import AgentBase
from refloop.workflows.calls import InterruptNow
from refloop.workflows.logic import tool_call_summary, truncate

# The model's own extra argument when it calls a tool its plan forbids (never the tool's)
JUSTIFICATION = "justification"
EDIT_NOTE_CHARS = 600  # of the edited arguments, in the note the model reads
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),)}


class ApprovalUnanswered(Exception):
    """No decision on a waiting call within the task's approval wait: the task ends
    incomplete, `missing` naming the call."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


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


def waiting_call(turn: TurnState | None, call_key: str) -> ToolCall | None:
    """The call a key (`<iteration>.<index>`) names, from the turn being run (the state,
    not the events, which continue-as-new trims); None when that turn is not this one."""
    iteration, _, index = call_key.partition(".")
    if turn is None or not index.isdigit() or str(turn.iteration) != iteration \
            or int(index) >= len(turn.calls):
        return None
    return turn.calls[int(index)]


def _validation_details(err: ValidationError) -> str:
    """As the tool registry words an invalid call (`path: Field required`)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}"
                     for e in err.errors())


def _builtin_refusal(args_model: type[BaseModel], arguments: dict[str, Any]) -> str | None:
    unknown = sorted(set(arguments) - set(args_model.model_fields) - {JUSTIFICATION})
    if unknown:
        return (f"unknown argument(s) {', '.join(unknown)}; the tool takes "
                f"{', '.join(args_model.model_fields)}")
    try:
        args_model.model_validate(arguments)
    except ValidationError as err:
        return _validation_details(err)
    return None


def _schema_refusal(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """An MCP tool's arguments against its server's JSON schema, as far as its top level
    says (required names, known names, their JSON types); the server checks the rest."""
    properties = schema.get("properties") or {}
    missing = [name for name in schema.get("required") or [] if name not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}"
    if properties and schema.get("additionalProperties") is not True:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return (f"unknown argument(s) {', '.join(unknown)}; the tool takes "
                    f"{', '.join(properties)}")
    for name, value in arguments.items():
        kinds = (properties.get(name) or {}).get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds or []
        known = [JSON_TYPES[kind] for kind in kinds if kind in JSON_TYPES]
        wrong_bool = isinstance(value, bool) and "boolean" not in kinds
        if known and (wrong_bool or not isinstance(value, tuple(t for k in known for t in k))):
            return f"{name}: expected {' or '.join(kinds)}"
    return None


def edit_refusal(call: ToolCall | None, decision: ApprovalDecision,
                 mcp_tools: dict[str, McpToolInfo]) -> str | None:
    """Why edited arguments cannot run, or None: checked as the tool registry checks the
    model's own call (its argument model), stricter on names (a misspelt optional argument
    would otherwise be dropped without a word)."""
    if decision.arguments is None:
        return None
    if not decision.approved:
        return "edited arguments go with an approval (a rejection runs nothing)"
    if call is None:
        return (f"call {decision.call_id} is not in the turn this run is in: approve or "
                "reject it as it is")
    declaration, mcp_tool = TOOLS.get(call.name), mcp_tools.get(call.name)
    if mcp_tool is not None:
        refusal = _schema_refusal(mcp_tool.parameters, decision.arguments)
    elif declaration is not None:
        refusal = _builtin_refusal(declaration.args, decision.arguments)
    else:
        return f"{call.name} is no tool this task knows: approve or reject it as it is"
    return f"invalid arguments for {call.name}: {refusal}" if refusal else None


def approved_call(call: ToolCall, decision: ApprovalDecision) -> ToolCall:
    """The call as it runs: the model's, or with the arguments the person approved (the
    model's justification, if it gave one, kept)."""
    if decision.arguments is None or decision.arguments == call.arguments:
        return call
    arguments = dict(decision.arguments)
    if JUSTIFICATION in call.arguments:
        arguments.setdefault(JUSTIFICATION, call.arguments[JUSTIFICATION])
    return call.model_copy(update={"arguments": arguments})


def decided_event(decision: ApprovalDecision, call: ToolCall, ran: ToolCall) -> dict[str, Any]:
    """The `approval_decided` event: the decision, and an edit's original and edited
    arguments (a decision without one reads as it always did)."""
    data = decision.model_dump(mode="json", exclude={"arguments"})
    if ran is not call:
        data.update(edited=True, original_arguments=call.arguments, arguments=ran.arguments)
    return data


def with_edit_note(result: ToolResult, call: ToolCall, ran: ToolCall) -> ToolResult:
    """The result the model reads, told that its call ran with the person's arguments."""
    if ran is call:
        return result
    shown = truncate(json.dumps(ran.arguments, ensure_ascii=False), EDIT_NOTE_CHARS)
    note = (f"Note: the user edited this call's arguments before approving it; it ran "
            f"with {shown}")
    return result.model_copy(update={"output": f"{note}\n{result.output}".rstrip()})


def wait_words(seconds: float) -> str:
    """A wait in words: 3 days, 12 h, 10 min, 1 s."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit}"
    return f"{seconds:g} s"


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

    def _refuse_decision(self, decision: ApprovalDecision) -> None:
        """The update's validator: a pending call, and edited arguments its tool takes."""
        validate_decision(self.state.approvals.waiting, decision)
        refusal = edit_refusal(waiting_call(self.state.calls.turn, decision.call_id),
                               decision, self.state.mcp.tools)
        if refusal:
            raise InvalidApprovalEdit(refusal)

    async def _await_approval(self, call: ToolCall, call_key: str) -> ToolCall | ToolResult:
        """The call to run (as the model asked, or with the arguments the person approved),
        or a denied tool result when it was rejected."""
        inp = self.state.input
        if not needs_approval(inp.approval_mode, call, self._tool_properties(call.name)):
            return call
        pending = self.state.approvals.waiting
        if call_key not in pending:  # else asked before a hand-over: still the same call
            pending[call_key] = None
            # `expires_at`: when the task ends incomplete if nobody decides (a hand-over
            # starts the wait again in the next run)
            expires = workflow.now() + timedelta(seconds=inp.approval_timeout_s)
            self._emit("approval_required",
                       {"call_id": call_key, "tool": call.name, "args": call.arguments,
                        "expires_at": expires.isoformat()})
        self._show()
        await self._record(self._visible_status())
        label = approval_label(call, self.state.mcp.tools)
        try:
            await workflow.wait_condition(
                lambda: pending[call_key] is not None or self.interrupt_due(),
                timeout=timedelta(seconds=inp.approval_timeout_s),
                # The Web UI shows the timer by this name (else an unlabelled 10 minutes).
                timeout_summary=f"waiting for approval: {label}",
            )
        except TimeoutError:
            pending.pop(call_key, None)
            waited = wait_words(inp.approval_timeout_s)
            self._emit("approval_expired", {"call_id": call_key, "tool": call.name,
                                            "waited": waited})
            raise ApprovalUnanswered(
                f"no decision on call {call_key} ({label}) within {waited}") from None
        if pending[call_key] is None:  # handed over while it waits: asked again after
            raise InterruptNow()
        decision = take_decision(pending, call_key, forget=True)
        ran = approved_call(call, decision)
        self._emit("approval_decided", decided_event(decision, call, ran))
        self._show()
        # Another call may still wait (its own wait writes again when it ends).
        await self._record(self._visible_status())
        if decision.approved:
            return ran
        reason = f": {decision.comment}" if decision.comment else ""
        return ToolResult(ok=False, error=f"E_DENIED: the user rejected this call{reason}")
