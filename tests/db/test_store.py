"""The tasks table on real PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import OperationalError

from refloop.contract.task import RecordTaskInput
from refloop.store.db import Store, store_for
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


def test_quality_review_rows_are_written_once_per_key(store: Store):
    from refloop.contract.activity_io import QualityReview, RecordQualityReviewInput

    task_id = uuid.uuid4().hex
    review = QualityReview(file_path="r.md", passed=False, outcome="failed",
                           reasons=["no summary"], suggestions="add one", summary="bad")
    rec = RecordQualityReviewInput(task_id=task_id, review_key=f"{task_id}:0",
                                   session_id="s", review=review)
    store.record_quality_review(rec)
    store.record_quality_review(rec)  # an activity retry after a lost ack
    rows = store.list_quality_reviews(task_id=task_id)
    assert len(rows) == 1
    row = rows[0]
    assert (row.file_path, row.passed, row.reasons, row.suggestions, row.summary) == (
        "r.md", False, ["no summary"], "add one", "bad")
    assert row.created_at is not None
    assert store.list_quality_reviews(session_id="s", task_id=task_id) == rows


def test_seed_000_columns_exist_in_postgresql(store: Store):
    from sqlalchemy import inspect

    store.init()
    inspector = inspect(store.engine)
    reviews = {c["name"] for c in inspector.get_columns("quality_reviews")}
    assert {"id", "session_id", "task_id", "file_path", "pass", "reasons", "suggestions",
            "summary", "created_at"} <= reviews
    prompts = {c["name"] for c in inspector.get_columns("prompts")}
    assert {"enable_quality_review", "quality_review_rules"} <= prompts


def test_blobs_are_durable_and_cached(store: Store):
    text = f"conversation {uuid.uuid4().hex} " * 50
    key = store.put_blob(text)
    assert store.blobs.get(key) == text  # the next act reads it without a query
    # Another worker process (a fresh Store, empty cache) reads it from the database.
    assert Store(TEST_DATABASE_URL).get_blob(key) == text
    with pytest.raises(KeyError):
        Store(TEST_DATABASE_URL).get_blob("0" * 64)


def same_blob_from_two_workers(url: str) -> int:
    """Two stores with empty caches (two worker processes) store one text: one row."""
    from sqlalchemy import func, select

    from refloop.store.db import BlobRecord

    text = f"tool output {uuid.uuid4().hex} " * 40
    first, second = Store(url), Store(url)
    assert first.put_blob(text) == second.put_blob(text)
    with first.engine.connect() as connection:
        return connection.execute(
            select(func.count()).select_from(BlobRecord).where(BlobRecord.text == text)
        ).scalar_one()


def test_a_blob_stored_twice_is_one_row_on_postgresql():
    assert same_blob_from_two_workers(TEST_DATABASE_URL) == 1


def test_embedded_sqlite_store_uses_wal_and_dedups_blobs(tmp_path):
    url = f"sqlite:///{tmp_path / 'refloop.db'}"
    assert same_blob_from_two_workers(url) == 1
    with Store(url).engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_blob_cache_is_bounded_and_keeps_recent_entries():
    from refloop.store.db import BlobCache

    cache = BlobCache(max_chars=100)
    for n in range(10):
        cache.put(f"k{n}", "x" * 20)
    assert cache.chars <= 100 and cache.get("k0") is None and cache.get("k9") == "x" * 20
    cache.put("huge", "y" * 60)  # over a quarter of the budget: not cached
    assert cache.get("huge") is None


def test_first_writes_from_many_threads_create_the_schema_once(tmp_path):
    """A fresh embedded database hit by a busy worker's first writes all at once."""
    from concurrent.futures import ThreadPoolExecutor

    store = Store(f"sqlite:///{tmp_path / 'fresh.db'}")
    texts = [f"blob {n}" * 10 for n in range(16)]
    with ThreadPoolExecutor(16) as pool:
        keys = list(pool.map(store.put_blob, texts))
    assert [Store(f"sqlite:///{tmp_path / 'fresh.db'}").get_blob(k) for k in keys] == texts
