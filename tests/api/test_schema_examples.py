"""The schema is the API: every request example the OpenAPI document gives passes the
route's own validation (the session example's relative `workspace` was refused: `name an
absolute path`); event streams are described as the objects their events carry; 413, 421
and 503 are declared where a route can answer them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from refloop.store import hosts as host_rows
from refloop.store.db import store_for, utcnow


def examples(document: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(method, path, example body) for every request body example in the document."""
    schemas = document["components"]["schemas"]
    found = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema", {})
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            for example in schema.get("examples", []):
                found.append((method, path, example))
    return found


@pytest.mark.parametrize("with_host", [False, True], ids=["one-machine", "live-host"])
async def test_every_request_example_passes_validation(api, settings, tmp_path, with_host,
                                                       monkeypatch):
    start = tmp_path / "project"  # the server's start directory, inside its roots
    start.mkdir()
    monkeypatch.chdir(start)
    store = store_for(settings.effective_database_url)
    host = settings.refloop_host_id  # this machine's: fresh session directories are made here
    if with_host:
        host_rows.beat(store, host, [str(tmp_path)], [f"q@{host}"], f"1@{host}", 60.0,
                       utcnow())
    try:
        document = (await api.get("/openapi.json")).json()
        found = examples(document)
        assert len(found) >= 6, found  # sessions, tasks, prompts, configs, reviews, move
        for method, path, body in found:
            concrete = re.sub(r"\{[^}]+\}", "example-1", path)
            response = await api.request(method, concrete, json=body)
            # 404 (the example names no resource of this database) or 409 is fine; a
            # validation refusal of the document's own example is not.
            assert response.status_code not in (400, 422) and response.status_code < 500, \
                (method, path, body, response.status_code, response.text[:300])
    finally:
        if with_host:
            host_rows.forget(store, host)


async def test_event_streams_and_error_statuses_are_declared(api):
    document = (await api.get("/openapi.json")).json()
    streams = [(path, op) for path, ops in document["paths"].items() for op in ops.values()
               if "text/event-stream" in op.get("responses", {}).get("200", {}).get(
                   "content", {})]
    assert streams
    for _path, operation in streams:
        media = operation["responses"]["200"]["content"]["text/event-stream"]
        event = media["itemSchema"]
        assert event["type"] == "object" and {"event", "data"} <= set(event["properties"])
        data = event["properties"]["data"]  # text on the wire, a JSON object inside
        assert data["contentMediaType"] == "application/json"
        assert data["contentSchema"]["type"] == "object"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            declared = set(operation["responses"])
            assert "421" in declared, (method, path)
            if path != "/healthz":
                assert {"413", "503"} <= declared, (method, path)
