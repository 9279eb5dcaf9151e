"""Activities of the code-review supervisor: content, Review, Verify, format."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.activities.model_calls import call_model
from refloop.contract import activity_calls
from refloop.contract.code_review import (
    AgentCallInput,
    AgentCallResult,
    FormatInput,
    FormatResult,
    LoadContentInput,
    RecordContentInput,
    ReviewContent,
    ReviewOutput,
    VerifyOutput,
)
from refloop.contract.errors import BadReviewInput, ToolError
from refloop.contract.messages import ChatMessage, Purpose
from refloop.llm.gateway import LLMGateway
from refloop.llm.prompts import CODE_REVIEW_SYSTEM, CODE_VERIFY_SYSTEM, code_agent_messages
from refloop.llm.wire import parse_json_answer
from refloop.review.content import by_reference, cap_content, split_diff
from refloop.store.db import CodeReviewContentRecord, Store
from refloop.tools.sandbox import read_text, relative, resolve, workspace_root


def load(inp: LoadContentInput) -> ReviewContent:
    request = inp.request
    if request.review_type == "diff":
        files, lines = split_diff(request.content or "")
        if not files:
            raise ValueError("the diff names no files (no '+++ b/<path>' lines)")
    elif request.review_type == "snippet":
        text = request.content or ""
        files = {"snippet": text}
        lines = {"snippet": list(range(1, text.count("\n") + 2))}
    else:
        root = workspace_root(request.working_directory)
        files, lines = {}, {}
        for raw in request.file_paths:
            path = resolve(root, raw)
            text = read_text(path, raw)
            name = relative(root, path)
            files[name] = text
            lines[name] = list(range(1, text.count("\n") + 2))
    return cap_content(files, lines, request.max_content_lines)


def mirror_file(mirror_dir: Path, task_id: str) -> Path:
    """The content record's JSON mirror. Its name is a digest of the task ID: no file name
    is ever built from a client-supplied ID (`../../x` stays inside the mirror dir)."""
    return mirror_dir / f"{hashlib.sha256(task_id.encode()).hexdigest()[:32]}_content.json"


def parse_agent(text: str | None, schema: type[BaseModel]) -> tuple[BaseModel | None, str | None]:
    """The agent's answer, or why it is not one (the supervisor retries on that)."""
    try:
        return parse_json_answer(text, schema), None
    except ValidationError as err:
        return None, str(err)[:500]
    except ValueError:
        return None, "no JSON object in the answer"


class CodeReviewActivities:
    def __init__(self, gateway: LLMGateway, store: Store, data_dir: Path) -> None:
        self.gateway = gateway
        self.store = store
        self.mirror_dir = data_dir / "review_content"

    @implements(activity_calls.LOAD_REVIEW_CONTENT)
    async def load_content(self, inp: LoadContentInput) -> ReviewContent:
        try:
            content = await asyncio.to_thread(load, inp)
        except (ToolError, ValueError) as err:
            raise ApplicationError(str(err), type=BadReviewInput.__name__,
                                   non_retryable=True) from err
        async with heartbeating():  # a large file's write to the shared store
            return await asyncio.to_thread(by_reference, content, self.store.put_blob)

    async def _files(self, content: ReviewContent) -> dict[str, str]:
        """The text under review: stored by the load (`files_ref`), or inline as results
        recorded before carried it."""
        if content.files_ref is None:
            return content.files
        async with heartbeating():
            stored = await asyncio.to_thread(self.store.get_blob, content.files_ref)
        files: dict[str, str] = json.loads(stored)
        return files

    async def _agent(self, purpose: Purpose, system: str, inp: AgentCallInput,
                     schema: type[BaseModel]) -> AgentCallResult:
        review = inp.review.model_dump(mode="json") if inp.review else None
        files = await self._files(inp.content)
        messages = code_agent_messages(system, inp.task_json, files, review)
        out = await call_model(self.gateway.chat(
            purpose, messages, model=self.gateway.settings.review_model(inp.model),
            response_format={"type": "json_object"}))
        parsed, invalid = parse_agent(out.content, schema)
        info = activity.info()
        key = "review" if schema is ReviewOutput else "verify"
        output: dict[str, Any] = {key: parsed}  # the schema's field: `review` or `verify`
        return AgentCallResult(**output, invalid=invalid, activity_id=info.activity_id,
                               attempt=info.attempt, usage=out.usage)

    @implements(activity_calls.REVIEW_AGENT)
    async def review(self, inp: AgentCallInput) -> AgentCallResult:
        return await self._agent(Purpose.code_review, CODE_REVIEW_SYSTEM, inp, ReviewOutput)

    @implements(activity_calls.VERIFY_AGENT)
    async def verify(self, inp: AgentCallInput) -> AgentCallResult:
        return await self._agent(Purpose.code_verify, CODE_VERIFY_SYSTEM, inp, VerifyOutput)

    @implements(activity_calls.FORMAT_REVIEW)
    async def format_output(self, inp: FormatInput) -> FormatResult:
        out = await call_model(self.gateway.chat(
            Purpose.summary, format_messages(inp),
            model=self.gateway.settings.review_model(inp.model)))
        return FormatResult(text=out.content or "", usage=out.usage)

    @implements(activity_calls.RECORD_REVIEW_CONTENT)
    async def record_content(self, inp: RecordContentInput) -> None:
        await asyncio.to_thread(self._record, inp)

    def _record(self, inp: RecordContentInput) -> None:
        """DB row and `{data_dir}/review_content/<digest of task_id>_content.json`, growing
        per stage (the document inside carries the task ID)."""
        row = self.store.get(CodeReviewContentRecord, inp.task_id)
        if row is None:
            row = self.store.add(CodeReviewContentRecord(task_id=inp.task_id,
                                                         review_type=inp.review_type))
        field = {"content": "content", "review": "review_result",
                 "verification": "verification_result"}[inp.stage]
        payload = {**inp.payload, "completed_at": datetime.now(UTC).isoformat()}
        ref = payload.pop("files_ref", None)
        if ref is not None:  # the row keeps the text itself, as it always did
            payload["files"] = json.loads(self.store.get_blob(ref))
        row = self.store.update(CodeReviewContentRecord, inp.task_id, {field: payload})
        assert row is not None  # added above if it was missing
        self.mirror_dir.mkdir(parents=True, exist_ok=True)
        document = {"task_id": row.task_id, "review_type": row.review_type,
                    "created_at": row.created_at.isoformat(), "content": row.content}
        for key in ("review_result", "verification_result"):
            if getattr(row, key) is not None:
                document[key] = getattr(row, key)
        target = mirror_file(self.mirror_dir, inp.task_id)
        target.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")


def format_messages(inp: FormatInput) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="Rewrite the code-review report exactly as the user "
                    "asks. Keep every finding, with its id, file and line."),
        ChatMessage(role="user", content=f"Format instruction: {inp.instruction}\n\nReport:\n"
                    + json.dumps(inp.report, ensure_ascii=False)),
    ]
