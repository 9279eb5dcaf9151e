"""The `hosts` table: every worker host, its workspace roots, task queues and last beat.

A worker writes its row at start and then every REFLOOP_HOST_HEARTBEAT_S; the API lists
the rows (GET /hosts) and resolves a workspace's host from them; a task naming a host is
checked against them when it starts. A host whose beats stopped is not live.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column
from sqlmodel import Field, Session, SQLModel, select

from refloop.contract.hosts import LIVE_BEATS, HostInfo
from refloop.store.db import Store, as_utc, utcnow


class HostRecord(SQLModel, table=True):
    __tablename__ = "hosts"

    host_id: str = Field(primary_key=True)
    roots: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    task_queues: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    identity: str | None = None
    beat_s: float = 10.0
    started_at: datetime = Field(default_factory=utcnow)
    last_seen: datetime = Field(default_factory=utcnow)


_created: set[int] = set()


def _ensure_table(store: Store) -> None:
    """The table is made on first use: Store.init may have run before this module loaded."""
    if id(store) not in _created:
        store.init()
        HostRecord.__table__.create(store.engine, checkfirst=True)  # type: ignore[attr-defined]
        _created.add(id(store))


def beat(store: Store, host_id: str, roots: list[str], task_queues: list[str],
         identity: str, beat_s: float, started_at: datetime) -> None:
    """Insert or refresh this host's row (its roots and queues as this worker has them)."""
    _ensure_table(store)
    with Session(store.engine) as session:
        row = session.get(HostRecord, host_id) or HostRecord(host_id=host_id)
        row.roots, row.task_queues, row.identity = roots, task_queues, identity
        row.beat_s, row.started_at, row.last_seen = beat_s, started_at, utcnow()
        session.add(row)
        session.commit()


def is_live(row: HostRecord, now: datetime | None = None) -> bool:
    age = ((now or utcnow()) - as_utc(row.last_seen)).total_seconds()
    return age <= LIVE_BEATS * row.beat_s


def list_hosts(store: Store) -> list[HostInfo]:
    _ensure_table(store)
    now = datetime.now(UTC)
    with Session(store.engine) as session:
        rows = list(session.exec(select(HostRecord).order_by(HostRecord.host_id)))
    return [HostInfo(host_id=r.host_id, roots=r.roots, task_queues=r.task_queues,
                     last_seen=as_utc(r.last_seen), started_at=as_utc(r.started_at),
                     beat_s=r.beat_s, live=is_live(r, now)) for r in rows]


def forget(store: Store, host_id: str) -> bool:
    """Drop a host's row (an operator retiring a machine; tests cleaning up)."""
    _ensure_table(store)
    return store.delete(HostRecord, host_id)


def public(info: HostInfo) -> dict[str, Any]:
    return info.model_dump(mode="json")
