"""The OpenAI chat wire format: messages out, tool-call arguments and structured JSON answers in."""

from __future__ import annotations

import functools
import json
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from refloop.contract.activity_io import LLMUsageRecord
from refloop.contract.messages import ChatMessage, ToolCall
from refloop.contract.text import first_json_object

T = TypeVar("T", bound=BaseModel)
class ChatOutcome(BaseModel):
    """One answer. `usage` covers every request it took (a cut-off answer's re-ask too)."""

    content: str | None = None
    tool_calls: list[ToolCall] = []
    finish_reason: str | None = None
    abnormal: str | None = None
    cut: str | None = None  # refloop hung up: "max_tokens" or "time" (refloop/llm/stream.py)
    usage: LLMUsageRecord

    @property
    def truncated(self) -> bool:
        """Cut off at the token cap with no tool call: not an answer."""
        return self.finish_reason == "length" and not self.tool_calls


class StructuredOutcome(BaseModel, Generic[T]):
    value: T
    usage: LLMUsageRecord
    attempts: int


def to_wire(message: ChatMessage) -> dict[str, Any]:
    # Content is always a string: llama-cpp-python's server refuses an assistant turn with
    # `content: null` (its tool-call turns) with a 500 validation error.
    wire: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        wire["tool_call_id"] = message.tool_call_id
    return wire


def parse_arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


@functools.cache
def json_schema_of(schema: type[BaseModel]) -> dict[str, Any]:
    """Output schemas are fixed classes: build each one's JSON schema once per process."""
    return schema.model_json_schema()


def parse_json_answer(text: str | None, schema: type[T]) -> T:
    """Tolerant of fences and prose: the first balanced {...} object is the answer."""
    candidate = first_json_object(text or "")
    if candidate is None:
        raise ValueError("the answer holds no JSON object")
    return schema.model_validate_json(candidate)
