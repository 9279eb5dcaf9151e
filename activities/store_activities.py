"""Persistence activities: the DB written from the workflow, retried through outages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.contract import activity_calls
from refloop.contract.activity_io import RecordQualityReviewInput
from refloop.contract.task import RecordTaskInput
from refloop.store.db import Store
from refloop.store.safety import short_db_error


class StoreActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=activity_calls.RECORD_TASK.name)
    async def record_task(self, rec: RecordTaskInput) -> None:
        # SQLAlchemy is synchronous; keep the worker's event loop free.
        with no_sql_in_failures():
            await asyncio.to_thread(self.store.record_task, rec)

    @activity.defn(name=activity_calls.RECORD_QUALITY_REVIEW.name)
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
