"""A task of thousands of tool calls stays within Temporal's limits: every payload small,
every run's history short, whatever the number of calls.

`REFLOOP_LONG_TASK_CALLS` sets the number of calls (default: a short form for `make test`;
`make long-task` runs 5,000, about nine minutes on a shared 2-core machine). The sizes of
each run's payloads are written to `.refloop-data/long-task-payloads.md`.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from refloop.contract.policies import REVIEWS_CARRIED
from refloop.contract.task import TaskInput
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history, replay_files
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.completeness_logic import RECORDS_IN_STATE
from refloop.workflows.triggers import LOOP_WINDOW
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, final, plan_of, result_of

CALLS = int(os.environ.get("REFLOOP_LONG_TASK_CALLS", "400"))
# Continue-as-new past this many history events (each call adds about six)
CAN_EVENTS = int(os.environ.get("REFLOOP_LONG_TASK_CAN_EVENTS", "500"))
CALLS_PER_TURN = 50
PAYLOAD_LIMIT = 512 * 1024
EVENTS_PER_RUN_LIMIT = 10_000
REPORT = Path(".refloop-data/long-task-payloads.md")


def largest_payload(event: HistoryEvent) -> int:
    """The largest payload an event carries (inputs, results, marker details, memo)."""
    largest = 0

    def visit(value) -> None:
        nonlocal largest
        if isinstance(value, Payload):
            largest = max(largest, value.ByteSize())
        elif hasattr(value, "ListFields"):
            for field, inner in value.ListFields():
                if field.message_type is not None:
                    visit(inner)
        elif hasattr(value, "values"):  # a map of messages
            for item in value.values():
                visit(item)
        else:  # a repeated message field
            for item in value:
                visit(item)

    visit(event)
    return largest


async def runs_of(client: Client, workflow_id: str, first_run_id: str,
                  keep_in: Path | None = None) -> list[list[HistoryEvent]]:
    """Each run's history, following continue-as-new from the first run (each also written
    to `keep_in`, for replay)."""
    runs, run_id = [], first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        if keep_in is not None:
            (keep_in / f"run-{len(runs) + 1}.json").write_text(dump_history(history))
        runs.append(list(history.events))
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.HasField("workflow_execution_continued_as_new_event_attributes")
                  else "")
    return runs


def field_sizes(value: object, path: str = "") -> dict[str, int]:
    """The JSON size of each field of a carried state, by its dotted path (a list whole)."""
    if isinstance(value, dict) and value:
        out: dict[str, int] = {}
        for key, inner in value.items():
            out.update(field_sizes(inner, f"{path}.{key}" if path else key))
        return out
    return {path: len(json.dumps(value, separators=(",", ":")))}


def carried_state(run: list[HistoryEvent]) -> dict:
    """The state a run started with (continue-as-new's input)."""
    start = run[0].workflow_execution_started_event_attributes.input.payloads[0].data
    return json.loads(start)["resume_state"]


def growth(before: dict, after: dict) -> dict[str, int]:
    """Fields whose size differs between two carried states: bytes gained (or lost)."""
    old, new = field_sizes(before), field_sizes(after)
    return {path: new.get(path, 0) - old.get(path, 0) for path in sorted({*old, *new})
            if new.get(path, 0) != old.get(path, 0)}


# What a continued run carries by design in windows that fill and empty with the calls
# (bounded by count and bytes, asserted apart): the recent events, the records since the
# last kept chunk, the triggers' recent calls, the last turn's results not yet sent.
WINDOWS = frozenset({"events", "calls.ledger", "calls.loop_records",
                     "conversation.unsent_turns"})
# Bytes the rest may differ by between two runs: counters gaining a digit (less than one
# more reference to kept records, 67 bytes)
COUNTER_SLACK = 40


def write_report(text: str) -> None:
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(text)


# Reviewed edits, more than a state carries: its reviews stay the recent ones, counted
REVIEWED_EDITS = REVIEWS_CARRIED + 5
PASS = {"json": {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}}
COMPLETE = {"json": {"is_complete": True, "analysis": "all read", "missing_aspects": [],
                     "supplements": []}}


def edit_calls() -> dict:
    return {"tool_calls": [
        {"name": "write_file", "arguments": {"path": f"e{n}.txt", "content": f"edit {n}\n"}}
        for n in range(REVIEWED_EDITS)]}


def read_calls(turn: int) -> dict:
    """One model turn of reads, each with its own arguments (file n of the workspace)."""
    return {"tool_calls": [
        {"name": "read_file", "arguments": {"path": f"f{(turn * CALLS_PER_TURN + n) % 20}.txt"}}
        for n in range(CALLS_PER_TURN)]}


@pytest.mark.slow
async def test_a_task_of_thousands_of_calls_keeps_payloads_and_histories_small(
        client, settings, scripted_llm, workspace, task_queue, tmp_path: Path):
    for n in range(20):
        (workspace / f"f{n}.txt").write_text(f"line of file {n}\n" * 3)
    turns = CALLS // CALLS_PER_TURN
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("read_file")],
        "act": [edit_calls(), *(read_calls(turn) for turn in range(turns)),
                final("read them all")],
        "quality_review": [PASS] * REVIEWED_EDITS,
        "completeness": [COMPLETE],
        "summary": [SUMMARY],
    })
    inp = TaskInput(task="read the files, again and again", workspace=str(workspace),
                    model=model, enable_reflection=True, enable_quality_review=True,
                    max_iterations=turns + 6,
                    continue_as_new_after_events=CAN_EVENTS)
    async with build_worker(client, settings, task_queue):
        handle = await client.start_workflow(
            AgentTaskWorkflow.run, inp, id=f"test-long-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue)
        result = await result_of(handle)
    assert result.status == "completed", result.missing
    assert result.stats.tool_calls == CALLS + REVIEWED_EDITS
    assert [r.file_path for r in result.quality_reviews] == \
        [f"e{n}.txt" for n in range(5, REVIEWED_EDITS)]  # the recent ones
    # The completeness judge read every call, in order: the kept chain, then the state's.
    judged = scripted_llm.requests(model=model, purpose="completeness")[0]["body"]
    history = re.findall(r"^\d+\. (\w+) ", judged["messages"][-1]["content"], re.MULTILINE)
    assert history == ["write_file"] * REVIEWED_EDITS + ["read_file"] * CALLS

    runs = await runs_of(client, handle.id, handle.first_execution_run_id, tmp_path)
    assert len(runs) > 2  # continued as new, more than once
    # Every run replays on the code (the chain of kept records, the bounded lists)
    assert await replay_files([tmp_path / f"run-{n}.json" for n in range(1, len(runs) + 1)]) \
        == {}
    lines = ["| run | history events | start input (bytes) | largest payload (bytes) |",
             "| --- | --- | --- | --- |"]
    for number, events in enumerate(runs, start=1):
        start = events[0].workflow_execution_started_event_attributes.input
        start_size = sum(payload.ByteSize() for payload in start.payloads)
        largest = max(largest_payload(event) for event in events)
        lines.append(f"| {number} | {len(events)} | {start_size} | {largest} |")
        assert len(events) < EVENTS_PER_RUN_LIMIT, (number, len(events))
        assert largest < PAYLOAD_LIMIT, (number, largest)
    # Field by field, what each continued run carries more than the one before it
    states = [carried_state(events) for events in runs[1:]]
    changes = [growth(before, after) for before, after in zip(states, states[1:], strict=False)]
    lines += ["", "| runs | fields whose size changed (bytes) |", "| --- | --- |"]
    lines += [f"| {n + 2}->{n + 3} | " + ", ".join(f"{k} {v:+d}" for k, v in change.items())
              + " |" for n, change in enumerate(changes)]
    write_report(f"{CALLS} tool calls, {len(runs)} runs\n\n" + "\n".join(lines) + "\n")
    # Outside its windows, the state carried at run k and at run k + m (from the first kept
    # chunk of records on) is the same size within a few bytes: nothing in it grows with
    # the task's length (the references to kept records did, 67 bytes a chunk).
    steady = [sum(size for path, size in field_sizes(state).items()
                  if path not in WINDOWS) for state in states
              if state["calls"]["kept_calls"]]
    assert len(steady) >= 2 and max(steady) - min(steady) <= COUNTER_SLACK, (steady, changes)
    # Whole: two runs whose windows hold as many entries carry states of the same size
    # (their events differ in a few digits).
    by_phase: dict[tuple[int, ...], list[int]] = {}
    for state, events in zip(states, runs[1:], strict=True):
        if state["calls"]["kept_calls"]:
            phase = (len(state["events"]), len(state["calls"]["ledger"]),
                     len(state["calls"]["loop_records"]),
                     len(state["conversation"]["unsent_turns"]))
            by_phase.setdefault(phase, []).append(
                events[0].workflow_execution_started_event_attributes.input.payloads[0]
                .ByteSize())
    for phase, sizes in by_phase.items():
        assert max(sizes) - min(sizes) <= 2 * COUNTER_SLACK, (phase, sizes)
    # The last run started with a state that does not grow with the calls before it: the
    # older tool records are in the blob store, the triggers keep a window.
    carried = json.loads(runs[-1][0].workflow_execution_started_event_attributes
                         .input.payloads[0].data)["resume_state"]["calls"]
    assert len(carried["ledger"]) < RECORDS_IN_STATE + CALLS_PER_TURN
    assert carried["kept_calls"] > 0 and carried["ledger_refs"]
    assert len(carried["loop_records"]) <= LOOP_WINDOW
    reviews = json.loads(runs[-1][0].workflow_execution_started_event_attributes
                         .input.payloads[0].data)["resume_state"]["reviews"]
    assert len(reviews["done"]) == REVIEWS_CARRIED and reviews["count"] == REVIEWED_EDITS
