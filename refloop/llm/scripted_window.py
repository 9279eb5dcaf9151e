"""The scripted model's context window: a scenario that sets one counts each prompt and
refuses a longer one as llama.cpp's server or OpenAI words it (refloop.llm.window learns
from both)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from refloop.llm.scenario import EndpointQuirks

UNENFORCED_WINDOW = 131072  # what /v1/models states of a scenario that sets no window
CHARS_PER_TOKEN = 3.5  # a windowed scenario's tokenizer: denser than refloop's first guess


def window_tokens(body: dict[str, Any]) -> int:
    """A windowed scenario's count of a prompt: its messages, tools and response format."""
    parts = [body.get(key) for key in ("messages", "tools", "response_format")]
    messages = body.get("messages") or []
    return int(len(json.dumps(parts, ensure_ascii=False)) / CHARS_PER_TOKEN) + 3 * len(messages)


def length_refused(quirks: EndpointQuirks, body: dict[str, Any]) -> JSONResponse | None:
    """A prompt too long for a windowed scenario, refused as its server words it."""
    window = quirks.context_tokens
    if window is None:
        return None
    prompt, completion = window_tokens(body), int(body.get("max_tokens") or 0)
    if prompt + completion <= window:
        return None
    if quirks.context_refusal == "openai":
        return JSONResponse({"error": {
            "message": f"This model's maximum context length is {window} tokens. However, "
                       f"you requested {prompt + completion} tokens ({prompt} in the "
                       f"messages, {completion} in the completion). Please reduce the length "
                       "of the messages or completion.",
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}}, status_code=400,
            headers={"X-Refloop-Scripted": "true"})
    return JSONResponse({"error": {
        "code": 400, "message": "the request exceeds the available context size, try "
                                "increasing it", "type": "exceed_context_size_error",
        "n_prompt_tokens": prompt, "n_ctx": window}}, status_code=400,
        headers={"X-Refloop-Scripted": "true"})
