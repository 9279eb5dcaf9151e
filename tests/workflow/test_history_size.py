"""A run's history holds its work, not bookkeeping: no patch markers, few events before the
first model call, and a one-write task within a fixed number of events."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType

from refloop.contract.task import TaskInput
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, run_with_history

BEFORE_FIRST_MODEL_CALL = 10
ONE_WRITE_TASK = 70


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
