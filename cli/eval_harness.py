"""`refloop eval`: early-reflection metrics over a suite of scripted scenarios, triggers on vs off.

Each scenario runs through the real AgentTaskWorkflow (embedded Temporal, scripted model
over HTTP). Scenario entries marked `when_contains: "Reflection triggered"` answer only
requests that carry guidance, so recovery after a trigger is measurable.
"""

from __future__ import annotations

import statistics
import tempfile
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from refloop.contract.messages import COMPLETE_STEP
from refloop.contract.task import TaskInput, TaskResult, TriggerConfig
from refloop.llm.scenario import load_scenario
from refloop.llm.scripted import ScriptedLLMServer
from refloop.settings import Settings

READ_ONLY = frozenset({"list_dir", "read_file", "glob_file_search", "grep"})


class EvalScenario(BaseModel):
    name: str
    kind: str
    task: str
    files: dict[str, str] = Field(default_factory=dict)
    expect: dict[str, Any] = Field(default_factory=dict)
    max_iterations: int = 12
    triggers: dict[str, Any] = Field(default_factory=dict)
    responses: dict[str, Any]


class RunOutcome(BaseModel):
    scenario: str
    kind: str
    mode: str
    completed: bool
    iterations: int
    triggers: list[dict[str, Any]]
    deviations: int
    tool_calls: int
    stuck_latency: int | None = None  # iterations from the stall's start to the first trigger
    loop_detection: int | None = None  # repeated calls seen when the loop was flagged


def load_suite(directory: str | None) -> list[EvalScenario]:
    root = Path(directory) if directory else Path(str(resources.files("refloop") / "eval_suite"))
    scenarios = []
    for path in sorted(root.glob("*.yaml")):
        scenario = EvalScenario.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        load_scenario({"name": scenario.name, "responses": scenario.responses})  # validate
        scenarios.append(scenario)
    if not scenarios:
        raise ValueError(f"no scenarios (*.yaml) in {root}")
    return scenarios


def measure(scenario: EvalScenario, mode: str, result: TaskResult, workspace: Path
            ) -> RunOutcome:
    """The early-reflection metrics of one run, from its events."""
    plan_tools = [step.tool for step in result.plan.steps] if result.plan else []
    step, deviations, calls = 1, 0, 0
    for event in result.events:
        if event.type == "step" and event.data.get("step"):
            step = event.data["step"]
        if event.type == "tool_result" and event.data["tool"] != COMPLETE_STEP:
            calls += 1
            planned = plan_tools[step - 1] if plan_tools and step <= len(plan_tools) else None
            tool = event.data["tool"]
            if planned and event.data["ok"] and tool != planned and tool not in READ_ONLY:
                deviations += 1
    fired = [event.data for event in result.events
             if event.type == "reflection" and event.data.get("trigger") not in (
                 "completeness", "quality_review")]
    first = min((t["iteration"] for t in fired), default=None)
    loops = [t["iteration"] for t in fired if t["trigger"] == "repetition"]
    expected_file = scenario.expect.get("file")
    completed = result.status == "completed" and (
        expected_file is None or (workspace / expected_file).exists())
    stall_from, loop_from = scenario.expect.get("stall_from"), scenario.expect.get("loop_from")
    return RunOutcome(
        scenario=scenario.name, kind=scenario.kind, mode=mode, completed=completed,
        iterations=result.stats.iterations, triggers=fired, deviations=deviations,
        tool_calls=calls,
        stuck_latency=first - stall_from + 1 if stall_from and first else None,
        loop_detection=min(loops) - loop_from + 1 if loop_from and loops else None,
    )


def eval_settings(settings: Settings, tmp: Path, model_url: str) -> Settings:
    """The suite's settings: its own scripted model and task queue (a `refloop up` on the
    same data dir never runs its tasks); the data dir and ports the operator gave
    (REFLOOP_DATA_DIR, REFLOOP_TEMPORAL_PORT...), else a temporary data dir."""
    data_dir = settings.refloop_data_dir if "refloop_data_dir" in settings.model_fields_set \
        else tmp / "data"
    return settings.model_copy(update={
        "openai_base_url": model_url, "openai_api_key": "eval", "refloop_data_dir": data_dir,
        "temporal_address": None, "refloop_task_queue": f"eval-{uuid.uuid4().hex[:8]}"})


async def run_suite(scenarios: list[EvalScenario], given: Settings) -> list[RunOutcome]:
    from temporalio.client import WorkflowFailureError

    from refloop.worker.stack import embedded_stack
    from refloop.workflows.agent import AgentTaskWorkflow

    outcomes = []
    with tempfile.TemporaryDirectory() as tmp, ScriptedLLMServer() as llm:
        settings = eval_settings(given, Path(tmp), llm.base_url)
        async with embedded_stack(settings) as stack:
            for scenario in scenarios:
                for mode in ("on", "off"):
                    name = f"{scenario.name}-{mode}"
                    llm.load(name, {"name": name, "responses": scenario.responses})
                    workspace = Path(tmp) / name
                    for rel, text in scenario.files.items():
                        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
                        (workspace / rel).write_text(text, encoding="utf-8")
                    workspace.mkdir(exist_ok=True)
                    triggers = TriggerConfig(**scenario.triggers)
                    if mode == "off":
                        triggers = triggers.model_copy(
                            update={"enabled": False, "enforce_constraints": False})
                    handle = await stack.client.start_workflow(
                        AgentTaskWorkflow.run,
                        TaskInput(task=scenario.task, workspace=str(workspace), model=name,
                                  max_iterations=scenario.max_iterations, triggers=triggers,
                                  enable_reflection=False),
                        id=f"eval-{name}", task_queue=stack.settings.task_queue,
                    )
                    try:
                        result = await handle.result()
                    except WorkflowFailureError as failure:
                        result = TaskResult.model_validate(failure.cause.details[0])
                    outcomes.append(measure(scenario, mode, result, workspace))
    return outcomes


def summarise(outcomes: list[RunOutcome]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for mode in ("on", "off"):
        runs = [o for o in outcomes if o.mode == mode]
        calls = sum(o.tool_calls for o in runs)
        stuck = [o.stuck_latency for o in runs if o.stuck_latency is not None]
        loops = [o.loop_detection for o in runs if o.loop_detection is not None]
        table[mode] = {
            "plan_deviation_rate": sum(o.deviations for o in runs) / calls if calls else 0.0,
            "stuck_detection_latency": statistics.mean(stuck) if stuck else None,
            "loop_detection_point": statistics.mean(loops) if loops else None,
            "completion_rate": sum(o.completed for o in runs) / len(runs),
            "average_iterations": statistics.mean(o.iterations for o in runs),
            "healthy_triggers": sum(len(o.triggers) for o in runs if o.kind == "healthy"),
        }
    return table


def render(table: dict[str, dict[str, Any]], outcomes: list[RunOutcome]) -> str:
    def cell(value: Any, percent: bool = False) -> str:
        if value is None:
            return "not detected"
        return f"{value:.0%}" if percent else (f"{value:.2f}" if isinstance(value, float)
                                               else str(value))

    rows = [
        ("plan deviation rate", "plan_deviation_rate", True),
        ("stuck detection latency (iterations)", "stuck_detection_latency", False),
        ("loop detection point (repeated calls)", "loop_detection_point", False),
        ("completion rate", "completion_rate", True),
        ("average iterations", "average_iterations", False),
        ("triggers on healthy traces", "healthy_triggers", False),
    ]
    lines = ["| metric | triggers on | triggers off |", "| --- | --- | --- |"]
    lines += [f"| {label} | {cell(table['on'][key], pct)} | {cell(table['off'][key], pct)} |"
              for label, key, pct in rows]
    lines.append("")
    lines.append("| scenario | kind | on: done / iterations / triggers | off: done / iterations |")
    lines.append("| --- | --- | --- | --- |")
    by_name: dict[str, dict[str, RunOutcome]] = {}
    for outcome in outcomes:
        by_name.setdefault(outcome.scenario, {})[outcome.mode] = outcome
    for name, modes in by_name.items():
        on, off = modes["on"], modes["off"]
        fired = ", ".join(sorted({t["trigger"] for t in on.triggers})) or "-"
        lines.append(f"| {name} | {on.kind} | {'yes' if on.completed else 'no'} / "
                     f"{on.iterations} / {fired} | {'yes' if off.completed else 'no'} / "
                     f"{off.iterations} |")
    return "\n".join(lines)
