"""The conversation the model sees: trimming and blob-aware rendering."""

from __future__ import annotations

from refloop.contract.messages import ChatMessage
from refloop.store.blobs import Get, expand_args, expand_for_model

TRIM_NOTE = "[earlier turns were trimmed to keep the context small]"
ARG_CHARS = 2_000  # how much of an offloaded tool argument the model re-reads


def trim_history(messages: list[ChatMessage], max_messages: int) -> list[ChatMessage]:
    """Trimming: keep the system prompt and start the rest on a user turn.

    The first user turn (the task) stays pinned so the model never loses its goal;
    the kept tail starts at an assistant turn so roles still alternate and no tool
    result is left without the call that produced it.
    """
    if len(messages) <= max_messages:
        return list(messages)
    pinned = messages[:2]
    start = len(messages) - (max_messages - len(pinned))
    while start < len(messages) and messages[start].role != "assistant":
        start += 1
    task = pinned[1]
    if TRIM_NOTE not in (task.content or ""):
        task = task.model_copy(update={"content": f"{task.content}\n\n{TRIM_NOTE}"})
    return [pinned[0], task, *messages[start:]]


def for_model(messages: list[ChatMessage], get: Get, output_chars: int) -> list[ChatMessage]:
    """Markers expanded: tool outputs up to `output_chars`, arguments up to ARG_CHARS."""
    rendered = []
    for message in messages:
        update = {}
        if message.content:
            update["content"] = expand_for_model(message.content, get, output_chars)
        if message.tool_calls:
            update["tool_calls"] = [
                call.model_copy(update={"arguments": expand_args(call.arguments, get,
                                                                 ARG_CHARS)})
                for call in message.tool_calls
            ]
        rendered.append(message.model_copy(update=update) if update else message)
    return rendered
