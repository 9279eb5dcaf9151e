"""The one LLM gateway: every model call of every activity goes through here.

`openai.AsyncOpenAI` with `max_retries=0` so Temporal owns every retry; errors are
classified retryable or not; each request carries `X-Refloop-Purpose`.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Generic, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from refloop.models import (
    ChatMessage,
    LLMUsageRecord,
    ModelEndpoint,
    Purpose,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from refloop.settings import Settings
from refloop.telemetry import tracer
from refloop.textguard import detect_abnormal_output, first_json_object

T = TypeVar("T", bound=BaseModel)
RETRYABLE_STATUSES = frozenset({408, 409, 429})
PURPOSE_HEADER = "X-Refloop-Purpose"


class LLMError(Exception):
    retryable = False

    def __init__(self, message: str, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class LLMTransportError(LLMError):
    """Timeouts, connection errors, 408/409/429, 5xx: Temporal retries with backoff."""

    retryable = True


class LLMClientError(LLMError):
    """400/401/403/404/422 and other 4xx: retrying cannot help."""


class InvalidModelOutput(LLMError):
    """Structured output still invalid after the bounded re-asks."""


class ChatOutcome(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = []
    finish_reason: str | None = None
    abnormal: str | None = None
    usage: LLMUsageRecord


class StructuredOutcome(BaseModel, Generic[T]):
    value: T
    usage: LLMUsageRecord
    attempts: int


def _retry_after(err: openai.APIStatusError) -> float | None:
    value = err.response.headers.get("retry-after") if err.response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def classify(err: Exception) -> LLMError:
    """Map an openai exception onto our retryable / non-retryable errors."""
    if isinstance(err, openai.APITimeoutError | openai.APIConnectionError):
        return LLMTransportError(f"model endpoint unreachable: {err}")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        message = f"model endpoint answered {status}: {err.message}"
        if status in RETRYABLE_STATUSES or status >= 500:
            return LLMTransportError(message, status, _retry_after(err))
        return LLMClientError(message, status)
    return LLMTransportError(f"model call failed: {err!r}")


def to_wire(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
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


class LLMGateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default_model = settings.refloop_model
        self.client = openai.AsyncOpenAI(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key or "not-needed",
            max_retries=0,
            timeout=settings.refloop_llm_timeout_s,
        )
        self.json_schema_supported = True
        self.usage_by_purpose: dict[str, TokenUsage] = {}
        self.endpoint_clients: dict[tuple[str | None, str | None, str], openai.AsyncOpenAI] = {}

    def client_for(self, endpoint: ModelEndpoint | None) -> openai.AsyncOpenAI:
        """The default client, or one for a task's model config: its base URL, and the key
        read here, on the worker, from the variable it names (never carried in a task)."""
        if endpoint is None or (endpoint.base_url is None and endpoint.api_key_env is None):
            return self.client
        key = self.settings.openai_api_key
        if endpoint.api_key_env:
            key = os.environ.get(endpoint.api_key_env)
            if not key:
                raise LLMClientError(f"the model config names {endpoint.api_key_env}, which is "
                                     "unset on this worker")
        base_url = endpoint.base_url or self.settings.openai_base_url
        cache_key = (base_url, endpoint.api_key_env, key or "")
        if cache_key not in self.endpoint_clients:
            self.endpoint_clients[cache_key] = openai.AsyncOpenAI(
                base_url=base_url, api_key=key or "not-needed", max_retries=0,
                timeout=self.settings.refloop_llm_timeout_s)
        return self.endpoint_clients[cache_key]

    async def _create(self, purpose: Purpose, client: openai.AsyncOpenAI | None = None,
                      **kwargs: Any) -> Any:
        try:
            return await (client or self.client).chat.completions.create(
                extra_headers={PURPOSE_HEADER: purpose.value}, **kwargs
            )
        except openai.OpenAIError as err:
            raise classify(err) from err

    def _usage(self, purpose: Purpose, model: str, response: Any) -> LLMUsageRecord:
        raw = response.usage
        usage = TokenUsage(
            prompt_tokens=getattr(raw, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(raw, "completion_tokens", 0) or 0,
            total_tokens=getattr(raw, "total_tokens", 0) or 0,
            calls=1,
        )
        total = self.usage_by_purpose.get(purpose.value, TokenUsage())
        self.usage_by_purpose[purpose.value] = total.add(usage)
        return LLMUsageRecord(purpose=purpose, model=model, usage=usage)

    async def chat(
        self,
        purpose: Purpose,
        messages: list[ChatMessage],
        *,
        model: str | None = None,
        tools: list[ToolSpec] | None = None,
        parallel_tool_calls: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        response_format: dict[str, Any] | None = None,
        endpoint: ModelEndpoint | None = None,
    ) -> ChatOutcome:
        client = self.client_for(endpoint)
        if endpoint is not None:  # a task's model config: its model and temperature
            model = endpoint.model
            temperature = endpoint.temperature if temperature is None else temperature
        model = model or self.default_model
        # Messages and tools are already wire-format dicts: sent as extra_body, the JSON is
        # the same and the SDK skips re-walking them on every call (a fifth of a busy
        # worker's CPU, measured with bench/bench_scale.py).
        extra: dict[str, Any] = {"messages": [to_wire(m) for m in messages]}
        kwargs: dict[str, Any] = {"model": model, "messages": [], "extra_body": extra}
        if tools:
            extra["tools"] = [spec.wire for spec in tools]
            if parallel_tool_calls is not None:
                extra["parallel_tool_calls"] = parallel_tool_calls
        for name, value in (("temperature", temperature), ("top_p", top_p)):
            if value is not None:
                kwargs[name] = value
        if response_format is not None:
            extra["response_format"] = response_format
        with tracer.start_as_current_span(f"chat {model}") as span:
            span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.system": "openai",
                                 "gen_ai.request.model": model,
                                 "refloop.purpose": purpose.value})
            response = await self._create(purpose, client, **kwargs)
            usage = getattr(response, "usage", None)
            span.set_attributes({
                "gen_ai.response.model": getattr(response, "model", "") or "",
                "gen_ai.usage.input_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                "gen_ai.usage.output_tokens": getattr(usage, "completion_tokens", 0) or 0,
            })
        if not response.choices:
            raise LLMTransportError("model endpoint answered with no choices")
        choice = response.choices[0]
        content = choice.message.content
        abnormal = detect_abnormal_output(content or "")
        if abnormal:
            content = (content or "")[:500]
        calls = [
            ToolCall(id=call.id or f"call_{index}", name=call.function.name,
                     arguments=parse_arguments(call.function.arguments))
            for index, call in enumerate(choice.message.tool_calls or [])
        ]
        return ChatOutcome(
            content=content,
            tool_calls=calls,
            finish_reason=choice.finish_reason,
            abnormal=abnormal,
            usage=self._usage(purpose, model, response),
        )

    async def structured(
        self,
        purpose: Purpose,
        messages: list[ChatMessage],
        schema: type[T],
        *,
        model: str | None = None,
        max_reasks: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        endpoint: ModelEndpoint | None = None,
    ) -> StructuredOutcome[T]:
        """Ask for JSON, validate with pydantic, re-ask with the error a bounded number of times."""
        reasks = self.settings.refloop_structured_max_reasks if max_reasks is None else max_reasks
        conversation = list(messages)
        total = TokenUsage()
        model = (endpoint.model if endpoint else model) or self.default_model
        last_error = ""
        for attempt in range(1, reasks + 2):
            outcome = await self._structured_call(purpose, conversation, schema, model,
                                                  temperature, top_p, endpoint)
            total = total.add(outcome.usage.usage)
            try:
                value = parse_json_answer(outcome.content, schema)
            except (ValueError, ValidationError) as err:
                last_error = str(err)
                conversation += [
                    ChatMessage(role="assistant", content=outcome.content or ""),
                    ChatMessage(
                        role="user",
                        content=f"Your answer was not valid: {last_error}\n"
                        "Answer again with only the JSON object, matching the schema.",
                    ),
                ]
                continue
            record = LLMUsageRecord(purpose=purpose, model=model, usage=total)
            return StructuredOutcome[schema](value=value, usage=record, attempts=attempt)
        raise InvalidModelOutput(
            f"{purpose.value}: the model's answer was still invalid after {reasks} re-asks: "
            f"{last_error[:500]}"
        )

    async def _structured_call(
        self, purpose: Purpose, messages: list[ChatMessage], schema: type[T], model: str,
        temperature: float | None, top_p: float | None,
        endpoint: ModelEndpoint | None = None,
    ) -> ChatOutcome:
        if self.json_schema_supported:
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": json_schema_of(schema),
                                "strict": False},
            }
            try:
                return await self.chat(purpose, messages, model=model, temperature=temperature,
                                       top_p=top_p, response_format=response_format,
                                       endpoint=endpoint)
            except LLMClientError as err:
                text = str(err).lower()
                if err.status != 400 or not ("response_format" in text or "json_schema" in text):
                    raise
                self.json_schema_supported = False  # this endpoint only takes json_object
        schema_note = ChatMessage(
            role="system",
            content="Answer with one JSON object matching this JSON schema:\n"
            + json.dumps(json_schema_of(schema)),
        )
        return await self.chat(purpose, [schema_note, *messages], model=model,
                               temperature=temperature, top_p=top_p,
                               response_format={"type": "json_object"}, endpoint=endpoint)
