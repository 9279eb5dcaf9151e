"""Capability negotiation, token caps, concurrency slots and the request ledger, over real
HTTP (real openai client) against the scripted model emulating real endpoints' quirks."""

from __future__ import annotations

import asyncio
import time

import pytest

from refloop.contract.errors import InvalidModelOutput, LLMError, LLMTransportError
from refloop.contract.messages import ChatMessage, IntentResult, Purpose, ToolSpec, parse_max_tokens
from refloop.llm.gateway import LLMGateway
from refloop.llm.ledger import RequestLedger, current_ledger
from refloop.settings import Settings
from tests.llm_fixtures import unique_scenario

USER = [ChatMessage(role="user", content="hello")]
INTENT = {"intent": "CODING_TASK", "confidence": 0.8, "reason": "edit"}
WRITE = ToolSpec(name="write_file", description="Create a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
LLAMA_CPP = {"reject_json_schema": 500}  # llama-cpp-python 0.3.x


def gateway_for(scripted_llm, **settings) -> LLMGateway:
    return LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                               refloop_structured_max_reasks=1, **settings))


def scenario(scripted_llm, responses, **endpoint) -> str:
    name = unique_scenario(scripted_llm, responses)
    scripted_llm.load(name, {"name": name, "endpoint": endpoint, "responses": responses})
    return name


def formats(scripted_llm, model: str) -> list:
    return [r["body"].get("response_format") for r in scripted_llm.requests(model=model)]


async def test_json_schema_500_steps_down_once_and_is_remembered(scripted_llm, caplog):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"intent": [{"json": INTENT}, {"json": INTENT}]},
                     **LLAMA_CPP)
    first = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    second = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert first.value.confidence == second.value.confidence == 0.8
    sent = formats(scripted_llm, model)
    # One rejected request, never retried as a transport error; then json_object + schema.
    assert [f["type"] for f in sent] == ["json_schema", "json_object", "json_object"]
    assert sent[1]["schema"]["properties"]["intent"]
    statuses = [r["status"] for r in scripted_llm.requests(model=model)]
    assert statuses == [500, 200, 200]
    assert gateway.endpoints.structured_mode(gateway.base_url, model) == "json_object_schema"
    chosen = [r for r in caplog.records if "structured output" in r.getMessage()]
    assert len(chosen) == 1 and "json_object_schema" in chosen[0].getMessage()


async def test_every_mode_rejected_ends_prompt_only(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"intent": [{"content": "Sure: " + '{"intent": '
                                                '"CODING_TASK", "confidence": 0.8}'}]},
                     reject_response_format=400)
    out = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert out.value.intent.value == "CODING_TASK"
    sent = formats(scripted_llm, model)
    assert sent == [sent[0], sent[1], {"type": "json_object"}, None]
    last = scripted_llm.requests(model=model)[-1]["body"]["messages"][0]["content"]
    assert "JSON schema" in last


async def test_a_500_that_does_not_name_the_format_is_a_transport_error(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"intent": [{"status": 500}]})
    with pytest.raises(LLMTransportError):
        await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert len(scripted_llm.requests(model=model)) == 1
    assert gateway.endpoints.structured_mode(gateway.base_url, model) == "json_schema"


async def test_pinned_mode_is_used_and_never_stepped_down(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_structured_mode="json_object")
    model = scenario(scripted_llm, {"intent": [{"json": INTENT}]})
    await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert formats(scripted_llm, model) == [{"type": "json_object"}]
    pinned = gateway_for(scripted_llm, refloop_structured_mode="json_schema")
    rejecting = scenario(scripted_llm, {"intent": [{"json": INTENT}]}, **LLAMA_CPP)
    with pytest.raises(LLMError):
        await pinned.structured(Purpose.intent, USER, IntentResult, model=rejecting)
    assert len(scripted_llm.requests(model=rejecting)) == 1


async def test_tool_choice_is_sent_and_brings_native_calls(scripted_llm):
    gateway = gateway_for(scripted_llm)
    answer = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a"}}]}
    model = scenario(scripted_llm, {"act": [answer]}, tools_need_choice=True)
    out = await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    assert [c.name for c in out.tool_calls] == ["write_file"]
    assert scripted_llm.requests(model=model)[0]["body"]["tool_choice"] == "auto"
    # Without tool_choice the same endpoint answers in prose (what refloop used to get).
    named = gateway_for(scripted_llm, refloop_tool_choice="write_file")
    model = scenario(scripted_llm, {"act": [answer]}, tools_need_choice=True)
    await named.chat(Purpose.act, USER, model=model, tools=[WRITE])
    assert scripted_llm.requests(model=model)[0]["body"]["tool_choice"] == {
        "type": "function", "function": {"name": "write_file"}}


def test_prose_without_tool_choice_is_what_the_quirk_emulates(scripted_llm):
    import httpx

    model = scenario(scripted_llm, {"act": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a"}}]}]},
        tools_need_choice=True)
    body = {"model": model, "messages": [], "tools": [WRITE.wire]}
    answer = httpx.post(f"{scripted_llm.base_url}/chat/completions", json=body,
                        headers={"X-Refloop-Purpose": "act"}).json()
    message = answer["choices"][0]["message"]
    assert "tool_calls" not in message and "write_file" in message["content"]


async def test_rejected_tool_choice_is_dropped_and_remembered(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "a"}, {"content": "b"}]},
                     reject_tool_choice=400)
    await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    sent = [("tool_choice" in r["body"], r["status"]) for r in scripted_llm.requests(model=model)]
    assert sent == [(True, 400), (False, 200), (False, 200)]


async def test_text_tool_mode_sends_no_tools(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_tool_mode="text")
    model = scenario(scripted_llm, {"act": [{"content": '{"tool": "write_file"}'}]})
    await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    body = scripted_llm.requests(model=model)[0]["body"]
    assert "tools" not in body and "tool_choice" not in body


async def test_max_tokens_per_purpose_and_override(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=300")
    model = scenario(scripted_llm, {"act": [{"content": "a"}], "intent": [{"json": INTENT}]})
    await gateway.chat(Purpose.act, USER, model=model)
    await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    caps = [r["body"]["max_tokens"] for r in scripted_llm.requests(model=model)]
    assert caps == [300, 256]
    assert parse_max_tokens("100")["plan"] == 100
    with pytest.raises(ValueError, match="dance"):
        parse_max_tokens("dance=3")
    with pytest.raises(SystemExit, match="REFLOOP_MAX_TOKENS"):
        load_settings_with(REFLOOP_MAX_TOKENS="act=zero")


def load_settings_with(**env: str) -> Settings:
    import os

    from refloop.settings import load_settings

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        return load_settings()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def test_cut_off_answer_is_reasked_once_with_the_limit(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=64")
    model = scenario(scripted_llm, {"act": [{"content": "long long", "finish_reason": "length"},
                                            {"content": "short"}]})
    ledger = RequestLedger()
    token = current_ledger.set(ledger)
    try:
        out = await gateway.chat(Purpose.act, USER, model=model)
    finally:
        current_ledger.reset(token)
    assert out.content == "short" and out.usage.usage.calls == 2
    reask = scripted_llm.requests(model=model)[1]["body"]["messages"][-1]["content"]
    assert "cut off" in reask and "64 tokens" in reask
    assert ledger.usage.calls == 2 and ledger.usage.failed_calls == 1


async def test_cut_off_twice_is_a_clear_non_retryable_failure(scripted_llm):
    gateway = gateway_for(scripted_llm)
    cut = {"content": "{\"intent\": \"COD", "finish_reason": "length"}
    model = scenario(scripted_llm, {"intent": [cut, cut, {"json": INTENT}]})
    with pytest.raises(InvalidModelOutput) as err:
        await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert not err.value.retryable and "max_tokens" in str(err.value)
    assert len(scripted_llm.requests(model=model)) == 2


async def test_ledger_counts_failed_requests(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "ok"}, {"status": 503}]})
    ledger = RequestLedger()
    token = current_ledger.set(ledger)
    try:
        await gateway.chat(Purpose.act, USER, model=model)
        with pytest.raises(LLMTransportError):
            await gateway.chat(Purpose.act, USER, model=model)
    finally:
        current_ledger.reset(token)
    assert ledger.usage.calls == 2 and ledger.usage.failed_calls == 1
    assert ledger.usage.total_tokens > 0 and ledger.purpose == "act" and ledger.model == model
    assert RequestLedger.load(ledger.dump()).usage == ledger.usage


async def test_concurrency_limit_serialises_requests(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_llm_concurrency=1)
    model = scenario(scripted_llm, {"act": [{"content": "a", "delay_ms": 300},
                                            {"content": "b", "delay_ms": 300}]})
    started = time.monotonic()
    await asyncio.gather(gateway.chat(Purpose.act, USER, model=model),
                         gateway.chat(Purpose.act, USER, model=model))
    assert time.monotonic() - started >= 0.6
    times = [r["time"] for r in scripted_llm.requests(model=model)]  # logged at answer time
    assert times[1] - times[0] >= 0.25


async def test_retry_after_a_client_timeout_waits_for_the_abandoned_slot(scripted_llm):
    # A bound long enough for each request to reach the server on a loaded machine (0.4 s
    # once timed out the second, fast request while the suite ran beside other work).
    gateway = gateway_for(scripted_llm, refloop_llm_concurrency=1, refloop_llm_timeout_s=1.0)
    model = scenario(scripted_llm, {"act": [{"content": "slow", "delay_ms": 4000},
                                            {"content": "fast"}]})
    started = time.monotonic()
    with pytest.raises(LLMTransportError, match="timed out"):
        await gateway.chat(Purpose.act, USER, model=model)
    out = await gateway.chat(Purpose.act, USER, model=model)
    # The slot stayed held for the timeout again after the client gave up (1 + 1 s).
    assert out.content == "fast" and time.monotonic() - started >= 2.0
    assert gateway.usage_by_purpose["act"].failed_calls == 1


async def test_a_timed_out_request_stays_abandoned_with_its_cap(scripted_llm):
    """The server may still generate for a request the client gave up on: its usage is
    unknown, so the ledger says so and bounds it by the request's max_tokens."""
    # A timeout long enough for the request to reach the server on a loaded machine (else
    # the slow entry is never taken and the next call gets it).
    gateway = gateway_for(scripted_llm, refloop_llm_timeout_s=1.0, refloop_max_tokens="act=77")
    model = scenario(scripted_llm, {"act": [{"content": "slow", "delay_ms": 4000},
                                            {"status": 503}, {"content": "fast"}]})
    ledger = RequestLedger()
    token = current_ledger.set(ledger)
    try:
        for _ in range(2):
            with pytest.raises(LLMTransportError):
                await gateway.chat(Purpose.act, USER, model=model)
        out = await gateway.chat(Purpose.act, USER, model=model)
    finally:
        current_ledger.reset(token)
    usage = ledger.usage
    assert (usage.calls, usage.failed_calls, usage.abandoned_calls) == (3, 2, 1)
    assert usage.abandoned_max_tokens == 77
    assert usage.completion_tokens == out.usage.usage.completion_tokens > 0
    assert gateway.usage_by_purpose["act"].abandoned_calls == 1
    assert RequestLedger.load(ledger.dump()).usage == usage


async def test_a_request_in_flight_is_heartbeated_as_abandoned(scripted_llm):
    """What an attempt killed mid-request leaves in its heartbeat: the request counted,
    failed and abandoned, until an answer settles it."""
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=50")
    model = scenario(scripted_llm, {"act": [{"content": "slow", "delay_ms": 5000}]})
    beats: list = []
    ledger = RequestLedger(on_change=lambda led: beats.append(led.usage))
    token = current_ledger.set(ledger)
    try:
        call = asyncio.ensure_future(gateway.chat(Purpose.act, USER, model=model))
        await asyncio.sleep(0.3)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        current_ledger.reset(token)
    assert beats[-1].calls == beats[-1].failed_calls == beats[-1].abandoned_calls == 1
    assert beats[-1].abandoned_max_tokens == 50
    assert gateway.usage_by_purpose["act"].abandoned_calls == 1


async def test_tool_call_turns_never_send_null_content(scripted_llm):
    from refloop.contract.messages import ToolCall

    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "done"}]}, reject_null_content=True)
    turn = ChatMessage(role="assistant", content=None,
                       tool_calls=[ToolCall(id="c1", name="write_file", arguments={})])
    result = ChatMessage(role="tool", tool_call_id="c1", content="ok")
    out = await gateway.chat(Purpose.act, [*USER, turn, result], model=model)
    assert out.content == "done"
    assert scripted_llm.requests(model=model)[0]["body"]["messages"][1]["content"] == ""


async def test_a_500_validation_error_is_not_retried(scripted_llm):
    from refloop.contract.errors import LLMClientError

    gateway = gateway_for(scripted_llm)
    body = {"error": {"message": "1 validation error: messages.2.content: Input should be "
                                 "a valid string"}}
    model = scenario(scripted_llm, {"act": [{"status": 500, "body": body}]})
    with pytest.raises(LLMClientError) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert err.value.status == 500 and not err.value.retryable
