"""The outsiders' second round, findings 1 to 4, each written as the attack: keys bound to
their endpoints, upstream error pages kept from clients, DNS rebinding, inputs that used
to give a 500, and workspaces that reach refloop's own state."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from refloop.api.main import create_app
from refloop.store.db import ModelConfigRecord
from tests.api.test_api import new_session, wait_done

SECRET_PAGE = "internal admin console 7f3a, do not show"


class Listener:
    """An HTTP server an attacker points a model config at: records what it receives and
    answers every request with an internal-looking error page."""

    def __init__(self) -> None:
        seen: list[dict[str, str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                seen.append(dict(self.headers))
                body = f"<html><body>{SECRET_PAGE}</body></html>".encode()
                self.send_response(404)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.seen = seen
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def api_settings(api_settings):
    return api_settings.model_copy(update={
        "refloop_model_key_envs": "REFLOOP_TEAM_KEY=https://llm.example/v1"})


# ------------------------------------------------------------ 1. keys bound to endpoints

async def test_a_config_pairing_the_team_key_with_another_url_is_refused(api, listener,
                                                                        monkeypatch):
    monkeypatch.setenv("REFLOOP_TEAM_KEY", "sk-team-secret")
    refused = await api.post("/model-configs", json={
        "name": "mine", "model": "m", "base_url": listener.base_url,
        "api_key_env": "REFLOOP_TEAM_KEY"})
    assert refused.status_code == 422, refused.text
    assert "REFLOOP_MODEL_KEY_ENVS" in refused.json()["detail"]
    fine = await api.post("/model-configs", json={
        "name": "team", "model": "m", "base_url": "https://llm.example/v1/",
        "api_key_env": "REFLOOP_TEAM_KEY"})
    assert fine.status_code == 201, fine.text
    moved = await api.patch(f"/model-configs/{fine.json()['id']}",
                            json={"base_url": listener.base_url})
    assert moved.status_code == 422
    assert not listener.seen


async def test_a_stored_config_that_pairs_them_never_sends_the_key(api, listener, workspace,
                                                                  monkeypatch):
    """A row written before the binding (or behind the API's back): the worker refuses."""
    monkeypatch.setenv("REFLOOP_TEAM_KEY", "sk-team-secret")
    config = api.app.state.store.add(ModelConfigRecord(
        name="old", model="m", base_url=listener.base_url, api_key_env="REFLOOP_TEAM_KEY"))
    session = await new_session(api, workspace, model_config_id=config.id)
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "hi"})).json()["task_id"]
    state = await wait_done(api, task_id)
    assert state["status"] == "failed"
    assert all("sk-team-secret" not in str(headers) for headers in listener.seen)
    assert "REFLOOP_MODEL_KEY_ENVS" in (state["error"] or "")


async def test_an_endpoints_error_page_never_reaches_the_client(api, listener, workspace):
    config = (await api.post("/model-configs", json={
        "name": "probe", "model": "m", "base_url": listener.base_url})).json()
    session = await new_session(api, workspace, model_config_id=config["id"])
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "hi"})).json()["task_id"]
    state = await wait_done(api, task_id)
    assert listener.seen and state["status"] == "failed"
    text = (await api.get(f"/tasks/{task_id}")).text
    assert SECRET_PAGE not in text and "HTTP 404" in text
    events = (await api.get(f"/tasks/{task_id}/events")).text
    assert SECRET_PAGE not in events


# ------------------------------------------------------------ 2. DNS rebinding

@pytest.mark.parametrize("route", ["/prompts", "/healthz", "/ui/", "/mcp", "/openapi.json"])
async def test_a_rebound_name_gets_421_on_every_route(api, route):
    response = await api.get(route, headers={"Host": "evil.example"})
    assert response.status_code == 421, response.text


async def test_post_with_a_foreign_host_changes_nothing(api):
    before = len((await api.get("/prompts")).json())
    response = await api.post("/prompts", headers={"Host": "evil.example:8000"},
                              json={"name": "x", "system_prompt": "y"})
    assert response.status_code == 421
    assert len((await api.get("/prompts")).json()) == before
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
        assert (await api.get("/prompts", headers={"Host": host})).status_code == 200


async def test_allowed_hosts_name_the_others(client, api_settings):
    app = create_app(api_settings.model_copy(update={
        "refloop_allowed_hosts": "refloop.internal, api"}), client=client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://refloop.internal") as http:
        assert (await http.get("/prompts")).status_code == 200
        assert (await http.get("/prompts", headers={"Host": "api:8000"})).status_code == 200
        assert (await http.get("/prompts", headers={"Host": "x.example"})).status_code == 421


def test_binding_to_an_address_allows_that_address():
    from refloop.api.bind import secure_bind
    from refloop.settings import Settings

    served, _ = secure_bind(Settings(refloop_api_token="t"), "10.1.2.3")
    assert "10.1.2.3" in (served.refloop_allowed_hosts or "")


# ------------------------------------------------------------ 3. no 500, short echoes

@pytest.mark.parametrize("raw", [
    b'{"name": "a\\ud800", "system_prompt": "x"}',
    b'{"name": "x", "system_prompt": "\\udfff"}',
    b'{"name": "x", "system_prompt": "y", "enable_quality_review": NaN}',
])
async def test_json_no_text_can_hold_is_a_422(api, raw):
    response = await api.post("/prompts", content=raw,
                              headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity"])
async def test_nan_and_infinity_are_422(api, value):
    raw = b'{"name": "x", "model": "m", "temperature": ' + value + b"}"
    response = await api.post("/model-configs", content=raw,
                              headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text


async def test_a_big_integer_is_quoted_short(api):
    raw = b'{"session_id": "s", "task": "t", "max_iterations": ' + b"9" * 4000 + b"}"
    response = await api.post("/agent/interactive/task", content=raw,
                              headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "9" * 81 not in response.text


async def test_workspace_filesystem_errors_are_short_422s(api, tmp_path):
    long_component = tmp_path / ("a" * 256)
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    huge = str(tmp_path / ("b" * 200)) * 20  # a 4,000-character path
    for workspace in (str(long_component), str(loop), huge):
        for route, body in (("/agent/interactive/start", {"workspace": workspace}),
                            ("/code-reviews", {"review_type": "snippet", "content": "x",
                                               "working_directory": workspace})):
            response = await api.post(route, json=body)
            assert response.status_code == 422, (route, response.text)
            assert "a" * 81 not in response.text and "b" * 81 not in response.text


# ------------------------------------------------------------ 4. refloop's own state

async def test_a_workspace_that_contains_the_data_dir_is_refused(api, tmp_path):
    data = api.app.state.settings.refloop_data_dir
    data.mkdir(parents=True, exist_ok=True)
    assert tmp_path in data.parents
    for route, body in (("/agent/interactive/start", {"workspace": str(tmp_path)}),
                        ("/code-reviews", {"review_type": "file", "file_paths": [
                            "data/refloop.db"], "working_directory": str(tmp_path)})):
        response = await api.post(route, json=body)
        assert response.status_code == 422, response.text
        assert "data directory" in response.json()["detail"]


@pytest.mark.parametrize("which", ["refloop_journal_dir", "refloop_index_dir"])
async def test_a_workspace_holding_the_journal_or_index_is_refused(client, api_settings,
                                                                   tmp_path, which):
    state = tmp_path / "shared" / "state"
    (state / "sub").mkdir(parents=True)
    app = create_app(api_settings.model_copy(update={which: state}), client=client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as http:
        for workspace in (tmp_path / "shared", state, state / "sub"):
            response = await http.post("/agent/interactive/start",
                                       json={"workspace": str(workspace)})
            assert response.status_code == 422, response.text


# ------------------------------------------------------------ 9. the OpenAPI tells the truth

def test_the_document_declares_streams_and_refusals():
    from pathlib import Path

    from refloop.settings import Settings

    document = create_app(Settings(refloop_data_dir=Path("/nonexistent"))).openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "421" in responses, (method, path)
            if path != "/healthz":
                assert "422" in responses, (method, path)
            ok = next(code for code in responses if code.startswith("2"))
            content = set(responses[ok].get("content", {}))
            if path.endswith(("/events", "/stream")):
                assert content == {"text/event-stream"}, (method, path)
