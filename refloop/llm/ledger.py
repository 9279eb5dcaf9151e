"""The request ledger: every HTTP request of one activity execution, counted as it goes
out (failed and abandoned until its answer arrives), carried across attempts in heartbeat
details. Each answer is priced as it arrives (its model's price, or counted unpriced).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from refloop.contract.activity_io import LLMUsageRecord
from refloop.contract.budget import ModelPrice, priced
from refloop.contract.messages import Purpose, TokenUsage


def in_flight(max_tokens: int) -> TokenUsage:
    """A request that went out and has no answer yet: failed and abandoned until then."""
    return TokenUsage(calls=1, failed_calls=1, abandoned_calls=1,
                      abandoned_max_tokens=max_tokens)


def settled(max_tokens: int, failed: bool) -> TokenUsage:
    """What turns an in-flight request into an answered (or a plainly failed) one."""
    return TokenUsage(failed_calls=0 if failed else -1, abandoned_calls=-1,
                      abandoned_max_tokens=-max_tokens)


@dataclass
class RequestLedger:
    """Every HTTP request of one activity execution, carried across its attempts."""

    purpose: str | None = None
    model: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    on_change: Callable[[RequestLedger], None] | None = None
    # The model's price (a task's model config's, else REFLOOP_MODEL_PRICES'); None: its
    # answers are counted unpriced
    price: ModelPrice | None = None

    def begin(self, purpose: Purpose, model: str, max_tokens: int,
              price: ModelPrice | None = None) -> None:
        """A request is about to go out: counted failed and abandoned (usage unknown, at
        most `max_tokens` generated) until its answer arrives, so an attempt killed
        mid-request is still in the ledger, heartbeated."""
        self.purpose = self.purpose or purpose.value
        self.model = self.model or model
        self.price = self.price or price
        self.usage = self.usage.add(in_flight(max_tokens))
        self._changed()

    def answered(self, usage: TokenUsage, max_tokens: int) -> float:
        """The answer's usage, priced, into the ledger; returns its cost."""
        answer = priced(usage.model_copy(update={"calls": 0, "cost_usd": 0.0}), self.price)
        self.usage = self.usage.add(answer.add(settled(max_tokens, failed=False)))
        self._changed()
        return answer.cost_usd

    def failed(self, max_tokens: int, abandoned: bool, received: TokenUsage | None = None
               ) -> None:
        """The request ended without a usable answer. `abandoned`: its answer never came
        (a client timeout): the server may still be generating, so it stays abandoned.
        `received`: what a broken stream delivered before it broke (counted)."""
        if not abandoned:
            self.usage = self.usage.add(settled(max_tokens, failed=True))
        if received is not None:  # priced: the tokens that came are paid for
            self.usage = self.usage.add(priced(received.model_copy(
                update={"calls": 0, "cost_usd": 0.0}), self.price, answers=0))
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def dump(self) -> dict[str, Any]:
        return {"purpose": self.purpose, "model": self.model,
                "usage": self.usage.model_dump()}

    @classmethod
    def load(cls, data: Any) -> RequestLedger:
        ledger = cls()
        if isinstance(data, dict) and isinstance(data.get("usage"), dict):
            try:
                ledger.usage = TokenUsage.model_validate(data["usage"])
                ledger.purpose, ledger.model = data.get("purpose"), data.get("model")
            except ValueError:
                pass
        return ledger

    def record(self, fallback: LLMUsageRecord | None = None) -> LLMUsageRecord | None:
        purpose = self.purpose or (fallback.purpose.value if fallback else None)
        model = self.model or (fallback.model if fallback else None)
        if purpose is None or model is None:
            return None
        return LLMUsageRecord(purpose=Purpose(purpose), model=model, usage=self.usage)


current_ledger: contextvars.ContextVar[RequestLedger | None] = contextvars.ContextVar(
    "refloop_call_ledger", default=None)
