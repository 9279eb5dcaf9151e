"""What the scripted model answers: a scenario (per purpose, an ordered list of responses
or tool calls, plus endpoint quirks to imitate), loaded from a file or a dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from refloop.contract.messages import Purpose

SCRIPTED_MARKER = "refloop-scripted"


class ScriptedCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedResponse(BaseModel):
    """One answer: JSON content, raw text, tool calls, or an HTTP error."""

    json_: Any = Field(default=None, alias="json")
    content: str | None = None
    tool_calls: list[ScriptedCall] | None = None
    status: int = 200
    body: dict[str, Any] | None = None
    retry_after: float | None = None
    headers: dict[str, str] | None = None  # more headers on an error answer
    delay_ms: int = 0
    # When set, this entry only answers requests whose text contains it (else skipped).
    when_contains: str | None = None
    # "length": the answer was cut off at max_tokens (as a real server reports it)
    finish_reason: str | None = None
    # A server that ignores max_tokens: streamed, tokens (the first tool call's arguments,
    # with tool_calls) until the client hangs up; unstreamed, RUNAWAY_FACTOR times the cap
    # (reported in its usage)
    runaway: bool = False
    # Streamed: this many tokens, then nothing (a stalled server)
    stall_after: int | None = Field(default=None, ge=0)
    # Streamed: a pause before each token
    token_ms: int = Field(default=0, ge=0)

    model_config = {"populate_by_name": True, "extra": "forbid"}

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptedResponse:
        kinds = [self.json_ is not None, self.content is not None, bool(self.tool_calls),
                 self.runaway]
        if self.status == 200 and not any(kinds):
            raise ValueError("needs one of json, content, tool_calls, or an error status")
        return self


class EndpointQuirks(BaseModel):
    """How real endpoints deviate, emulated so the gateway's negotiation is tested over
    HTTP. A rejection consumes no scripted response."""

    model_config = {"extra": "forbid"}

    # Status for `response_format: json_schema` (llama-cpp-python: 500 naming it)
    reject_json_schema: int | None = None
    # Status for `{"type": "json_object", "schema": ...}`
    reject_json_object_schema: int | None = None
    # Status for any `response_format`
    reject_response_format: int | None = None
    # Status for a request carrying `tool_choice`
    reject_tool_choice: int | None = None
    # Tool-call answers come back as prose unless the request sends `tool_choice`
    # (llama-cpp-python's chatml-function-calling handler)
    tools_need_choice: bool = False
    # llama-cpp-python: a message with `content: null` is a 500 validation error
    reject_null_content: bool = False
    # Status for a request with `stream: true` (a server that cannot stream)
    reject_stream: int | None = None
    # Status for a request carrying `stream_options`
    reject_stream_options: int | None = None
    # llama-cpp-python 0.3.36: a streamed answer that would be a tool call under
    # `tool_choice: auto` ends without a chunk (its handler raises inside the stream)
    stream_tools_break: bool = False
    # llama-cpp-python 0.3.36 again: unstreamed, a tool call under `tool_choice: auto`
    # ignores max_tokens (its handler passes none on): RUNAWAY_FACTOR times the cap
    unstreamed_tools_run_away: bool = False
    # A server that cannot stream a tool call at all, the tool named or not
    stream_named_tools_break: bool = False
    # llama-cpp-python 0.3.36 once more: every streamed delta of a tool call repeats its
    # id, type and name (OpenAI sends them in the first only), the legacy function_call
    # beside them
    stream_repeats_call_fields: bool = False
    # A context window of this many tokens (the prompt counted at 3.5 characters of its
    # JSON a token, as prompt_tokens reports it): a longer prompt, or one whose max_tokens
    # would not fit beside it, is refused as `context_refusal` words it. Unset: 131072,
    # stated in /v1/models, not enforced.
    context_tokens: int | None = Field(default=None, ge=256)
    # llama_cpp: 400 `exceed_context_size_error` with n_ctx, and GET /props states the
    # window (the default scenario's); openai: 400 `context_length_exceeded`, "maximum
    # context length is N tokens", and the window stated nowhere.
    context_refusal: Literal["llama_cpp", "openai"] = "llama_cpp"


class Scenario(BaseModel):
    name: str = "default"
    latency_ms: int = Field(default=0, ge=0)
    # Serve any number of tasks, at once too: a purpose answers with the entry of its
    # conversation's turn (the number of assistant messages so far), wrapping at the end,
    # so no task consumes another's answers.
    repeat: bool = False
    endpoint: EndpointQuirks = Field(default_factory=EndpointQuirks)
    responses: dict[Purpose, list[ScriptedResponse]] = Field(default_factory=dict)
    # Every answer reports this usage ({"prompt_tokens": N, "completion_tokens": M})
    # instead of its counted tokens: calls of a known price (spend-limit tests)
    usage: dict[Literal["prompt_tokens", "completion_tokens"], int] | None = None


def load_scenario(source: dict[str, Any] | str | Path, name: str | None = None) -> Scenario:
    """Validate a scenario; a bad file fails here naming the bad entry."""
    if not isinstance(source, dict):
        path = Path(source)
        try:
            source = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"scenario {path}: cannot read: {err}") from None
    try:
        scenario = Scenario.model_validate(source)
    except ValidationError as err:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise ValueError(f"invalid scenario: {where}") from None
    if name:
        scenario.name = name
    return scenario
