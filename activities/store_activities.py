"""Persistence activities: the DB written from the workflow, retried through outages."""

from __future__ import annotations

import asyncio

from temporalio import activity

from refloop.contract import activity_calls
from refloop.contract.activity_io import RecordQualityReviewInput
from refloop.contract.task import RecordTaskInput
from refloop.store.db import Store


class StoreActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=activity_calls.RECORD_TASK.name)
    async def record_task(self, rec: RecordTaskInput) -> None:
        # SQLAlchemy is synchronous; keep the worker's event loop free.
        await asyncio.to_thread(self.store.record_task, rec)

    @activity.defn(name=activity_calls.RECORD_QUALITY_REVIEW.name)
    async def record_quality_review(self, rec: RecordQualityReviewInput) -> None:
        # The workflow-assigned key makes a retried write a no-op.
        await asyncio.to_thread(self.store.record_quality_review, rec)
