"""Pure, deterministic decisions of the agent loop, unit-tested without Temporal.

No I/O, no clock, no randomness: workflows call these and only apply the results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from refloop.contract import tool_catalog
from refloop.contract.activity_io import ToolConstraints, ToolResult
from refloop.contract.mcp import is_untrusted
from refloop.contract.messages import COMPLETE_STEP as COMPLETE_STEP  # agent.py reads it here
from refloop.contract.messages import (
    ChatMessage,
    IntentLabel,
    IntentResult,
    Plan,
    ToolCall,
    ToolSpec,
)
from refloop.contract.task import Event
from refloop.contract.text import first_json_object
from refloop.contract.tool_properties import ToolProperties

NO_PLANNING_INTENTS = frozenset({IntentLabel.GENERAL_CHAT, IntentLabel.CAPABILITY_QUERY})
_FENCE = re.compile(r"```(?:json|JSON)?\s*(\{.*?\})\s*```", re.DOTALL)
_TOOL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_QUESTION_START = re.compile(
    r"^\s*(what|who|whom|whose|when|where|why|how|which|explain|describe|tell me|define|"
    r"hi|hello|hey|thanks|thank you)\b", re.IGNORECASE)
_WORK_WORDS = re.compile(
    r"\b(write|create|save|edit|modify|fix|add|remove|delete|rename|refactor|implement|"
    r"generate|update|change|run|install|build|commit|read|open|list|search|find)\b|"
    r"[\w-]+\.(?:md|txt|py|js|ts|json|ya?ml|toml|csv|html|css|sh)\b", re.IGNORECASE)
# Verbs of a task that asks for files to change: read when the model could not say.
_CHANGE_WORDS = re.compile(
    r"\b(write|create|save|edit|modify|fix|add|append|remove|delete|rename|move|refactor|"
    r"implement|generate|update|change|replace|commit)\b", re.IGNORECASE)
UNKNOWN_INTENTS = frozenset({IntentLabel.UNCERTAIN})


# ---------------------------------------------------------------- decision gate


def should_plan(intent: IntentResult | None, enable_planning: bool) -> bool:
    """Decision gate: chat and capability questions skip explicit planning."""
    if not enable_planning:
        return False
    return intent is None or intent.intent not in NO_PLANNING_INTENTS


def validate_plan(
    plan: Plan, known_tools: Iterable[str], constraints: ToolConstraints | None = None
) -> list[str]:
    """Violations that send the plan back for a bounded re-plan; empty when valid.

    Every step names a known tool; no forbidden tool appears; generation tools
    come last - after the first one, at most one other (verifying) step may follow.
    """
    known = set(known_tools) - {COMPLETE_STEP}
    violations = []
    forbidden = set(constraints.forbidden) if constraints else set()
    for number, step in enumerate(plan.steps, start=1):
        if step.tool not in known:
            violations.append(
                f"step {number} uses unknown tool '{step.tool}'; choose one of: "
                + ", ".join(sorted(known))
            )
        elif constraints is not None and step.tool in forbidden:  # else none is
            violations.append(
                f"step {number} uses '{step.tool}', forbidden for {constraints.task_type} "
                f"tasks; allowed: {', '.join(constraints.allowed) or 'any other tool'}"
            )
    generation = set(constraints.generation_tools) if constraints else set()
    positions = [n for n, step in enumerate(plan.steps, start=1) if step.tool in generation]
    if positions:
        trailing = [n for n in range(positions[0], len(plan.steps) + 1)
                    if plan.steps[n - 1].tool not in generation]
        if len(trailing) > 1:
            violations.append(
                f"step {positions[0]} generates output ({plan.steps[positions[0] - 1].tool}) "
                f"too early: steps {trailing} come after it; put generation steps last"
            )
    return violations


# ---------------------------------------------------------------- history


# ---------------------------------------------------------------- tool-call parsing


def _as_tool_call(candidate: str | None, call_id: str, every_form: bool = True
                  ) -> ToolCall | None:
    """`{"tool": N, "args": {..}}`, `{"name": N, "arguments": {..} or "{..}"}`, or either
    wrapped as `{"function": {...}}`; only the first form when not `every_form`."""
    if not candidate:
        return None
    try:
        obj = json.loads(candidate)
    except json.JSONDecodeError:
        return None
    if every_form and isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict):
        return None
    name = obj.get("tool", obj.get("name")) if every_form else obj.get("tool")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("args", obj.get("arguments", obj.get("parameters", {}) if every_form else {}))
    if every_form and isinstance(args, str):  # OpenAI's wire form: arguments as JSON text
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=call_id, name=name, arguments=args)


def parse_text_tool_call(text: str | None, call_id: str, every_form: bool = True
                         ) -> ToolCall | None:
    """Tolerant parsing of a tool call written as text by a model without native
    tool calls: `{"tool": NAME, "args": {...}}` or `{"name": NAME, "arguments": {...}}`.

    Tried in order: a `<tool_call>` tag, the whole text as JSON, a fenced ```json block,
    the first {...} object. Without `every_form` (runs started before the other forms were
    accepted): only `{"tool": ...}`, and no tag.
    """
    if not text or "{" not in text:
        return None
    tagged = _TOOL_TAG.search(text) if every_form else None
    fenced = _FENCE.search(text)
    candidates = (
        first_json_object(tagged.group(1)) if tagged else None,
        text.strip(),
        fenced.group(1) if fenced else None,
        first_json_object(text),
    )
    for candidate in candidates:
        call = _as_tool_call(candidate, call_id, every_form)
        if call is not None:
            return call
    return None


# ---------------------------------------------------------------- feeding results back


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... truncated {len(text) - limit} characters ...]"


def format_tool_result(name: str, result: ToolResult, limit: int) -> str:
    """What the model sees of a tool result: status, error and a bounded output."""
    if result.ok:
        return truncate(f"[{name}] ok\n{result.output}", limit)
    body = f"[{name}] error: {result.error}"
    if result.output:
        body += f"\n{result.output}"
    return truncate(body, limit)


def tool_result_message(call: ToolCall, structured: bool, text: str) -> ChatMessage:
    """Structured calls (the API's `tool_calls`) answer with a `tool` turn; calls parsed
    out of the text with a user turn."""
    if structured:
        return ChatMessage(role="tool", tool_call_id=call.id, name=call.name, content=text)
    return ChatMessage(role="user", content=f"Tool result for {call.name}:\n{text}")


def assistant_tool_message(content: str | None, calls: list[ToolCall],
                           structured: bool) -> ChatMessage:
    """The assistant turn that carried the calls; text calls are cleaned to their JSON."""
    if structured:
        return ChatMessage(role="assistant", content=content, tool_calls=calls)
    call = calls[0]
    return ChatMessage(
        role="assistant", content=json.dumps({"tool": call.name, "args": call.arguments})
    )


def tool_call_summary(call: ToolCall, limit: int = 80) -> str:
    """A one-line label for the Web UI and progress output."""
    args = call.arguments
    key = next(
        (args[k] for k in ("path", "file_path", "command", "pattern", "query") if k in args),
        None,
    )
    label = f"{call.name} {key}" if key is not None else call.name
    return label if len(label) <= limit else label[: limit - 1] + "…"


# ---------------------------------------------------------------- plan progress


def complete_step(
    plan: Plan | None, completed: list[int], arguments: dict[str, Any]
) -> tuple[ToolResult, list[int]]:
    """Mark a 1-based plan step done; returns the tool result and the new completed list."""
    if plan is None:
        return ToolResult(ok=False, error="there is no plan; just continue the task"), completed
    step = arguments.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return ToolResult(ok=False, error="E_INVALID_ARGS: 'step' must be an integer"), completed
    if not 1 <= step <= len(plan.steps):
        return (
            ToolResult(ok=False, error=f"step must be between 1 and {len(plan.steps)}"),
            completed,
        )
    done = sorted(set(completed) | {step})
    remaining = [n for n in range(1, len(plan.steps) + 1) if n not in done]
    note = f"step {step} marked complete"
    note += f"; next: step {remaining[0]}: {plan.steps[remaining[0] - 1].goal}" if remaining else (
        "; all steps complete, give your final answer"
    )
    return ToolResult(ok=True, output=note, data={"step": step}), done


def current_step(plan: Plan | None, completed: list[int]) -> int | None:
    if plan is None:
        return None
    return next((n for n in range(1, len(plan.steps) + 1) if n not in completed), None)


# ---------------------------------------------------------------- prompts


def system_prompt(custom: str | None, tools: list[ToolSpec], workspace: str,
                  context: str | None = None) -> str:
    base = custom or (
        "You are refloop, a careful software and writing agent. Work in small verified steps. "
        "Call one tool at a time; after finishing a plan step call complete_step. "
        "When the task is done, answer without a tool call, stating what you did."
    )
    names = ", ".join(spec.name for spec in tools)
    prompt = (
        f"{base}\n\nWorkspace: {workspace} (all paths are relative to it).\n"
        f"Tools: {names}.\nIf native tool calls are unavailable, reply with exactly one JSON "
        'object {"tool": NAME, "args": {...}}, the args matching the tool\'s schema:\n'
        + tool_signatures(tools)
    )
    return f"{prompt}\n\n{context}" if context else prompt


def tool_signatures(tools: list[ToolSpec]) -> str:
    """One line per tool: name, argument schema (required ones marked) and description,
    so a model without native tool calls can still call every tool correctly."""
    lines = []
    for spec in tools:
        props = spec.parameters.get("properties", {})
        required = set(spec.parameters.get("required", []))
        args = ", ".join(
            f"{name}{'' if name in required else '?'}: {_type_of(schema)}"
            for name, schema in props.items()
        )
        # A server-written description stays in the tool definition, fenced; never here.
        description = ("an MCP tool: its server's description is in the tool definition"
                       if is_untrusted(spec.description)
                       else spec.description.strip().split("\n")[0][:160])
        lines.append(f"- {spec.name}({args}): {description}")
    return "\n".join(lines)


def _type_of(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return "|".join(_type_of(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type_of(schema.get('items', {}))}"
    return str(kind)


# ---------------------------------------------------------------- honest outcomes


DIRECT_ANSWER_PROMPT = (
    "You are refloop. Answer the user's question directly and briefly, in plain text. "
    "No tools are available for this answer."
)


def is_question(task: str) -> bool:
    """A question or chat line that needs no tools ("What is 2+2?"): answered directly
    when it cannot be planned. Anything naming work or a file is not."""
    text = task.strip()
    if not text or len(text) > 300 or _WORK_WORDS.search(text):
        return False
    return text.endswith("?") or bool(_QUESTION_START.match(text))


def question_planned_as_edits(task: str, intent: IntentResult | None, plan: Plan | None,
                              edit_tools: set[str]) -> str | None:
    """Why a valid plan is set aside for a direct answer, or None to follow it.

    A question that names no work and no file ("What is 2+2?") asks for no change; a plan
    that edits anyway is the model misreading it (small models plan `write_file` for
    anything), and following it would end the run `incomplete` or write a stray file.
    Unless intent said the task is code work, such a question is answered without tools."""
    if plan is None or not is_question(task):
        return None
    if intent is not None and intent.intent in (IntentLabel.CODING_TASK,
                                                IntentLabel.REPO_ANALYSIS):
        return None
    edits = sorted({step.tool for step in plan.steps if step.tool in edit_tools})
    if not edits:
        return None
    return f"the task is a question, but the plan edits the workspace ({', '.join(edits)})"


PropertiesOf = Callable[[str], ToolProperties | None]


def is_edit(tool: str, arguments: dict[str, Any], edit_tools: set[str],
            properties_of: PropertiesOf = tool_catalog.tool_properties) -> bool:
    """A call of one of `edit_tools` that edits: not a read-only sub-command, as the tool's
    properties (`properties_of`: the run's, default the code's) name them."""
    properties = properties_of(tool)
    return tool in edit_tools and properties is not None \
        and properties.kind_of(arguments) != "read"


def may_change_workspace(tool: str, arguments: dict[str, Any],
                         properties_of: PropertiesOf = tool_catalog.tool_properties) -> bool:
    """A call that can change the workspace: a built-in that writes or runs a command (not a
    read, not a control tool), or a tool refloop does not declare (an MCP server's)."""
    properties = properties_of(tool)
    return properties is None or properties.kind_of(arguments) in ("write", "execute")


def checkpoint_after(tool: str, arguments: dict[str, Any], ok: bool,
                     properties_of: PropertiesOf = tool_catalog.tool_properties) -> bool:
    """A call after which the workspace is checkpointed: one that may have changed it. A
    failed edit changed nothing; a failed command or MCP call may have changed anything."""
    if not may_change_workspace(tool, arguments, properties_of):
        return False
    properties = properties_of(tool)
    return ok or properties is None or properties.kind_of(arguments) == "execute"


def successful_calls(events: Iterable[Event], counted: Callable[[str, dict[str, Any]], bool]
                     ) -> int:
    """Calls that succeeded and that `counted(tool, arguments)` accepts, from a run's
    events."""
    args: dict[Any, dict[str, Any]] = {}  # by the call's id
    count = 0
    for event in events:
        if event.type == "tool_call":
            args[event.data.get("id")] = event.data.get("args") or {}
        elif event.type == "tool_result" and event.data.get("ok") and counted(
                event.data.get("tool", ""), args.get(event.data.get("id"), {})):
            count += 1
    return count


def successful_edits(events: Iterable[Event], edit_tools: set[str]) -> int:
    """Edit calls that succeeded, counted from a run's events."""
    return successful_calls(events, lambda tool, arguments: is_edit(tool, arguments, edit_tools))


def asks_for_change(task: str) -> bool:
    """The task's own words ask for files to change ("Create hello.txt ..."); read only
    when the model could not classify it. A question about a change ("How do I fix
    app.py?") asks for none; a request put as one ("Can you fix app.py?") does."""
    text = task.strip()
    asks_how = text.endswith("?") and bool(_QUESTION_START.match(text))
    return bool(_CHANGE_WORDS.search(text)) and not asks_how


def edit_task_without_plan(intent: IntentResult | None, plan: Plan | None,
                           direct_answer: bool, task: str = "",
                           read_unknown_intent: bool = False) -> bool:
    """A run with no plan (planning off) whose intent is to change or create files: it is
    done only once a call that can change the workspace succeeded. A question answered
    directly is not such a run.

    With `read_unknown_intent`, a run whose intent is unknown (the classification failed
    open, or said UNCERTAIN) is such a run when the task's words ask for a change: a
    failed classification must not let "Create hello.txt" end `completed` without it."""
    if plan is not None or direct_answer:
        return False
    if intent is not None and intent.intent == IntentLabel.CODING_TASK:
        return True
    unknown = intent is None or intent.intent in UNKNOWN_INTENTS
    return read_unknown_intent and unknown and asks_for_change(task)


def missing_work(plan: Plan | None, edit_tools: set[str], edits_ok: int,
                 last_verdict: dict[str, Any] | None,
                 edit_task_unplanned: bool = False) -> list[str]:
    """Why a run that reached its end is not done; empty: it may end `completed`.

    - the plan has a step that edits the workspace, but no edit tool call succeeded;
    - the task, run without a plan, asks for changes (`edit_task_unplanned`: its count of
      successful calls that may change the workspace is `edits_ok`), and there were none;
    - the last completeness verdict (not a fail-open one) still found gaps.
    """
    missing: list[str] = []
    steps = [f"step {n}: {step.goal} ({step.tool})"
             for n, step in enumerate(plan.steps if plan else [], start=1)
             if step.tool in edit_tools]
    if steps and edits_ok == 0:
        missing.append("the plan requires changes but no edit succeeded: " + "; ".join(steps))
    elif edit_task_unplanned and edits_ok == 0:
        missing.append("the task asks to change or create files but no call that changes "
                       "the workspace succeeded")
    if last_verdict and not last_verdict.get("is_complete", True) \
            and not last_verdict.get("fail_open"):
        aspects = [str(a) for a in last_verdict.get("missing_aspects") or []]
        missing += aspects or ["the completeness check found the task incomplete"]
    return missing


def task_message(task: str, plan: Plan | None, prior_context: str | None = None) -> str:
    text = f"{task}\n\n{prior_context}" if prior_context else task
    if plan is None:
        return text
    steps = "\n".join(
        f"{n}. {step.goal} (tool: {step.tool})" for n, step in enumerate(plan.steps, start=1)
    )
    return f"{text}\n\nPlan ({plan.task_type.value}):\n{steps}"


def check_constraints(constraints: ToolConstraints | None, enforce: bool, call: ToolCall,
                      step: int | None, iteration: int, justified_tools: list[str]
                      ) -> tuple[dict[str, Any] | None, ToolResult | None]:
    """A forbidden tool of the task type: the violation to record, and the refusal unless
    a justification excuses it (once per tool). (None, None): the call is not forbidden."""
    if constraints is None or not enforce or call.name not in constraints.forbidden:
        return None, None
    justification = call.arguments.get("justification")
    justified = bool(justification) and call.name not in justified_tools
    violation = {"tool": call.name, "step": step, "iteration": iteration,
                 "justified": justified, "justification": justification}
    if justified:
        return violation, None
    allowed = ", ".join(constraints.allowed) or "any other tool"
    return violation, ToolResult(
        ok=False,
        error=f"E_FORBIDDEN: '{call.name}' is not allowed for {constraints.task_type} "
        f"tasks; use one of: {allowed}. If it is truly necessary, call it again with a "
        "'justification' argument (allowed once).",
    )


# A violation's justification as the state carries it (the whole is in its event)
JUSTIFICATION_CHARS = 300


def carried_violations(violations: list[dict[str, Any]], violation: dict[str, Any],
                       keep: int) -> list[dict[str, Any]]:
    """The violations a task carries after `violation`: the last `keep`, each with its
    justification cut short (the state counts them all)."""
    justification = violation.get("justification")
    if isinstance(justification, str):
        violation = {**violation, "justification": truncate(justification, JUSTIFICATION_CHARS)}
    return [*violations, violation][-keep:]


SUMMARY_EVENTS = frozenset({"plan", "tool_call", "tool_result", "step", "reflection",
                            "reflection_plan", "reflection_exec"})


def summary_transcript(events: Iterable[Event], supplements: list[dict[str, Any]],
                       answer: str) -> str:
    """What the summary model reads: the run's events, its supplements and the answer,
    each cut short."""
    transcript = "\n".join(
        f"{event.type}: {json.dumps(event.data, ensure_ascii=False)[:300]}"
        for event in events if event.type in SUMMARY_EVENTS
    )
    for record in supplements:
        transcript += f"\nsupplement: {json.dumps(record, ensure_ascii=False)[:500]}"
    return f"{transcript}\nfinal answer: {answer}"


def abnormal_output_message(reason: str) -> str:
    return (
        f"Your previous output was abnormal ({reason}) and was discarded. "
        "Answer again concisely: one tool call, or the final answer."
    )


# What the events a result or a continued run carries may weigh, in JSON bytes.
CARRIED_EVENT_BYTES = 128_000


def recent_events(events: list[Event], count: int, max_bytes: int) -> list[Event]:
    """The latest `count` events whose JSON fits in `max_bytes`: what a result or a continued
    run carries (older events keep their sequence numbers' gap)."""
    kept: list[Event] = []
    size = 0
    for event in reversed(events[-count:]):
        size += len(event.model_dump_json().encode())
        if size > max_bytes:
            break
        kept.append(event)
    return kept[::-1]


def act_tools(names: list[str]) -> tuple[list[str], bool]:
    """How an `act` names its tools, (tool_names, every_tool): the whole catalogue by the
    flag (170 bytes less of every step's history), any other list by name."""
    if names and names == [spec.name for spec in tool_catalog.tool_specs()]:
        return [], True
    return names, False
