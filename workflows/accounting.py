"""Token and call accounting of a task: usage per model and purpose, review counts, the
usage of failed calls (from their failure or last heartbeat), the spend limit. Pure
functions.
"""

from __future__ import annotations

from typing import Any

from refloop.contract.activity_io import LLMUsageRecord, QualityReview
from refloop.contract.budget import COST_DIGITS
from refloop.contract.messages import (
    TokenUsage,
)
from refloop.contract.task import TaskStats


def merged_usage(ledger: dict[str, TokenUsage],
                 more: dict[str, TokenUsage]) -> dict[str, TokenUsage]:
    """Usage per key (purpose, model) with more of it added."""
    merged = dict(ledger)
    for key, usage in more.items():
        merged[key] = merged[key].add(usage) if key in merged else usage
    return merged


def add_usage(stats: TaskStats, record: LLMUsageRecord) -> TaskStats:
    return stats.model_copy(
        update={
            "llm_calls": stats.llm_calls + record.usage.calls,
            "llm_failed_calls": stats.llm_failed_calls + record.usage.failed_calls,
            "usage": stats.usage.add(record.usage),
            "usage_by_purpose": merged_usage(stats.usage_by_purpose,
                                             {record.purpose.value: record.usage}),
            "usage_by_model": merged_usage(stats.usage_by_model, {record.model: record.usage}),
        }
    )


def usage_since(now: TokenUsage, then: TokenUsage) -> TokenUsage:
    """The usage added between two readings of the same running total."""
    return TokenUsage.model_validate({
        name: round(value - getattr(then, name), 9) if isinstance(value, float)
        else value - getattr(then, name)
        for name, value in now.model_dump().items()})


def mark_rewound(stats: TaskStats, usage_then: TokenUsage,
                 by_model_then: dict[str, TokenUsage]) -> TaskStats:
    """A rewind to a point whose totals were `usage_then`: what was spent since stays in
    the totals and the ledger (it was paid for) and is counted apart as rewound."""
    by_model = {model: usage_since(usage, by_model_then.get(model, TokenUsage()))
                for model, usage in stats.usage_by_model.items()}
    return stats.model_copy(update={
        "rewound_usage": stats.rewound_usage.add(usage_since(stats.usage, usage_then)),
        "rewound_by_model": merged_usage(stats.rewound_by_model,
                                         {m: u for m, u in by_model.items() if u.calls}),
    })


def count_review(stats: TaskStats, review: QualityReview) -> TaskStats:
    """The stats with one more review counted under its outcome."""
    counts = stats.reviews
    outcome = "unavailable" if review.outcome == "unavailable" else (
        "passed" if review.passed else "failed")
    reviews = counts.model_copy(
        update={"total": counts.total + 1, outcome: getattr(counts, outcome) + 1})
    return stats.model_copy(update={"reviews": reviews})


def failed_usage(details: Any) -> LLMUsageRecord | None:
    """The usage a failed model activity reported: its failure details
    (`{"usage": {...}}`) or its last heartbeat (`{"refloop_ledger": {...}}`)."""
    for item in details or ():
        if not isinstance(item, dict):
            continue
        data = item.get("usage") or item.get("refloop_ledger")
        if isinstance(data, dict) and data.get("purpose") and data.get("model"):
            try:
                return LLMUsageRecord.model_validate(data)
            except ValueError:
                return None
    return None


def success_rate(attempted: int, succeeded: int) -> float | None:
    """Undefined (None) when nothing was attempted, never a perfect 1.0."""
    return round(succeeded / attempted, 3) if attempted else None


def usd(amount: float) -> str:
    return f"${amount:.4f}".rstrip("0").rstrip(".") if amount else "$0"


def over_budget(usage: TokenUsage, max_cost_usd: float | None,
                max_tokens: int | None) -> str | None:
    """Why the limit does not cover the next model call (None: it does). The spend so far
    has reached a limit, or the spend plus what a call has cost on average would pass it;
    so the spend at the pause is at most one call past the limit."""
    calls = max(usage.calls, 1)
    if max_cost_usd is not None:
        per_call = usage.cost_usd / calls
        if usage.cost_usd >= max_cost_usd or round(usage.cost_usd + per_call,
                                                   COST_DIGITS) > max_cost_usd:
            return (f"spend limit: {usd(usage.cost_usd)} spent of {usd(max_cost_usd)}; the "
                    f"next model call (about {usd(per_call)}) is not covered")
    if max_tokens is not None:
        per_call_tokens = usage.total_tokens / calls
        if usage.total_tokens >= max_tokens or usage.total_tokens + per_call_tokens > max_tokens:
            return (f"token limit: {usage.total_tokens} tokens used of {max_tokens}; the next "
                    f"model call (about {round(per_call_tokens)} tokens) is not covered")
    return None


def refuse_raise(usage: TokenUsage, max_cost_usd: float | None,
                 max_tokens: int | None) -> str | None:
    """Why a new limit cannot be set (None: it can): it is below what was spent."""
    if max_cost_usd is not None and max_cost_usd < usage.cost_usd:
        return (f"the task has spent {usd(usage.cost_usd)} (its children's included): a "
                f"limit of {usd(max_cost_usd)} is below that")
    if max_tokens is not None and max_tokens < usage.total_tokens:
        return (f"the task has used {usage.total_tokens} tokens (its children's included): "
                f"a limit of {max_tokens} is below that")
    return None


def remaining(limit: float | None, spent: float) -> float | None:
    """What is left of a limit for a child (never 0: a child with nothing left starts by
    waiting for a raise)."""
    if limit is None:
        return None
    return max(round(limit - spent, COST_DIGITS), 10.0 ** -COST_DIGITS)
