"""Where checkpoint content lives: immutable objects keyed by their sha256, readable by
every host.

`ObjectStore` is the whole interface: what is missing, put, get. The database's table
(`checkpoint_objects`) is the default, shared like the rest of the store; a directory
store serves one machine (and the tests); `refloop.checkpoints.s3` keeps them in an
S3-compatible bucket (HEAD, PUT, GET under a key prefix), chosen by
REFLOOP_CHECKPOINT_STORE (`refloop.checkpoints.stores`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from sqlalchemy import Column, LargeBinary
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, select

# Rows read or written per statement: bounded memory and bounded statement size.
BATCH_KEYS = 500


def content_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ObjectStore(Protocol):
    def missing(self, keys: Iterable[str]) -> set[str]: ...

    # The last object is stored after all the others: a checkpoint's root tree comes
    # last, so a stored root always has everything it names.
    def put_many(self, objects: dict[str, bytes]) -> None: ...

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]: ...


class CheckpointObjectRecord(SQLModel, table=True):
    """One stored content (a file's bytes or a manifest), once whatever holds it."""

    __tablename__ = "checkpoint_objects"

    key: str = Field(primary_key=True)  # sha256 of data
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    size: int
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def _batches(keys: Iterable[str]) -> Iterable[list[str]]:
    batch: list[str] = []
    for key in keys:
        batch.append(key)
        if len(batch) == BATCH_KEYS:
            yield batch
            batch = []
    if batch:
        yield batch


class DatabaseObjectStore:
    """The objects in the shared database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._ready = False
        self._ready_lock = threading.Lock()

    def _ensure_table(self) -> None:
        """On first use, not at construction: a worker starts while its database is down."""
        if self._ready:
            return
        with self._ready_lock:
            if not self._ready:
                CheckpointObjectRecord.metadata.create_all(
                    self.engine, tables=[CheckpointObjectRecord.__table__])  # type: ignore[list-item]
                self._ready = True

    def missing(self, keys: Iterable[str]) -> set[str]:
        self._ensure_table()
        wanted = set(keys)
        found: set[str] = set()
        column = CheckpointObjectRecord.key  # type: ignore[assignment]
        with Session(self.engine) as session:
            for batch in _batches(sorted(wanted)):
                found.update(session.exec(select(column).where(column.in_(batch))))
        return wanted - found

    def put_many(self, objects: dict[str, bytes]) -> None:
        if not objects:
            return
        self._ensure_table()
        if self.sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        now = datetime.now(UTC)
        rows = [{"key": key, "data": data, "size": len(data), "created_at": now}
                for key, data in objects.items()]
        with self.engine.begin() as connection:
            for start in range(0, len(rows), BATCH_KEYS):
                statement = insert(CheckpointObjectRecord).values(
                    rows[start:start + BATCH_KEYS]).on_conflict_do_nothing(
                    index_elements=["key"])
                connection.execute(statement)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        self._ensure_table()
        wanted = sorted(set(keys))
        found: dict[str, bytes] = {}
        with Session(self.engine) as session:
            for batch in _batches(wanted):
                rows = session.exec(select(CheckpointObjectRecord).where(
                    CheckpointObjectRecord.key.in_(batch)))  # type: ignore[attr-defined]
                found.update((row.key, row.data) for row in rows)
        absent = set(wanted) - set(found)
        if absent:
            raise KeyError(f"{len(absent)} checkpoint objects are not in the store "
                           f"(first: {sorted(absent)[0]})")
        return found


class DirectoryObjectStore:
    """Objects as files `<root>/ab/cdef...`, each written whole then renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not an object key: {key!r}")
        return self.root / key[:2] / key[2:]

    def missing(self, keys: Iterable[str]) -> set[str]:
        return {key for key in set(keys) if not self._path(key).exists()}

    def put_many(self, objects: dict[str, bytes]) -> None:
        for key, data in objects.items():
            path = self._path(key)
            if path.exists():
                continue
            path.parent.mkdir(exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_bytes(data)
            os.replace(partial, path)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        found = {}
        for key in set(keys):
            try:
                found[key] = self._path(key).read_bytes()
            except FileNotFoundError:
                raise KeyError(f"checkpoint object {key} is not in the store") from None
        return found
