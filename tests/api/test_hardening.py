"""Each finding of the outside test of the HTTP API, against the real test server, real
PostgreSQL (REFLOOP_TEST_DATABASE_URL) and the scripted model."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from refloop.activities.code_review_activities import mirror_file
from refloop.api.bind import console_url, is_loopback, secure_bind
from refloop.api.main import create_app
from refloop.api.reconcile import reconcile_all
from refloop.contract.task import RecordTaskInput
from refloop.runtime.workspaces import WorkspaceError, check_user_workspace, resolve_workspace
from refloop.store.db import TaskRecord, utcnow
from tests.api.test_api import parse_sse
from tests.llm_fixtures import unique_scenario

REVIEW = {"json": {"task_id": "t", "issues": [], "summary": {"overall_assessment": "ok"}}}
VERIFY = {"json": {"task_id": "t", "verification_result": {
    "accuracy_check": [], "rule_compliance_check": [], "quality_assessment": {
        "overall_score": 90}}}}


def old_running_row(api, kind: str = "agent") -> str:
    """A row that claims to run, for a workflow Temporal has never heard of (as after a
    restart of the in-memory server)."""
    store = api.app.state.store
    task_id = f"task-{uuid.uuid4().hex[:12]}"
    store.record_task(RecordTaskInput(task_id=task_id, workflow_id=task_id, kind=kind,
                                      status="running"))
    store.update(TaskRecord, task_id, {"created_at": utcnow() - timedelta(minutes=5)})
    return task_id


# ------------------------------------------------------------------ workspaces and paths

async def test_code_review_outside_the_roots_is_refused(api):
    response = await api.post("/code-reviews", json={
        "review_type": "file", "working_directory": "/etc", "file_paths": ["passwd"]})
    assert response.status_code == 422
    assert "workspace roots" in response.text or "system directory" in response.text
    assert "root:" not in response.text


async def test_code_review_id_never_builds_a_path(api, tmp_path):
    response = await api.post("/code-reviews", json={
        "review_type": "snippet", "working_directory": str(tmp_path / "ws"), "content": "x = 1",
        "task_id": "../../../../tmp/X"})
    assert response.status_code == 422
    target = mirror_file(tmp_path / "review_content", "../../../../tmp/X")
    assert target.parent == tmp_path / "review_content"  # a digest, not the ID


@pytest.mark.parametrize("where", ["/", "/etc", "/proc", "/usr/lib"])
async def test_session_workspace_in_system_dirs_is_refused(api, where):
    response = await api.post("/agent/interactive/start", json={"workspace": where})
    assert response.status_code == 422, response.text
    assert "REFLOOP_WORKSPACE_ROOTS" in response.json()["detail"]


async def test_workspace_symlink_out_of_the_roots_is_refused(api, tmp_path):
    (tmp_path / "sneaky").symlink_to("/etc")
    response = await api.post("/agent/interactive/start",
                              json={"workspace": str(tmp_path / "sneaky")})
    assert response.status_code == 422 and "/etc" in response.json()["detail"]


async def test_data_dir_is_never_a_workspace(api):
    data = api.app.state.settings.refloop_data_dir
    data.mkdir(parents=True, exist_ok=True)
    response = await api.post("/agent/interactive/start", json={"workspace": str(data)})
    assert response.status_code == 422 and "data directory" in response.json()["detail"]


async def test_omitted_workspace_gets_a_fresh_directory(api):
    session_id = (await api.post("/agent/interactive/start", json={})).json()["session_id"]
    from refloop.store.db import SessionRecord

    session = api.app.state.store.get(SessionRecord, session_id)
    root = api.app.state.settings.refloop_data_dir.resolve() / "workspaces"
    assert root in Path(session.workspace).parents


def test_roots_rules(settings, tmp_path):
    with pytest.raises(WorkspaceError, match="outside the workspace roots"):
        (tmp_path / "elsewhere").mkdir()
        resolve_workspace(str(tmp_path / "elsewhere"), settings.model_copy(update={
            "refloop_workspace_roots": str(tmp_path / "only")}))
    # a configured system directory is still refused
    with pytest.raises(WorkspaceError):
        resolve_workspace("/etc", settings.model_copy(update={"refloop_workspace_roots": "/etc"}))
    (tmp_path / "ws").mkdir(exist_ok=True)
    assert resolve_workspace(str(tmp_path / "ws"), settings) == (tmp_path / "ws").resolve()


def test_cli_workspace_refuses_root_and_system_dirs(tmp_path):
    for where in ("/", "/etc", "/proc/self"):
        with pytest.raises(WorkspaceError):
            check_user_workspace(where)
    assert check_user_workspace(tmp_path) == tmp_path.resolve()


# ------------------------------------------------------------------ auth

def test_non_loopback_bind_gets_a_generated_token(settings):
    same, none = secure_bind(settings, "127.0.0.1")
    assert none is None and same.refloop_api_token is None
    secured, token = secure_bind(settings, "0.0.0.0")
    assert token and secured.refloop_api_token == token
    assert console_url("0.0.0.0", 8000, token).endswith(f"/ui/#token={token}")
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("example.org")
    kept, none = secure_bind(settings.model_copy(update={"refloop_api_token": "t"}), "0.0.0.0")
    assert none is None and kept.refloop_api_token == "t"


async def test_docs_and_schema_behind_the_token_and_assets_local(api):
    api.app.state.settings = api.app.state.settings.model_copy(
        update={"refloop_api_token": "s3cret"})
    assert (await api.get("/openapi.json")).status_code == 401
    spec = await api.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
    assert spec.status_code == 200 and "bearer" in spec.json()["components"][
        "securitySchemes"]
    page = (await api.get("/docs")).text
    assert "/docs/assets/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    asset = await api.get("/docs/assets/swagger-ui-bundle.js")
    assert asset.status_code == 200 and len(asset.content) > 100_000
    assert (await api.get("/tasks")).status_code == 401
    assert (await api.get("/healthz")).status_code == 200


# ------------------------------------------------------------------ bodies and bad input

async def test_chunked_body_over_the_limit_is_refused_while_streaming(api):
    sent = 0

    async def chunks():
        nonlocal sent
        for _ in range(50):  # 50 MB offered, without Content-Length
            sent += 1
            yield b"x" * 1_000_000

    response = await api.post("/prompts", content=chunks(),
                              headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert sent < 5  # the rest was never read


async def test_422_quotes_only_a_short_prefix(api):
    response = await api.post("/prompts", json={"name": ["x" * 400_000],
                                                "system_prompt": "y" * 400_000})
    assert response.status_code == 422
    assert len(response.content) < 2_000


@pytest.mark.parametrize("path", ["/prompts/154942286972890187300864",
                                  "/model-configs/154942286972890187300864",
                                  "/prompts/-1"])
async def test_out_of_range_ids_are_not_500(api, path):
    assert (await api.get(path)).status_code in (404, 422)


async def test_out_of_range_id_in_a_body_is_422(api, workspace):
    response = await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "prompt_id": 154942286972890187300864})
    assert response.status_code == 422


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/tasks?status=%00", None),
    ("GET", "/tasks/task-%00", None),
    ("POST", "/prompts", {"name": "a\u0000b", "system_prompt": "s"}),
    ("POST", "/prompts", {"name": "a", "system_prompt": "s\u0000"}),
    ("POST", "/model-configs", {"name": "n", "model": "m", "base_url": "http://x\u0000"}),
    ("POST", "/agent/interactive/task", {"session_id": "sess-1", "task": "\u0000"}),
])
async def test_nul_bytes_are_422_at_the_boundary(api, method, path, body):
    response = await api.request(method, path, json=body)
    assert response.status_code == 422 and "NUL" in response.text


async def test_duplicate_code_review_id_is_409_and_agent_rows_are_safe(api, scripted_llm,
                                                                       workspace):
    model = unique_scenario(scripted_llm, {"code_review": [REVIEW], "code_verify": [VERIFY]})
    body = {"review_type": "snippet", "working_directory": str(workspace), "content": "x",
            "model": model, "task_id": f"mine-{uuid.uuid4().hex[:6]}"}
    assert (await api.post("/code-reviews", json=body)).status_code == 202
    assert (await api.post("/code-reviews", json=body)).status_code == 409
    # an agent task's ID: refused, and the agent's row is untouched
    agent_id = old_running_row(api)
    api.app.state.store.record_task(RecordTaskInput(task_id=agent_id, workflow_id=agent_id,
                                                    status="completed"))
    taken = await api.post("/code-reviews", json={**body, "task_id": agent_id})
    assert taken.status_code == 409
    row = api.app.state.store.get_task(agent_id)
    assert row.kind == "agent" and row.status == "completed"
    # and /code-reviews/{agent task id} is not a code review
    assert (await api.get(f"/code-reviews/{agent_id}")).status_code == 404
    assert (await api.post(f"/tasks/{body['task_id']}/approvals",
                           json={"call_id": "1.0", "approved": True})).status_code == 404


# ------------------------------------------------------------------ truthful state

async def test_running_row_without_workflow_becomes_lost(api):
    task_id = old_running_row(api)
    state = (await api.get(f"/tasks/{task_id}")).json()
    assert state["status"] == "lost" and "not found in Temporal" in state["error"]
    events = parse_sse((await asyncio.wait_for(api.get(f"/tasks/{task_id}/events"), 10)).text)
    assert events[-1]["event"] == "lost" and events[-1]["data"]["error"]


async def test_events_of_a_lost_task_end(api):
    task_id = old_running_row(api)
    response = await asyncio.wait_for(api.get(f"/tasks/{task_id}/events"), 10)
    assert parse_sse(response.text)[-1]["event"] == "lost"


async def test_cancel_of_a_lost_task_is_409(api):
    task_id = old_running_row(api)
    response = await api.post(f"/tasks/{task_id}/cancel")
    assert response.status_code == 409 and "lost" in response.text
    assert api.app.state.store.get_task(task_id).status == "lost"


async def test_start_up_reconciles_rows(api):
    task_id = old_running_row(api)
    assert await reconcile_all(api.app.state.client, api.app.state.store) >= 1
    assert api.app.state.store.get_task(task_id).status == "lost"
    # the app's lifespan runs that pass
    other = old_running_row(api)
    app = create_app(api.app.state.settings, client=api.app.state.client)
    async with app.router.lifespan_context(app):
        for _ in range(100):
            if app.state.store.get_task(other).status == "lost":
                break
            await asyncio.sleep(0.05)
    assert app.state.store.get_task(other).status == "lost"


async def test_code_review_rows_follow_their_workflow(api, scripted_llm, workspace):
    model = unique_scenario(scripted_llm, {"code_review": [REVIEW], "code_verify": [VERIFY]})
    task_id = (await api.post("/code-reviews", json={
        "review_type": "snippet", "working_directory": str(workspace), "content": "x = 1",
        "model": model})).json()["task_id"]
    events = parse_sse((await asyncio.wait_for(api.get(f"/tasks/{task_id}/events"), 30)).text)
    assert events[-1]["event"] == "completed" and events[-1]["data"]["kind"] == "code_review"
    listed = {t["task_id"]: t for t in (await api.get("/tasks")).json()}
    assert listed[task_id]["status"] == "completed" and listed[task_id]["kind"] == "code_review"
    assert (await api.get(f"/code-reviews/{task_id}")).json()["status"] == "completed"


# ------------------------------------------------------------------ OpenAPI

def test_openapi_declares_errors_and_security_only_with_a_token(client, settings):
    open_spec = create_app(settings, client=client).openapi()
    assert "securitySchemes" not in open_spec.get("components", {})
    operation = open_spec["paths"]["/tasks/{task_id}/cancel"]["post"]
    assert {"404", "409", "422"} <= set(operation["responses"])
    assert "401" not in operation["responses"] and "security" not in operation
    body_op = open_spec["paths"]["/prompts"]["post"]["responses"]
    assert body_op["413"]["content"]["application/json"]["schema"]["$ref"].endswith("Problem")
    assert body_op["422"]["content"]["application/json"]["schema"]["$ref"].endswith("Problem")
    secured = create_app(settings.model_copy(update={"refloop_api_token": "t"}),
                         client=client).openapi()
    operation = secured["paths"]["/tasks/{task_id}/cancel"]["post"]
    assert operation["security"] == [{"bearer": []}] and "401" in operation["responses"]
    assert "security" not in secured["paths"]["/healthz"]["get"]


def test_openapi_examples_validate(client, settings):
    from refloop.api import schemas
    from refloop.api.routes import code_reviews

    spec = create_app(settings, client=client).openapi()
    checked = 0
    for name, schema in spec["components"]["schemas"].items():
        for example in schema.get("examples", []):
            model = getattr(schemas, name, None) or getattr(code_reviews, name)
            model.model_validate(example)
            checked += 1
    assert checked >= 4
    assert json.dumps(spec)  # serialisable as served


async def test_patch_with_null_for_a_required_field_is_422(api):
    key = (await api.post("/prompts", json={"name": "p", "system_prompt": "s"})).json()["id"]
    for field in ("name", "system_prompt", "enable_quality_review"):
        response = await api.patch(f"/prompts/{key}", json={field: None})
        assert response.status_code == 422, field
    assert (await api.get(f"/prompts/{key}")).json()["name"] == "p"


# ------------------------------------------------------------------ the offline demo model

async def test_demo_model_serves_any_number_of_tasks_with_real_reviews(api, scripted_llm,
                                                                        workspace):
    from refloop.llm.scenario import load_scenario
    from refloop.worker.model_endpoint import demo_scenario_path
    from tests.api.test_api import new_session, wait_done

    scenario = load_scenario(demo_scenario_path()).model_dump(mode="json", by_alias=True)
    name = scenario["name"] = f"demo-{uuid.uuid4().hex[:8]}"
    scripted_llm.load(name, scenario)
    session = await new_session(api, workspace, model=name, enable_quality_review=True,
                                quality_review_rules="A report needs sections.")
    async def one_task() -> None:
        task_id = (await api.post("/agent/interactive/task", json={
            "session_id": session, "task": "write report.md"})).json()["task_id"]
        state = await wait_done(api, task_id)
        assert state["status"] == "completed", state.get("error")
        reviews = (await api.get("/quality-reviews", params={"task_id": task_id})).json()
        assert reviews and all(r["outcome"] != "unavailable" and r["pass"] for r in reviews)

    for _ in range(2):  # one after another,
        await one_task()
    await asyncio.gather(*(one_task() for _ in range(3)))  # and at the same time


# ------------------------------------------------------------------ model configs per task

def decoded_payloads(node) -> str:
    """Every payload of a history (base64 in its JSON form), decoded and joined."""
    import base64

    if isinstance(node, dict):
        return "\n".join(
            base64.b64decode(value).decode("utf-8", "replace")
            if key == "data" and isinstance(value, str) else decoded_payloads(value)
            for key, value in node.items())
    if isinstance(node, list):
        return "\n".join(decoded_payloads(item) for item in node)
    return ""


@pytest.fixture(scope="module")
def config_endpoint():
    """The endpoint the operator's model-config key is bound to."""
    from refloop.llm.scripted import ScriptedLLMServer

    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def api_settings(api_settings, config_endpoint):
    """The operator sets aside one variable for model-config keys, bound to one URL."""
    return api_settings.model_copy(update={
        "refloop_model_key_envs": f"REFLOOP_I17_CONFIG_KEY={config_endpoint.base_url}"})


async def test_model_config_is_honoured_and_its_key_never_enters_the_history(
        api, workspace, monkeypatch, config_endpoint):
    from refloop.worker.replay import dump_history
    from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of

    secret = f"sk-only-on-the-worker-{uuid.uuid4().hex}"
    monkeypatch.setenv("REFLOOP_I17_CONFIG_KEY", secret)
    responses = {"intent": [CODING], "plan": [plan_of("write_file")],
                 "act": [call("write_file", path="c.md", content="# C\n"), final("done")],
                 "summary": [SUMMARY]}
    other = config_endpoint
    other.load("configured-model", {"name": "configured-model", "responses": responses})
    config = (await api.post("/model-configs", json={
        "name": "other endpoint", "model": "configured-model", "base_url": other.base_url,
        "api_key_env": "REFLOOP_I17_CONFIG_KEY", "temperature": 0.3})).json()
    session = (await api.post("/agent/interactive/start", json={
        "workspace": str(workspace), "model_config_id": config["id"]})).json()["session_id"]
    task_id = (await api.post("/agent/interactive/task", json={
        "session_id": session, "task": "write c.md"})).json()["task_id"]
    from tests.api.test_api import wait_done

    state = await wait_done(api, task_id)
    assert state["status"] == "completed", state.get("error")
    seen = other.requests(model="configured-model")
    assert {r["purpose"] for r in seen} >= {"intent", "plan", "act", "summary"}
    assert all(r["authorization"] == f"Bearer {secret}" for r in seen)
    acts = [r["body"] for r in seen if r["purpose"] == "act"]
    assert acts and all(body.get("temperature") == 0.3 for body in acts)
    # The key is in neither the workflow's input nor its history, nor the stored row.
    history = await api.app.state.client.get_workflow_handle(task_id).fetch_history()
    text = dump_history(history)
    payloads = decoded_payloads(json.loads(text))
    assert "REFLOOP_I17_CONFIG_KEY" in payloads  # the first event: the workflow's input
    assert secret not in text and secret not in payloads
    row = api.app.state.store.get_task(task_id)
    assert row.input["endpoint"]["api_key_env"] == "REFLOOP_I17_CONFIG_KEY"
    assert secret not in json.dumps(row.input) and secret not in json.dumps(row.result)


@pytest.mark.parametrize("where", ["/", "/etc"])
def test_refloop_run_refuses_root_and_system_dirs(where):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "refloop", "run", "x", "--workspace", where],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workspace" in done.stderr
    assert "refused" in done.stderr or "system directory" in done.stderr


async def test_events_of_a_task_in_any_closed_status_end(api):
    """A status this API does not know (e.g. a newer worker's) still ends the stream."""
    task_id = old_running_row(api)
    api.app.state.store.record_task(RecordTaskInput(task_id=task_id, workflow_id=task_id,
                                                    status="incomplete", error="missing x"))
    response = await asyncio.wait_for(api.get(f"/tasks/{task_id}/events"), 10)
    last = parse_sse(response.text)[-1]
    assert last["event"] == "incomplete" and last["data"]["error"] == "missing x"
    assert (await api.post(f"/tasks/{task_id}/cancel")).status_code == 409


async def test_a_stored_session_outside_the_roots_starts_no_task(api):
    from refloop.store.db import SessionRecord

    session = api.app.state.store.add(SessionRecord(session_id=f"sess-{uuid.uuid4().hex[:8]}",
                                                    workspace="/"))  # from before the roots
    response = await api.post("/agent/interactive/task", json={
        "session_id": session.session_id, "task": "list /"})
    assert response.status_code == 422 and "REFLOOP_WORKSPACE_ROOTS" in response.text
