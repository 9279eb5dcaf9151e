"""How large a prompt each model endpoint takes, and how many tokens a prompt is.

Per (base URL, model), on the worker, the window comes from (first that says): the
task's model config (its `context_tokens`), the operator's setting
(`REFLOOP_MODEL_CONTEXT_TOKENS`), the endpoint's first refusal for length (llama.cpp's
`exceed_context_size_error` with `n_ctx`, OpenAI's "maximum context length is N tokens"),
the endpoint's own word (llama.cpp `GET /props` `n_ctx`, `/v1/models` metadata), else a
conservative default; a refusal corrects the first two as well. Each choice is logged
once, as the other negotiated modes are (refloop.llm.endpoint).

Token counts are estimates from the JSON sent (characters over a ratio), calibrated by the
`prompt_tokens` each endpoint reports back: no tokenizer of any model is needed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from refloop.contract.messages import ChatMessage, TokenUsage
from refloop.contract.window import parse_context_tokens
from refloop.llm.fitting import Budget, clip_to_fit

log = logging.getLogger("refloop.llm")

# Characters of wire JSON per token before an endpoint reported any usage: lower than
# English prose's ~4 so that the first estimate errs towards a smaller prompt.
FIRST_CHARS_PER_TOKEN = 3.0
# An estimate leaves this share of the window unused: tokenizers differ by message.
SAFETY = 0.08
# Tokens a chat template adds around each message (role markers, separators).
PER_MESSAGE_TOKENS = 4

_OPENAI_WINDOW = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
# OpenAI: "your messages resulted in N tokens"; vLLM and llama-cpp-python's server: "you
# requested N tokens (P in the messages, C in the completion)": P is the prompt
_MESSAGES_PROMPT = re.compile(r"\((\d+) in the messages", re.IGNORECASE)
_OPENAI_PROMPT = re.compile(r"(?:resulted in|requested) (\d+) tokens", re.IGNORECASE)
# llama-cpp-python: "Requested tokens (5000) exceed context window of 4096"
_PY_WINDOW = re.compile(r"exceed context window of (\d+)", re.IGNORECASE)
_PY_PROMPT = re.compile(r"Requested tokens \((\d+)\)", re.IGNORECASE)
_N_CTX = re.compile(r'"?n_ctx"?\s*[:=]\s*(\d+)')
_N_PROMPT = re.compile(r'"?n_prompt_tokens"?\s*[:=]\s*(\d+)')
LENGTH_WORDS = ("exceed_context_size_error", "context_length_exceeded",
                "maximum context length", "exceeds the available context size",
                "context window", "too many tokens")


@dataclass(frozen=True)
class LengthRefusal:
    """An endpoint's refusal of a prompt too long for its window."""

    window: int | None  # the window it states, if it does
    prompt_tokens: int | None  # how long it counted the refused prompt, if it says


def length_refusal(status: int | None, body: str) -> LengthRefusal | None:
    """The refusal for length in an error answer (any status: llama.cpp once answered it
    with a 500), with the numbers it gives; None for any other error."""
    if status is None or status < 400:
        return None
    text = body.lower()
    if not any(word in text for word in LENGTH_WORDS):
        return None
    window = _OPENAI_WINDOW.search(body) or _N_CTX.search(body) or _PY_WINDOW.search(body)
    prompt = (_N_PROMPT.search(body) or _MESSAGES_PROMPT.search(body)
              or _OPENAI_PROMPT.search(body) or _PY_PROMPT.search(body))
    return LengthRefusal(int(window.group(1)) if window else None,
                         int(prompt.group(1)) if prompt else None)


def props_window(props: Any) -> int | None:
    """llama.cpp's `GET /props`: `default_generation_settings.n_ctx` (or a top-level
    `n_ctx`)."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    for source in (settings if isinstance(settings, dict) else {}, props):
        value = source.get("n_ctx")
        if isinstance(value, int) and value > 0:
            return value
    return None


# Fields of a `/v1/models` entry that state the served window (vLLM, OpenRouter, LM
# Studio, the scripted model). llama.cpp's `meta.n_ctx_train` is the training length, not
# what the server was started with, and is ignored.
MODEL_WINDOW_FIELDS = ("max_model_len", "context_length", "context_window",
                       "max_context_length")


def models_window(listing: Any, model: str) -> int | None:
    """The window `/v1/models` states for `model`, if it does."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("id") != model:
            continue
        for name in MODEL_WINDOW_FIELDS:
            value = entry.get(name)
            if isinstance(value, int) and value > 0:
                return value
    return None


def server_root(base_url: str) -> str:
    """llama.cpp serves `/props` beside `/v1`, not under it."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def wire_chars(value: Any) -> int:
    """Characters of `value` as the request's JSON carries it."""
    return len(json.dumps(value, ensure_ascii=False))


@dataclass
class EndpointWindow:
    """What one (base URL, model) is known to take."""

    window: int
    source: str  # config | setting | refusal | props | models | default
    chars_per_token: float = FIRST_CHARS_PER_TOKEN
    calibrated: bool = False
    probed: bool = False  # the endpoint was asked (once per worker)
    probe_after: float = 0.0  # monotonic time before which an unreachable one is not asked
    said: str = ""  # the last "window N from source" logged, so each choice logs once


@dataclass
class WindowBook:
    """Every endpoint's window and token ratio, on this worker."""

    settings: dict[str, int]
    default: int
    windows: dict[tuple[str, str], EndpointWindow] = field(default_factory=dict)

    def of(self, base_url: str, model: str) -> EndpointWindow:
        key = (base_url, model)
        if key not in self.windows:
            pinned = self.settings.get(model, self.settings.get("*"))
            self.windows[key] = (EndpointWindow(pinned, "setting", probed=True) if pinned
                                 else EndpointWindow(self.default, "default"))
            self._say(base_url, model)
        return self.windows[key]

    def configured(self, base_url: str, model: str, window: int) -> None:
        """A model config's window (its `context_tokens`): ahead of the operator's setting
        and the endpoint's word, and the endpoint is not asked. A refusal still corrects
        it, and a config's window over the one a refusal taught does not undo the lesson;
        a config changed since is taken at its new word."""
        known = self.windows.get((base_url, model))
        if known is None:
            self.windows[(base_url, model)] = EndpointWindow(window, "config", probed=True)
        elif known.window == window or (known.source == "refusal" and window > known.window):
            return
        else:
            known.window, known.source, known.probed = window, "config", True
        self._say(base_url, model)

    def heard(self, base_url: str, model: str, window: int | None, source: str) -> None:
        """The endpoint's own word (`props`, `models`); a setting or a refusal wins."""
        known = self.of(base_url, model)
        known.probed = True
        if window and known.source in ("default", "props", "models"):
            known.window, known.source = window, source
            self._say(base_url, model)

    def refused(self, base_url: str, model: str, refusal: LengthRefusal,
                sent_chars: int) -> None:
        """A refusal for length: its window is the truth from now on (an operator's setting
        that is wrong too), its count of the prompt calibrates the ratio."""
        known = self.of(base_url, model)
        if refusal.window:
            known.window, known.source = refusal.window, "refusal"
        elif refusal.prompt_tokens is None:
            # Neither number: the prompt was at least the window; aim a fifth lower.
            known.window, known.source = int(known.window * 0.8), "refusal"
        if refusal.prompt_tokens:
            self.calibrate(base_url, model, sent_chars, refusal.prompt_tokens)
        self._say(base_url, model)

    def calibrate(self, base_url: str, model: str, sent_chars: int,
                  prompt_tokens: int) -> None:
        """The endpoint counted `prompt_tokens` for `sent_chars` of wire JSON. Only prompts
        long enough to say something move the ratio; it leans towards the denser counts."""
        if prompt_tokens < 64 or sent_chars < 256:
            return
        known = self.of(base_url, model)
        observed = sent_chars / prompt_tokens
        if not known.calibrated:
            known.chars_per_token, known.calibrated = observed, True
        else:  # a denser prompt counts at once; a sparser one moves the ratio slowly
            known.chars_per_token = min(observed, known.chars_per_token * 0.8 + observed * 0.2)

    def tokens(self, base_url: str, model: str, chars: int, messages: int = 0) -> int:
        known = self.of(base_url, model)
        return int(chars / known.chars_per_token) + PER_MESSAGE_TOKENS * messages

    def _say(self, base_url: str, model: str) -> None:
        known = self.windows[(base_url, model)]
        said = f"{known.window}:{known.source}"
        if said != known.said:
            known.said = said
            # A refusal corrected what was assumed: said as loudly as a mode stepping down
            log.log(logging.WARNING if known.source == "refusal" else logging.INFO,
                    "model endpoint %s model %s: context window %d tokens (%s)", base_url,
                    model, known.window, WINDOW_SOURCES[known.source])


WINDOW_SOURCES = {
    "config": "its model config's context_tokens",
    "setting": "REFLOOP_MODEL_CONTEXT_TOKENS",
    "refusal": "learnt from its refusal of a longer prompt",
    "props": "its GET /props n_ctx",
    "models": "its /v1/models metadata",
    "default": "not known yet: the conservative default REFLOOP_MODEL_CONTEXT_DEFAULT",
}


@dataclass
class FittedRequest:
    """A request's messages and completion cap, fitted to its endpoint's window."""

    messages: list[ChatMessage]
    max_tokens: int
    chars: int  # of wire JSON (messages, tools, response format): calibrates the ratio
    budget: Budget


Fitter = Callable[[list[ChatMessage], Budget], list[ChatMessage]]
PROBE_TIMEOUT_S = 3.0
PROBE_AGAIN_S = 60.0  # an endpoint that could not be asked is asked again this much later


class WindowKeeper:
    """The gateway's side of windows: learns them (settings, the endpoint, refusals) and
    fits each request before it is sent."""

    def __init__(self, context_tokens: str | None, default: int, mask_at: float = 0.6,
                 compact_at: float = 0.75) -> None:
        self.book = WindowBook(parse_context_tokens(context_tokens), default)
        self.mask_at, self.compact_at = mask_at, compact_at

    async def budget(self, client: openai.AsyncOpenAI, base_url: str, model: str,
                     message_chars: int, fixed_chars: int, cap: int) -> Budget:
        """Tokens this request's messages may take. The endpoint is asked its window only
        once a prompt is long enough for it to matter: a quarter of the window assumed,
        below where any fitting begins."""
        known = self.book.of(base_url, model)
        if (not known.probed and time.monotonic() >= known.probe_after
                and self.book.tokens(base_url, model, message_chars + fixed_chars)
                > known.window // 4):
            await self.probe(client, base_url, model)
        fixed = self.book.tokens(base_url, model, fixed_chars)
        total = int(known.window * (1 - SAFETY)) - fixed
        room = min(cap, known.window // 4)
        return Budget(prompt_tokens=max(total - room, 1), chars_per_token=known.chars_per_token,
                      window=known.window, total=max(total, 1), mask_at=self.mask_at,
                      compact_at=self.compact_at)

    async def fitted(self, client: openai.AsyncOpenAI, base_url: str, model: str,
                     messages: list[ChatMessage], fixed: Any, cap: int,
                     fitter: Fitter | None) -> FittedRequest:
        """Sent as is when it fits with its whole cap, or when the window is only assumed;
        else the cap shrinks to the room left (no lower than a quarter of the window), and
        the messages are fitted when that is not enough (`fitter`, else the longest
        contents clipped)."""
        fixed_chars = wire_chars(fixed) if fixed else 0
        message_chars = sum(len(m.model_dump_json(exclude_none=True)) for m in messages)
        budget = await self.budget(client, base_url, model, message_chars, fixed_chars, cap)
        if self.book.of(base_url, model).source == "default":
            # Nothing says the window: the prompt goes as it is (a long code review on a
            # large-window endpoint is not cut to the default), and a refusal teaches it.
            return FittedRequest(messages, cap, message_chars + fixed_chars, budget)
        used = sum(budget.tokens(m) for m in messages)
        if used > budget.prompt_tokens:
            messages = (fitter or clip_to_fit)(messages, budget)
            used = sum(budget.tokens(m) for m in messages)
            message_chars = sum(len(m.model_dump_json(exclude_none=True)) for m in messages)
        return FittedRequest(messages, max(min(cap, budget.total - used), 1),
                             message_chars + fixed_chars, budget)

    def configured(self, base_url: str, model: str, window: int | None) -> None:
        """A task's model config states the window (`ModelEndpoint.context_tokens`); the
        gateway says so before it asks for a budget or fits a request."""
        if window:
            self.book.configured(base_url, model, window)

    def refused(self, base_url: str, model: str, refusal: LengthRefusal,
                request: FittedRequest) -> None:
        self.book.refused(base_url, model, refusal, request.chars)

    def answered(self, base_url: str, model: str, request: FittedRequest,
                 usage: TokenUsage) -> None:
        """The server's count of one answered request's prompt calibrates the ratio."""
        if usage.calls == 1 and not usage.estimated_calls and usage.prompt_tokens:
            self.book.calibrate(base_url, model, request.chars, usage.prompt_tokens)

    async def probe(self, client: openai.AsyncOpenAI, base_url: str, model: str) -> None:
        """llama.cpp's `/props`, then `/v1/models`: the first that states a window. An
        endpoint that cannot be reached is asked again a minute later; one that answers
        without a window is not asked again."""
        options: Any = {"timeout": PROBE_TIMEOUT_S}
        for source, url in (("props", f"{server_root(base_url)}/props"),
                            ("models", f"{base_url.rstrip('/')}/models")):
            try:
                said = await client.get(url, cast_to=object, options=options)
            except openai.APIConnectionError:  # down or hung (an outage): asked again later
                self.book.of(base_url, model).probe_after = time.monotonic() + PROBE_AGAIN_S
                return
            except openai.OpenAIError:
                continue
            window = props_window(said) if source == "props" else models_window(said, model)
            if window:
                self.book.heard(base_url, model, window, source)
                return
        self.book.heard(base_url, model, None, "models")
