"""LLM activities: thin adapters from activity inputs to the one LLM gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from pydantic import TypeAdapter
from temporalio import activity
from temporalio.exceptions import ApplicationError

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
    ContextReport,
    MakePlanInput,
    MakePlanResult,
    SummarizeInput,
    SummarizeResult,
)
from refloop.contract.messages import ChatMessage, IntentResult, Plan, Purpose
from refloop.contract.policies import TOOL_RESULT_CHARS  # what the model reads of one output
from refloop.contract.tool_catalog import is_edit, tool_specs
from refloop.contract.window import CompactInput, CompactResult
from refloop.llm import fitting
from refloop.llm.conversation import for_model, trim_history
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import (
    compact_messages,
    intent_messages,
    plan_messages,
    summary_messages,
)
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

    def _tokens(self, messages: list[ChatMessage], budget: fitting.Budget) -> int:
        """Estimated tokens of a conversation as the model reads it."""
        return sum(budget.tokens(m) for m in for_model(messages, self.store.get_blob,
                                                       TOOL_RESULT_CHARS))

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
        tools = [*tool_specs(inp.tools()),
                 *await mcp_specs(inp.mcp_tools_ref, self.store.get_blob)]
        # Fitted to the model's window: old outputs masked, in what is stored too. Beating:
        # the first long prompt asks the endpoint its window (seconds, once a worker).
        async with heartbeating():
            budget = await self.gateway.budget_for(Purpose.act, prompt, model=inp.model,
                                                   endpoint=inp.endpoint, tools=tools)
        fit = fitting.fit_conversation(stored, prompt, budget)
        # Stored before the model is asked: a database outage then fails the attempt
        # before it costs a model call, and the retry asks once.
        text = CONVERSATION.dump_json(fit.stored).decode()
        async with heartbeating():  # a slow database is not a lost worker
            ref = await asyncio.to_thread(self.store.put_blob, text)
        out = await call_model(
            self.gateway.chat(
                Purpose.act,
                fit.rendered,
                model=inp.model,
                endpoint=inp.endpoint,
                tools=tools,
                parallel_tool_calls=inp.parallel_tool_calls,
                fitter=fitting.refit_conversation,
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
            context=ContextReport(
                window=budget.window, budget=budget.prompt_tokens,
                tokens_before=fit.tokens_before, tokens=fit.tokens_after, masked=fit.masked,
                windowed=fit.windowed, folded=fit.folded, compact_due=fit.compact_due),
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

    @implements(activity_calls.COMPACT)
    async def compact(self, inp: CompactInput) -> CompactResult:
        """The older turns folded into one summary the model writes (kept in the blob store
        with the assistant's own notes and the files written, verbatim), the recent turns
        kept whole. A model that cannot summarise (a refusal, invalid output) leaves a list
        of the calls made instead: compaction never fails a task."""
        stored = await asyncio.to_thread(
            lambda: CONVERSATION.validate_json(self.store.get_blob(inp.conversation_ref)))
        # The act's room, in this worker's ratio; turns measured as the model reads them
        async with heartbeating():
            budget = dataclasses.replace(
                await self.gateway.budget_for(Purpose.act, stored, model=inp.model,
                                              endpoint=inp.endpoint), prompt_tokens=inp.budget)
        read = await asyncio.to_thread(for_model, stored, self.store.get_blob,
                                       TOOL_RESULT_CHARS)
        plan = fitting.compact_plan(read, budget)
        before = sum(budget.tokens(m) for m in read)
        if plan is None:
            return CompactResult(conversation_ref=inp.conversation_ref, tokens_before=before,
                                 tokens_after=before)
        notes: list[str] = []
        files: list[str] = []
        if plan.previous_ref:  # what the earlier summary kept verbatim goes on being kept
            earlier = json.loads(await asyncio.to_thread(self.store.get_blob,
                                                         plan.previous_ref))
            notes, files = list(earlier["notes"]), list(earlier["files"])
        folded = stored[plan.start:plan.end]
        new_turns = folded[1:] if plan.previous_ref else folded
        rendered = await asyncio.to_thread(for_model, folded, self.store.get_blob, 1_500)
        transcript = fitting.transcript(
            rendered, int(budget.prompt_tokens * budget.chars_per_token * 0.6))
        summary, usage, by_model = "", None, True
        try:
            out = await call_model(self.gateway.chat(
                Purpose.compact, compact_messages(inp.task, transcript), model=inp.model,
                endpoint=inp.endpoint))
            summary, usage = (out.content or "").strip(), out.usage
        except ApplicationError as err:  # the gateway's errors, classified for Temporal
            if not err.non_retryable:
                raise  # an outage: waited out, as for any model call
            activity.logger.warning("compact: the model could not summarise (%s); the "
                                    "calls made are listed instead", err)
        if not summary:
            by_model = False
            summary = "Calls made: " + fitting.calls_made(new_turns)
        notes = [*notes, *fitting.assistant_notes(new_turns)]
        files = fitting.files_written(new_turns, is_edit, files)
        record = {"summary": summary, "notes": notes, "files": files,
                  "folded": len(new_turns), "previous": plan.previous_ref}
        summary_ref = await asyncio.to_thread(self.store.put_blob, json.dumps(record))
        message = fitting.summary_message(summary_ref, summary, notes, inp.progress, files)
        compacted = fitting.compacted_conversation(stored, plan, message)
        ref = await asyncio.to_thread(self.store.put_blob,
                                      CONVERSATION.dump_json(compacted).decode())
        after = await asyncio.to_thread(self._tokens, compacted, budget)
        return CompactResult(conversation_ref=ref, summary_ref=summary_ref,
                             folded=len(new_turns), tokens_before=before, tokens_after=after,
                             by_model=by_model, usage=usage)
