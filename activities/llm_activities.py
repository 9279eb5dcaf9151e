"""LLM activities: thin adapters from activity inputs to the one LLM gateway."""

from __future__ import annotations

import asyncio

from pydantic import TypeAdapter

from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.activities.mcp_activities import mcp_specs
from refloop.activities.model_calls import call_model
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    ActInput,
    ActResult,
    ClassifyIntentInput,
    ClassifyIntentResult,
    MakePlanInput,
    MakePlanResult,
    SummarizeInput,
    SummarizeResult,
)
from refloop.contract.messages import ChatMessage, IntentResult, Plan, Purpose
from refloop.contract.policies import TOOL_RESULT_CHARS  # what the model reads of one output
from refloop.contract.tool_catalog import tool_specs
from refloop.llm.conversation import for_model, trim_history
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import intent_messages, plan_messages, summary_messages
from refloop.store.blobs import Get, holds_large_string, offload_args
from refloop.store.db import BlobNotCached, Store
from refloop.tools.task_rules import constraints_for, infer_task_type, keyword_type, load_task_rules

# A stored conversation: one JSON array, parsed and written in pydantic's core.
CONVERSATION = TypeAdapter(list[ChatMessage])


class LLMActivities:
    def __init__(self, gateway: LLMGateway, store: Store) -> None:
        self.gateway = gateway
        self.store = store

    @staticmethod
    def _conversation(inp: ActInput, get: Get) -> tuple[list[ChatMessage], list[ChatMessage]]:
        """(the trimmed conversation to store, what the model reads of it)."""
        earlier: list[ChatMessage] = []
        if inp.conversation_ref:
            earlier = CONVERSATION.validate_json(get(inp.conversation_ref))
        messages = trim_history([*earlier, *inp.messages], inp.max_history_messages)
        return messages, for_model(messages, get, TOOL_RESULT_CHARS)

    @implements(activity_calls.CLASSIFY_INTENT)
    async def classify_intent(self, inp: ClassifyIntentInput) -> ClassifyIntentResult:
        out = await call_model(
            self.gateway.structured(
                Purpose.intent, intent_messages(inp.task), IntentResult, model=inp.model,
                endpoint=inp.endpoint,
            )
        )
        return ClassifyIntentResult(intent=out.value, usage=out.usage)

    @implements(activity_calls.MAKE_PLAN)
    async def make_plan(self, inp: MakePlanInput) -> MakePlanResult:
        rules = load_task_rules(self.gateway.settings.refloop_task_rules)
        guidance = constraints_for(keyword_type(inp.task, rules), rules)
        tools = [*tool_specs(inp.tool_names),
                 *await mcp_specs(inp.mcp_tools_ref, self.store.get_blob)]
        messages = plan_messages(inp.task, tools, inp.feedback, guidance)
        out = await call_model(
            self.gateway.structured(Purpose.plan, messages, Plan, model=inp.model,
                                    endpoint=inp.endpoint)
        )
        task_type = infer_task_type(inp.task, out.value.task_type.value, rules)
        return MakePlanResult(plan=out.value, usage=out.usage,
                              constraints=constraints_for(task_type, rules))

    @implements(activity_calls.ACT)
    async def act(self, inp: ActInput) -> ActResult:
        # The previous act of this task ran here, so its blobs are usually cached: no
        # thread hop then. A miss (another worker, a restart) reads the database.
        try:
            stored, prompt = self._conversation(inp, self.store.cached_blob)
        except BlobNotCached:
            stored, prompt = await asyncio.to_thread(self._conversation, inp,
                                                     self.store.get_blob)
        # Stored before the model is asked: a database outage then fails the attempt
        # before it costs a model call, and the retry asks once.
        text = CONVERSATION.dump_json(stored).decode()
        async with heartbeating():  # a slow database is not a lost worker
            ref = await asyncio.to_thread(self.store.put_blob, text)
        out = await call_model(
            self.gateway.chat(
                Purpose.act,
                prompt,
                model=inp.model,
                endpoint=inp.endpoint,
                tools=[*tool_specs(inp.tool_names),
                       *await mcp_specs(inp.mcp_tools_ref, self.store.get_blob)],
                parallel_tool_calls=inp.parallel_tool_calls,
            )
        )
        threshold = self.gateway.settings.refloop_blob_threshold_bytes
        calls = out.tool_calls
        if holds_large_string([call.arguments for call in calls], threshold):
            # Beating: the answer is paid for; a retry would ask the model again.
            async with heartbeating():
                calls = await asyncio.to_thread(lambda: [
                    call.model_copy(update={"arguments": offload_args(
                        call.arguments, threshold, self.store.put_blob)})
                    for call in out.tool_calls])
        return ActResult(
            content=out.content,
            tool_calls=calls,
            conversation_ref=ref,
            finish_reason=out.finish_reason,
            abnormal=out.abnormal,
            usage=out.usage,
        )

    @implements(activity_calls.SUMMARIZE)
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        out = await call_model(
            self.gateway.chat(
                Purpose.summary, summary_messages(inp.task, inp.transcript), model=inp.model,
                endpoint=inp.endpoint,
            )
        )
        return SummarizeResult(summary=out.content or "", usage=out.usage)
