"""Labels the Web UI shows: clipped summaries, the plan as details, model-call summaries."""

from __future__ import annotations

from refloop.contract import visibility
from refloop.contract.messages import Plan


def plan() -> Plan:
    return Plan.model_validate({"task_type": "coding", "steps": [
        {"goal": "read the spec", "tool": "read_file"},
        {"goal": "write report.md\nwith the findings", "tool": "write_file"}]})


def test_summaries_are_one_clipped_line():
    assert visibility.task_summary("fix\n the   bug") == "fix the bug"
    long = visibility.task_summary("x" * 500)
    assert len(long) == visibility.SUMMARY_CHARS and long.endswith("…")
    meta = visibility.start_metadata("a\ntask", "/ws")
    assert meta == {"static_summary": "a task", "static_details": "a\ntask\n\nworkspace: `/ws`"}


def test_plan_details_mark_done_and_current_steps():
    details = visibility.plan_details(plan(), [1], 2)
    assert details.splitlines()[0] == "**step 2/2: write report.md with the findings**"
    assert "- [x] 1. read the spec `read_file`" in details
    assert "- [ ] 2. write report.md with the findings `write_file` ←" in details
    assert visibility.plan_details(None, [], None) == ""
    assert not visibility.plan_details(plan(), [1, 2], None).startswith("**")


def test_model_call_summary():
    assert visibility.model_call_summary("act", 4, 2, 5) == "act · iteration 4 · step 2/5"
    assert visibility.model_call_summary("act", 7) == "act · iteration 7"
    assert visibility.model_call_summary("intent") == "intent"


def test_search_attribute_names_and_types_are_the_documented_ones():
    assert visibility.SEARCH_ATTRIBUTES == {
        "RefloopStatus": "Keyword", "RefloopKind": "Keyword", "RefloopSessionId": "Keyword",
        "RefloopIntent": "Keyword", "RefloopTotalTokens": "Int"}
    assert visibility.STATUS.name == "RefloopStatus" and visibility.TOTAL_TOKENS.name == \
        "RefloopTotalTokens"


def test_list_query_quotes_hostile_values():
    assert visibility.list_query(status="completed", session_id="s1", intent=None) == \
        "RefloopStatus = 'completed' AND RefloopSessionId = 's1'"
    assert visibility.list_query(session_id="x' OR RefloopStatus != '") == \
        "RefloopSessionId = 'x\\' OR RefloopStatus != \\''"
    import pytest

    with pytest.raises(ValueError):
        visibility.list_query(workflow_id="x")
