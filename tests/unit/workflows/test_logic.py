"""Pure decision functions of the agent loop."""

from __future__ import annotations

from refloop.contract.activity_io import LLMUsageRecord, ToolResult
from refloop.contract.messages import (
    ChatMessage,
    IntentLabel,
    IntentResult,
    Plan,
    PlanStep,
    Purpose,
    TokenUsage,
    ToolCall,
)
from refloop.contract.task import TaskStats
from refloop.llm.conversation import TRIM_NOTE, trim_history
from refloop.workflows import accounting, logic


def intent(label: IntentLabel) -> IntentResult:
    return IntentResult(intent=label, confidence=0.9, reason="")


def plan(*tools: str) -> Plan:
    return Plan(task_type="coding", steps=[PlanStep(goal=f"do {t}", tool=t) for t in tools])


# ---------------------------------------------------------------- decision gate


def test_chat_and_capability_queries_skip_planning():
    assert not logic.should_plan(intent(IntentLabel.GENERAL_CHAT), True)
    assert not logic.should_plan(intent(IntentLabel.CAPABILITY_QUERY), True)


def test_coding_uncertain_and_unknown_intents_plan():
    assert logic.should_plan(intent(IntentLabel.CODING_TASK), True)
    assert logic.should_plan(intent(IntentLabel.UNCERTAIN), True)
    assert logic.should_plan(intent(IntentLabel.REPO_ANALYSIS), True)
    assert logic.should_plan(None, True)


def test_planning_switched_off_never_plans():
    assert not logic.should_plan(intent(IntentLabel.CODING_TASK), False)


def test_validate_plan_flags_unknown_tools_and_lists_known_ones():
    violations = logic.validate_plan(plan("read_file", "teleport"), ["read_file", "write_file"])
    assert len(violations) == 1
    assert "step 2" in violations[0] and "teleport" in violations[0]
    assert "read_file, write_file" in violations[0]


def test_validate_plan_rejects_complete_step_as_a_plan_tool():
    assert logic.validate_plan(plan("complete_step"), ["read_file", "complete_step"])


def test_validate_plan_accepts_known_tools():
    assert logic.validate_plan(plan("read_file", "write_file"), ["read_file", "write_file"]) == []


# ---------------------------------------------------------------- trimming


def conversation(turns: int) -> list[ChatMessage]:
    messages = [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", content="the task"),
    ]
    for n in range(turns):
        call = ToolCall(id=f"c{n}", name="read_file", arguments={"path": "a"})
        messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        messages.append(ChatMessage(role="tool", tool_call_id=f"c{n}", content=f"r{n}"))
    return messages


def test_trim_keeps_short_history_untouched():
    messages = conversation(3)
    assert trim_history(messages, 30) == messages


def test_trim_keeps_system_and_task_and_starts_tail_on_assistant():
    trimmed = trim_history(conversation(40), 10)
    assert len(trimmed) <= 10
    assert trimmed[0].content == "sys"
    assert trimmed[1].role == "user" and trimmed[1].content.startswith("the task")
    assert TRIM_NOTE in trimmed[1].content
    assert trimmed[2].role == "assistant"
    assert trimmed[-1].content == "r39"  # the newest turn survives


def test_trim_never_leaves_orphan_tool_results():
    for size in range(5, 15):
        trimmed = trim_history(conversation(20), size)
        ids = {c.id for m in trimmed if m.tool_calls for c in m.tool_calls}
        assert all(m.tool_call_id in ids for m in trimmed if m.role == "tool")


def test_trim_note_is_added_once():
    once = trim_history(conversation(40), 10)
    twice = trim_history([*once, *conversation(5)[2:]], 10)
    assert twice[1].content.count(TRIM_NOTE) == 1


# ---------------------------------------------------------------- tool-call parsing


def test_parse_bare_json_tool_call():
    call = logic.parse_text_tool_call('{"tool": "read_file", "args": {"path": "a.py"}}', "t1")
    assert call == ToolCall(id="t1", name="read_file", arguments={"path": "a.py"})


def test_parse_fenced_tool_call():
    text = 'I will look.\n```json\n{"tool": "list_dir", "args": {"path": "."}}\n```'
    assert logic.parse_text_tool_call(text, "t").name == "list_dir"


def test_parse_first_object_in_prose_with_braces_in_strings():
    text = 'Sure: {"tool": "write_file", "args": {"path": "x", "content": "a } b {"}} done'
    call = logic.parse_text_tool_call(text, "t")
    assert call.arguments == {"path": "x", "content": "a } b {"}


def test_parse_skips_non_tool_objects_before_the_call():
    text = 'config {"a": 1} then {"tool": "grep", "args": {"pattern": "x"}}'
    # Only the first object is tried, best-effort: no call here.
    assert logic.parse_text_tool_call(text, "t") is None


def test_parse_rejects_plain_text_and_bad_args():
    assert logic.parse_text_tool_call("The answer is 42.", "t") is None
    assert logic.parse_text_tool_call('{"tool": "x", "args": [1]}', "t") is None
    assert logic.parse_text_tool_call('{"tool": 3}', "t") is None
    assert logic.parse_text_tool_call("{broken", "t") is None
    assert logic.parse_text_tool_call(None, "t") is None


def test_parse_accepts_arguments_alias():
    call = logic.parse_text_tool_call('{"tool": "read_file", "arguments": {"path": "a"}}', "t")
    assert call.arguments == {"path": "a"}


# ---------------------------------------------------------------- feeding back


def test_format_tool_result_error_and_truncation():
    text = logic.format_tool_result("read_file", ToolResult(ok=False, error="E_PATH_ESCAPE"), 100)
    assert text == "[read_file] error: E_PATH_ESCAPE"
    long = logic.format_tool_result("read_file", ToolResult(ok=True, output="x" * 500), 100)
    assert long.startswith("[read_file] ok") and "truncated" in long and len(long) < 200


def test_text_calls_are_fed_back_as_user_turns_and_native_as_tool_turns():
    call = ToolCall(id="c1", name="grep", arguments={"pattern": "x"})
    assert logic.tool_result_message(call, True, "r").role == "tool"
    assert logic.tool_result_message(call, False, "r").role == "user"
    cleaned = logic.assistant_tool_message("prose {json}", [call], structured=False)
    assert cleaned.content == '{"tool": "grep", "args": {"pattern": "x"}}'


def test_tool_call_summary_names_the_target():
    call = ToolCall(id="c", name="write_file", arguments={"path": "report.md", "content": "x"})
    assert logic.tool_call_summary(call) == "write_file report.md"
    assert logic.tool_call_summary(ToolCall(id="c", name="undo_patch")) == "undo_patch"


# ---------------------------------------------------------------- plan progress


def test_complete_step_advances_and_names_next():
    result, done = logic.complete_step(plan("a", "b"), [], {"step": 1, "summary": "ok"})
    assert result.ok and done == [1]
    assert "next: step 2" in result.output
    assert logic.current_step(plan("a", "b"), done) == 2


def test_complete_step_last_step_asks_for_final_answer():
    result, done = logic.complete_step(plan("a"), [], {"step": 1})
    assert "final answer" in result.output and logic.current_step(plan("a"), done) is None


def test_complete_step_rejects_out_of_range_and_non_integers():
    assert not logic.complete_step(plan("a"), [], {"step": 2})[0].ok
    assert not logic.complete_step(plan("a"), [], {"step": "1"})[0].ok
    assert not logic.complete_step(plan("a"), [], {"step": True})[0].ok
    assert not logic.complete_step(None, [], {"step": 1})[0].ok


# ---------------------------------------------------------------- prompts and accounting


def test_task_message_lists_plan_steps():
    text = logic.task_message("fix it", plan("read_file", "apply_patch"))
    assert "1. do read_file (tool: read_file)" in text and "2. do apply_patch" in text
    assert logic.task_message("hi", None) == "hi"


def test_add_usage_accumulates_per_purpose():
    stats = TaskStats()
    for purpose, tokens in ((Purpose.act, 10), (Purpose.act, 5), (Purpose.plan, 7)):
        usage = TokenUsage(prompt_tokens=tokens, completion_tokens=1, total_tokens=tokens + 1,
                           calls=1)
        stats = accounting.add_usage(stats, LLMUsageRecord(purpose=purpose, model="m", usage=usage))
    assert stats.llm_calls == 3
    assert stats.usage.total_tokens == 25
    assert stats.usage_by_purpose["act"].total_tokens == 17
    assert stats.usage_by_purpose["plan"].calls == 1


def test_runs_started_before_the_other_text_forms_parse_as_they_did():
    """Replay safety: a run from before the extra forms keeps reading them as an answer."""
    named = '{"name": "read_file", "arguments": {"path": "a"}}'
    tagged = '<tool_call>{"tool": "read_file", "args": {"path": "a"}}</tool_call>'
    assert logic.parse_text_tool_call(named, "t").name == "read_file"
    assert logic.parse_text_tool_call(named, "t", every_form=False) is None
    assert logic.parse_text_tool_call("see " + tagged, "t", every_form=False).name == "read_file"
    wrapped = '{"function": {"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}}'
    assert logic.parse_text_tool_call(wrapped, "t", every_form=False) is None
    legacy = '{"tool": "read_file", "args": {"path": "a"}}'
    assert logic.parse_text_tool_call(legacy, "t", every_form=False).arguments == {"path": "a"}


def test_a_forbidden_tool_is_refused_unless_justified_once():
    from refloop.contract.activity_io import ToolConstraints

    constraints = ToolConstraints(task_type="analysis", allowed=["read_file"],
                                  forbidden=["write_file"])
    plain = ToolCall(id="1", name="write_file", arguments={"path": "a"})
    excused = ToolCall(id="2", name="write_file", arguments={"path": "a", "justification": "x"})
    assert logic.check_constraints(constraints, True, ToolCall(id="0", name="read_file"),
                                   1, 1, []) == (None, None)
    assert logic.check_constraints(constraints, False, plain, 1, 1, []) == (None, None)
    assert logic.check_constraints(None, True, plain, 1, 1, []) == (None, None)
    violation, refusal = logic.check_constraints(constraints, True, plain, 2, 5, [])
    assert violation == {"tool": "write_file", "step": 2, "iteration": 5, "justified": False,
                         "justification": None}
    assert refusal is not None and refusal.error.startswith("E_FORBIDDEN: 'write_file'")
    assert "use one of: read_file" in refusal.error
    violation, refusal = logic.check_constraints(constraints, True, excused, 2, 6, [])
    assert violation["justified"] and refusal is None
    # The one exception is spent: a second justification is refused.
    violation, refusal = logic.check_constraints(constraints, True, excused, 2, 7,
                                                 ["write_file"])
    assert not violation["justified"] and refusal is not None


def test_summary_transcript_keeps_the_run_and_cuts_it_short():
    from refloop.contract.task import Event

    events = [Event(seq=1, type="plan", ts="t", data={"steps": ["x" * 1000]}),
              Event(seq=2, type="quality_review", ts="t", data={"skipped": True}),
              Event(seq=3, type="tool_call", ts="t", data={"tool": "read_file"})]
    text = logic.summary_transcript(events, [{"status": "completed", "answer": "y" * 900}],
                                    "done")
    lines = text.split("\n")
    assert [line.split(":")[0] for line in lines] == ["plan", "tool_call", "supplement",
                                                      "final answer"]
    assert len(lines[0]) == len("plan: ") + 300 and len(lines[2]) == len("supplement: ") + 500
    assert lines[-1] == "final answer: done"


def test_recent_events_keep_the_latest_within_count_and_bytes():
    from refloop.contract.task import Event

    events = [Event(seq=n, type="tool_result", ts="t", data={"output": "x" * 1000})
              for n in range(1, 11)]
    assert [e.seq for e in logic.recent_events(events, 3, 1_000_000)] == [8, 9, 10]
    one = len(events[0].model_dump_json().encode())
    assert [e.seq for e in logic.recent_events(events, 10, one * 4 + 1)] == [7, 8, 9, 10]
    assert logic.recent_events(events, 10, one - 1) == []
