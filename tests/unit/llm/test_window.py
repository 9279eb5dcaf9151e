"""Context windows: known from settings, the endpoint or its refusal; every request fitted
to it before it is sent; a refusal for length refitted once, never an outage. Over real
HTTP against the scripted model enforcing a window."""

from __future__ import annotations

import logging

import pytest

from refloop.contract.errors import LLMClientError
from refloop.contract.messages import ChatMessage, IntentResult, Purpose, ToolSpec
from refloop.contract.window import parse_context_tokens
from refloop.llm.endpoint import refuses_shape
from refloop.llm.gateway import LLMGateway
from refloop.llm.scripted import ScriptedLLMServer
from refloop.llm.window import (
    LengthRefusal,
    WindowBook,
    length_refusal,
    models_window,
    props_window,
    server_root,
)
from refloop.settings import Settings
from tests.llm_fixtures import unique_scenario

LLAMA_REFUSAL = ('{"error":{"code":400,"message":"the request exceeds the available context '
                 'size, try increasing it","type":"exceed_context_size_error",'
                 '"n_prompt_tokens":13001,"n_ctx":12000}}')
OPENAI_REFUSAL = ('{"error":{"message":"This model\'s maximum context length is 8192 tokens. '
                  'However, your messages resulted in 9000 tokens. Please reduce the length '
                  'of the messages.","type":"invalid_request_error","param":"messages",'
                  '"code":"context_length_exceeded"}}')
READ = ToolSpec(name="read_file", description="Read a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})


def test_the_setting_takes_one_window_or_one_per_model():
    assert parse_context_tokens(None) == {}
    assert parse_context_tokens("32768") == {"*": 32768}
    assert parse_context_tokens("smollm2=4096, gpt-4o=128000") == {"smollm2": 4096,
                                                                     "gpt-4o": 128000}
    with pytest.raises(ValueError, match="bad item"):
        parse_context_tokens("smollm2=12")
    with pytest.raises(ValueError):
        Settings(refloop_model_context_tokens="big")


def test_refusals_for_length_are_read_from_both_wordings():
    assert length_refusal(400, LLAMA_REFUSAL) == LengthRefusal(12000, 13001)
    assert length_refusal(400, OPENAI_REFUSAL) == LengthRefusal(8192, 9000)
    # llama.cpp once answered it with a 500: still a refusal for length, not an outage
    assert length_refusal(500, LLAMA_REFUSAL) == LengthRefusal(12000, 13001)
    # vLLM and llama-cpp-python's server: the prompt is the part "in the messages"
    vllm = ("This model's maximum context length is 4096 tokens. However, you requested 5200 "
            "tokens (4176 in the messages, 1024 in the completion). Please reduce the length")
    assert length_refusal(400, vllm) == LengthRefusal(4096, 4176)
    # llama-cpp-python's own words, before its server rewords them
    assert length_refusal(400, "Requested tokens (5000) exceed context window of 4096") == \
        LengthRefusal(4096, 5000)
    assert length_refusal(400, '{"error": "tool_choice is not supported"}') is None
    assert length_refusal(None, LLAMA_REFUSAL) is None


def test_a_500_naming_a_request_field_refuses_the_shape_not_the_server():
    assert refuses_shape(500, "Internal error: response_format is not supported")
    assert refuses_shape(500, "'stream_options' unexpected")
    assert refuses_shape(500, "1 validation error: x")
    assert not refuses_shape(500, "CUDA out of memory")
    assert refuses_shape(502, "could not parse tools")  # names a field: stepped down
    assert not refuses_shape(400, "response_format")  # a 4xx is the negotiation's already
    assert not refuses_shape(500, LLAMA_REFUSAL)


def test_the_endpoint_states_its_window_in_props_or_models():
    assert props_window({"default_generation_settings": {"n_ctx": 4096}}) == 4096
    assert props_window({"n_ctx": 2048}) == 2048
    assert props_window({"model_path": "x"}) is None
    listing = {"data": [{"id": "a", "max_model_len": 32768},
                        {"id": "b", "meta": {"n_ctx_train": 131072}},
                        {"id": "c", "context_length": 8000}]}
    assert models_window(listing, "a") == 32768
    assert models_window(listing, "b") is None  # the training length is not the window
    assert models_window(listing, "c") == 8000
    assert server_root("http://h:8080/v1") == server_root("http://h:8080/v1/") == "http://h:8080"


def test_a_setting_wins_a_refusal_corrects_it_and_each_window_is_logged_once(caplog):
    caplog.set_level(logging.INFO, "refloop.llm")
    book = WindowBook({"m": 16000}, default=8192)
    assert book.of("u", "m").window == 16000 and book.of("u", "m").source == "setting"
    book.heard("u", "m", 4096, "props")  # the operator's word stands
    assert book.of("u", "m").window == 16000
    book.refused("u", "m", LengthRefusal(12000, None), sent_chars=60_000)
    assert (book.of("u", "m").window, book.of("u", "m").source) == (12000, "refusal")
    assert book.of("u", "other").window == 8192
    book.of("u", "other")
    said = [r.getMessage() for r in caplog.records if "context window" in r.getMessage()]
    assert len(said) == 3, said  # setting, refusal, default: each once


def test_a_model_configs_window_comes_first_and_a_refusal_still_corrects_it(caplog):
    """A model config's `context_tokens`: ahead of the operator's setting and of what the
    endpoint states (which is then not asked); a refusal still teaches a smaller window,
    which a larger configured one does not undo; a config changed since is taken."""
    caplog.set_level(logging.INFO, "refloop.llm")
    book = WindowBook({"m": 16000}, default=8192)
    book.configured("u", "m", 6000)
    known = book.of("u", "m")
    assert (known.window, known.source, known.probed) == (6000, "config", True)
    book.heard("u", "m", 32768, "props")  # the endpoint's word does not override it
    assert (known.window, known.source) == (6000, "config")
    book.configured("u", "m", 6000)  # said again with every request: logged once
    book.refused("u", "m", LengthRefusal(5000, None), sent_chars=30_000)
    assert (known.window, known.source) == (5000, "refusal")
    book.configured("u", "m", 6000)  # over what the endpoint refused: the lesson stands
    assert (known.window, known.source) == (5000, "refusal")
    book.configured("u", "m", 4096)  # a config changed to less: taken
    assert (known.window, known.source) == (4096, "config")
    # Per (base URL, model): the setting still decides the same model elsewhere
    assert (book.of("v", "m").window, book.of("v", "m").source) == (16000, "setting")
    said = [r.getMessage() for r in caplog.records if "context window" in r.getMessage()]
    assert len(said) == 4, said  # 6000 config, 5000 refusal, 4096 config, 16000 setting
    assert "its model config's context_tokens" in said[0]


async def test_a_configured_window_fits_requests_without_asking_the_endpoint():
    """The endpoint states 12,000 tokens (/props); its model config says 5,000: requests
    are fitted to 5,000 and /props is never asked."""
    from refloop.llm.gateway import model_client
    from refloop.llm.window import WindowKeeper

    scenario = {"name": "w", "endpoint": {"context_tokens": 12000},
                "responses": {"summary": [{"content": "a"}]}}
    with ScriptedLLMServer(scenario) as server:
        keeper = WindowKeeper(None, 8192)

        async def never(*args: object) -> None:
            raise AssertionError("the endpoint was asked its window")
        keeper.probe = never  # type: ignore[method-assign]
        client = model_client(server.base_url, "k", 5)
        keeper.configured(server.base_url, "w", 5000)
        keeper.configured(server.base_url, "w", None)  # a config without one: no change
        request = await keeper.fitted(client, server.base_url, "w", long_conversation(40_000),
                                      None, 512, None)
        known = keeper.book.of(server.base_url, "w")
        assert (known.window, known.source) == (5000, "config")
        tokens = keeper.book.tokens(server.base_url, "w", request.chars, len(request.messages))
        assert tokens + request.max_tokens <= 5000
        assert "left out to fit the model's window" in request.messages[1].content


def test_the_ratio_is_calibrated_by_the_counts_the_endpoint_reports():
    book = WindowBook({}, default=8192)
    assert book.tokens("u", "m", 3000) == 1000  # three characters a token, at first
    book.calibrate("u", "m", 7000, 2000)
    assert book.of("u", "m").chars_per_token == 3.5
    book.calibrate("u", "m", 5000, 2000)  # a denser prompt counts at once
    assert book.of("u", "m").chars_per_token == 2.5
    book.calibrate("u", "m", 40, 10)  # too short to say anything
    assert book.of("u", "m").chars_per_token == 2.5


def windowed(scripted_llm, responses, **endpoint) -> str:
    name = unique_scenario(scripted_llm, responses)
    scripted_llm.load(name, {"name": name, "endpoint": endpoint, "responses": responses})
    return name


def long_conversation(chars: int) -> list[ChatMessage]:
    return [ChatMessage(role="system", content="You are terse."),
            ChatMessage(role="user", content="Summarise this:\n" + "lorem ipsum " * (chars // 12))]


async def test_a_prompt_over_the_window_is_fitted_and_never_sent_whole(scripted_llm):
    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                                  refloop_model_context_tokens="6000"))
    model = windowed(scripted_llm, {"summary": [{"content": "ok"}]}, context_tokens=6000,
                     context_refusal="openai")
    out = await gateway.chat(Purpose.summary, long_conversation(60_000), model=model)
    assert out.content == "ok"
    [request] = scripted_llm.requests(model=model)
    assert request["status"] == 200
    assert request["prompt_tokens"] + request["body"]["max_tokens"] <= 6000
    assert "left out to fit the model's window" in request["body"]["messages"][1]["content"]


@pytest.mark.parametrize("wording", ["openai", "llama_cpp"])
async def test_a_refusal_for_length_teaches_the_window_and_is_refitted_once(
        scripted_llm, wording, caplog):
    model = windowed(scripted_llm, {"act": [{"content": "first"}, {"content": "second"}]},
                     context_tokens=5000, context_refusal=wording)
    # OpenAI states its window nowhere, and the default (8192) is more than it takes; the
    # llama.cpp-worded one states it in /v1/models, which a wrong setting overrides.
    gateway = LLMGateway(Settings(
        openai_base_url=scripted_llm.base_url, openai_api_key="k",
        refloop_model_context_tokens=f"{model}=9000" if wording == "llama_cpp" else None))
    out = await gateway.chat(Purpose.act, long_conversation(20_000), model=model, tools=[READ])
    assert out.content == "first"
    statuses = [r["status"] for r in scripted_llm.requests(model=model)]
    assert statuses == [400, 200]  # one refusal, no wait, no failure
    known = gateway.windows.book.of(gateway.base_url, model)
    assert (known.window, known.source) == (5000, "refusal")
    # Learnt: the next long request fits at once
    await gateway.chat(Purpose.act, long_conversation(20_000), model=model, tools=[READ])
    answered = scripted_llm.requests(model=model)
    assert [r["status"] for r in answered] == [400, 200, 200]
    assert all(r["prompt_tokens"] + r["body"]["max_tokens"] <= 5000 for r in answered[1:])
    assert any("learnt from its refusal" in r.getMessage() for r in caplog.records)


async def test_a_second_refusal_fails_clearly_and_is_not_waited_out(scripted_llm):
    # An operator's window far over the endpoint's, and a refusal that states no number
    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                                  refloop_model_context_tokens="100000"))
    refusal = {"status": 400, "body": {"error": {"message": "context window exceeded",
                                                 "code": "context_length_exceeded"}}}
    model = windowed(scripted_llm, {"summary": [refusal, refusal]})
    with pytest.raises(LLMClientError, match="HTTP 400"):
        await gateway.chat(Purpose.summary, long_conversation(2_000), model=model)
    assert len(scripted_llm.requests(model=model)) == 2
    assert gateway.windows.book.of(gateway.base_url, model).window == 80000


async def test_a_500_naming_response_format_steps_down_instead_of_waiting(scripted_llm):
    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k"))
    intent = {"intent": "CODING_TASK", "confidence": 0.8, "reason": "edit"}
    refused = {"status": 500, "body": {"error": {"message": "Internal Server Error: "
                                                 "unsupported response_format"}}}
    model = windowed(scripted_llm, {"intent": [refused, {"json": intent}]})
    out = await gateway.structured(Purpose.intent, long_conversation(100), IntentResult,
                                   model=model)
    assert out.value.confidence == 0.8
    assert [r["status"] for r in scripted_llm.requests(model=model)] == [500, 200]
    assert gateway.endpoints.structured_mode(gateway.base_url, model) == "json_object_schema"


async def test_the_window_is_asked_of_the_endpoint_once_a_prompt_is_long():
    scenario = {"name": "w", "endpoint": {"context_tokens": 12000},
                "responses": {"summary": [{"content": "a"}, {"content": "b"}]}}
    with ScriptedLLMServer(scenario) as server:
        gateway = LLMGateway(Settings(openai_base_url=server.base_url, openai_api_key="k"))
        await gateway.chat(Purpose.summary, long_conversation(200), model="w")
        assert not gateway.windows.book.of(server.base_url, "w").probed  # short: not asked
        await gateway.chat(Purpose.summary, long_conversation(20_000), model="w")
        known = gateway.windows.book.of(server.base_url, "w")
        assert (known.window, known.source) == (12000, "props")
        assert known.calibrated and known.chars_per_token > 3.0
        assert all(r["status"] == 200 for r in server.requests())


async def test_a_window_only_assumed_cuts_no_prompt(scripted_llm):
    """Nothing states this endpoint's window (as OpenAI's): a long prompt goes whole, not cut
    to the default; a refusal would teach the window."""
    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k"))
    model = windowed(scripted_llm, {"summary": [{"content": "ok"}]}, context_refusal="openai")
    await gateway.chat(Purpose.summary, long_conversation(60_000), model=model)
    [request] = scripted_llm.requests(model=model)
    assert request["body"]["messages"][1]["content"] == long_conversation(60_000)[1].content
    assert request["body"]["max_tokens"] == 512
    assert gateway.windows.book.of(gateway.base_url, model).source == "default"


async def test_an_endpoint_that_cannot_be_asked_is_asked_again_only_a_minute_later():
    from refloop.llm.gateway import model_client
    from refloop.llm.window import WindowKeeper
    from refloop.runtime.net import free_port

    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens
    keeper = WindowKeeper(None, 8192)
    client = model_client(base_url, "k", 5)
    await keeper.budget(client, base_url, "m", 60_000, 0, 512)
    known = keeper.book.of(base_url, "m")
    assert not known.probed and known.probe_after > 0 and known.source == "default"
    again = known.probe_after
    await keeper.budget(client, base_url, "m", 60_000, 0, 512)
    assert known.probe_after == again  # not asked again within the minute


async def test_a_500_naming_tool_choice_drops_it_instead_of_waiting(scripted_llm):
    """llama-cpp-python answers a field it does not take with a 500 (here without the words
    "validation error"): the request's shape was refused, not the server down."""
    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k"))
    model = windowed(scripted_llm, {"act": [{"tool_calls": [
        {"name": "read_file", "arguments": {"path": "a.txt"}}]}]}, reject_tool_choice=500)
    out = await gateway.chat(Purpose.act, long_conversation(100), model=model, tools=[READ])
    assert [call.name for call in out.tool_calls] == ["read_file"]
    sent = scripted_llm.requests(model=model)
    assert [r["status"] for r in sent] == [500, 200]
    assert "tool_choice" in sent[0]["body"] and "tool_choice" not in sent[1]["body"]
