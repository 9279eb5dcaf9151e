"""A task's spend limit: model prices, the cost of a call from the usage its endpoint
reported, and the update that raises a limit. Plain data and pure functions: the gateway
prices each answered request, the workflow decides from the sums.

Prices are USD per million tokens (the unit price lists use). A model with no price is
counted in tokens only: its calls are `unpriced_calls` in the usage, and a cost limit
cannot see them (a token limit still can).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from refloop.contract.messages import TokenUsage

# The workflow update that sets a task's limit (`refloop budget`, POST /tasks/{id}/budget,
# `temporal workflow update execute --name raise_budget`)
RAISE_BUDGET_UPDATE = "raise_budget"
# From a parent to its running supplement child: its share of a raised limit
CHILD_BUDGET_SIGNAL = "budget_share"
# From a supplement child to its parent: it waits for budget (the parent shows it), or not
CHILD_WAIT_SIGNAL = "child_budget_wait"
# How long a task waits for a raise when nobody set REFLOOP_BUDGET_WAIT_S: 7 days
DEFAULT_BUDGET_WAIT_S = 7 * 24 * 3600.0
# Costs are summed in floats: rounded to a nano-dollar, so 100 calls of $0.01 are $1.00
COST_DIGITS = 9


class ModelPrice(BaseModel):
    """One model's price list (REFLOOP_MODEL_PRICES, or a model config's)."""

    model_config = {"extra": "forbid"}

    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    # Accepted so price lists can be pasted whole; cached prompt tokens are priced as input
    # tokens until endpoints' cached-token counts are recorded
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)


def parse_prices(data: Any) -> dict[str, ModelPrice]:
    """REFLOOP_MODEL_PRICES: a JSON object (or its text), model name to price."""
    import json

    if data is None or data == "":
        return {}
    if isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, dict):
        raise ValueError("a JSON object: model name to {input_usd_per_mtok, "
                         "output_usd_per_mtok}")
    return {str(name): ModelPrice.model_validate(price) for name, price in data.items()}


def add_cost(a: float, b: float) -> float:
    return round(a + b, COST_DIGITS)


def call_cost(usage: TokenUsage, price: ModelPrice) -> float:
    """What the tokens of `usage` cost at `price`."""
    return round((usage.prompt_tokens * price.input_usd_per_mtok
                  + usage.completion_tokens * price.output_usd_per_mtok) / 1_000_000,
                 COST_DIGITS)


def priced(usage: TokenUsage, price: ModelPrice | None, answers: int = 1) -> TokenUsage:
    """`usage` with its cost, or (no price) with its `answers` counted as unpriced."""
    if price is None:
        return usage.model_copy(update={"unpriced_calls": usage.unpriced_calls + answers})
    return usage.model_copy(update={"cost_usd": add_cost(usage.cost_usd,
                                                         call_cost(usage, price))})


class BudgetRaise(BaseModel):
    """A task's new limit: a total (its children's spend included), not an increment. A
    limit left out stays as it was."""

    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"max_cost_usd": 5.0}, {"max_tokens": 2_000_000}]}}

    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_limit(self) -> BudgetRaise:
        if self.max_cost_usd is None and self.max_tokens is None:
            raise ValueError("name max_cost_usd or max_tokens (or both)")
        return self


class BudgetState(BaseModel):
    """A task's limits and its spend (its children's included), as the update answers."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    cost_usd: float = 0.0
    tokens: int = 0
    waiting: bool = False


class ChildBudgetWait(BaseModel):
    """A supplement child's budget wait, told to its parent."""

    child_id: str
    waiting: bool
    reason: str = ""
