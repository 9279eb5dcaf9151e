"""A model config's context window (`context_tokens`) through the API and PostgreSQL: stored,
changed and cleared; given to its tasks with their endpoint; a database made before the
column existed gets it; and the task's requests fit the config's window, not the larger
one the endpoint states."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from refloop.api.main import create_app
from tests.api.test_api import wait_done
from tests.constants import TEST_DATABASE_URL
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, final, plan_of
from tests.workflow.test_window import reads, summaries, write_files


async def test_a_model_configs_window_is_stored_changed_and_given_to_its_tasks(
        api, scripted_llm, workspace):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")], "act": [final("listed")],
        "summary": [SUMMARY]})
    for bad in (100, 10_000_001, "4096", 4096.5):
        refused = await api.post("/model-configs", json={
            "name": "w", "model": model, "context_tokens": bad})
        assert refused.status_code == 422, (bad, refused.text)
    created = await api.post("/model-configs", json={
        "name": "small window", "model": model, "context_tokens": 4096})
    assert created.status_code == 201, created.text
    config = created.json()
    assert config["context_tokens"] == 4096
    changed = await api.patch(f"/model-configs/{config['id']}", json={"context_tokens": 6000})
    assert changed.status_code == 200 and changed.json()["context_tokens"] == 6000
    assert (await api.get(f"/model-configs/{config['id']}")).json()["context_tokens"] == 6000
    assert (await api.patch(f"/model-configs/{config['id']}",
                            json={"context_tokens": 10})).status_code == 422
    started = await api.post("/tasks", json={
        "workspace": str(workspace), "task": "list the files", "model_config_id": config["id"]})
    assert started.status_code == 202, started.text
    task_id = started.json()["task_id"]
    assert (await wait_done(api, task_id))["status"] == "completed"
    row = api.app.state.store.get_task(task_id)
    assert row.input["endpoint"]["context_tokens"] == 6000
    # Cleared: its tasks' window is the setting's or the endpoint's again
    cleared = await api.patch(f"/model-configs/{config['id']}", json={"context_tokens": None})
    assert cleared.status_code == 200 and cleared.json()["context_tokens"] is None
    listed = {c["id"]: c for c in (await api.get("/model-configs")).json()}
    assert listed[config["id"]]["context_tokens"] is None


@pytest.fixture
def old_database():
    """A database whose model_configs table an older version made: no context_tokens."""
    url = make_url(TEST_DATABASE_URL)
    url = url.set(database=f"{url.database}_old_configs")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    old = create_engine(url)
    with old.begin() as conn:
        conn.execute(text(
            "CREATE TABLE model_configs (id SERIAL PRIMARY KEY, name VARCHAR NOT NULL, "
            "model VARCHAR NOT NULL, base_url VARCHAR, api_key_env VARCHAR, temperature "
            "FLOAT, price JSON, created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)"))
        conn.execute(text(
            "INSERT INTO model_configs (name, model, created_at, updated_at) "
            "VALUES ('old', 'smollm2', now(), now())"))
    old.dispose()
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        admin.dispose()


async def test_a_database_made_before_the_window_gets_its_column(client, settings,
                                                                 old_database):
    app = create_app(settings.model_copy(update={"database_url": old_database}), client=client)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as api:
            [old] = (await api.get("/model-configs")).json()
            assert old["name"] == "old" and old["context_tokens"] is None
            changed = await api.patch(f"/model-configs/{old['id']}",
                                      json={"context_tokens": 4096})
            assert changed.status_code == 200, changed.text
            assert (await api.get(f"/model-configs/{old['id']}")).json()["context_tokens"] == 4096
    finally:
        app.state.store.engine.dispose()


async def test_a_task_fits_its_model_configs_window_not_the_endpoints(
        api, scripted_llm, workspace):
    """The endpoint states 12,000 tokens (its /v1/models) and enforces them; the task's
    model config says 5,000: a task reading 8 files of 7,800 characters (about 20,000
    tokens) completes with every request within 5,000."""
    write_files(workspace, 8, 7_800)
    responses = {"intent": [CODING], "plan": [plan_of("read_file")],
                 "act": [*reads(8), final("read all 8")], "compact": summaries(8),
                 "summary": [SUMMARY]}
    model = unique_scenario(scripted_llm, responses)
    scripted_llm.load(model, {"name": model, "responses": responses, "endpoint": {
        "context_tokens": 12_000, "context_refusal": "llama_cpp"}})
    config = (await api.post("/model-configs", json={
        "name": "configured window", "model": model, "context_tokens": 5000})).json()
    started = await api.post("/tasks", json={
        "workspace": str(workspace), "task": "read f0.txt to f7.txt",
        "model_config_id": config["id"], "max_iterations": 20})
    assert started.status_code == 202, started.text
    state = await wait_done(api, started.json()["task_id"], within_s=120)
    assert state["status"] == "completed", state.get("error")

    sent = scripted_llm.requests(model=model)
    assert [r for r in sent if r.get("status") != 200] == []
    assert max(r["prompt_tokens"] + r["body"]["max_tokens"] for r in sent) <= 5000
