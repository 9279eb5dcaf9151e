"""Pure decisions behind honest outcomes and tolerant text tool calls."""

from __future__ import annotations

import pytest

from refloop.contract.messages import Plan, PlanStep, ToolSpec
from refloop.contract.task import Event
from refloop.workflows import accounting, logic

EDITS = {"write_file", "apply_patch", "str_replace_based_edit_tool"}


@pytest.mark.parametrize("text", [
    '{"tool": "write_file", "args": {"path": "a"}}',
    '{"name": "write_file", "arguments": {"path": "a"}}',
    '{"name": "write_file", "arguments": "{\\"path\\": \\"a\\"}"}',
    'Sure.\n```json\n{"name": "write_file", "arguments": {"path": "a"}}\n```',
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "a"}}\n</tool_call>',
    '<tool_call>{"name": "write_file", "arguments": {"path": "a"}}',  # unclosed tag
    'I will call {"function": {"name": "write_file", "arguments": {"path": "a"}}} now',
])
def test_common_text_forms_of_a_tool_call_are_parsed(text):
    call = logic.parse_text_tool_call(text, "text_1")
    assert call is not None and call.name == "write_file" and call.arguments == {"path": "a"}


@pytest.mark.parametrize("text", ["4", '{"answer": 4}', '{"name": 3, "arguments": {}}',
                                  '{"name": "x", "arguments": "not json"}'])
def test_non_calls_are_not_parsed(text):
    assert logic.parse_text_tool_call(text, "t") is None


def test_system_prompt_carries_every_tool_argument_schema():
    spec = ToolSpec(name="write_file", description="Create a file.\nMore.", parameters={
        "type": "object", "required": ["path"],
        "properties": {"path": {"type": "string"}, "mode": {"enum": ["w", "a"]},
                       "lines": {"type": "array", "items": {"type": "integer"}}}})
    prompt = logic.system_prompt(None, [spec], "/ws")
    assert '- write_file(path: string, mode?: "w"|"a", lines?: array of integer): ' \
           "Create a file." in prompt


@pytest.mark.parametrize(("task", "question"), [
    ("What is 2+2?", True), ("how are you", True), ("Hello", True),
    ("Is the sky blue?", True), ("do the task", False),
    ("What is in notes.md? Write it to out.txt", False),
    ("Create hello.txt", False), ("Fix the bug", False),
])
def test_questions_are_told_from_work(task, question):
    assert logic.is_question(task) is question


def step(tool):
    return PlanStep(goal=f"use {tool}", tool=tool)


def test_missing_work():
    plan = Plan(steps=[step("read_file"), step("write_file")])
    missing = logic.missing_work(plan, EDITS, 0, None)
    assert len(missing) == 1 and "step 2: use write_file" in missing[0]
    assert logic.missing_work(plan, EDITS, 1, None) == []
    assert logic.missing_work(Plan(steps=[step("read_file")]), EDITS, 0, None) == []
    verdict = {"is_complete": False, "missing_aspects": ["no summary.md"]}
    assert logic.missing_work(None, EDITS, 0, verdict) == ["no summary.md"]
    assert logic.missing_work(None, EDITS, 0, {**verdict, "fail_open": True}) == []
    assert logic.missing_work(None, EDITS, 0, {"is_complete": False}) == [
        "the completeness check found the task incomplete"]


def test_successful_edits_skip_views_and_failures():
    def ev(seq, kind, **data):
        return Event(seq=seq, type=kind, ts="t", data=data)

    events = [
        ev(1, "tool_call", id="a", tool="str_replace_based_edit_tool", args={"command": "view"}),
        ev(2, "tool_result", id="a", tool="str_replace_based_edit_tool", ok=True),
        ev(3, "tool_call", id="b", tool="write_file", args={"path": "x"}),
        ev(4, "tool_result", id="b", tool="write_file", ok=False),
        ev(5, "tool_call", id="c", tool="apply_patch", args={}),
        ev(6, "tool_result", id="c", tool="apply_patch", ok=True),
    ]
    assert logic.successful_edits(events, EDITS) == 1


def test_success_rate_is_undefined_without_attempts():
    assert accounting.success_rate(0, 0) is None and accounting.success_rate(4, 3) == 0.75


def test_failed_usage_from_details_or_heartbeat():
    usage = {"purpose": "act", "model": "m", "usage": {"calls": 2, "failed_calls": 2}}
    assert accounting.failed_usage([{"status": 500, "usage": usage}]).usage.calls == 2
    assert accounting.failed_usage([{"refloop_ledger": usage}]).usage.failed_calls == 2
    assert accounting.failed_usage([{"status": 500}]) is None \
        and accounting.failed_usage(["x"]) is None


def test_empty_review_or_verify_answers_are_invalid_and_reasked():
    from refloop.activities.code_review_activities import parse_agent
    from refloop.contract.code_review import ReviewOutput, VerifyOutput

    for schema in (ReviewOutput, VerifyOutput):
        parsed, invalid = parse_agent("{}", schema)
        assert parsed is None and "required" in invalid
    parsed, invalid = parse_agent('{"issues": []}', ReviewOutput)
    assert invalid is None and parsed.issues == []
    parsed, invalid = parse_agent('{"status": "ERROR", "message": "no diff"}', ReviewOutput)
    assert invalid is None and parsed.message == "no diff"
    _, invalid = parse_agent('{"verification_result": {"accuracy_check": []}}', VerifyOutput)
    assert "quality_assessment" in invalid
    _, invalid = parse_agent('{"verification_result": {"quality_assessment": {}}}',
                             VerifyOutput)
    assert "overall_score" in invalid


@pytest.mark.parametrize("task, intent, tools, set_aside", [
    ("What is 2+2?", None, ["write_file"], True),
    ("What is 2+2?", "UNCERTAIN", ["read_file", "apply_patch"], True),
    ("What is 2+2?", "UNCERTAIN", ["read_file"], False),  # reading may answer it
    ("What is 2+2?", "CODING_TASK", ["write_file"], False),  # intent says code work
    ("Where is the config loaded?", "REPO_ANALYSIS", ["write_file"], False),
    ("Write the answer to 2+2 into answer.txt", None, ["write_file"], False),
    ("Create hello.txt", "UNCERTAIN", ["write_file"], False),
])
def test_a_question_planned_as_edits_is_answered_directly(task, intent, tools, set_aside):
    from refloop.contract.messages import IntentResult

    label = IntentResult(intent=intent, confidence=0.5, reason="r") if intent else None
    reason = logic.question_planned_as_edits(task, label, Plan(steps=[step(t) for t in tools]),
                                             EDITS)
    assert (reason is not None) is set_aside
    if set_aside:
        assert "question" in reason and "write_file" in reason or "apply_patch" in reason
    assert logic.question_planned_as_edits(task, label, None, EDITS) is None


def test_a_task_to_change_files_run_without_a_plan_needs_a_change():
    from refloop.contract.messages import IntentLabel, IntentResult

    coding = IntentResult(intent=IntentLabel.CODING_TASK, confidence=0.9, reason="create")
    chat = IntentResult(intent=IntentLabel.GENERAL_CHAT, confidence=0.9, reason="hi")
    plan = Plan(steps=[step("write_file")])
    assert logic.edit_task_without_plan(coding, None, direct_answer=False)
    assert not logic.edit_task_without_plan(coding, plan, direct_answer=False)  # the plan says
    assert not logic.edit_task_without_plan(coding, None, direct_answer=True)  # a question
    assert not logic.edit_task_without_plan(chat, None, direct_answer=False)
    assert not logic.edit_task_without_plan(None, None, direct_answer=False)
    missing = logic.missing_work(None, EDITS, 0, None, edit_task_unplanned=True)
    assert missing == ["the task asks to change or create files but no call that changes the "
                       "workspace succeeded"]
    assert logic.missing_work(None, EDITS, 1, None, edit_task_unplanned=True) == []
    assert logic.missing_work(None, EDITS, 0, None) == []


@pytest.mark.parametrize("task,label,needs_edit", [
    ("Create a file hello.txt containing the word hi.", None, True),  # classification failed
    ("Create a file hello.txt containing the word hi.", "UNCERTAIN", True),
    ("fix the failing test in app.py", None, True),
    ("Summarise the README in one line", None, False),  # asks for no change
    ("What should I add to hello.txt?", None, False),  # a question
    ("How do I fix app.py?", "UNCERTAIN", False),
    ("Can you fix app.py?", None, True),  # a request put as a question
    ("Create a file hello.txt containing the word hi.", "GENERAL_CHAT", False),  # model said
])
def test_a_task_of_unknown_intent_is_read_from_its_words(task, label, needs_edit):
    from refloop.contract.messages import IntentLabel, IntentResult

    intent = label and IntentResult(intent=IntentLabel(label), confidence=0.3, reason="?")
    assert logic.edit_task_without_plan(intent, None, False, task,
                                        read_unknown_intent=True) is needs_edit
    # Runs recorded before this rule keep ending as they did.
    assert not logic.edit_task_without_plan(intent, None, False, task)
    # A plan or a direct answer settles it whatever the words say.
    assert not logic.edit_task_without_plan(intent, Plan(steps=[step("write_file")]), False,
                                            task, read_unknown_intent=True)
    assert not logic.edit_task_without_plan(intent, None, True, task, read_unknown_intent=True)


def test_calls_that_may_change_the_workspace():
    assert logic.may_change_workspace("write_file", {"path": "a", "content": ""})
    assert logic.may_change_workspace("run_cmd", {"command": "echo hi > a"})
    assert logic.may_change_workspace("some_mcp_tool", {})  # undeclared: may write
    assert not logic.may_change_workspace("read_file", {"path": "a"})
    assert not logic.may_change_workspace("str_replace_based_edit_tool",
                                          {"command": "view", "path": "a"})
    assert not logic.may_change_workspace("complete_step", {"step": 1})
    events = [Event(seq=1, ts="t", type="tool_call", data={"id": "1", "tool": "run_cmd",
                                                           "args": {"command": "true"}}),
              Event(seq=2, ts="t", type="tool_result", data={"id": "1", "tool": "run_cmd",
                                                             "ok": True}),
              Event(seq=3, ts="t", type="tool_call", data={"id": "2", "tool": "read_file",
                                                           "args": {"path": "a"}}),
              Event(seq=4, ts="t", type="tool_result", data={"id": "2", "tool": "read_file",
                                                             "ok": True})]
    assert logic.successful_calls(events, logic.may_change_workspace) == 1
    assert logic.successful_edits(events, EDITS) == 0
