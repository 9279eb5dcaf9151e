"""A run's history holds its work, not bookkeeping: no patch markers, few events before the
first model call, a one-write task within a fixed number of events, and a write step within
its events and bytes."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType

from bench.step_breakdown import step_history
from refloop.contract.task import TaskInput
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, run_with_history

BEFORE_FIRST_MODEL_CALL = 10
ONE_WRITE_TASK = 70
# A write step: 12 events, 2,968 bytes here (3,148 while each model turn listed its tools
# by name, 3,526 before the model call's payloads left out their defaults); the margin is
# for longer paths and host names
STEP_EVENTS = 12
STEP_BYTES = 3200


async def test_a_one_write_task_has_a_lean_history(client, settings, scripted_llm, workspace,
                                                   task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="a.txt", content="a"),
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write a", workspace=str(workspace), model=model, enable_reflection=False))
    assert result.status == "completed" and (workspace / "a.txt").read_text() == "a"
    events = list(history.events)
    markers = [e.marker_recorded_event_attributes.marker_name for e in events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert "core_patch" not in markers
    upserts = [e for e in events
               if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES]
    assert not any("TemporalChangeVersion" in e.upsert_workflow_search_attributes_event_attributes
                   .search_attributes.indexed_fields for e in upserts)
    first_model_call = next(
        i for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name.startswith(
            "refloop.llm."))
    assert first_model_call <= BEFORE_FIRST_MODEL_CALL, first_model_call
    assert len(events) <= ONE_WRITE_TASK, len(events)


async def test_a_write_step_stays_within_its_events_and_bytes(client, settings, scripted_llm,
                                                             workspace, task_queue):
    """A step of one model call and one write: its events and bytes as `bench_steps`
    counts them (a model call's scheduling to the next one's)."""
    writes = [call("write_file", path=f"f{n}.txt", content=f"{n}\n") for n in range(4)]
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [*writes, final("ok")], "summary": [SUMMARY],
    })
    result, history = await run_with_history(client, settings, task_queue, TaskInput(
        task="write four files", workspace=str(workspace), model=model,
        enable_reflection=False, enable_quality_review=False))
    assert result.status == "completed", result.answer
    events, size = step_history(history)
    print(f"a write step: {events:.0f} events, {size:.0f} bytes")
    assert events <= STEP_EVENTS, events
    assert size <= STEP_BYTES, size
