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


def test_a_token_limit_column_made_as_an_integer_is_widened():
    """A limit of up to 10**15 tokens (what the API takes) fits the sessions' and presets'
    columns, also in a database made when they were 32-bit."""
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.engine import make_url

    from refloop.store.db import PromptRecord
    from tests.conftest import create_database
    from tests.constants import TEST_DATABASE_URL

    url = make_url(TEST_DATABASE_URL)
    url = url.set(database=f"{url.database}_widen")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    address = url.render_as_string(hide_password=False)
    assert create_database(address) is None
    Store(address).init()
    engine = create_engine(address)
    try:
        with engine.begin() as conn:  # as the release before made them
            for table in ("sessions", "prompts"):
                conn.execute(text(f'ALTER TABLE "{table}" ALTER COLUMN max_tokens TYPE INTEGER'))
        store = Store(address)
        store.init()
        with engine.connect() as conn:
            kinds = {table: {c["name"]: str(c["type"]) for c in inspect(conn).get_columns(table)}
                     for table in ("sessions", "prompts")}
        assert kinds["sessions"]["max_tokens"] == kinds["prompts"]["max_tokens"] == "BIGINT"
        session = store.add(SessionRecord(session_id="big", workspace="/w", max_tokens=10**15))
        assert store.get(SessionRecord, session.session_id).max_tokens == 10**15
        prompt = store.add(PromptRecord(name="p", system_prompt="s", max_tokens=10**15))
        assert store.get(PromptRecord, prompt.id).max_tokens == 10**15
        store.engine.dispose()
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        admin.dispose()
