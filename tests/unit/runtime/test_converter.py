"""The data converter writes a step's model call without its default fields, loads it back
whole, and leaves every other payload as the SDK's pydantic converter writes it."""

from __future__ import annotations

import json

from temporalio.contrib.pydantic import pydantic_data_converter

from refloop.contract.activity_io import (
    ActInput,
    ActResult,
    ContextReport,
    LLMUsageRecord,
    RunToolInput,
)
from refloop.contract.messages import ChatMessage, TokenUsage, ToolCall
from refloop.runtime.client import DATA_CONVERTER
from refloop.worker.runner import ignores_serialization_context

CONVERTER = DATA_CONVERTER.payload_converter


def act_input() -> ActInput:
    return ActInput(
        messages=[ChatMessage(role="assistant", tool_calls=[
            ToolCall(id="call_1", name="read_file", arguments={"path": "a.txt"})]),
                  ChatMessage(role="tool", content="one", tool_call_id="call_1",
                              name="read_file")],
        tool_names=["read_file", "write_file"], conversation_ref="ref", model="m")


def act_result() -> ActResult:
    return ActResult(
        tool_calls=[ToolCall(id="call_2", name="write_file",
                             arguments={"path": "b.txt", "content": ""})],
        finish_reason="tool_calls",
        usage=LLMUsageRecord(purpose="act", model="m", usage=TokenUsage(
            prompt_tokens=795, completion_tokens=50, total_tokens=845, calls=1,
            unpriced_calls=1)),
        context=ContextReport(window=8192, budget=4821, tokens_before=399, tokens=399))


def test_a_model_call_is_written_without_its_defaults_and_loads_back_whole():
    for value in (act_input(), act_result()):
        [payload] = CONVERTER.to_payloads([value])
        [stock] = pydantic_data_converter.payload_converter.to_payloads([value])
        written = json.loads(payload.data)
        assert "null" not in payload.data.decode() and len(payload.data) < 0.8 * len(
            stock.data), payload.data
        assert payload.metadata == stock.metadata  # the Web UI reads it as plain JSON
        [loaded] = CONVERTER.from_payloads([payload], [type(value)])
        assert loaded == value
        # and a payload written whole (a history from before) loads the same
        assert CONVERTER.from_payloads([stock], [type(value)]) == [value]
        assert written  # not empty: the set fields are there
    usage = json.loads(CONVERTER.to_payloads([act_result()])[0].data)["usage"]["usage"]
    assert usage == {"prompt_tokens": 795, "completion_tokens": 50, "total_tokens": 845,
                     "calls": 1, "unpriced_calls": 1}


def test_a_default_set_explicitly_still_loads_as_set():
    """A field set to its default is left out and comes back as the same value."""
    value = act_input().model_copy(update={"max_history_messages": 400,
                                           "parallel_tool_calls": None})
    [payload] = CONVERTER.to_payloads([value])
    assert "max_history_messages" not in json.loads(payload.data)
    assert CONVERTER.from_payloads([payload], [ActInput]) == [value]


def test_other_payloads_are_written_as_the_sdk_writes_them():
    tool = RunToolInput(call_id="c", name="write_file", arguments={"path": "a"},
                        workspace="/w")
    values = [tool, {"kept": None}, [1, None], "text", None]
    assert [p.data for p in CONVERTER.to_payloads(values)] == [
        p.data for p in pydantic_data_converter.payload_converter.to_payloads(values)]


def test_the_converter_still_ignores_serialization_context():
    """The sandbox's fast path (no per-payload context lookup) stays on."""
    assert ignores_serialization_context(DATA_CONVERTER)
