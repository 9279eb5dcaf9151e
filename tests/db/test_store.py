"""The tasks table on real PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import OperationalError

from refloop.models import RecordTaskInput
from refloop.store import Store, store_for
from tests.constants import TEST_DATABASE_URL


@pytest.fixture
def store() -> Store:
    return store_for(TEST_DATABASE_URL)


def record(task_id: str, status: str, **fields) -> RecordTaskInput:
    return RecordTaskInput(task_id=task_id, workflow_id=f"wf-{task_id}", status=status, **fields)


def test_record_task_upserts_and_finishes(store: Store):
    task_id = uuid.uuid4().hex
    store.record_task(record(task_id, "running", input={"task": "x"}, session_id="s1"))
    row = store.get_task(task_id)
    assert row.status == "running" and row.finished_at is None and row.input == {"task": "x"}

    store.record_task(record(task_id, "completed", result={"answer": "ok"}, usage={"calls": 3}))
    row = store.get_task(task_id)
    assert row.status == "completed"
    assert row.input == {"task": "x"}  # earlier fields survive later updates
    assert row.session_id == "s1"
    assert row.result == {"answer": "ok"} and row.usage == {"calls": 3}
    assert row.finished_at is not None and row.duration_s >= 0


def test_repeated_terminal_record_is_idempotent(store: Store):
    task_id = uuid.uuid4().hex
    store.record_task(record(task_id, "failed", error="boom"))
    first = store.get_task(task_id).finished_at
    store.record_task(record(task_id, "failed", error="boom"))  # an activity retry
    assert store.get_task(task_id).finished_at == first


def test_list_tasks_filters_by_session_and_status(store: Store):
    session = uuid.uuid4().hex
    ids = [uuid.uuid4().hex for _ in range(3)]
    store.record_task(record(ids[0], "running", session_id=session))
    store.record_task(record(ids[1], "completed", session_id=session))
    store.record_task(record(ids[2], "completed", session_id="other"))
    assert {r.task_id for r in store.list_tasks(session_id=session)} == set(ids[:2])
    done = store.list_tasks(session_id=session, status="completed")
    assert [r.task_id for r in done] == [ids[1]]


def test_unreachable_database_raises_a_clear_error():
    broken = Store("postgresql+psycopg://postgres@127.0.0.1:1/none")
    with pytest.raises(OperationalError):
        broken.record_task(record("x", "running"))
