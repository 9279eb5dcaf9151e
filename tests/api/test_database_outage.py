"""A database outage is a state: the API's role is refused by PostgreSQL (ALTER ROLE
NOLOGIN, its sessions terminated), and every route that needs the database answers 503
with Retry-After and a JSON body naming the database, on a keep-alive connection that
stays usable; the same connection answers 200 once the role may log in again. `refloop
api` and `refloop up` with a database at a closed port say so once and exit 2."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from refloop.api.main import create_app
from refloop.runtime.net import free_port, wait_for_port
from tests.constants import TEST_DATABASE_URL

ROUTES = [("GET", "/tasks/some-task", None), ("GET", "/prompts", None),
          ("GET", "/tasks", None), ("GET", "/hosts", None),
          ("POST", "/agent/interactive/start", {}),
          ("POST", "/prompts", {"name": "p", "system_prompt": "s"})]


def admin():
    return create_engine(make_url(TEST_DATABASE_URL).set(database="postgres"),
                         isolation_level="AUTOCOMMIT")


@pytest.fixture
def own_role() -> Iterator[tuple[str, str]]:
    """A role and a database of its own (never the shared server's): (url, role)."""
    role = f"outage_{uuid.uuid4().hex[:8]}"
    engine = admin()
    with engine.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'CREATE DATABASE "{role}" OWNER "{role}"'))
    url = make_url(TEST_DATABASE_URL).set(username=role, password=None, database=role)
    try:
        yield url.render_as_string(hide_password=False), role
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER ROLE "{role}" LOGIN'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :db"), {"db": role})
            conn.execute(text(f'DROP DATABASE IF EXISTS "{role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        engine.dispose()


def refuse(role: str, refused: bool) -> None:
    engine = admin()
    with engine.connect() as conn:
        conn.execute(text(f'ALTER ROLE "{role}" {"NOLOGIN" if refused else "LOGIN"}'))
        if refused:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE usename = :role"), {"role": role})
    engine.dispose()


@contextlib.asynccontextmanager
async def serving(settings, client) -> AsyncIterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, client=client),
                                           host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(server.serve())
    await asyncio.to_thread(wait_for_port, port, 30)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


def ask(conn: http.client.HTTPConnection, method: str, path: str, body: object | None
        ) -> tuple[int, dict[str, str], str]:
    payload = None if body is None else json.dumps(body)
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, \
        response.read().decode()


async def test_the_api_role_refused_is_a_503_on_a_connection_that_stays_usable(
        client, settings, own_role):
    url, role = own_role
    outage = settings.model_copy(update={"database_url": url})
    async with serving(outage, client) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, _, _ = await asyncio.to_thread(ask, conn, "GET", "/prompts", None)
        assert status == 200  # tables made, connection pooled
        sock = conn.sock
        await asyncio.to_thread(refuse, role, True)
        for method, path, body in ROUTES:
            status, headers, text_ = await asyncio.to_thread(ask, conn, method, path, body)
            assert status == 503, (method, path, status, text_)
            assert headers["retry-after"].isdigit() and \
                headers.get("connection", "").lower() != "close"
            assert "database is unavailable" in json.loads(text_)["detail"]
            assert conn.sock is sock, f"{method} {path}: the server closed the connection"
        status, _, text_ = await asyncio.to_thread(ask, conn, "GET", "/healthz", None)
        assert status == 503 and json.loads(text_)["database"] is False
        await asyncio.to_thread(refuse, role, False)
        status, _, _ = await asyncio.to_thread(ask, conn, "GET", "/prompts", None)
        assert status == 200 and conn.sock is sock
        conn.close()


@pytest.mark.parametrize("command", ["api", "up"])
def test_a_database_at_a_closed_port_is_said_once_and_exits_2(
        temporal_server, tmp_path, command):
    closed = free_port()  # nothing listens there
    env = {**os.environ, "DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{closed}/x",
           "REFLOOP_DATABASE_WAIT_S": "3", "TEMPORAL_ADDRESS": temporal_server,
           "REFLOOP_DATA_DIR": str(tmp_path / "data"), "REFLOOP_API_PORT": str(free_port())}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "refloop", command], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr[-2000:]
    err = " ".join(done.stderr.split())
    assert err.count("does not answer") == 1 and "retrying every 2 s for up to 3 s" in err
    assert f"127.0.0.1:{closed}" in err and "is unreachable" in err and "exiting" in err
    assert "Traceback" not in done.stderr and took < 30
