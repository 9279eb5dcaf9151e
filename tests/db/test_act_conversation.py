"""The act activity's stored conversation on real PostgreSQL, through the scripted model."""

from __future__ import annotations

import json

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from refloop.activities.llm_activities import LLMActivities
from refloop.contract.activity_io import ActInput
from refloop.contract.messages import ChatMessage
from refloop.contract.tool_catalog import tool_specs
from refloop.llm.gateway import LLMGateway
from refloop.settings import Settings
from refloop.store.db import Store
from refloop.workflows import logic
from tests.constants import TEST_DATABASE_URL
from tests.llm_fixtures import unique_scenario


def activities_of(scripted_llm, store: Store) -> LLMActivities:
    settings = Settings(openai_base_url=scripted_llm.base_url, openai_api_key="test",
                        database_url=TEST_DATABASE_URL)
    return LLMActivities(LLMGateway(settings), store)


def turn(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=role, content=text)


async def test_a_worker_with_a_cold_cache_continues_the_stored_conversation(scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"content": "first"}, {"content": "second"}]})
    first = await ActivityEnvironment().run(
        activities_of(scripted_llm, Store(TEST_DATABASE_URL)).act,
        ActInput(messages=[turn("system", "sys"), turn("user", "task")], model=model))
    assert first.content == "first"

    # Another worker process: its cache is empty, so the conversation comes from the DB.
    cold = Store(TEST_DATABASE_URL)
    second = await ActivityEnvironment().run(activities_of(scripted_llm, cold).act, ActInput(
        messages=[turn("assistant", "first"), turn("user", "go on")],
        conversation_ref=first.conversation_ref, model=model))
    sent = scripted_llm.requests(model=model)[1]["body"]["messages"]
    assert [m["content"] for m in sent] == ["sys", "task", "first", "go on"]
    stored = json.loads(Store(TEST_DATABASE_URL).get_blob(second.conversation_ref))
    assert [m["content"] for m in stored] == ["sys", "task", "first", "go on"]


async def test_a_failed_model_call_fails_the_act_and_leaves_the_conversation_intact(
        scripted_llm):
    # A failure no wait can fix (an outage is waited out inside the call instead)
    model = unique_scenario(scripted_llm, {"act": [{"status": 404}]})
    store = Store(TEST_DATABASE_URL)
    with pytest.raises(ApplicationError) as failure:
        await ActivityEnvironment().run(activities_of(scripted_llm, store).act, ActInput(
            messages=[turn("system", "sys"), turn("user", "retry me")], model=model))
    assert failure.value.non_retryable and scripted_llm.base_url in str(failure.value)
    # The conversation write finished (content-addressed: the retry stores the same key).
    assert any("retry me" in text for text in store.blobs.entries.values())


async def test_an_act_offers_every_tool_by_the_flag_and_only_the_named_ones_by_name(
        scripted_llm):
    model = unique_scenario(scripted_llm, {"act": [{"content": "a"}, {"content": "b"}]})
    activities = activities_of(scripted_llm, Store(TEST_DATABASE_URL))
    messages = [turn("system", "sys"), turn("user", "task")]
    everything, names = logic.act_tools([spec.name for spec in tool_specs()])
    assert (everything, names) == ([], True)  # the usual list travels as a flag
    await ActivityEnvironment().run(activities.act, ActInput(
        messages=messages, tool_names=everything, every_tool=names, model=model))
    subset, flag = logic.act_tools(["read_file", "complete_step"])
    assert (subset, flag) == (["read_file", "complete_step"], False)
    await ActivityEnvironment().run(activities.act, ActInput(
        messages=messages, tool_names=subset, every_tool=flag, model=model))
    offered = [[tool["function"]["name"] for tool in request["body"]["tools"]]
               for request in scripted_llm.requests(model=model)]
    assert offered == [[spec.name for spec in tool_specs()], ["read_file", "complete_step"]]
    assert logic.act_tools([]) == ([], False)  # a direct answer: no tools at all
