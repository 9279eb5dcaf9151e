"""A database created before a nullable column existed gets the column at start-up."""

from __future__ import annotations

import sqlite3

from refloop.store.db import SessionRecord, Store


def test_missing_nullable_columns_are_added(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the sessions table as an older version made it
        db.execute("CREATE TABLE sessions (session_id VARCHAR PRIMARY KEY, workspace VARCHAR "
                   "NOT NULL, prompt_id INTEGER, system_prompt VARCHAR, enable_quality_review "
                   "BOOLEAN NOT NULL, quality_review_rules VARCHAR, model VARCHAR, "
                   "model_config_id INTEGER, approval_mode VARCHAR NOT NULL, created_at "
                   "DATETIME NOT NULL)")
        db.execute("INSERT INTO sessions VALUES ('s1', '/w', NULL, NULL, 0, NULL, NULL, NULL, "
                   "'auto', '2026-01-01 00:00:00')")
    store = Store(f"sqlite:///{path}")
    old = store.get(SessionRecord, "s1")
    assert old is not None and old.mcp_servers is None
    new = store.add(SessionRecord(session_id="s2", workspace="/w", mcp_servers=["git"]))
    assert store.get(SessionRecord, new.session_id).mcp_servers == ["git"]
    Store(f"sqlite:///{path}").init()  # idempotent
