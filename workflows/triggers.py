"""Early-reflection triggers: pure functions over the loop's records.

Each trigger looks at what the agent did so far and returns evidence when it should stop
and think; `evaluate` applies the cool-down and escalation, `guidance` words the message
that goes into the next `act` request.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from refloop.contract.activity_io import ToolResult
from refloop.contract.messages import COMPLETE_STEP
from refloop.contract.task import TriggerConfig

if TYPE_CHECKING:
    from refloop.contract.tool_properties import ToolProperties

EMPTY_OUTPUTS = frozenset({"", "(empty)", "(no matches)", "(empty file)"})
ADVICE = {
    "result_anomaly": "Read the error or empty result, then fix the arguments or choose "
                      "another tool; do not retry the same call unchanged.",
    "repetition": "Stop repeating this call at once: try a different approach or move on to "
                  "the next step.",
    "step_stuck": "Decide whether the current step is already done (then call complete_step) "
                  "or needs a different approach; consider splitting it.",
    "slow_progress": "Simplify: take one concrete action that advances the plan, or move on.",
    "checkpoint": "You are behind schedule: prioritise the remaining plan steps and skip "
                  "anything optional.",
}


class LoopRecord(BaseModel):
    """One executed tool call, as the triggers see it."""

    iteration: int
    step: int | None
    tool: str
    args_key: str
    anomaly: str | None = None
    advanced: bool = False  # a successful complete_step


class Trigger(BaseModel):
    name: str
    evidence: str
    level: int = 1  # 2+: fired before and was ignored


class TriggerState(BaseModel):
    last_fired: dict[str, int] = Field(default_factory=dict)
    fire_counts: dict[str, int] = Field(default_factory=dict)


# Calls the triggers remember (a task of thousands of calls carries only these).
LOOP_WINDOW = 300


def args_digest(arguments: dict[str, Any]) -> str:
    """`args_key`, short: the triggers only compare keys."""
    return hashlib.sha256(args_key(arguments).encode()).hexdigest()[:16]


def args_key(arguments: dict[str, Any]) -> str:
    """Arguments normalised for comparison: reading two files is not a loop."""
    cleaned = {k: v.strip() if isinstance(v, str) else v for k, v in arguments.items()
               if k != "justification"}
    return json.dumps(cleaned, sort_keys=True, ensure_ascii=False)


def anomaly_of(result: ToolResult, properties: ToolProperties | None) -> str | None:
    """A failure, or an empty result from a tool that `expects_output` (a read or search;
    an empty directory listing is an answer)."""
    if not result.ok:
        error = result.error or "failed"
        return "denied" if error.startswith(("E_DENIED", "E_POLICY", "E_FORBIDDEN")) else (
            f"error: {error[:120]}")
    content = properties is not None and properties.expects_output
    if content and result.output.strip().split("\n")[-1] in EMPTY_OUTPUTS:
        return "empty result"
    return None


def _real_calls(records: list[LoopRecord]) -> list[LoopRecord]:
    """The calls that did work: the plan's own step marker left out."""
    return [r for r in records if r.tool != COMPLETE_STEP]


def result_anomaly(records: list[LoopRecord], iteration: int) -> str | None:
    bad = [r for r in _real_calls(records) if r.iteration == iteration and r.anomaly]
    return "; ".join(f"{r.tool}: {r.anomaly}" for r in bad) or None


def repetition(records: list[LoopRecord], threshold: int) -> str | None:
    calls = _real_calls(records)
    if not calls:
        return None
    last = calls[-1]
    same = sum(1 for r in calls if (r.tool, r.args_key) == (last.tool, last.args_key))
    if same >= threshold:
        return f"{last.tool} called {same} times with the same arguments"
    if len(calls) >= 4:
        a, b, c, d = ((r.tool, r.args_key) for r in calls[-4:])
        if a == c and b == d and a != b:
            return f"alternating between {calls[-4].tool} and {calls[-3].tool} (A/B/A/B)"
    return None


def step_stuck(records: list[LoopRecord], iteration: int, step: int | None,
               step_started: int, config: TriggerConfig) -> str | None:
    if step is None:
        return None
    on_step = iteration - step_started + 1
    executions = sum(1 for r in _real_calls(records)
                     if r.step == step and r.iteration >= step_started)
    if on_step >= config.stuck_iterations:
        return f"plan step {step} unchanged for {on_step} iterations"
    if executions > config.stuck_tool_executions:
        return f"{executions} tool executions on plan step {step}"
    return None


def slow_progress(records: list[LoopRecord], iteration: int, window: int) -> str | None:
    """At every `window`-th iteration: no step advance and no new successful result."""
    if iteration < window or iteration % window:
        return None
    recent = [r for r in records if r.iteration > iteration - window]
    if any(r.advanced for r in recent):
        return None
    earlier = {(r.tool, r.args_key) for r in records if r.iteration <= iteration - window}
    fresh = [r for r in _real_calls(recent)
             if not r.anomaly and (r.tool, r.args_key) not in earlier]
    if fresh:
        return None
    return f"no plan progress and no new result in the last {window} iterations"


def checkpoint(iteration: int, max_iterations: int, plan_steps: int,
               completed: int) -> str | None:
    """At 1/3 and 2/3 of the budget: fire only when behind schedule by more than one step."""
    marks = {max_iterations // 3: 1 / 3, (2 * max_iterations) // 3: 2 / 3}
    if plan_steps == 0 or iteration not in marks or iteration == 0:
        return None
    if (completed + 1) / plan_steps >= marks[iteration]:
        return None
    return (f"checkpoint {iteration}/{max_iterations} iterations with {completed}/"
            f"{plan_steps} plan steps done")


def evaluate(
    records: list[LoopRecord], iteration: int, max_iterations: int, step: int | None,
    step_started: int, plan_steps: int, completed: int, config: TriggerConfig,
    state: TriggerState,
) -> tuple[list[Trigger], TriggerState]:
    """All triggers that fire now, after the cool-down; escalation counts repeats."""
    if not config.enabled:
        return [], state
    found = {
        "result_anomaly": result_anomaly(records, iteration),
        "repetition": repetition(records, config.repeat_threshold),
        "step_stuck": step_stuck(records, iteration, step, step_started, config),
        "slow_progress": slow_progress(records, iteration, config.slow_window),
        "checkpoint": checkpoint(iteration, max_iterations, plan_steps, completed),
    }
    fired, last, counts = [], dict(state.last_fired), dict(state.fire_counts)
    for name, evidence in found.items():
        if evidence is None:
            continue
        if name in last and iteration - last[name] <= config.cooldown_iterations:
            continue
        counts[name] = counts.get(name, 0) + 1
        last[name] = iteration
        fired.append(Trigger(name=name, evidence=evidence, level=counts[name]))
    return fired, TriggerState(last_fired=last, fire_counts=counts)


def guidance(triggers: list[Trigger], quality_reflection: str | None) -> str | None:
    """One message for the next `act`: early-reflection triggers and review reflection."""
    parts = []
    if triggers:
        lines = ["⚠️ Reflection triggered"]
        for trigger in triggers:
            prefix = "AGAIN (you did not act on the last warning) " if trigger.level > 1 else ""
            lines.append(f"- {prefix}{trigger.name}: {trigger.evidence}. "
                         f"{ADVICE[trigger.name]}")
        lines.append("If the task is hard, break it into smaller sub-tasks.")
        parts.append("\n".join(lines))
    if quality_reflection:
        parts.append(quality_reflection)
    return "\n\n".join(parts) or None
