"""Which calls get reviewed, what the model is told, and the per-file cap."""

from __future__ import annotations

from refloop.contract.activity_io import QualityReview, ToolResult
from refloop.contract.messages import ToolCall
from refloop.contract.tool_catalog import tool_properties
from refloop.workflows import review_logic

OK = ToolResult(ok=True, output="", data={"file_path": "a.md"})


def edit(name: str, **arguments) -> ToolCall:
    return ToolCall(id="c", name=name, arguments=arguments)


def review(outcome: str, path: str = "a.md") -> QualityReview:
    return QualityReview(file_path=path, passed=outcome in ("passed", "unavailable"),
                         outcome=outcome, reasons=["r1"] if outcome.endswith("failed") else [],
                         suggestions="do x" if outcome == "failed" else "")


def needs_review(call: ToolCall, result: ToolResult, whitelist=None) -> bool:
    return review_logic.needs_review(call, result, tool_properties(call.name), whitelist)


def test_only_successful_document_edits_are_reviewed():
    assert needs_review(edit("write_file", path="a.md"), OK)
    assert needs_review(edit("apply_patch", patch="..."), OK)
    for command in ("create", "str_replace", "insert"):
        assert needs_review(edit("str_replace_based_edit_tool", command=command), OK)
    assert not needs_review(edit("str_replace_based_edit_tool", command="view"), OK)
    assert not needs_review(edit("str_replace_based_edit_tool", command="undo_edit"), OK)
    assert not needs_review(edit("undo_patch"), OK)  # an undo restores reviewed content
    assert needs_review(edit("json_edit_tool", operation="add"), OK)
    assert not needs_review(edit("json_edit_tool", operation="view"), OK)
    assert not needs_review(edit("read_file", path="a.md"), OK)
    assert not needs_review(edit("run_cmd", command="x"), OK)
    assert not needs_review(edit("teleport"), OK)
    failed = ToolResult(ok=False, error="E_NOT_UNIQUE")
    assert not needs_review(edit("write_file", path="a.md"), failed)
    assert not needs_review(edit("write_file", path="a.md"), ToolResult(ok=True, output=""))


def test_whitelist_is_configurable():
    assert not needs_review(edit("write_file"), OK, ["json_edit_tool"])
    assert needs_review(edit("json_edit_tool", operation="set"), OK, ["json_edit_tool"])
    assert not needs_review(edit("json_edit_tool", operation="view"), OK, ["json_edit_tool"])


def test_feedback_texts():
    assert review_logic.review_feedback(review("passed")) == "[quality_review] a.md: PASS"
    failed = review_logic.review_feedback(review("failed"))
    assert failed.startswith("[quality_review] a.md: FAIL") and "- r1" in failed
    assert "Suggestions: do x" in failed
    assert "unavailable" in review_logic.review_feedback(review("unavailable"))


def test_reflection_only_for_failures():
    assert review_logic.reflect_on_quality_results([review("passed")], set()) is None
    assert review_logic.reflect_on_quality_results([review("unavailable")], set()) is None
    text = review_logic.reflect_on_quality_results(
        [review("passed", "ok.md"), review("failed"), review("deterministic_failed", "b.json")],
        set(),
    )
    assert "Fix a.md" in text and "Fix b.json" in text and "ok.md" not in text


def test_a_capped_file_changes_the_advice():
    text = review_logic.reflect_on_quality_results([review("failed")], {"a.md"})
    assert "review round limit" in text and "Fix a.md" not in text


def test_a_task_carries_its_recent_reviews_only():
    done: list[QualityReview] = []
    for n in range(30):
        done = review_logic.carried_reviews(done, [review("passed", f"f{n}.md")], 20)
    assert len(done) == 20 and done[0].file_path == "f10.md" and done[-1].file_path == "f29.md"
    children = [review("failed", f"c{n}.md") for n in range(25)]
    assert [r.file_path for r in review_logic.carried_reviews(done, children, 20)] == \
        [f"c{n}.md" for n in range(5, 25)]
    # Runs recorded before the bound carry them all.
    assert len(review_logic.carried_reviews(done, children, None)) == 45
