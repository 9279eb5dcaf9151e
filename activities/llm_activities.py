"""LLM activities: thin adapters from activity inputs to the one LLM gateway."""

from __future__ import annotations

from temporalio import activity

from activities.errors import call_model
from refloop.llm import LLMGateway
from refloop.models import (
    ActInput,
    ActivityName,
    ActResult,
    ClassifyIntentInput,
    ClassifyIntentResult,
    IntentResult,
    MakePlanInput,
    MakePlanResult,
    Plan,
    Purpose,
    SummarizeInput,
    SummarizeResult,
)
from refloop.prompts import intent_messages, plan_messages, summary_messages
from refloop.task_rules import constraints_for, infer_task_type, keyword_type, load_task_rules
from refloop.tools import tool_specs


class LLMActivities:
    def __init__(self, gateway: LLMGateway) -> None:
        self.gateway = gateway

    @activity.defn(name=ActivityName.CLASSIFY_INTENT)
    async def classify_intent(self, inp: ClassifyIntentInput) -> ClassifyIntentResult:
        out = await call_model(
            self.gateway.structured(
                Purpose.intent, intent_messages(inp.task), IntentResult, model=inp.model
            )
        )
        return ClassifyIntentResult(intent=out.value, usage=out.usage)

    @activity.defn(name=ActivityName.MAKE_PLAN)
    async def make_plan(self, inp: MakePlanInput) -> MakePlanResult:
        rules = load_task_rules(self.gateway.settings.refloop_task_rules)
        guidance = constraints_for(keyword_type(inp.task, rules), rules)
        messages = plan_messages(inp.task, tool_specs(inp.tool_names), inp.feedback, guidance)
        out = await call_model(
            self.gateway.structured(Purpose.plan, messages, Plan, model=inp.model)
        )
        task_type = infer_task_type(inp.task, out.value.task_type.value, rules)
        return MakePlanResult(plan=out.value, usage=out.usage,
                              constraints=constraints_for(task_type, rules))

    @activity.defn(name=ActivityName.ACT)
    async def act(self, inp: ActInput) -> ActResult:
        out = await call_model(
            self.gateway.chat(
                Purpose.act,
                inp.messages,
                model=inp.model,
                tools=tool_specs(inp.tool_names),
                parallel_tool_calls=inp.parallel_tool_calls,
            )
        )
        return ActResult(
            content=out.content,
            tool_calls=out.tool_calls,
            finish_reason=out.finish_reason,
            abnormal=out.abnormal,
            usage=out.usage,
        )

    @activity.defn(name=ActivityName.SUMMARIZE)
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        out = await call_model(
            self.gateway.chat(
                Purpose.summary, summary_messages(inp.task, inp.transcript), model=inp.model
            )
        )
        return SummarizeResult(summary=out.content or "", usage=out.usage)
