"""No input is a 500: a path component longer than any file system allows (NAME_MAX,
errno 36), sent to every route family, with a live host registered and without one."""

from __future__ import annotations

import uuid

import pytest

from refloop.store import hosts as host_rows
from refloop.store.db import store_for, utcnow

LONG = "x" * 300  # over NAME_MAX (255 bytes): stat() raises OSError(ENAMETOOLONG)


@pytest.fixture
def live_host(settings, tmp_path):
    store = store_for(settings.effective_database_url)
    host = f"long-{uuid.uuid4().hex[:6]}"
    host_rows.beat(store, host, [str(tmp_path)], [f"q@{host}"], f"1@{host}", 60.0, utcnow())
    yield host
    host_rows.forget(store, host)


def requests(tmp_path):
    far = str(tmp_path / LONG / "ws")
    return [
        ("POST", "/agent/interactive/start", {"workspace": far}),
        ("POST", "/agent/interactive/start", {"workspace": f"/{LONG}"}),
        ("POST", "/code-reviews", {"review_type": "file", "working_directory": far,
                                   "file_paths": ["m.py"]}),
        ("POST", "/code-reviews", {"review_type": "snippet", "working_directory": far,
                                   "content": "eval(x)"}),
        ("GET", f"/tasks/{LONG}", None),
        ("GET", f"/tasks/{LONG}/events", None),
        ("POST", f"/tasks/{LONG}/move", {"host": LONG}),
        ("POST", f"/tasks/{LONG}/approvals", {"approved": True}),
        ("GET", f"/prompts/{LONG}", None),
        ("PATCH", f"/model-configs/{LONG}", {"name": LONG}),
        ("GET", "/hosts", None),
        ("GET", f"/ui/{LONG}", None),
    ]


@pytest.mark.parametrize("with_host", [True, False], ids=["live-host", "no-host"])
async def test_a_path_component_over_name_max_is_refused_never_a_500(
        api, request, tmp_path, with_host):
    if with_host:
        request.getfixturevalue("live_host")
    for method, path, body in requests(tmp_path):
        response = await api.request(method, path, json=body)
        assert response.status_code < 500, (method, path, response.text[:200])
        assert response.headers["content-type"].startswith(("application/json", "text/"))
    started = await api.post("/agent/interactive/start",
                             json={"workspace": str(tmp_path / LONG / "ws")})
    if with_host:  # the host's roots hold the parent: the name itself is what is refused
        assert started.status_code == 422 and "File name too long" in started.text
