"""What one model endpoint supports, how much it may generate, how many requests it takes at
once, and the ledger of every request an activity made.

State is kept per (base URL, model) on the worker: the structured-output mode and tool
mode that work, learnt from the endpoint's rejections and logged once. Concurrency slots
are per base URL (one server, whatever model it serves).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from refloop.llm.window import length_refusal

if TYPE_CHECKING:
    from refloop.contract.errors import LLMError

log = logging.getLogger("refloop.llm")

# Strongest first; a rejection steps down one mode, never back up.
STRUCTURED_MODES = ("json_schema", "json_object_schema", "json_object", "prompt")

# Statuses that say nothing about the request's shape: no step-down on these.
NOT_ABOUT_SHAPE = frozenset({401, 403, 404, 408, 409, 429})
MODE_WORDS = ("response_format", "json_schema", "schema")


# Request fields a server may refuse; a 5xx naming one refused the request's shape
# (llama-cpp-python answers an unsupported field with a 500, with or without the words
# "validation error"): waiting cannot help, a weaker mode can.
REQUEST_FIELDS = re.compile(r"\b(response_format|json_schema|tool_choice|tools|stream_options|"
                            r"parallel_tool_calls)\b")


def refuses_shape(status: int | None, body: str) -> bool:
    """A 5xx about the request rather than the server: a validation error, or a body
    naming a request field. A refusal for length is neither (refloop.llm.window)."""
    if status is None or status < 500 or length_refusal(status, body) is not None:
        return False
    return "validation error" in body.lower() or REQUEST_FIELDS.search(body) is not None


def rejects_mode(status: int | None, body: str) -> bool:
    """A structured-output mode was refused: any 4xx about the request, or a 5xx whose
    body names the response format (llama-cpp-python answers json_schema with a 500)."""
    if status is None or length_refusal(status, body) is not None:
        return False
    text = body.lower()
    if 400 <= status < 500:
        return status not in NOT_ABOUT_SHAPE
    return status >= 500 and any(word in text for word in MODE_WORDS)


def rejects_field(status: int | None, body: str, word: str) -> bool:
    """A request field (`tool_choice`, `tools`, `stream_options`, `stream`) refused: a 4xx
    naming it, or a 5xx validation error naming it (llama-cpp-python)."""
    if status is None or word not in body.lower() or length_refusal(status, body):
        return False
    if status >= 500:
        return refuses_shape(status, body)
    return 400 <= status < 500 and status not in NOT_ABOUT_SHAPE


# What a refused streaming feature falls back to, said once per (base URL, model).
FALLBACKS = {
    "stream": "not streamed from now on: max_tokens is the server's to keep, and each "
              "request is bounded by REFLOOP_LLM_TIMEOUT_S alone",
    "stream_tools": "requests offering tools under tool_choice auto now pick their tool "
                    "first (a short capped request), then stream the call with that tool "
                    "named (or none)",
    "stream_named": "requests offering tools are not streamed from now on: their "
                    "max_tokens is the server's to keep, and each is bounded by "
                    "REFLOOP_LLM_TIMEOUT_S alone",
    "stream_options": "streams without it from now on; their usage is refloop's estimate",
}


@dataclass
class EndpointState:
    """What was learnt about one (base URL, model)."""

    structured: int = 0  # index into STRUCTURED_MODES
    tool_choice: bool = True  # send `tool_choice`
    native_tools: bool = True  # send `tools` at all
    response_format: bool = True  # plain `json_object` accepted (code review)
    stream: bool = True  # stream answers (refloop/llm/stream.py)
    stream_options: bool = True  # ask for the usage at the end of a stream
    # stream a request that offers tools under `tool_choice: auto`. llama-cpp-python 0.3.36
    # cannot (its stream ends without a chunk, and unstreamed it drops max_tokens): such an
    # endpoint is asked which tool first, then for the call with that tool named.
    stream_tools: bool = True
    # stream a request that names its tool (or `none`); off: unstreamed, bounded by time
    stream_named: bool = True

    def streams(self, offers_tools: bool, named: bool = False) -> bool:
        if not offers_tools:
            return self.stream
        return self.stream and (self.stream_named if named else self.stream_tools)

    def picks_tool(self) -> bool:
        """A request offering tools under `tool_choice: auto` goes as a pick, then the call
        with its tool named: both stream, so both are cut at their caps."""
        return (self.stream and not self.stream_tools and self.stream_named
                and self.native_tools and self.tool_choice)


class Endpoints:
    """Per-(base URL, model) capability state and per-base-URL slots of one gateway."""

    def __init__(self, structured_pin: str, tool_mode: str, concurrency: int,
                 hold_after_timeout_s: float, stream: str = "auto") -> None:
        self.structured_pin = structured_pin
        self.stream = stream
        self.tool_mode = tool_mode
        self.concurrency = concurrency
        self.hold_after_timeout_s = hold_after_timeout_s
        self.states: dict[tuple[str, str], EndpointState] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}

    def state(self, base_url: str, model: str) -> EndpointState:
        key = (base_url, model)
        if key not in self.states:
            state = EndpointState()
            if self.structured_pin != "auto":
                state.structured = STRUCTURED_MODES.index(self.structured_pin)
            if self.tool_mode == "text":
                state.native_tools = False
            state.stream = self.stream != "off"
            self.states[key] = state
        return self.states[key]

    def structured_mode(self, base_url: str, model: str) -> str:
        return STRUCTURED_MODES[self.state(base_url, model).structured]

    def step_down(self, base_url: str, model: str, reason: str) -> bool:
        """Next weaker structured mode; False when pinned or already prompt-only."""
        state = self.state(base_url, model)
        if self.structured_pin != "auto" or state.structured == len(STRUCTURED_MODES) - 1:
            return False
        old = STRUCTURED_MODES[state.structured]
        state.structured += 1
        log.warning("model endpoint %s model %s: structured output %s rejected (%s); "
                    "using %s from now on", base_url, model, old, reason[:200],
                    STRUCTURED_MODES[state.structured])
        return True

    def drop(self, base_url: str, model: str, what: str, reason: str) -> bool:
        """Stop sending `tool_choice` / `tools` / `response_format`, or stop streaming
        (`stream`, `stream_options`, `stream_tools`, `stream_named`); False if already off
        or the operator pinned native tools."""
        state = self.state(base_url, model)
        pinned = what in ("tool_choice", "native_tools") and self.tool_mode == "native"
        if not getattr(state, what) or pinned:
            return False
        setattr(state, what, False)
        log.warning("model endpoint %s model %s: %s rejected (%s); %s", base_url, model,
                    what, reason[:200], FALLBACKS.get(what, "not sent from now on"))
        return True

    def drop_rejected(self, err: LLMError, kwargs: dict[str, Any], model: str,
                      base_url: str) -> bool:
        """Stop sending what the endpoint refused of a request's `kwargs` (`stream_options`,
        then `stream`; `tool_choice`, then `tools`; a plain `json_object` response format);
        True: ask again without it."""
        body = err.body or str(err)
        extra = kwargs["extra_body"]
        fmt = extra.get("response_format") or {}
        candidates = (
            ("stream_options", "stream_options" in kwargs
             and rejects_field(err.status, body, "stream_options")),
            ("stream", kwargs.get("stream") is True and "stream_options" not in body.lower()
             and rejects_field(err.status, body, "stream")),
            ("tool_choice", "tool_choice" in extra
             and rejects_field(err.status, body, "tool_choice")),
            ("native_tools", "tools" in extra and rejects_field(err.status, body, "tool")),
            ("response_format", fmt.get("type") == "json_object" and "schema" not in fmt
             and rejects_mode(err.status, body)),
        )
        return any(rejected and self.drop(base_url, model, what, str(err))
                   for what, rejected in candidates)

    def slot(self, base_url: str) -> asyncio.Semaphore | None:
        if not self.concurrency:
            return None
        if base_url not in self.slots:
            self.slots[base_url] = asyncio.Semaphore(self.concurrency)
        return self.slots[base_url]

    def release_later(self, slot: asyncio.Semaphore) -> None:
        """After a client timeout the server is most likely still generating the abandoned
        answer (llama.cpp does not stop on disconnect): keep its slot a while so the
        retry does not queue behind it."""
        asyncio.get_running_loop().call_later(self.hold_after_timeout_s, slot.release)
