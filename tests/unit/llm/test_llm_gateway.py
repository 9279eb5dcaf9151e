"""The LLM gateway over real HTTP (real openai client) against the scripted model."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

import pytest

from refloop.contract.activity_io import ModelEndpoint
from refloop.contract.errors import InvalidModelOutput, LLMClientError, LLMTransportError
from refloop.contract.messages import ChatMessage, IntentResult, Plan, Purpose, ToolSpec
from refloop.contract.text import detect_abnormal_output
from refloop.llm.failures import retry_after, should_retry
from refloop.llm.gateway import LLMGateway
from refloop.llm.scenario import load_scenario
from refloop.settings import Settings
from tests.llm_fixtures import unique_scenario

USER = [ChatMessage(role="user", content="hello")]
INTENT = {"intent": "CODING_TASK", "confidence": 0.8, "reason": "edit"}


@pytest.fixture
def gateway(scripted_llm) -> LLMGateway:
    return LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                               refloop_structured_max_reasks=2))


async def test_every_request_carries_its_purpose(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {p: [{"content": "x"}] for p in
                                           ("act", "summary", "quality_review")})
    for purpose in (Purpose.act, Purpose.summary, Purpose.quality_review):
        await gateway.chat(purpose, USER, model=model)
    assert [r["purpose"] for r in scripted_llm.requests(model=model)] == [
        "act", "summary", "quality_review"]


async def test_native_tool_calls_are_parsed(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a"}, "id": "c1"}]}]})
    spec = ToolSpec(name="read_file", description="d", parameters={"type": "object"})
    out = await gateway.chat(Purpose.act, USER, model=model, tools=[spec],
                             parallel_tool_calls=False)
    assert out.tool_calls[0].model_dump() == {"id": "c1", "name": "read_file",
                                              "arguments": {"path": "a"}}
    body = scripted_llm.requests(model=model)[0]["body"]
    assert body["parallel_tool_calls"] is False and body["tools"][0]["type"] == "function"
    assert out.usage.usage.calls == 1 and out.usage.usage.total_tokens > 0


async def test_structured_success_asks_for_json_schema(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"intent": [{"json": INTENT}]})
    out = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert out.value.intent.value == "CODING_TASK" and out.attempts == 1
    body = scripted_llm.requests(model=model)[0]["body"]
    assert body["response_format"]["type"] == "json_schema"


async def test_invalid_json_is_reasked_with_the_error(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"intent": [
        {"content": '{"intent": "DANCING", "confidence": 3}'},
        {"content": "Sure!\n```json\n" + json.dumps(INTENT) + "\n```"},
    ]})
    out = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert out.attempts == 2 and out.usage.usage.calls == 2
    reask = scripted_llm.requests(model=model)[1]["body"]["messages"]
    assert reask[-2]["role"] == "assistant" and "DANCING" in reask[-2]["content"]
    assert "not valid" in reask[-1]["content"] and "intent" in reask[-1]["content"]


async def test_reasks_exhausted_raise_invalid_output(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"plan": [{"content": "no"}] * 3})
    with pytest.raises(InvalidModelOutput) as err:
        await gateway.structured(Purpose.plan, USER, Plan, model=model)
    assert not err.value.retryable and "after 2 re-asks" in str(err.value)
    assert len(scripted_llm.requests(model=model)) == 3


async def test_json_schema_rejected_falls_back_to_json_object(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"intent": [
        {"status": 400, "body": {"error": {"message": "response_format json_schema unsupported"}}},
        {"json": INTENT},
    ]})
    out = await gateway.structured(Purpose.intent, USER, IntentResult, model=model)
    assert out.value.confidence == 0.8
    second = scripted_llm.requests(model=model)[1]["body"]
    assert second["response_format"]["type"] == "json_object"
    assert second["response_format"]["schema"]["title"] == "IntentResult"
    assert "JSON schema" in second["messages"][0]["content"]
    assert gateway.json_schema_supported is True  # learnt for that model only


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (500, LLMTransportError, True), (503, LLMTransportError, True),
    (429, LLMTransportError, True), (408, LLMTransportError, True),
    (401, LLMTransportError, True), (403, LLMTransportError, True),  # a key may be rotated
    (404, LLMClientError, False), (400, LLMClientError, False), (422, LLMClientError, False),
])
async def test_status_classification(gateway, scripted_llm, status, kind, retryable):
    model = unique_scenario(scripted_llm, {"act": [{"status": status}]})
    with pytest.raises(kind) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert err.value.retryable is retryable and err.value.status == status
    assert len(scripted_llm.requests(model=model)) == 1  # the client itself never retried


async def test_retry_after_is_parsed(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"status": 429, "retry_after": 7}]})
    with pytest.raises(LLMTransportError) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert err.value.retry_after == 7


async def test_retry_after_ms_and_should_retry_headers_are_read(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [
        {"status": 429, "retry_after": 7, "headers": {"retry-after-ms": "1500"}},
        {"status": 503, "headers": {"x-should-retry": "false"}},
        {"status": 400, "headers": {"x-should-retry": "true", "retry-after": "2"}},
    ]})
    with pytest.raises(LLMTransportError) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    assert err.value.retry_after == 1.5  # milliseconds win over seconds
    with pytest.raises(LLMClientError) as refused:
        await gateway.chat(Purpose.act, USER, model=model)
    assert not refused.value.retryable and refused.value.status == 503
    with pytest.raises(LLMTransportError) as asked:
        await gateway.chat(Purpose.act, USER, model=model)
    assert asked.value.retryable and asked.value.retry_after == 2


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "0"}, None),
    ({"retry-after": "soon"}, None),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    ({"retry-after-ms": "x", "retry-after": "9"}, 9.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),  # in the past: no wait
])
def test_retry_after_headers(headers, expected):
    assert retry_after(headers) == expected


def test_retry_after_as_a_future_http_date():
    from email.utils import format_datetime

    when = datetime.now(UTC) + timedelta(seconds=30)
    assert 25 < retry_after({"retry-after": format_datetime(when, usegmt=True)}) <= 30


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("true", True), ("FALSE", False), ("maybe", None)])
def test_should_retry_header(value, expected):
    assert should_retry({} if value is None else {"x-should-retry": value}) is expected


async def test_connection_refused_is_retryable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway = LLMGateway(Settings(openai_base_url=f"http://127.0.0.1:{port}/v1"))
    with pytest.raises(LLMTransportError) as err:
        await gateway.chat(Purpose.act, USER)
    assert err.value.retryable
    # Refused: the request reached no server, so nothing is left generating on it.
    usage = gateway.usage_by_purpose["act"]
    assert (usage.failed_calls, usage.abandoned_calls, usage.abandoned_max_tokens) == (1, 0, 0)


async def test_exhausted_scenario_is_a_clear_client_error(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"content": "one"}]})
    await gateway.chat(Purpose.act, USER, model=model)
    with pytest.raises(LLMClientError) as err:
        await gateway.chat(Purpose.act, USER, model=model)
    # The endpoint's short class only; its words stay in the worker log.
    assert "scenario_exhausted" in str(err.value) and "after 1" not in str(err.value)


async def test_usage_is_totalled_per_purpose(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"content": "a"}, {"content": "b"}],
                                           "summary": [{"content": "c"}]})
    await gateway.chat(Purpose.act, USER, model=model)
    await gateway.chat(Purpose.act, USER, model=model)
    await gateway.chat(Purpose.summary, USER, model=model)
    assert gateway.usage_by_purpose["act"].calls == 2
    assert gateway.usage_by_purpose["summary"].calls == 1


async def test_runaway_output_is_flagged_and_cut(gateway, scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"content": "ok " + "[" * 3000}]})
    out = await gateway.chat(Purpose.act, USER, model=model)
    assert out.abnormal and "'['" in out.abnormal and len(out.content) <= 500


def test_abnormal_detection_thresholds():
    assert detect_abnormal_output("{" * 51)
    assert detect_abnormal_output("[ " * 60)
    assert detect_abnormal_output("{" * 50) is None
    assert detect_abnormal_output('{"a": [1, [2, [3]]]}') is None


def test_scripted_answers_say_so_and_bad_scenarios_are_rejected(scripted_llm, tmp_path):
    import httpx

    model = unique_scenario(scripted_llm, {"act": [{"content": "hi"}]})
    response = httpx.post(f"{scripted_llm.base_url}/chat/completions",
                          json={"model": model, "messages": []},
                          headers={"X-Refloop-Purpose": "act"})
    assert response.headers["x-refloop-scripted"] == "true"
    assert response.json()["model"] == f"scripted:{model}"
    assert response.json()["system_fingerprint"] == "refloop-scripted"
    missing = httpx.post(f"{scripted_llm.base_url}/chat/completions",
                         json={"model": model, "messages": []})
    assert missing.status_code == 400 and "X-Refloop-Purpose" in missing.text
    bad = tmp_path / "bad.yaml"
    bad.write_text("responses:\n  act:\n    - {}\n")
    with pytest.raises(ValueError, match="responses.act.0"):
        load_scenario(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("responses:\n  dance:\n    - content: x\n")
    with pytest.raises(ValueError, match="dance"):
        load_scenario(unknown)


def test_demo_scenario_is_valid():
    from refloop.worker.model_endpoint import demo_scenario_path

    scenario = load_scenario(demo_scenario_path())
    assert {p.value for p in scenario.responses} == {
        "intent", "plan", "act", "completeness", "summary", "code_review", "code_verify",
        "quality_review"}
    assert scenario.repeat  # one `refloop up` serves any number of tasks


def config_client(endpoint: ModelEndpoint, **settings: str) -> object:
    gateway = LLMGateway(Settings(openai_base_url="http://127.0.0.1:9/v1",
                                  openai_api_key="sk-worker-default", **settings))
    return gateway.client_for(endpoint)


def test_a_model_config_cannot_name_any_worker_variable_for_its_key(monkeypatch):
    """An API client's model config could otherwise send any secret of the worker's
    environment, as a bearer token, to a URL it chose."""
    monkeypatch.setenv("DATABASE_PASSWORD", "hunter2")
    with pytest.raises(LLMClientError, match="REFLOOP_MODEL_KEY_ENVS"):
        config_client(ModelEndpoint(model="m", base_url="http://evil.invalid/v1",
                                    api_key_env="DATABASE_PASSWORD"))
    monkeypatch.setenv("TEAM_MODEL_KEY", "sk-team")
    allowed = config_client(ModelEndpoint(model="m", base_url="http://Models.internal/v1/",
                                          api_key_env="TEAM_MODEL_KEY"),
                            refloop_model_key_envs="TEAM_MODEL_KEY=http://models.internal/v1,"
                                                   " OTHER")
    assert allowed.api_key == "sk-team"


def test_a_key_goes_only_to_the_base_urls_it_is_bound_to(monkeypatch):
    """The attack: a client's config names the operator's TEAM_KEY with its own base URL,
    and the listener there would have received `Bearer <the key>`."""
    monkeypatch.setenv("TEAM_KEY", "sk-team")
    bound = {"refloop_model_key_envs": "TEAM_KEY=https://llm.example/v1,"
                                       "TEAM_KEY=https://backup.example/v1"}
    with pytest.raises(LLMClientError, match="may not be sent to http://127.0.0.1:9999"):
        config_client(ModelEndpoint(model="m", base_url="http://127.0.0.1:9999/v1",
                                    api_key_env="TEAM_KEY"), **bound)
    for url in ("https://llm.example/v1", "https://backup.example/v1"):
        client = config_client(ModelEndpoint(model="m", base_url=url, api_key_env="TEAM_KEY"),
                               **bound)
        assert client.api_key == "sk-team"
    # A bare name: only the worker's own endpoint.
    with pytest.raises(LLMClientError, match="may not be sent"):
        config_client(ModelEndpoint(model="m", base_url="https://llm.example/v1",
                                    api_key_env="TEAM_KEY"), refloop_model_key_envs="TEAM_KEY")
    own = config_client(ModelEndpoint(model="m", api_key_env="TEAM_KEY"),
                        refloop_model_key_envs="TEAM_KEY")
    assert own.api_key == "sk-team"


def test_key_bindings_are_checked_at_start_up():
    from refloop.settings import SettingsError, load_settings

    for bad in ("TEAM_KEY=ftp://x", "team key=https://x"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("REFLOOP_MODEL_KEY_ENVS", bad)
            with pytest.raises(SettingsError, match="REFLOOP_MODEL_KEY_ENVS"):
                load_settings()


def test_an_endpoints_error_page_never_reaches_the_task():
    """Upstream bodies can be anything a URL answers (an internal page): a status and a
    short class only; the whole text goes to the worker log."""
    import httpx
    import openai

    from refloop.llm.failures import classify

    page = "<html>internal admin console, build 7f3a</html>"
    response = httpx.Response(404, text=page, request=httpx.Request("POST", "http://x/v1"))
    error = classify(openai.NotFoundError(page, response=response, body=page))
    assert str(error) == "HTTP 404 from the model endpoint (NotFoundError)"
    assert error.body == page  # kept for the gateway's own decisions, never shown


def test_the_workers_own_key_never_goes_to_a_url_a_model_config_chose():
    chosen = config_client(ModelEndpoint(model="m", base_url="http://evil.invalid/v1"))
    assert chosen.api_key != "sk-worker-default"
    same_endpoint = config_client(ModelEndpoint(model="m", temperature=0.1))
    assert same_endpoint.api_key == "sk-worker-default"
