"""Tool-result feedback windows long outputs around the task's keywords."""

from __future__ import annotations

from refloop.contract.activity_io import ToolResult
from refloop.contract.text import task_keywords
from refloop.tools.output import arguments_or_refusal, window_text


def test_keywords_skip_stopwords_and_keep_order():
    assert task_keywords("Where is the retry policy configured? Fix the Retry policy") == [
        "retry", "policy", "configured"]
    assert task_keywords("修改 配置文件") == ["修改", "配置文件"]


def test_short_output_is_unchanged():
    assert window_text("a\nb", ["x"], 100) == "a\nb"


def test_keyword_lines_far_below_the_head_survive_with_markers():
    lines = [f"{n:5d}  filler line" for n in range(1, 3001)]
    lines[2400] = " 2401  policy = RetryPolicy(maximum_attempts=5)"
    out = window_text("\n".join(lines), ["retry", "policy"], 2_000)
    assert len(out) <= 2_000
    assert "RetryPolicy(maximum_attempts=5)" in out
    assert out.startswith("    1  filler line")  # the head is kept too
    assert out.splitlines()[-2] == " 3000  filler line"  # and the tail (a command's verdict)
    assert "[... " in out and "(output lines" in out
    assert "lines left out]" in out.splitlines()[-1]
    # the window around the hit keeps its neighbours
    assert " 2400  filler line" in out and " 2402  filler line" in out


def test_without_hits_the_head_is_kept():
    out = window_text("\n".join(f"line {n}" for n in range(1000)), ["absent"], 500)
    assert out.startswith("line 0\nline 1") and len(out) <= 500


def test_one_huge_line_is_cut_with_a_note():
    out = window_text("x" * 10_000, ["x"], 1_000)
    assert len(out) <= 1_000 and out.endswith("characters left out ...]")


async def test_arguments_nested_past_recursion_are_a_result_the_model_reads():
    """Built-in and MCP calls alike: hostile nesting is a failed call, not a retry."""
    nested: dict = {}
    inner = nested
    for _ in range(100_000):
        inner["a"] = {}
        inner = inner["a"]

    def never(_key: str) -> str:
        raise AssertionError("no blob is read for arguments that hold no marker")

    refused = await arguments_or_refusal({"x": nested}, never)
    assert isinstance(refused, ToolResult) and not refused.ok
    assert refused.error.startswith("E_INVALID_ARGS")
    assert await arguments_or_refusal({"path": "a.txt"}, never) == {"path": "a.txt"}
