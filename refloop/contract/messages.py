"""What the model and the agent exchange: chat messages, tool calls and specs, token
usage, and the structured answers (intent, plan).
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

COMPLETE_STEP = "complete_step"  # the built-in that marks a plan step done


class Purpose(str, Enum):
    """Value of the `X-Refloop-Purpose` header; routing and test doubles key on it."""

    intent = "intent"
    plan = "plan"
    act = "act"
    quality_review = "quality_review"
    completeness = "completeness"
    supplement_plan = "supplement_plan"
    code_review = "code_review"
    code_verify = "code_verify"
    summary = "summary"
    # A summary of the conversation's older turns, written when it nears the window
    compact = "compact"


# Completion caps by purpose: large enough for any sane answer of that kind.
DEFAULT_MAX_TOKENS: dict[str, int] = {
    Purpose.intent.value: 256,
    Purpose.plan.value: 1024,
    Purpose.act.value: 2048,
    Purpose.quality_review.value: 1024,
    Purpose.completeness.value: 1024,
    Purpose.supplement_plan.value: 1024,
    Purpose.code_review.value: 4096,
    Purpose.code_verify.value: 4096,
    Purpose.summary.value: 512,
    Purpose.compact.value: 1024,
}


def parse_max_tokens(value: str | None) -> dict[str, int]:
    """`REFLOOP_MAX_TOKENS`: "4096" (every purpose) or "act=4096,plan=2048"."""
    caps = dict(DEFAULT_MAX_TOKENS)
    if not value:
        return caps
    value = value.strip()
    if value.isdigit():
        return {purpose: int(value) for purpose in caps}
    for item in value.split(","):
        name, _, number = item.partition("=")
        name, number = name.strip(), number.strip()
        if name not in caps or not number.isdigit() or int(number) < 1:
            raise ValueError(f"expected a number or purpose=N pairs (purposes: "
                             f"{', '.join(caps)}); bad item {item.strip()!r}")
        caps[name] = int(number)
    return caps


# ---------------------------------------------------------------- chat


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class TokenUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0  # HTTP requests, answered or not
    failed_calls: int = 0  # of those: errors, timeouts, cut-off or unusable answers
    # Of the failed: requests whose answer never arrived (client timeout, cancelled or
    # killed attempt). The server may still have generated for them, so their usage is
    # unknown; `abandoned_max_tokens` (the sum of their caps) bounds its completion tokens.
    abandoned_calls: int = 0
    abandoned_max_tokens: int = 0
    # Of the calls: streamed answers refloop hung up on, past their `max_tokens` or still
    # generating at the time bound (the tokens that came are counted).
    cut_calls: int = 0
    # Of the calls: the server sent no usage (a cut stream, a server that never sends it),
    # so their tokens are refloop's estimate (refloop/llm/stream.py).
    estimated_calls: int = 0
    # USD, at the model's price (refloop/contract/budget.py); answered calls of a model
    # with no price are `unpriced_calls` instead. New: earlier usage reads 0.
    cost_usd: float = 0.0
    unpriced_calls: int = 0

    def add(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            calls=self.calls + other.calls,
            failed_calls=self.failed_calls + other.failed_calls,
            abandoned_calls=self.abandoned_calls + other.abandoned_calls,
            abandoned_max_tokens=self.abandoned_max_tokens + other.abandoned_max_tokens,
            cut_calls=self.cut_calls + other.cut_calls,
            estimated_calls=self.estimated_calls + other.estimated_calls,
            # rounded to a nano-dollar: float sums must not drift (budget.COST_DIGITS)
            cost_usd=round(self.cost_usd + other.cost_usd, 9),
            unpriced_calls=self.unpriced_calls + other.unpriced_calls,
        )


class ToolSpec(BaseModel):
    """What crosses to the model: name, description and JSON schema, never callables."""

    name: str
    description: str
    parameters: dict[str, Any]

    @functools.cached_property
    def wire(self) -> dict[str, Any]:
        """The OpenAI `tools` entry, built once per spec (the registry's specs are shared)."""
        return {"type": "function", "function": self.model_dump()}


# ---------------------------------------------------------------- structured answers


class IntentLabel(str, Enum):
    CODING_TASK = "CODING_TASK"
    CAPABILITY_QUERY = "CAPABILITY_QUERY"
    REPO_ANALYSIS = "REPO_ANALYSIS"
    GENERAL_CHAT = "GENERAL_CHAT"
    UNCERTAIN = "UNCERTAIN"


class IntentResult(BaseModel):
    intent: IntentLabel
    confidence: float = Field(ge=0.0, le=1.0)
    reason: str = ""


class TaskType(str, Enum):
    research = "research"
    creation = "creation"
    data_processing = "data_processing"
    coding = "coding"
    other = "other"


class PlanStep(BaseModel):
    goal: str = Field(min_length=1)
    tool: str = Field(min_length=1)


class Plan(BaseModel):
    task_type: TaskType = TaskType.other
    steps: list[PlanStep] = Field(min_length=1)
