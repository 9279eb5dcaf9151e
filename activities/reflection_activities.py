"""Completeness-reflection activities: the completeness judge and the supplement planner."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.activities.mcp_activities import mcp_specs
from refloop.activities.model_calls import call_model, model_ledger
from refloop.activities.store_activities import kept_records
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    ClaimedFilesInput,
    ClaimedFilesResult,
    CompletenessInput,
    CompletenessResult,
    CompletenessVerdict,
    HistoryItem,
    MakePlanResult,
    SupplementPlanInput,
    ToolRecord,
)
from refloop.contract.errors import InvalidModelOutput, ToolError
from refloop.contract.messages import ChatMessage, Plan, Purpose
from refloop.contract.tool_catalog import tool_specs
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import completeness_messages, supplement_plan_messages
from refloop.store.db import Store
from refloop.tools.sandbox import is_file, resolve, workspace_root

NO_SUPPLEMENTS_REASK = (
    "You judged the task incomplete but suggested no supplements. Either name the missing "
    "operations as supplements (at most {n}) or judge the task complete."
)


def missing_claimed_files(workspace: str, claimed_files: list[str]) -> list[str]:
    """The decisive findings, no model needed: a file the model claims to have written but
    that does not exist (reads the workspace: on the task's host)."""
    root = workspace_root(workspace)
    decisive = []
    for name in claimed_files:
        try:
            exists = is_file(resolve(root, name))
        except ToolError:
            exists = False
        if not exists:
            decisive.append(f"the answer claims {name} was written, but it does not exist")
    return decisive


class ReflectionActivities:
    def __init__(self, gateway: LLMGateway, store: Store | None = None) -> None:
        self.gateway = gateway
        self.store = store

    @implements(activity_calls.CHECK_COMPLETENESS)
    async def check_completeness(self, inp: CompletenessInput) -> CompletenessResult:
        """Read and judge in one activity (runs recorded before the split)."""
        decisive = await asyncio.to_thread(missing_claimed_files, inp.workspace,
                                           inp.claimed_files)
        return await self.judge_completeness(inp.model_copy(update={"decisive": decisive}))

    @implements(activity_calls.CHECK_CLAIMED_FILES)
    async def check_claimed_files(self, inp: ClaimedFilesInput) -> ClaimedFilesResult:
        return ClaimedFilesResult(missing=await asyncio.to_thread(
            missing_claimed_files, inp.workspace, inp.claimed_files))

    async def _kept_records(self, refs: list[str]) -> list[ToolRecord]:
        """Earlier calls' records, which a long task keeps in the blob store."""
        if not refs:
            return []
        if self.store is None:
            raise ApplicationError("kept tool records need the store", non_retryable=True)
        return await asyncio.to_thread(kept_records, refs, self.store.get_blob)

    @implements(activity_calls.JUDGE_COMPLETENESS)
    async def judge_completeness(self, inp: CompletenessInput) -> CompletenessResult:
        """The judge, given the missing files (decisive) found on the task's host. An
        unmarked plan step is only advisory: the work may be done without the marker."""
        decisive = inp.decisive or []
        evidence = decisive + [f"plan {step} was not marked complete"
                               for step in inp.missing_steps]
        settings = self.gateway.settings
        records: list[ToolRecord | HistoryItem] = [
            *await self._kept_records(inp.history_refs), *inp.history]
        history = [f"{r.tool} {r.arguments} -> {r.outcome}" for r in records]
        messages = completeness_messages(inp.task, history, inp.tool_names, evidence,
                                         inp.final_answer, inp.max_supplements)
        options: dict[str, Any] = {
            "model": settings.reflection_model(inp.model),
            "max_reasks": settings.fc_reflection_max_retries,
            "temperature": settings.fc_reflection_temperature,
            "top_p": settings.fc_reflection_top_p,
            "endpoint": inp.endpoint,
        }
        async with model_ledger() as ledger:
            try:
                out = await self.gateway.structured(
                    Purpose.completeness, messages, CompletenessVerdict, **options)
                usage = out.usage
                if not out.value.is_complete and not out.value.supplements:
                    reask = [*messages,
                             ChatMessage(role="assistant", content=out.value.model_dump_json()),
                             ChatMessage(role="user", content=NO_SUPPLEMENTS_REASK.format(
                                 n=inp.max_supplements))]
                    out = await self.gateway.structured(
                        Purpose.completeness, reask, CompletenessVerdict, **options)
                    usage = usage.model_copy(
                        update={"usage": usage.usage.add(out.usage.usage)})
            except InvalidModelOutput as err:
                # Fail open: an unreadable judge must not hold a finished task hostage.
                activity.logger.warning("completeness judge unparseable: %s", err)
                verdict = CompletenessVerdict(is_complete=True,
                                              analysis=f"judge unparseable: {err}")
                return CompletenessResult(verdict=verdict, evidence=evidence,
                                          decisive=decisive, fail_open=True,
                                          usage=ledger.record())
        return CompletenessResult(verdict=out.value, evidence=evidence, decisive=decisive,
                                  usage=ledger.record(usage) or usage)

    @implements(activity_calls.PLAN_SUPPLEMENT)
    async def plan_supplement(self, inp: SupplementPlanInput) -> MakePlanResult:
        mcp = await mcp_specs(inp.mcp_tools_ref, self.store.get_blob) if self.store else []
        messages = supplement_plan_messages(inp.objective, [*tool_specs(inp.tool_names), *mcp],
                                            inp.completed_steps)
        out = await call_model(self.gateway.structured(
            Purpose.supplement_plan, messages, Plan, model=inp.model, endpoint=inp.endpoint))
        return MakePlanResult(plan=out.value, usage=out.usage)
