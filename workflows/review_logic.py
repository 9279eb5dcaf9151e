"""Pure decisions of the quality-review loop: which calls get reviewed, what
the model is told afterwards, and when the review→fix loop on a file must stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from refloop.contract.activity_io import QualityReview, ToolResult
from refloop.contract.messages import ToolCall

if TYPE_CHECKING:
    from refloop.contract.tool_properties import ToolProperties

DEFAULT_RULES = (
    "The edit must do what the task asks, be correct and complete, and keep the document "
    "well-formed and consistent."
)


def needs_review(call: ToolCall, result: ToolResult, properties: ToolProperties | None,
                 whitelist: list[str] | None = None) -> bool:
    """Only successful edits of a reviewed tool that name the file they produced; never
    views, reads, commands or failures. `whitelist` (the task's own list of tool names)
    replaces the tools' `reviewed` property."""
    if not result.ok or properties is None or not result.data.get("file_path"):
        return False
    reviewed = call.name in whitelist if whitelist else properties.reviewed
    return bool(reviewed) and properties.edit_reviewed(call.arguments)


def review_feedback(review: QualityReview) -> str:
    """The review as the model sees it, right after the edit's own result."""
    if review.outcome == "unavailable":
        return f"[quality_review] {review.file_path}: review unavailable ({review.summary})"
    verdict = "PASS" if review.passed else "FAIL"
    text = f"[quality_review] {review.file_path}: {verdict}"
    if review.summary:
        text += f" - {review.summary}"
    if not review.passed:
        text += "".join(f"\n- {reason}" for reason in review.reasons)
        if review.suggestions:
            text += f"\nSuggestions: {review.suggestions}"
    return text


def reflect_on_quality_results(
    reviews: list[QualityReview], capped: set[str]
) -> str | None:
    """Reflection while review is on uses only the reviews of this turn.

    A failed review asks for a fix; a passing one produces no text. A file whose
    review→fix rounds hit the cap is reported and left, so the task moves on.
    """
    failed = [review for review in reviews if not review.passed and review.outcome != "unavailable"]
    if not failed:
        return None
    parts = []
    for review in failed:
        reasons = "; ".join(review.reasons) or review.summary or "no reason given"
        if review.file_path in capped:
            parts.append(
                f"{review.file_path} still fails review ({reasons}) and has reached the "
                "review round limit: the failure is recorded; move on with the task."
            )
        else:
            advice = f" Suggestions: {review.suggestions}" if review.suggestions else ""
            parts.append(
                f"The quality review of {review.file_path} failed: {reasons}.{advice} "
                f"Fix {review.file_path} so that it meets the review rules."
            )
    return "Reflection on the quality reviews:\n" + "\n".join(parts)


def carried_reviews(reviews: list[QualityReview], new: list[QualityReview],
                    keep: int | None) -> list[QualityReview]:
    """The reviews a task carries after `new` ones: the last `keep` (None: all, as runs
    recorded before the bound did)."""
    kept = [*reviews, *new]
    return kept if keep is None else kept[-keep:]


def remember_failure(failures: dict[str, int], capped: list[str], review: QualityReview,
                     max_rounds: int, keep: int) -> tuple[dict[str, int], list[str], bool]:
    """The cap's memory after a review, bounded by `keep` files each: `failures` counts the
    failed reviews of files not yet capped, `capped` lists the files that reached the cap;
    in both the most recent last. True when this failure reaches the cap. A file forgotten
    (`keep` other files since) starts again from no failure."""
    if review.passed or review.outcome == "unavailable":
        return failures, capped, False
    path = review.file_path
    count = failures.get(path, 0) + 1
    others = {name: n for name, n in failures.items() if name != path}
    if count >= max_rounds:
        return _last(others, keep), recent_first_out(capped, path, keep), True
    return _last({**others, path: count}, keep), capped, False


def recent_first_out(items: list[str], item: str, keep: int) -> list[str]:
    """`item` moved (or added) to the end, the oldest dropped past `keep`: a capped file
    edited again stays remembered."""
    return [*(other for other in items if other != item), item][-keep:]


def _last(counts: dict[str, int], keep: int) -> dict[str, int]:
    return dict(list(counts.items())[-keep:])
