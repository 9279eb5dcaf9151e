"""SQLModel tables and the small repository the activities, API and CLI share.

Listing tasks comes from here, never from Temporal visibility: the embedded test
server has no ListWorkflowExecutions.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import JSON, BigInteger, Boolean, Column, Integer, Text, event, inspect
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, create_engine, select

from refloop.contract.activity_io import RecordQualityReviewInput
from refloop.contract.task import RecordTaskInput
from refloop.store.safety import json_without_nul, without_nul_bytes

# `lost`: the row's workflow no longer exists in Temporal (api/reconcile.py).
TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled", "lost"})


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; PostgreSQL aware ones."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class TaskRecord(SQLModel, table=True):
    """One row per workflow run."""

    __tablename__ = "tasks"

    task_id: str = Field(primary_key=True)
    workflow_id: str = Field(index=True)
    kind: str = "agent"
    session_id: str | None = Field(default=None, index=True)
    status: str = Field(default="running", index=True)
    input: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    usage: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    error: str | None = None
    # What the task waits for now, by kind (RecordTaskInput.waiting)
    waiting: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    duration_s: float | None = None


class QualityReviewRecord(SQLModel, table=True):
    """The `quality_reviews` table: one row per review of one edit."""

    __tablename__ = "quality_reviews"

    id: int | None = Field(default=None, primary_key=True)
    # Idempotency key of the writing activity: a retried write never duplicates a row.
    review_key: str = Field(unique=True)
    session_id: str | None = Field(default=None, index=True)
    task_id: str = Field(index=True)
    file_path: str
    passed: bool = Field(sa_column=Column("pass", Boolean, nullable=False))
    outcome: str = "failed"
    reasons: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    suggestions: str = ""
    summary: str = ""
    created_at: datetime = Field(default_factory=utcnow)


class PromptRecord(SQLModel, table=True):
    """System prompts with their quality-review settings."""

    __tablename__ = "prompts"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    system_prompt: str
    enable_quality_review: bool = False
    quality_review_rules: str | None = None
    # The spend limit of the tasks of a session started with it (added later: nullable;
    # None: none), unless the session or the task names its own
    max_cost_usd: float | None = None
    max_tokens: int | None = Field(default=None, sa_column=Column(BigInteger))
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class ModelConfigRecord(SQLModel, table=True):
    """A named model choice. Keys are never stored: only the env var that holds one."""

    __tablename__ = "model_configs"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    # Its model's price, {"input_usd_per_mtok", "output_usd_per_mtok"} (added later:
    # nullable; None: REFLOOP_MODEL_PRICES)
    price: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # Its model's context window in tokens (added later: nullable; None: the operator's
    # REFLOOP_MODEL_CONTEXT_TOKENS, else the endpoint's word)
    context_tokens: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class SessionRecord(SQLModel, table=True):
    """An interactive session: the settings its tasks inherit."""

    __tablename__ = "sessions"

    session_id: str = Field(primary_key=True)
    workspace: str
    prompt_id: int | None = None
    system_prompt: str | None = None
    enable_quality_review: bool = False
    quality_review_rules: str | None = None
    model: str | None = None
    model_config_id: int | None = None
    approval_mode: str = "auto"
    created_at: datetime = Field(default_factory=utcnow)
    # MCP servers its tasks use unless a task names its own (added later: nullable)
    mcp_servers: list[str] | None = Field(default=None, sa_column=Column(JSON))
    # The worker host holding its workspace (added later: nullable; None: one host)
    host: str | None = None
    # How long its tasks' calls wait for a decision (added later: nullable; None: the
    # operator's REFLOOP_APPROVAL_TIMEOUT_S)
    approval_timeout_s: float | None = None
    # The spend limit its tasks start with (added later: nullable; None: no limit)
    max_cost_usd: float | None = None
    max_tokens: int | None = Field(default=None, sa_column=Column(BigInteger))


class CodeReviewContentRecord(SQLModel, table=True):
    """The code review's content record: content, then review, then verification."""

    __tablename__ = "code_review_contents"

    task_id: str = Field(primary_key=True)
    review_type: str
    content: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    review_result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    verification_result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class BlobRecord(SQLModel, table=True):
    """Content-addressed large strings referenced from workflow histories."""

    __tablename__ = "blobs"

    key: str = Field(primary_key=True)  # sha256 of the text
    text: str = Field(sa_column=Column(Text, nullable=False))
    size: int
    created_at: datetime = Field(default_factory=utcnow)


class TaskCheckpointRecord(SQLModel, table=True):
    """A workspace checkpoint a task took, after which call: what a rewind, a fork or a
    move looks up (a task's events are trimmed; this list is not)."""

    __tablename__ = "task_checkpoints"

    task_id: str = Field(primary_key=True)
    call_id: str = Field(primary_key=True)  # the call after which it was taken
    checkpoint_id: str = Field(index=True)
    host: str | None = None
    files: int = 0
    new_bytes: int = 0
    created_at: datetime = Field(default_factory=utcnow)


T = TypeVar("T", bound=SQLModel)


class BlobCache:
    """Blobs are immutable (keyed by their hash), so a worker keeps the recent ones: the
    conversation an `act` stored is the one the next `act` reads. Bounded by characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self.entries: OrderedDict[str, str] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self.lock:
            text = self.entries.get(key)
            if text is not None:
                self.entries.move_to_end(key)
            return text

    def put(self, key: str, text: str) -> None:
        if len(text) > self.max_chars // 4:
            return  # one huge blob would evict everything else
        with self.lock:
            if key not in self.entries:
                self.entries[key] = text
                self.chars += len(text)
            self.entries.move_to_end(key)
            while self.chars > self.max_chars:
                _, evicted = self.entries.popitem(last=False)
                self.chars -= len(evicted)


BLOB_CACHE_CHARS = 32_000_000


class BlobNotCached(KeyError):
    """The blob is not in this worker's cache: reading it needs the database."""


def sqlite_engine(url: str) -> Engine:
    """The embedded database: WAL lets readers (the API) run beside the worker's writes,
    and synchronous=NORMAL commits without an fsync each (WAL stays crash-consistent)."""
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def tune(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def _dialect_insert(sqlite: bool) -> Any:
    """The dialect's INSERT (it has ON CONFLICT); only the one in use is imported."""
    if sqlite:
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    return insert


# The advisory lock every process takes to create or extend the schema (any fixed number).
SCHEMA_LOCK = 0x7265666C6F6F70  # "refloop"


def create_schema(engine: Engine, tables: list[Any] | None = None) -> None:
    """Create missing tables (all, or `tables`) and add missing nullable columns, in one
    transaction that holds the schema lock on PostgreSQL: workers and the API starting
    together on an empty database would otherwise race between "does it exist" and
    "create it" (a UniqueViolation on pg_type). DDL is transactional there, so the second
    process finds the first one's tables."""
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(sql_text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": SCHEMA_LOCK})
        SQLModel.metadata.create_all(connection, tables=tables)
        add_missing_columns(connection, tables)


def add_missing_columns(connection: Connection, tables: list[Any] | None = None) -> None:
    """Nullable columns added to a model after its table was created: added to the table
    (create_all creates missing tables only); an integer column the model now keeps as a
    big integer is widened (SQLite's integers are 64-bit whatever they are declared)."""
    inspector = inspect(connection)
    for table in tables or SQLModel.metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        present = {column["name"]: column for column in inspector.get_columns(table.name)}
        for column in table.columns:
            kind = column.type.compile(dialect=connection.dialect)
            found = present.get(column.name)
            if found is None and column.nullable:
                connection.execute(sql_text(
                    f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}'))
            elif (found is not None and connection.dialect.name == "postgresql"
                  and isinstance(column.type, BigInteger)
                  and not isinstance(found["type"], BigInteger)
                  and isinstance(found["type"], Integer)):
                connection.execute(sql_text(
                    f'ALTER TABLE "{table.name}" ALTER COLUMN "{column.name}" TYPE {kind}'))


class Store:
    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite")
        # A server database can restart under us (pre-ping); a file cannot.
        self.engine: Engine = (sqlite_engine(url) if self.sqlite
                               else create_engine(url, pool_pre_ping=True,
                                                  json_serializer=json_without_nul))
        without_nul_bytes(self.engine)  # a model's answer may hold one (refloop/store/safety.py)
        self._initialised = False
        self._init_lock = threading.Lock()
        self.blobs = BlobCache(BLOB_CACHE_CHARS)

    def init(self) -> None:
        # Once per process (create_schema serialises the processes).
        if self._initialised:
            return
        with self._init_lock:
            if not self._initialised:
                create_schema(self.engine)
                self._initialised = True

    def record_task(self, rec: RecordTaskInput) -> TaskRecord:
        """Insert or update a task row; safe to repeat (activity retries)."""
        self.init()
        now = utcnow()
        with Session(self.engine) as session:
            row = session.get(TaskRecord, rec.task_id)
            if row is None:
                row = TaskRecord(task_id=rec.task_id, workflow_id=rec.workflow_id, created_at=now)
            row.workflow_id = rec.workflow_id
            row.kind = rec.kind
            row.session_id = rec.session_id or row.session_id
            row.status = rec.status
            row.waiting = rec.waiting or None
            for name in ("input", "result", "usage", "error"):
                value = getattr(rec, name)
                if value is not None:
                    setattr(row, name, value)
            row.updated_at = now
            if rec.status in TERMINAL_STATUSES and row.finished_at is None:
                row.finished_at = now
                row.duration_s = (now - as_utc(row.created_at)).total_seconds()
            session.add(row)
            session.commit()
            session.refresh(row)
            return row

    def claim_task(self, rec: RecordTaskInput) -> bool:
        """Insert a new row; False when the ID is taken (by a task of any kind)."""
        self.init()
        row = TaskRecord(task_id=rec.task_id, workflow_id=rec.workflow_id, kind=rec.kind,
                         session_id=rec.session_id, status=rec.status, input=rec.input)
        with Session(self.engine) as session:
            session.add(row)
            try:
                session.commit()
            except IntegrityError:
                return False
        return True

    def get_task(self, task_id: str) -> TaskRecord | None:
        self.init()
        with Session(self.engine) as session:
            return session.get(TaskRecord, task_id)

    def forks_of(self, task_id: str, limit: int = 100) -> list[TaskRecord]:
        """The tasks forked from `task_id` (their input's `fork`), oldest first."""
        self.init()
        origin = TaskRecord.__table__.c.input["fork"]["task_id"].as_string()
        query = select(TaskRecord).where(origin == task_id) \
            .order_by(TaskRecord.created_at).limit(limit)  # type: ignore[arg-type]
        with Session(self.engine) as session:
            return list(session.exec(query))

    def list_tasks(
        self, session_id: str | None = None, status: str | None = None, limit: int = 100,
        kind: str | None = None, open_only: bool = False,
    ) -> list[TaskRecord]:
        """Newest first; `open_only`: the rows not in a terminal status."""
        self.init()
        query = select(TaskRecord).order_by(TaskRecord.created_at.desc()).limit(limit)
        if session_id:
            query = query.where(TaskRecord.session_id == session_id)
        if status:
            query = query.where(TaskRecord.status == status)
        if kind:
            query = query.where(TaskRecord.kind == kind)
        if open_only:
            query = query.where(col(TaskRecord.status).not_in(sorted(TERMINAL_STATUSES)))
        with Session(self.engine) as session:
            return list(session.exec(query))


    def waiting_for_model(self, endpoint: str) -> list[str]:
        """The workflow ids of the open tasks whose rows say they wait for `endpoint` (as
        messages name it), whatever else they wait for too."""
        self.init()
        query = select(TaskRecord.workflow_id, TaskRecord.waiting).where(
            col(TaskRecord.status).not_in(sorted(TERMINAL_STATUSES)),
            col(TaskRecord.waiting).is_not(None))
        with Session(self.engine) as session:
            rows = session.exec(query).all()
        return [workflow_id for workflow_id, waiting in rows
                if isinstance(waiting, dict) and isinstance(waiting.get("model"), dict)
                and (waiting["model"].get("detail") or {}).get("endpoint") == endpoint]

    def record_quality_review(self, rec: RecordQualityReviewInput) -> None:
        """Insert once per review key; a retried activity finds its row and does nothing."""
        review_key = rec.review_key
        self.init()
        with Session(self.engine) as session:
            exists = session.exec(
                select(QualityReviewRecord.id).where(QualityReviewRecord.review_key == review_key)
            ).first()
            if exists is not None:
                return
            review = rec.review
            session.add(
                QualityReviewRecord(
                    review_key=review_key,
                    session_id=rec.session_id,
                    task_id=rec.task_id,
                    file_path=review.file_path,
                    passed=review.passed,
                    outcome=review.outcome,
                    reasons=review.reasons,
                    suggestions=review.suggestions,
                    summary=review.summary,
                )
            )
            session.commit()

    def list_quality_reviews(
        self, session_id: str | None = None, task_id: str | None = None
    ) -> list[QualityReviewRecord]:
        self.init()
        query = select(QualityReviewRecord).order_by(QualityReviewRecord.id)
        if session_id:
            query = query.where(QualityReviewRecord.session_id == session_id)
        if task_id:
            query = query.where(QualityReviewRecord.task_id == task_id)
        with Session(self.engine) as session:
            return list(session.exec(query))


    # ------------------------------------------------------------ generic rows (API CRUD)

    def add(self, row: T) -> T:
        self.init()
        with Session(self.engine) as session:
            session.add(row)
            session.commit()
            session.refresh(row)
            return row

    def get(self, model: type[T], key: Any) -> T | None:
        self.init()
        with Session(self.engine) as session:
            return session.get(model, key)

    def update(self, model: type[T], key: Any, fields: dict[str, Any]) -> T | None:
        self.init()
        with Session(self.engine) as session:
            row = session.get(model, key)
            if row is None:
                return None
            for name, value in fields.items():
                setattr(row, name, value)
            if hasattr(row, "updated_at"):
                row.updated_at = utcnow()
            session.add(row)
            session.commit()
            session.refresh(row)
            return row

    def delete(self, model: type[T], key: Any) -> bool:
        self.init()
        with Session(self.engine) as session:
            row = session.get(model, key)
            if row is None:
                return False
            session.delete(row)
            session.commit()
            return True

    def all(self, model: type[T], limit: int = 500) -> list[T]:
        self.init()
        with Session(self.engine) as session:
            return list(session.exec(select(model).limit(limit)))

    def put_blob(self, text: str) -> str:
        """Store once per content; the key is the text's sha256."""
        from refloop.store.blobs import digest

        key = digest(text)
        if self.blobs.get(key) is not None:
            return key  # stored (or read back) by this process already
        self.init()
        # One statement: a blob another worker stored first is left as it is.
        insert = _dialect_insert(self.sqlite)
        statement = insert(BlobRecord).values(
            key=key, text=text, size=len(text), created_at=utcnow()
        ).on_conflict_do_nothing(index_elements=["key"])
        with self.engine.begin() as connection:
            connection.execute(statement)
        self.blobs.put(key, text)
        return key

    def cached_blob(self, key: str) -> str:
        """A blob from this worker's cache only: no I/O, so callable on the event loop."""
        text = self.blobs.get(key)
        if text is None:
            raise BlobNotCached(key)
        return text

    def get_blob(self, key: str) -> str:
        cached = self.blobs.get(key)
        if cached is not None:
            return cached
        self.init()
        with Session(self.engine) as session:
            row = session.get(BlobRecord, key)
        if row is None:
            raise KeyError(f"blob {key} is not in the store")
        self.blobs.put(key, row.text)
        return row.text

    def record_checkpoint(self, row: TaskCheckpointRecord) -> None:
        """Once per (task, call): a retried activity leaves the first row as it is."""
        self.init()
        insert = _dialect_insert(self.sqlite)
        statement = insert(TaskCheckpointRecord).values(
            **row.model_dump()).on_conflict_do_nothing(index_elements=["task_id", "call_id"])
        with self.engine.begin() as connection:
            connection.execute(statement)

    def checkpoints_of(self, task_id: str) -> list[TaskCheckpointRecord]:
        """A task's checkpoints, oldest first."""
        self.init()
        with Session(self.engine) as session:
            return list(session.exec(
                select(TaskCheckpointRecord).where(TaskCheckpointRecord.task_id == task_id)
                .order_by(TaskCheckpointRecord.created_at)))  # type: ignore[arg-type]

    def count_by_status(self) -> dict[str, tuple[int, float | None]]:
        """status -> (tasks, seconds since the oldest of them last changed): for metrics
        (a wait writes its row when it begins, so that is how long it has waited)."""
        self.init()
        now = utcnow()
        query = sql_text("SELECT status, COUNT(*), MIN(updated_at) FROM tasks GROUP BY status")
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        counts: dict[str, tuple[int, float | None]] = {}
        for status, number, oldest in rows:
            if isinstance(oldest, str):  # SQLite hands the timestamp back as text
                oldest = datetime.fromisoformat(oldest)
            counts[status] = (int(number), (now - as_utc(oldest)).total_seconds()
                              if oldest is not None else None)
        return counts

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")


@functools.cache
def store_for(url: str) -> Store:
    """One engine per URL per process."""
    return Store(url)
