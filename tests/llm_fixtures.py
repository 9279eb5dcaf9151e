"""The scripted model for tests: one server per session, one scenario per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from refloop.llm.scripted import ScriptedLLMServer


@pytest.fixture(scope="session")
def scripted_llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


def unique_scenario(server: ScriptedLLMServer, responses: dict[str, Any],
                    latency_ms: int = 0, repeat: bool = False) -> str:
    """Load a scenario under a fresh name; pass the name as the model to select it.
    `repeat`: answers chosen by the conversation's turn, so a repeated request gets the
    same answer."""
    name = f"s-{uuid.uuid4().hex[:10]}"
    server.load(name, {"name": name, "latency_ms": latency_ms, "repeat": repeat,
                       "responses": responses})
    return name
