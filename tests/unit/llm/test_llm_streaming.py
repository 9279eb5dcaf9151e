"""Streamed model calls over real HTTP (the real openai client against the scripted model):
counted as they arrive, hung up at the cap, timed by progress, and the fallback for
endpoints that cannot stream."""

from __future__ import annotations

import time

import openai
import pytest

from refloop.contract.activity_io import LLMUsageRecord
from refloop.contract.errors import InvalidModelOutput, LLMTransportError
from refloop.contract.messages import ChatMessage, Purpose, TokenUsage, ToolCall, ToolSpec
from refloop.llm.gateway import LLMGateway
from refloop.llm.ledger import RequestLedger, current_ledger
from refloop.llm.prompts import is_tool_pick
from refloop.llm.stream import StreamTally, raw_chunks, streamed_answer
from refloop.llm.tool_pick import PICK_MAX_TOKENS, picked_tool
from refloop.llm.wire import ChatOutcome
from refloop.settings import Settings
from tests.llm_fixtures import unique_scenario

USER = [ChatMessage(role="user", content="hello")]
WRITE = ToolSpec(name="write_file", description="Create a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
WRITE_CALL = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt"}}]}


def gateway_for(scripted_llm, **settings) -> LLMGateway:
    return LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                               **settings))


def scenario(scripted_llm, responses, **endpoint) -> str:
    name = unique_scenario(scripted_llm, responses)
    scripted_llm.load(name, {"name": name, "endpoint": endpoint, "responses": responses})
    return name


def hung_up(scripted_llm, model: str, first: int) -> list[bool]:
    """The first requests' hang-ups as the server saw them (at its next token)."""
    deadline = time.monotonic() + 5
    while True:
        seen = [r.get("hung_up") for r in scripted_llm.requests(model=model)][:first]
        if all(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


async def chat_with_ledger(gateway, model, **kwargs):
    ledger = RequestLedger()
    token = current_ledger.set(ledger)
    try:
        return await gateway.chat(Purpose.act, USER, model=model, **kwargs), ledger
    finally:
        current_ledger.reset(token)


async def test_answers_stream_with_the_servers_usage(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "a streamed answer"}, WRITE_CALL]})
    text, _ = await chat_with_ledger(gateway, model)
    call, ledger = await chat_with_ledger(gateway, model, tools=[WRITE])
    assert text.content == "a streamed answer" and text.finish_reason == "stop"
    assert call.tool_calls[0].name == "write_file"
    assert call.tool_calls[0].arguments == {"path": "a.txt"}
    sent = scripted_llm.requests(model=model)
    assert all(r["body"]["stream"] and r["body"]["stream_options"] == {"include_usage": True}
               for r in sent)
    assert [r["hung_up"] for r in sent] == [False, False]
    # The server's own usage, not an estimate.
    assert text.usage.usage.estimated_calls == 0 and text.usage.usage.completion_tokens > 0
    assert ledger.usage.calls == 1 and ledger.usage.failed_calls == 0


async def test_a_runaway_is_hung_up_at_its_cap_counted_and_the_model_told(scripted_llm):
    """A server that ignores max_tokens: refloop stops reading at the cap and closes the
    connection; the answer so far is `length`, re-asked once as for a server that kept
    the cap; the tokens that came are in the ledger."""
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=40")
    model = scenario(scripted_llm, {"act": [{"runaway": True, "token_ms": 10},
                                            {"content": "short"}]})
    started = time.monotonic()
    out, ledger = await chat_with_ledger(gateway, model)
    assert out.content == "short" and time.monotonic() - started < 10
    assert hung_up(scripted_llm, model, 1) == [True]
    runaway, reask = scripted_llm.requests(model=model)
    assert runaway["body"]["max_tokens"] == 40
    # The cap, the token the server was on, and one more a loaded machine may send
    # before the hang-up reaches it.
    assert 40 <= runaway["chunks"] <= 42
    told = reask["body"]["messages"][-1]["content"]
    assert "cut off at the limit of 40 tokens" in told
    assert "la la" in reask["body"]["messages"][-2]["content"]
    usage = ledger.usage
    assert (usage.calls, usage.failed_calls, usage.cut_calls, usage.abandoned_calls) == \
        (2, 1, 1, 0)
    assert usage.completion_tokens >= 40 + 1  # the runaway's cap counted, plus the answer
    assert usage.estimated_calls == 1  # a cut stream brings no usage: estimated


async def test_a_runaway_twice_is_a_non_retryable_failure(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=20")
    model = scenario(scripted_llm, {"act": [{"runaway": True}, {"runaway": True}]})
    with pytest.raises(InvalidModelOutput) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert not err.value.retryable and "cut off twice" in str(err.value)
    assert hung_up(scripted_llm, model, 2) == [True, True]


async def test_a_stalled_stream_is_an_idle_timeout_not_the_total_bound(scripted_llm):
    """A few tokens, then nothing: a stalled server, noticed after the idle timeout (not the
    total bound), retried like a transport fault; the tokens that came are counted."""
    gateway = gateway_for(scripted_llm, refloop_llm_timeout_s=30,
                          refloop_llm_idle_timeout_s=0.5)
    model = scenario(scripted_llm, {"act": [{"content": "one two three four five six",
                                             "stall_after": 3}]})
    started = time.monotonic()
    with pytest.raises(LLMTransportError, match="no token for 0.5 s") as err:
        await chat_with_ledger(gateway, model)
    assert err.value.retryable and time.monotonic() - started < 5
    sent = scripted_llm.requests(model=model)
    assert sent[0]["chunks"] == 3
    usage = gateway.usage_by_purpose["act"]
    assert (usage.calls, usage.failed_calls, usage.abandoned_calls) == (1, 1, 0)
    assert usage.completion_tokens == 3


async def test_tokens_still_flowing_at_the_time_bound_are_cut_not_retried(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_llm_timeout_s=1.0,
                          refloop_llm_idle_timeout_s=0.5, refloop_max_tokens="act=100000")
    model = scenario(scripted_llm, {"act": [{"runaway": True, "token_ms": 20},
                                            {"content": "short"}]})
    started = time.monotonic()
    out, ledger = await chat_with_ledger(gateway, model)
    assert out.content == "short" and time.monotonic() - started < 5
    told = scripted_llm.requests(model=model)[1]["body"]["messages"][-1]["content"]
    assert "after 1 s, the time limit of one answer" in told
    assert ledger.usage.cut_calls == 1 and ledger.usage.completion_tokens > 10


async def test_no_token_within_the_bound_is_a_retryable_timeout(scripted_llm):
    """Before its first token a stream cannot tell the server is gone (llama-cpp-python
    evaluates the prompt in a thread): the slot stays held for one more bound."""
    gateway = gateway_for(scripted_llm, refloop_llm_timeout_s=0.4, refloop_llm_concurrency=1)
    model = scenario(scripted_llm, {"act": [{"content": "late", "delay_ms": 1500},
                                            {"content": "fast"}]})
    started = time.monotonic()
    with pytest.raises(LLMTransportError, match="timed out") as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert err.value.retryable
    assert (await gateway.chat(Purpose.act, USER, model=model)).content == "fast"
    assert time.monotonic() - started >= 0.8
    assert gateway.usage_by_purpose["act"].abandoned_calls == 1


async def test_an_endpoint_that_cannot_stream_falls_back_once_and_says_so(
        scripted_llm, caplog):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "a"}, {"content": "b"}]},
                     reject_stream=400)
    first = await gateway.chat(Purpose.act, USER, model=model)
    second = await gateway.chat(Purpose.act, USER, model=model)
    assert (first.content, second.content) == ("a", "b")
    sent = scripted_llm.requests(model=model)
    assert [(r["status"], bool(r["body"].get("stream"))) for r in sent] == \
        [(400, True), (200, False), (200, False)]
    said = [r for r in caplog.records if "not streamed from now on" in r.getMessage()]
    assert len(said) == 1


async def test_refused_stream_options_stream_without_them_and_estimate(scripted_llm):
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [{"content": "twelve chars"}]},
                     reject_stream_options=400)
    out = await gateway.chat(Purpose.act, USER, model=model)
    assert out.content == "twelve chars"
    sent = scripted_llm.requests(model=model)
    assert [r["status"] for r in sent] == [400, 200]
    assert sent[1]["body"]["stream"] and "stream_options" not in sent[1]["body"]
    usage = out.usage.usage
    assert usage.estimated_calls == 1 and usage.completion_tokens == 3  # 3 chunks of 4
    assert usage.prompt_tokens > 0


def sent_shape(scripted_llm, model: str) -> list[tuple[str, bool, object]]:
    """Each request as (what it was, streamed, its tool_choice)."""
    shape = []
    for r in scripted_llm.requests(model=model):
        body = r["body"]
        kind = ("pick" if is_tool_pick(body) else
                "tools" if body.get("tools") else "plain")
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            choice = choice["function"]["name"]
        shape.append((kind, bool(body.get("stream")), choice))
    return shape


async def test_a_tool_call_that_cannot_stream_is_picked_then_streamed_named(scripted_llm,
                                                                            caplog):
    """llama-cpp-python 0.3.36 (chatml-function-calling, tool_choice auto): a tool call
    cannot stream (its stream ends without a chunk) and, unstreamed, ignores max_tokens.
    Learnt once per endpoint: the model is asked which tool (a short capped request), then
    for the call with that tool named; both stream, so both end at their caps."""
    gateway = gateway_for(scripted_llm, refloop_max_tokens="act=64")
    model = scenario(scripted_llm, {"act": [WRITE_CALL, WRITE_CALL, {"content": "done"}]},
                     stream_tools_break=True, unstreamed_tools_run_away=True,
                     stream_repeats_call_fields=True)
    first, ledger = await chat_with_ledger(gateway, model, tools=[WRITE])
    second = await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    third = await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    assert first.tool_calls[0].name == second.tool_calls[0].name == "write_file"
    assert first.tool_calls[0].arguments == {"path": "a.txt"}
    assert third.content == "done" and not third.tool_calls
    assert sent_shape(scripted_llm, model) == [
        ("tools", True, "auto"),  # the stream that ended without a chunk
        ("pick", True, "next_tool"), ("tools", True, "write_file"),
        ("pick", True, "next_tool"), ("tools", True, "write_file"),
        ("pick", True, "next_tool"), ("tools", True, "none")]
    sent = scripted_llm.requests(model=model)
    assert sent[1]["body"]["max_tokens"] == PICK_MAX_TOKENS
    assert all(r["body"]["max_tokens"] == 64 for r in sent if not is_tool_pick(r["body"]))
    # The pick and the call are both in the answer's usage and the ledger.
    assert (ledger.usage.calls, ledger.usage.failed_calls) == (3, 1)
    assert first.usage.usage.calls == 2
    said = [r for r in caplog.records if "pick their tool first" in r.getMessage()]
    assert len(said) == 1


def test_a_pick_naming_no_offered_tool_is_none():
    names = ["write_file", "read_file"]

    def pick(arguments=None, content=None):
        calls = [] if arguments is None else [ToolCall(id="c", name="next_tool",
                                                       arguments=arguments)]
        return ChatOutcome(content=content, tool_calls=calls, usage=LLMUsageRecord(
            purpose=Purpose.act, model="m", usage=TokenUsage()))
    assert picked_tool(pick({"tool": "read_file"}), names) == "read_file"
    assert picked_tool(pick(content='Sure: {"tool": "write_file"}'), names) == "write_file"
    for arguments in ({"tool": "rm_rf"}, {"tool": "none"}, {"tool": ["write_file"]}, {}):
        assert picked_tool(pick(arguments), names) is None, arguments
    for content in ('{"tool": "write_f', "write_file", "", None, "[1]"):
        assert picked_tool(pick(content=content), names) is None, content


async def test_an_endpoint_that_cannot_stream_a_named_tool_call_goes_unstreamed(
        scripted_llm, caplog):
    """No stream for a tool call at all, its tool named or not: the pick and the call are
    asked again unstreamed at once, bounded by the time limit alone, and said so once."""
    gateway = gateway_for(scripted_llm)
    model = scenario(scripted_llm, {"act": [WRITE_CALL, WRITE_CALL]},
                     stream_tools_break=True, stream_named_tools_break=True)
    first = await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    second = await gateway.chat(Purpose.act, USER, model=model, tools=[WRITE])
    assert first.tool_calls[0].name == second.tool_calls[0].name == "write_file"
    assert sent_shape(scripted_llm, model) == [
        ("tools", True, "auto"), ("pick", True, "next_tool"), ("pick", False, "next_tool"),
        ("tools", False, "write_file"), ("tools", False, "auto")]
    said = [r for r in caplog.records if "offering tools are not streamed" in r.getMessage()]
    assert len(said) == 1


async def test_streaming_can_be_turned_off(scripted_llm):
    gateway = gateway_for(scripted_llm, refloop_llm_stream="off")
    model = scenario(scripted_llm, {"act": [{"content": "a"}]})
    await gateway.chat(Purpose.act, USER, model=model)
    assert "stream" not in scripted_llm.requests(model=model)[0]["body"]


async def test_a_stream_is_read_as_the_servers_json_not_an_object_a_chunk(scripted_llm):
    """The SDK's stream, through `raw_chunks`, hands over each chunk's JSON: no typed object
    a chunk (most of a call's parsing CPU), and the same answer."""
    model = scenario(scripted_llm, {"act": [WRITE_CALL]})
    client = openai.AsyncOpenAI(base_url=scripted_llm.base_url, api_key="k", max_retries=0)
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], stream=True,
        tools=[{"type": "function", "function": WRITE.model_dump()}],
        extra_headers={"X-Refloop-Purpose": "act"})
    tally = StreamTally()
    async for chunk in raw_chunks(stream):
        assert type(chunk) is dict
        tally.add(chunk)
    answer = streamed_answer(tally, prompt_chars=0)
    assert answer.calls and answer.calls[0][1] == "write_file"
    assert answer.finish_reason == "tool_calls"
    await client.close()


def delta_chunk(content=None, calls=None, reasoning=None, finish=None):
    """A chunk as the server sends it (the tally reads the JSON, not the SDK's objects)."""
    delta = {"content": content, "tool_calls": calls, "function_call": None,
             **({"reasoning_content": reasoning} if reasoning else {})}
    return {"model": "m", "usage": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call_delta(name, arguments, id=None):  # noqa: A002 - the field's name
    return {"index": 0, "id": id, "function": {"name": name, "arguments": arguments}}


def test_the_estimate_and_the_cap_of_a_stream():
    tally = StreamTally()
    for piece in ["a", "b", "c"]:  # short tokens: one per chunk
        tally.add(delta_chunk(piece))
    assert tally.estimated_tokens() == 3 and not tally.at_cap(4) and tally.at_cap(3)
    big = StreamTally()
    big.add(delta_chunk("x" * 100))  # a server sending many tokens a chunk
    assert big.estimated_tokens() == 25
    assert big.at_cap(12) and not big.at_cap(13)  # past twice the cap in characters
    thinking = StreamTally()
    thinking.add(delta_chunk(reasoning="let me think"))
    thinking.add(delta_chunk("4", finish="stop"))
    assert thinking.text() == "4" and thinking.text_chunks == 2
    call = call_delta("write_file", '{"pa', id="c1")
    cut = StreamTally()
    cut.add(delta_chunk(calls=[call]))
    cut.cut = "max_tokens"
    answer = streamed_answer(cut, prompt_chars=40)
    # A call cut in half is not a call; the prompt is estimated at four characters a token.
    assert answer.calls == [] and answer.finish_reason == "length"
    assert answer.usage.prompt_tokens == 10 and answer.usage.cut_calls == 1


def test_a_call_whose_every_delta_repeats_its_name_is_one_call_counted_per_chunk():
    """llama-cpp-python 0.3.36 streams a tool call with its id and name in every delta, and
    some deltas add no character: one call, one name, a token per chunk (as it counts)."""
    tally = StreamTally()
    for piece in ['{"', "tool", '":', "", ' "write_file"', "}", ""]:
        call = call_delta("next_tool", piece, id="c1")
        tally.add(delta_chunk(calls=[call]))
    answer = streamed_answer(tally, prompt_chars=40)
    assert answer.calls == [("c1", "next_tool", '{"tool": "write_file"}')]
    assert tally.text_chunks == 7 and tally.estimated_tokens() >= 7
    split = StreamTally()  # a name sent in pieces is still joined
    for name, arguments in (("write", ""), ("_file", "{}")):
        split.add(delta_chunk(calls=[call_delta(name, arguments)]))
    assert streamed_answer(split, prompt_chars=0).calls[0][1] == "write_file"
