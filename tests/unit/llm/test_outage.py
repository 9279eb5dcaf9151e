"""Waiting out a model endpoint's outage: the decisions (plain functions), the per-worker
gate, and how failures are classified and worded (the endpoint's fault, never a Python
exception's name)."""

from __future__ import annotations

import json
import random
import time

import httpx
import openai
import pytest

from refloop.contract.errors import LLMClientError, LLMTransportError, ModelUnavailable
from refloop.llm.failures import classify
from refloop.llm.outage import (
    RETRY_AFTER_CAP_S,
    EndpointGates,
    OutageWatch,
    Turn,
    endpoint_name,
    outage_over,
    parked_recheck_s,
    probe_delay,
    recoverable,
    release_spread,
    wait_bound,
)

URL = "http://model.example:8080/v1"


def status_error(status: int, body: str = "{}", headers: dict[str, str] | None = None
                 ) -> openai.APIStatusError:
    response = httpx.Response(status, text=body, headers=headers or {},
                              request=httpx.Request("POST", URL))
    return openai.APIStatusError("failed", response=response, body=None)


@pytest.mark.parametrize(("status", "waits"), [
    (500, True), (502, True), (503, True), (429, True), (408, True), (409, True),
    (401, True), (403, True),  # a refused key: waited for (keys are rotated)
    (400, False), (404, False), (422, False),
])
def test_which_statuses_are_waited_out(status, waits):
    error = classify(status_error(status), endpoint_name(URL))
    assert recoverable(error) is waits
    assert isinstance(error, LLMTransportError if waits else LLMClientError)
    assert URL in str(error) and f"HTTP {status}" in str(error)


def test_a_refused_key_says_what_the_wait_is_for():
    error = classify(status_error(401), endpoint_name(URL))
    assert "refuses the API key" in str(error)


def test_a_model_not_found_fails_at_once_naming_the_endpoint():
    body = json.dumps({"error": {"code": "model_not_found", "message": "no such model"}})
    error = classify(openai.NotFoundError("no such model", response=httpx.Response(
        404, text=body, request=httpx.Request("POST", URL)), body=json.loads(body)["error"]),
        endpoint_name(URL))
    assert not recoverable(error)
    assert str(error) == f"HTTP 404 from {URL} (model_not_found)"


@pytest.mark.parametrize("body", [b'\xff\xfe{"id": "x', b'{"id": "x", "choi', b"<html>",
                                  b""])
def test_garbage_is_the_endpoints_fault_not_a_python_exception(body):
    """A success status with a body that is not UTF-8 or not JSON: recoverable, worded as
    the endpoint's answer; the bytes themselves stay in the worker log."""
    try:
        json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        error = classify(err, endpoint_name(URL))
    assert recoverable(error) and error.status == 200
    text = str(error)
    assert text.startswith(f"{URL} answered HTTP 2xx with ")
    assert "not UTF-8" in text or "not valid JSON" in text or "an empty body" in text
    for name in ("UnicodeDecodeError", "JSONDecodeError", "codec", "Traceback"):
        assert name not in text
    assert "<html>" not in text  # no excerpt of the body reaches the task


def test_a_refused_connection_is_worded_as_such():
    err = openai.APIConnectionError(request=httpx.Request("POST", URL))
    err.__cause__ = httpx.ConnectError("[Errno 111] Connection refused")
    error = classify(err, endpoint_name(URL))
    assert recoverable(error)
    assert str(error) == f"{URL} unreachable (connection refused)"


def test_endpoint_names_drop_credentials_and_queries():
    assert endpoint_name("https://user:secret@llm.example/v1?key=abc") == \
        "https://llm.example/v1"
    assert endpoint_name("scripted") == "scripted"


@pytest.mark.parametrize(("failures", "retry_after", "expected"), [
    (1, None, 1.0), (2, None, 2.0), (3, None, 4.0), (4, None, 8.0), (9, None, 8.0),
    (1, 30.0, 30.0),  # Retry-After beyond the cap is honoured
    (4, 0.5, 8.0),  # a shorter one does not bring the probe forward
    (1, 10**9, RETRY_AFTER_CAP_S),  # an absurd one is capped
])
def test_probe_backoff_doubles_to_the_cap_and_honours_retry_after(
        failures, retry_after, expected):
    assert probe_delay(failures, retry_after, probe_s=8.0) == expected


def test_release_spread_and_outage_bound():
    assert release_spread(8.0) == 1.5 and release_spread(0.4) == pytest.approx(0.1)
    assert outage_over(3600.0, 3600.0) and not outage_over(3599.9, 3600.0)


def test_the_gate_lets_one_probe_through_and_turns_the_rest_away_with_a_delay():
    gates = EndpointGates(probe_s=0.4, rng=random.Random(1))
    assert gates.try_turn(URL) == Turn()  # up: it goes
    gates.failed(URL, Turn(), LLMTransportError("HTTP 500"))
    assert gates.try_turn(URL) is None  # the first probe is 0.05 s away
    assert 0.05 <= gates.retry_in(URL) <= 0.05 + release_spread(0.4) + 0.01
    time.sleep(0.06)
    probe = gates.try_turn(URL)
    assert probe is not None and probe.probe
    turned_away = [gates.try_turn(URL) for _ in range(20)]  # a probe is out: nobody else
    assert turned_away == [None] * 20
    assert gates.retry_in(URL) >= 0.1  # a quarter interval while the probe is out
    gates.failed(URL, probe, LLMTransportError("HTTP 500 again"))
    assert gates.last_error(URL) == "HTTP 500 again" and gates.try_turn(URL) is None
    gates.answered(URL)
    assert not gates.is_down(URL) and gates.try_turn(URL) == Turn()


def test_parked_calls_are_named_when_the_endpoint_answers_and_only_then():
    gates = EndpointGates(probe_s=0.4)
    assert gates.answered(URL) is None  # it was not down here: nobody to wake
    gates.failed(URL, Turn(), LLMTransportError("HTTP 503", 503))
    assert gates.last_status(URL) == 503
    assert gates.park(URL, "task-a") == parked_recheck_s(0.4) == 8.0
    gates.park(URL, "task-b")
    gates.park(URL, "task-a")  # parked again: woken once
    assert gates.try_turn(URL) is None  # still down: parking changed nothing else
    assert gates.answered(URL) == {"task-a", "task-b"}
    assert gates.answered(URL) is None and gates.try_turn(URL) == Turn()
    gates.failed(URL, Turn(), LLMTransportError("HTTP 500"))
    assert gates.answered(URL) == set()  # down again, nobody parked since: none woken


def test_a_refused_keys_wait_has_its_own_bound_only_when_shorter():
    assert wait_bound(401, 3600, 300) == (300, "REFLOOP_MODEL_AUTH_WAIT_S")
    assert wait_bound(403, 3600, 300) == (300, "REFLOOP_MODEL_AUTH_WAIT_S")
    assert wait_bound(503, 3600, 300) == (3600, "REFLOOP_MODEL_OUTAGE_S")
    assert wait_bound(401, 60, 300) == (60, "REFLOOP_MODEL_OUTAGE_S")
    assert wait_bound(None, 60, None) == (60, "REFLOOP_MODEL_OUTAGE_S")


def test_retry_after_holds_the_next_probe():
    gates = EndpointGates(probe_s=0.4)
    gates.failed(URL, Turn(), LLMTransportError("HTTP 429", 429, retry_after=0.6))
    time.sleep(0.1)
    assert gates.try_turn(URL) is None  # the backoff alone (0.05 s) would have probed
    assert gates.retry_in(URL) >= 0.45


def test_a_cancelled_probe_hands_the_probe_on():
    gates = EndpointGates(probe_s=0.4)
    gates.failed(URL, Turn(), LLMTransportError("HTTP 500"))
    time.sleep(0.06)
    first = gates.try_turn(URL)
    assert first is not None and first.probe
    assert gates.try_turn(URL) is None  # a probe is out
    gates.abandoned(URL, first)
    second = gates.try_turn(URL)
    assert second is not None and second.probe


async def test_a_refused_key_gives_up_at_its_own_shorter_bound():
    now = [0.0]
    watch = OutageWatch(clock=lambda: now[0])
    await watch.waiting(URL, "HTTP 401", bound_s=3600, status=401, auth_bound_s=60)
    now[0] = 59.0
    await watch.waiting(URL, "HTTP 401", bound_s=3600, status=401, auth_bound_s=60)
    now[0] = 60.0
    with pytest.raises(ModelUnavailable, match="REFLOOP_MODEL_AUTH_WAIT_S"):
        await watch.waiting(URL, "HTTP 401", bound_s=3600, status=401, auth_bound_s=60)
    # a 503 waits the whole outage bound
    await OutageWatch(since=0.0, clock=lambda: 600.0).waiting(
        URL, "HTTP 503", bound_s=3600, status=503, auth_bound_s=60)


async def test_a_watch_tells_once_and_gives_up_past_the_bound_naming_the_endpoint():
    told: list[dict] = []
    now = [1000.0]

    async def notify(report: dict) -> None:
        told.append(report)

    watch = OutageWatch(notify=notify, clock=lambda: now[0])
    await watch.waiting(URL, "HTTP 500 from it", bound_s=60)
    now[0] += 30
    await watch.waiting(URL, "HTTP 500 from it", bound_s=60)
    assert [r["waiting"] for r in told] == [True] and told[0]["since"] == 1000.0
    now[0] += 30
    with pytest.raises(ModelUnavailable) as gave_up:
        await watch.waiting(URL, "HTTP 503 from it", bound_s=60)
    assert URL in str(gave_up.value) and "REFLOOP_MODEL_OUTAGE_S" in str(gave_up.value)
    assert told[-1] == {"waiting": False, "endpoint": URL, "gave_up": True, "waited_s": 60.0}
    assert "HTTP 503 from it" in str(gave_up.value)


async def test_a_watch_carried_from_an_earlier_attempt_keeps_its_start_and_reports_back():
    told: list[dict] = []

    async def notify(report: dict) -> None:
        told.append(report)

    watch = OutageWatch(since=100.0, notify=notify, clock=lambda: 160.0)
    assert await watch.back() == 60.0
    assert told == [{"waiting": False, "endpoint": "", "waited_s": 60.0}]
    assert await OutageWatch(notify=notify).back() == 0.0 and len(told) == 1


async def test_a_watch_tells_again_when_its_endpoint_went_down_anew():
    """Another task's request answered in between (an answer already on its way when the
    endpoint went down): the worker woke the waiting tasks, this call's among them, while
    its own call still fails. It tells its task again, once per outage; a call carried
    from an attempt that did not record the outage keeps telling once."""
    told: list[dict] = []

    async def notify(report: dict) -> None:
        told.append(report)

    gates = EndpointGates(probe_s=0.4)
    gates.failed(URL, Turn(), LLMTransportError("refused"))
    first = gates.episode(URL)
    watch = OutageWatch(notify=notify)
    await watch.waiting(URL, "HTTP 500", bound_s=60, episode=first)
    await watch.waiting(URL, "HTTP 500", bound_s=60, episode=first)
    assert [r["waiting"] for r in told] == [True]
    assert gates.answered(URL) == set() and gates.episode(URL) is None
    gates.failed(URL, Turn(), LLMTransportError("refused"))
    again = gates.episode(URL)
    assert again is not None and again != first
    await watch.waiting(URL, "HTTP 500", bound_s=60, episode=again)
    await watch.waiting(URL, "HTTP 500", bound_s=60, episode=again)
    assert [r["waiting"] for r in told] == [True, True]
    # carried across attempts: the outage it told of goes with it
    carried = OutageWatch(since=watch.since, notify=notify, told_episode=watch.told_episode)
    await carried.waiting(URL, "HTTP 500", bound_s=60, episode=again)
    await OutageWatch(since=watch.since, notify=notify).waiting(
        URL, "HTTP 500", bound_s=60, episode=first)
    assert len(told) == 2


@pytest.mark.parametrize("stream", ["auto", "off"])
async def test_a_garbled_answer_over_http_is_the_endpoints_fault(scripted_llm, stream):
    """Through the real client, streamed and not: a 200 whose body is cut in a UTF-8
    sequence is a recoverable error naming the endpoint, never a decoder's exception."""
    from refloop.contract.messages import ChatMessage, Purpose
    from refloop.llm.gateway import LLMGateway
    from refloop.settings import Settings

    gateway = LLMGateway(Settings(openai_base_url=scripted_llm.base_url, openai_api_key="k",
                                  refloop_llm_stream=stream))
    scripted_llm.set_fault(garbage=True)
    try:
        with pytest.raises(LLMTransportError) as err:
            await gateway.chat(Purpose.act, [ChatMessage(role="user", content="hi")])
    finally:
        scripted_llm.set_fault()
    text = str(err.value)
    assert text.startswith(scripted_llm.base_url) and recoverable(err.value)
    for name in ("UnicodeDecodeError", "JSONDecodeError", "codec", "Error"):
        assert name not in text, text
