"""What the database is given and what its errors say.

PostgreSQL text cannot hold a NUL byte, and a model's answer may contain one: every string
parameter has NUL replaced by U+FFFD (the replacement character) before it is sent, so an
answer is stored, never a failed task. A database error's text holds the SQL and its
parameters (a task's content); callers outside the store get only its class.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

NUL_STAND_IN = "\ufffd"


def _clean(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", NUL_STAND_IN)
    return value


def _clean_parameters(parameters: Any) -> Any:
    if isinstance(parameters, dict):
        return {key: _clean(value) for key, value in parameters.items()}
    if isinstance(parameters, list | tuple):
        return type(parameters)(_clean_parameters(p) if isinstance(p, dict | list | tuple)
                                else _clean(p) for p in parameters)
    return parameters


def _clean_deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {_clean(k): _clean_deep(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_deep(v) for v in value]
    return _clean(value)


def json_without_nul(value: Any) -> str:
    """The JSON columns' serializer: jsonb and PostgreSQL text refuse "\\u0000" too."""
    return json.dumps(_clean_deep(value))


def without_nul_bytes(engine: Engine) -> None:
    """Install the NUL replacement on every statement the engine runs."""

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def clean(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
              executemany: bool) -> tuple[str, Any]:
        return statement, _clean_parameters(parameters)


def short_db_error(err: SQLAlchemyError) -> str:
    """The error's class and the driver's class, never its SQL or parameters."""
    cause = getattr(err, "orig", None)
    inner = f": {type(cause).__name__}" if cause is not None else ""
    return f"database error ({type(err).__name__}{inner})"
