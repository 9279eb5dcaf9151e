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


def test_processes_starting_together_on_an_empty_database_all_start():
    """Workers and the API start together on an empty PostgreSQL: each makes the schema
    (here, stores of their own in threads, as separate processes would), and none fails
    on the other's half-made tables."""
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.conftest import create_database
    from tests.constants import TEST_DATABASE_URL

    url = make_url(TEST_DATABASE_URL).set(database=f"{make_url(TEST_DATABASE_URL).database}_empty")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    assert create_database(url.render_as_string(hide_password=False)) is None
    stores = [Store(url.render_as_string(hide_password=False)) for _ in range(8)]
    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            list(pool.map(lambda store: store.init(), stores))  # raises what any raised
        assert stores[0].add(SessionRecord(session_id="s1", workspace="/w")).session_id == "s1"
    finally:
        for store in stores:
            store.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        admin.dispose()
