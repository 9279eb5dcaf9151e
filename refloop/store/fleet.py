"""The fleet's own settings, in the one place every worker reads: the `fleet` table.

A fleet is the workers of one task queue on one database. Its model-call rate limit is
Temporal's rate limit on the model queue, which the server takes from its pollers: a
worker polling with another limit (or none) would set the queue's rate for everyone. So
the first worker started with REFLOOP_LLM_RATE_PER_S records it here; every later worker
takes it from here, whatever its own setting says, and one that asks for another limit
refuses to start (`refloop fleet-rate` changes the fleet's).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel

from refloop.settings import SettingsError
from refloop.store.db import Store, utcnow


class FleetRecord(SQLModel, table=True):
    __tablename__ = "fleet"

    task_queue: str = Field(primary_key=True)
    # Model calls a second for the whole fleet; None: none (set so by an operator).
    llm_rate_per_s: float | None = None
    set_by: str = ""
    updated_at: datetime = Field(default_factory=utcnow)


class FleetRateConflict(SettingsError):
    """A worker asks for another model rate than its fleet's: it does not start."""


_created: set[int] = set()


def _ensure_table(store: Store) -> None:
    if id(store) not in _created:
        store.init()
        FleetRecord.__table__.create(store.engine, checkfirst=True)  # type: ignore[attr-defined]
        _created.add(id(store))


def _rate(rate: float | None) -> str:
    return f"{rate:g} a second" if rate is not None else "none"


def fleet_llm_rate(store: Store, task_queue: str, asked: float | None, by: str
                   ) -> float | None:
    """The model-call rate a worker of `task_queue` polls the model queue with: the fleet's
    if it has one recorded (a worker without the setting takes it), else `asked`, recorded
    as the fleet's. FleetRateConflict: `asked` differs from the fleet's."""
    _ensure_table(store)
    for _ in range(2):  # a worker starting at the same moment may record it first
        with Session(store.engine) as session:
            row = session.get(FleetRecord, task_queue)
            if row is not None:
                if asked is not None and asked != row.llm_rate_per_s:
                    raise FleetRateConflict(
                        f"REFLOOP_LLM_RATE_PER_S={asked:g}, but the fleet of task queue "
                        f"{task_queue!r} has a model-call rate limit of "
                        f"{_rate(row.llm_rate_per_s)} (set by {row.set_by or 'an operator'} "
                        f"at {row.updated_at:%F %T}Z): a worker cannot change it alone. "
                        "Start this worker with that value or without the setting, or "
                        "change the fleet's with `refloop fleet-rate N` (or `off`)")
                return row.llm_rate_per_s
            if asked is None:
                return None
            session.add(FleetRecord(task_queue=task_queue, llm_rate_per_s=asked, set_by=by))
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                continue
            return asked
    raise RuntimeError("unreachable: the fleet row was written and then not found")


def set_fleet_llm_rate(store: Store, task_queue: str, rate: float | None, by: str) -> None:
    """An operator's change of the fleet's rate (None: no limit); workers started before it
    keep polling with the old one until they restart."""
    _ensure_table(store)
    with Session(store.engine) as session:
        row = session.get(FleetRecord, task_queue) or FleetRecord(task_queue=task_queue)
        row.llm_rate_per_s, row.set_by, row.updated_at = rate, by, utcnow()
        session.add(row)
        session.commit()


def forget_fleet(store: Store, task_queue: str) -> bool:
    _ensure_table(store)
    return store.delete(FleetRecord, task_queue)
