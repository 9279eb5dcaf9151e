"""Session-wide real Temporal server (the `temporal` CLI dev server, in memory, on free
ports), scripted model and DB URL."""

from __future__ import annotations

import collections
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from refloop.runtime.client import connect
from refloop.runtime.net import free_port
from refloop.settings import Settings
from refloop.worker.temporal_server import EmbeddedTemporal
from tests.constants import TEST_DATABASE_URL
from tests.llm_fixtures import scripted_llm  # noqa: F401  (session fixture)


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped by SIGTERM (a timeout, CI) tears down like Ctrl-C: the session's dev
    # servers and model servers stop instead of outliving it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Each xdist worker has its own database, and REFLOOP_TEST_DATABASE_URL may name a new one.
    problem = create_database(TEST_DATABASE_URL)
    if problem:  # the DB tests fail on their own; the rest still run
        config.issue_config_time_warning(pytest.PytestWarning(problem), stacklevel=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis gives each API operation's test its function's node id; pytest-xdist
    (`make test`) schedules a file's tests by node id and would run one operation of each
    function: every item gets its own id (`test_api_on_sqlite[GET /tasks]`), and a node id
    seen twice stops the run rather than silently losing tests. Slow files go first."""
    for item in items:
        if getattr(item, "operation_label", None) and item.parent is not None:
            if hasattr(item, "_id"):  # pytest >= 9
                item._id = item.parent.id.child(item.name)
            else:
                item._nodeid = f"{item.parent.nodeid}::{item.name}"
    # Files holding a test marked slow first (each file's own order kept): xdist then
    # ends on short files, not with one process alone in a long one.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
    seen = collections.Counter(item.nodeid for item in items)
    twice = [nodeid for nodeid, count in seen.items() if count > 1]
    if twice:
        raise pytest.UsageError(f"tests share a node id (xdist would run one): {twice[:3]}")


def create_database(url: str) -> str | None:
    """CREATE DATABASE unless it exists (through the server's `postgres` database); what
    went wrong, if it could not."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    name = make_url(url).database
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                  {"name": name}).first()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as err:
        return f"cannot create the test database {name}: {str(err).splitlines()[0]}"
    finally:
        admin.dispose()
    return None


def forget_every_host(url: str) -> None:
    from sqlalchemy import delete
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from refloop.store.db import store_for
    from refloop.store.hosts import HostRecord, forget

    store = store_for(url)
    try:
        forget(store, "")  # makes the table on first use
        with Session(store.engine) as session:
            session.exec(delete(HostRecord))  # type: ignore[call-overload]
            session.commit()
    except SQLAlchemyError:  # no database: the DB tests fail on their own
        pass


@pytest.fixture(scope="session")
async def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    server = EmbeddedTemporal(tmp_path_factory.mktemp("temporal"), port=free_port(),
                              ui_port=None, persistent=False)
    address = await server.start()
    yield address
    server.stop()


@pytest.fixture(scope="session")
async def client(temporal_server: str) -> Client:
    return await connect(temporal_server, "default")


@pytest.fixture
def settings(scripted_llm, tmp_path: Path) -> Settings:  # noqa: F811
    # Every test starts with no host registered: a row another test's worker left behind
    # (the hosts table outlives the run) would make the fleet place workspaces on it.
    forget_every_host(TEST_DATABASE_URL)
    return Settings(
        openai_base_url=scripted_llm.base_url,
        openai_api_key="test",
        database_url=TEST_DATABASE_URL,
        refloop_data_dir=tmp_path / "data",
        refloop_workspace_roots=str(tmp_path),
        # Indexing spawns an embedding process per task: only the semantic tests want it.
        refloop_semantic_index=False,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:8]}"
