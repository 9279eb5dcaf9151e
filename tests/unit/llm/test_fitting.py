"""Fitting a conversation to the model's window: the pure decisions (refloop.llm.fitting)."""

from __future__ import annotations

from dataclasses import replace

from refloop.contract.messages import ChatMessage, ToolCall
from refloop.contract.tool_catalog import is_edit
from refloop.llm import fitting
from refloop.llm.fitting import Budget, compact_plan, fit_conversation

SYSTEM = ChatMessage(role="system", content="You are refloop.")
TASK = ChatMessage(role="user", content="Task: read the files and report the code word.")
BUDGET = Budget(prompt_tokens=6000, chars_per_token=3.5, window=10_000, total=8000)


def turn(n: int, output_chars: int = 2000, note: str | None = None) -> list[ChatMessage]:
    call = ToolCall(id=f"c{n}", name="read_file", arguments={"path": f"f{n}.txt"})
    return [ChatMessage(role="assistant", content=note, tool_calls=[call]),
            ChatMessage(role="tool", tool_call_id=f"c{n}", name="read_file",
                        content="[read_file] ok\n" + f"line {n} " * (output_chars // 7))]


def conversation(turns: int, **kwargs) -> list[ChatMessage]:
    messages = [SYSTEM, TASK]
    for n in range(turns):
        messages += turn(n, note="The code word is PLUM-42." if n == 1 else None, **kwargs)
    return messages


def tokens(messages: list[ChatMessage]) -> int:
    return sum(BUDGET.tokens(m) for m in messages)


def test_a_conversation_within_the_threshold_is_sent_as_it_is():
    messages = conversation(3)
    fit = fit_conversation(messages, messages, BUDGET)
    assert fit.stored == fit.rendered == messages
    assert (fit.masked, fit.windowed, fit.folded, fit.compact_due) == (0, 0, 0, False)


def test_past_the_threshold_old_outputs_are_masked_to_a_line_and_notes_kept():
    messages = conversation(12)
    assert tokens(messages) > BUDGET.mask_at * BUDGET.prompt_tokens
    fit = fit_conversation(messages, messages, BUDGET)
    assert fit.masked > 0 and fit.tokens_after < fit.tokens_before
    assert fit.stored == fit.rendered  # the store keeps what was sent
    assert fit.stored[:2] == [SYSTEM, TASK]
    masked = [m for m in fit.stored if fitting.is_masked(m)]
    assert len(masked) == fit.masked
    assert masked[0].content.startswith("[read_file] ok line 0 line 0")
    assert "\n" not in masked[0].content and len(masked[0].content) < 250
    assert not fitting.is_masked(fit.stored[-1])  # the latest output stays whole
    assert "PLUM-42" in fit.stored[4].content  # the assistant's own note
    assert fit.tokens_after <= BUDGET.prompt_tokens


def test_the_prefix_stays_byte_stable_until_the_next_masking():
    messages = conversation(12)
    first = fit_conversation(messages, messages, BUDGET)
    grown = [*first.stored, *turn(12, output_chars=100)]
    second = fit_conversation(grown, grown, BUDGET)
    assert second.masked == 0
    assert [m.model_dump_json() for m in second.stored[:len(first.stored)]] == \
        [m.model_dump_json() for m in first.stored]


def test_a_single_output_larger_than_its_share_is_windowed_for_the_model_only():
    messages = [SYSTEM, TASK, *turn(0, output_chars=40_000)]
    fit = fit_conversation(messages, messages, BUDGET)
    assert fit.windowed == 1
    assert fit.stored[-1] == messages[-1]  # kept whole
    shown = fit.rendered[-1].content
    assert "left out to fit the model's window" in shown
    assert len(shown) <= BUDGET.output_share * BUDGET.prompt_tokens * 3.5 + 10


def test_a_prompt_still_too_large_is_folded_keeping_the_notes_verbatim():
    messages = conversation(150, output_chars=300)
    fit = fit_conversation(messages, messages, BUDGET)
    assert fit.folded > 0 and fit.tokens_after <= BUDGET.prompt_tokens
    note = fit.stored[2].content
    assert "folded to fit the model's window" in note and "PLUM-42" in note
    assert "calls (read_file x" in note and 'read_file {"path": "f' in note
    assert fit.stored[3].role == "assistant"  # no output without its call


def test_a_summary_is_due_past_the_second_threshold_with_enough_to_fold():
    messages = conversation(40, output_chars=300)
    assert fit_conversation(messages, messages, BUDGET).compact_due
    assert not fit_conversation(conversation(3), conversation(3), BUDGET).compact_due
    # Past the threshold with little to fold: a summary would save little
    assert not fit_conversation(messages, messages, replace(BUDGET, fold_at=0.9)).compact_due


def test_a_compaction_folds_the_middle_and_the_next_one_its_summary_too():
    messages = conversation(20)
    plan = compact_plan(messages, BUDGET)
    assert plan is not None and plan.start == 2 and plan.previous_ref is None
    assert messages[plan.end].role == "assistant" and plan.end < len(messages)
    folded = messages[plan.start:plan.end]
    notes = fitting.assistant_notes(folded)
    assert notes == ["The code word is PLUM-42."]
    ref = "a" * 64
    summary = fitting.summary_message(ref, "Read f0 to f15.", notes, "steps done: 1 of 2",
                                      ["report.md"])
    compacted = fitting.compacted_conversation(messages, plan, summary)
    assert compacted[:3] == [SYSTEM, TASK, summary]
    assert compacted[3:] == messages[plan.end:]
    assert "PLUM-42" in summary.content and "report.md" in summary.content
    again = compact_plan([*compacted, *conversation(20)[2:]], BUDGET)
    assert again is not None and again.previous_ref == ref and again.start == 2


def test_nothing_to_fold_is_no_compaction():
    assert compact_plan(conversation(1), BUDGET) is None


def test_files_written_are_the_edit_calls_paths_once_each():
    write = ToolCall(id="w", name="write_file", arguments={"path": "a.md", "content": "x"})
    read = ToolCall(id="r", name="read_file", arguments={"path": "b.md"})
    messages = [ChatMessage(role="assistant", tool_calls=[write, read]),
                ChatMessage(role="assistant", tool_calls=[write])]
    assert fitting.files_written(messages, is_edit, ["z.md"]) == ["z.md", "a.md"]


def test_any_prompt_is_clipped_longest_first():
    messages = [SYSTEM, ChatMessage(role="user", content="x " * 30_000),
                ChatMessage(role="user", content="keep me")]
    clipped = fitting.clip_to_fit(messages, BUDGET)
    assert sum(BUDGET.tokens(m) for m in clipped) <= BUDGET.prompt_tokens
    assert clipped[0] == SYSTEM and clipped[2].content == "keep me"


def test_an_old_calls_offloaded_argument_stays_masked_in_the_store():
    marker = "[[blob:" + "c" * 64 + ":9000:2000]]"
    write = ToolCall(id="w", name="write_file", arguments={"path": "a.md", "content": marker})
    shown = write.model_copy(update={"arguments": {"path": "a.md", "content": "x" * 2000}})
    stored = [SYSTEM, TASK, ChatMessage(role="assistant", tool_calls=[write]),
              ChatMessage(role="tool", tool_call_id="w", name="write_file", content="ok"),
              *conversation(12)[2:]]
    rendered = [*stored[:2], stored[2].model_copy(update={"tool_calls": [shown]}), *stored[3:]]
    fit = fit_conversation(stored, rendered, BUDGET)
    assert fit.masked > 0
    assert fit.stored[2].tool_calls[0].arguments["content"] == "<2000 characters>"
    assert fit.stored[2] == fit.rendered[2]
