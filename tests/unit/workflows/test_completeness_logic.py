"""Completeness reflection's pure pieces: claims, evidence reconciliation, objective,
context, stats."""

from __future__ import annotations

from refloop.contract.activity_io import CompletenessVerdict, Supplement
from refloop.contract.messages import Plan, PlanStep, TokenUsage
from refloop.contract.task import Event, ReviewCounts, TaskStats
from refloop.workflows import completeness_logic as cl

TOOLS = ["read_file", "write_file"]


def verdict(complete: bool, supplements: list[Supplement] | None = None) -> CompletenessVerdict:
    return CompletenessVerdict(is_complete=complete, analysis="a",
                               supplements=supplements or [])


def test_claimed_files_need_a_writing_verb():
    assert cl.claimed_files(["I saved the summary to summary.md."]) == ["summary.md"]
    assert cl.claimed_files(["See notes.txt for details."]) == []
    assert cl.claimed_files(["Wrote docs/a.md and docs/b.json", "已保存到 结果.md"]) == [
        "docs/a.md", "docs/b.json", "结果.md"]
    assert cl.claimed_files(["Visit example.com"]) == []


def test_missing_steps_lists_unmarked_ones():
    plan = Plan(steps=[PlanStep(goal="a", tool="read_file"), PlanStep(goal="b", tool="x")])
    assert cl.missing_steps(plan, [1]) == ["step 2: b"]
    assert cl.missing_steps(None, []) == []


def test_decisive_evidence_overrides_a_complete_verdict():
    out = cl.reconcile(verdict(True), ["summary.md is missing"], TOOLS, 3)
    assert not out.is_complete
    assert out.supplements[0].action == "Resolve: summary.md is missing"
    assert "summary.md is missing" in out.missing_aspects


def test_complete_verdict_drops_supplements_and_incomplete_caps_them():
    extra = [Supplement(action=f"s{n}") for n in range(5)]
    assert cl.reconcile(verdict(True, extra), [], TOOLS, 3).supplements == []
    capped = cl.reconcile(verdict(False, extra), [], TOOLS, 2)
    assert [s.action for s in capped.supplements] == ["s0", "s1"]


def test_suggested_tools_are_limited_to_available_ones():
    out = cl.reconcile(verdict(False, [Supplement(action="x", suggested_tools=[
        "write_file", "send_email"])]), [], TOOLS, 3)
    assert out.supplements[0].suggested_tools == ["write_file"]


def test_objective_carries_the_english_marker():
    text = cl.supplement_objective("task", [Supplement(action="save it", reason="lost",
                                                       suggested_tools=["write_file"])])
    assert text.startswith("task\n\nMissing actions to supplement:\n")
    assert text.endswith("1. save it (reason: lost; tools: write_file)")


def test_repeated_steps_are_dropped():
    plan = Plan(steps=[PlanStep(goal="Read data", tool="read_file"),
                       PlanStep(goal="save", tool="write_file")])
    kept = cl.drop_repeated_steps(plan, [("read data", "read_file")])
    assert [s.goal for s in kept.steps] == ["save"]
    assert cl.drop_repeated_steps(plan, [("read data", "read_file"), ("save", "write_file")]) \
        is None


def events() -> list[Event]:
    return [
        Event(seq=1, type="tool_call", ts="t", data={"id": "c1", "tool": "read_file",
                                                      "args": {"path": "d.txt"}}),
        Event(seq=2, type="tool_result", ts="t", data={"id": "c1", "tool": "read_file",
                                                        "ok": True, "output": "value=42"}),
        Event(seq=3, type="tool_call", ts="t", data={"id": "c2", "tool": "write_file",
                                                      "args": {"path": "o.md"}}),
        Event(seq=4, type="tool_result", ts="t", data={"id": "c2", "tool": "write_file",
                                                        "ok": True, "output": "wrote",
                                                        "data": {"file_path": "o.md"}}),
    ]


def test_condensed_history_and_prior_context():
    records = cl.records_from_events(events())
    history = cl.condensed_history(records)
    assert [(h.tool, h.outcome) for h in history] == [("read_file", "ok: value=42"),
                                                      ("write_file", "ok: wrote")]
    context = cl.prior_context(records, "done")
    assert "value=42" in context and "Files touched: o.md" in context
    assert context.endswith("Earlier final answer: done")


def test_merge_stats_adds_everything():
    usage = TokenUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2, calls=1)
    parent = TaskStats(iterations=2, llm_calls=3, tool_calls=2, tool_errors=1,
                       reviews=ReviewCounts(total=1, passed=1), usage=usage,
                       usage_by_purpose={"act": usage})
    child = TaskStats(iterations=1, llm_calls=1, tool_calls=1, usage=usage,
                      reviews=ReviewCounts(total=1, failed=1),
                      usage_by_purpose={"act": usage, "quality_review": usage})
    merged = cl.merge_stats(parent, child)
    assert (merged.iterations, merged.llm_calls, merged.tool_calls, merged.tool_errors) == (
        3, 4, 3, 1)
    assert merged.reviews == ReviewCounts(total=2, passed=1, failed=1)
    assert merged.usage_by_purpose["act"].calls == 2
    assert merged.usage_by_purpose["quality_review"].calls == 1


def test_tool_record_is_short_and_keeps_claims():
    record = cl.tool_record("write_file", {"path": "a.md", "content": "x" * 5000}, True, None,
                            "wrote " + "y" * 500, {"file_path": "a.md"})
    assert len(record.arguments) <= 301 and record.arguments.endswith("…")
    assert record.outcome == "ok: wrote " + "y" * 114 and record.file_path == "a.md"
    failed = cl.tool_record("write_file", {"path": "b.md"}, False, "E_DENIED", "",
                            {"file_path": "b.md"})
    assert failed.outcome == "error: E_DENIED" and failed.file_path is None
    step = cl.tool_record("complete_step", {"step": 1, "summary": "saved out.md"}, True, None)
    assert cl.claim_texts([record, step], "final") == ["final", "saved out.md"]



def test_claims_of_kept_records_and_the_count_of_earlier_calls_reach_the_judge_and_child():
    from refloop.workflows.completeness_logic import claim_texts, prior_context, tool_record

    ledger = [tool_record("read_file", {"path": "a.md"}, True, None, "text")]
    texts = claim_texts(ledger, "answer", ["wrote report.md in step 1"])
    assert texts == ["answer", "wrote report.md in step 1"]
    context = prior_context(ledger, "answer", earlier_calls=4200)
    assert "(4200 earlier calls not listed)" in context and "read_file" in context
    assert "earlier calls" not in prior_context(ledger, "answer")
