"""The test suite's own machinery: per-process databases under xdist, node ids that xdist
can schedule, and the scripted model's count of requests still waiting."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from refloop.llm.scripted import ScriptedLLMServer
from refloop.runtime.net import free_port
from tests.conftest import create_database, pytest_collection_modifyitems
from tests.constants import TEST_DATABASE_URL, per_worker_url
from tests.llm_fixtures import unique_scenario


def test_each_xdist_process_gets_its_own_database(monkeypatch):
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert per_worker_url(url) == url
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert per_worker_url(url) == "postgresql+psycopg://postgres@127.0.0.1:5432/test_gw1"


@pytest.mark.db
def test_the_database_is_made_once_and_an_unreachable_server_is_said():
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(TEST_DATABASE_URL)
    fresh = url.set(database=f"{url.database}_made_{uuid.uuid4().hex[:6]}")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        for _ in range(2):  # made, then found
            assert create_database(fresh.render_as_string(hide_password=False)) is None
        with admin.connect() as conn:
            assert conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                {"name": fresh.database}).first()
            conn.execute(text(f'DROP DATABASE "{fresh.database}"'))
    finally:
        admin.dispose()
    dead = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test_gw0"
    assert create_database(dead).startswith("cannot create the test database test_gw0: ")


def fake_item(nodeid: str, slow: bool = False) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, path=Path(nodeid.partition("::")[0]),
                           get_closest_marker=lambda name: slow if name == "slow" else None)


def test_a_node_id_seen_twice_stops_the_run():
    with pytest.raises(pytest.UsageError, match="share a node id"):
        pytest_collection_modifyitems([fake_item("a.py::t"), fake_item("a.py::t")])


def test_files_with_a_slow_test_go_first_in_their_own_order():
    items = [fake_item("a.py::t1"), fake_item("b.py::t1"), fake_item("b.py::t2", slow=True),
             fake_item("c.py::t1")]
    pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "a.py::t1", "c.py::t1"]


def test_a_request_counts_as_arrived_before_its_answer():
    with ScriptedLLMServer() as server:
        model = unique_scenario(server, {"act": [{"content": "late", "delay_ms": 1000}]})
        with httpx.Client() as http:
            call = threading.Thread(target=http.post, args=(
                f"{server.base_url}/chat/completions",), kwargs={
                "json": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                "headers": {"x-refloop-purpose": "act"}})
            call.start()
            for _ in range(100):
                if server.arrived(model, "act"):
                    break
                call.join(0.01)
            assert server.arrived(model, "act") == 1 and server.requests(model, "act") == []
            call.join()
        assert len(server.requests(model, "act")) == 1
