"""Persistence activities: the DB written from the workflow, retried through outages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from pydantic import TypeAdapter
from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    KeepRecordsInput,
    KeepRecordsResult,
    KeptRecords,
    RecordQualityReviewInput,
    ToolRecord,
)
from refloop.contract.task import RecordTaskInput
from refloop.store.db import Store
from refloop.store.safety import short_db_error

RECORDS = TypeAdapter(list[ToolRecord])
_LINK: TypeAdapter[list[ToolRecord] | KeptRecords] = TypeAdapter(list[ToolRecord] | KeptRecords)


def link_text(inp: KeepRecordsInput) -> str:
    """A link of the chain as stored: the bare records when none came before (the form
    earlier code stored), else the records with the links before them."""
    if not inp.earlier:
        return RECORDS.dump_json(inp.records).decode()
    return KeptRecords(earlier=inp.earlier, records=inp.records).model_dump_json()


def read_link(text: str) -> KeptRecords:
    value = _LINK.validate_json(text)
    return value if isinstance(value, KeptRecords) else KeptRecords(records=value)


def kept_records(refs: list[str], read: Callable[[str], str]) -> list[ToolRecord]:
    """Every record of the chains ending at `refs` (oldest first), each link read once with
    `read`; iterative, so a chain of any length fits the stack."""
    links: list[list[ToolRecord]] = []  # newest first
    pending, seen = list(refs), set()
    while pending:
        ref = pending.pop()
        if ref in seen:  # content-addressed: two equal links are one blob
            continue
        seen.add(ref)
        link = read_link(read(ref))
        links.append(link.records)
        pending.extend(link.earlier)
    return [record for records in reversed(links) for record in records]


class StoreActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(activity_calls.RECORD_TASK)
    async def record_task(self, rec: RecordTaskInput) -> None:
        # SQLAlchemy is synchronous; keep the worker's event loop free.
        with no_sql_in_failures():
            await asyncio.to_thread(self.store.record_task, rec)

    @implements(activity_calls.KEEP_RECORDS)
    async def keep_records(self, inp: KeepRecordsInput) -> KeepRecordsResult:
        # Content-addressed: a retried write stores the same blob under the same key.
        text = link_text(inp)
        with no_sql_in_failures():
            return KeepRecordsResult(ref=await asyncio.to_thread(self.store.put_blob, text))

    @implements(activity_calls.RECORD_QUALITY_REVIEW)
    async def record_quality_review(self, rec: RecordQualityReviewInput) -> None:
        # The workflow-assigned key makes a retried write a no-op.
        with no_sql_in_failures():
            await asyncio.to_thread(self.store.record_quality_review, rec)


@contextlib.contextmanager
def no_sql_in_failures() -> Iterator[None]:
    """A failed write fails the activity with the error's class only: its text holds the
    SQL and the task's content, and failures reach the task's `error` and the Web UI."""
    try:
        yield
    except SQLAlchemyError as err:
        activity.logger.warning("database write failed: %s", err)
        raise ApplicationError(short_db_error(err), type="StoreError") from None
