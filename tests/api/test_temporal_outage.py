"""When Temporal cannot answer, the API says so (503, retry) and changes nothing; a closed
code review reads in refloop's own words, never Temporal's status spelling."""

from __future__ import annotations

import asyncio

import httpx
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RetryConfig

from refloop.api.main import create_app
from refloop.runtime.net import free_port
from refloop.store.db import TaskRecord
from refloop.worker.temporal_server import EmbeddedTemporal

REVIEW_BODY = {"review_type": "snippet", "content": "eval(x)", "output_format": "simple"}


async def test_a_temporal_outage_is_a_503_and_the_row_is_left_as_it_was(api_settings,
                                                                      tmp_path, workspace):
    server = EmbeddedTemporal(tmp_path / "temporal", port=free_port(), ui_port=None,
                              persistent=False)
    # Few client-side retries: the outage is certain, only the answer is under test.
    own_client = await Client.connect(
        await server.start(), data_converter=pydantic_data_converter,
        retry_config=RetryConfig(max_retries=1, max_elapsed_time_millis=1000))
    app = create_app(api_settings, client=own_client)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as api:
            started = await api.post("/code-reviews", json={
                **REVIEW_BODY, "working_directory": str(workspace)})
            assert started.status_code == 202
            task_id = started.json()["task_id"]
            server.stop()  # Temporal goes away under the running review

            response = await api.get(f"/code-reviews/{task_id}")
            assert response.status_code == 503, response.text
            assert "Temporal did not answer" in response.json()["detail"]
            assert response.headers["retry-after"] == "5"
            cancel = await api.post(f"/tasks/{task_id}/cancel")
            assert cancel.status_code == 503, cancel.text
    finally:
        server.stop()
    row = app.state.store.get(TaskRecord, task_id)
    assert row.status == "queued" and row.error is None  # not marked lost, nothing lost


async def test_a_terminated_review_reads_failed_with_the_reason(api, client, workspace):
    started = await api.post("/code-reviews", json={
        **REVIEW_BODY, "working_directory": str(workspace)})
    assert started.status_code == 202
    task_id, workflow_id = started.json()["task_id"], started.json()["workflow_id"]
    await client.get_workflow_handle(workflow_id).terminate("operator stopped it")
    for _ in range(100):
        state = (await api.get(f"/code-reviews/{task_id}")).json()
        if state["status"] != "running":
            break
        await asyncio.sleep(0.05)
    assert state["status"] == "failed"  # Temporal would say "terminated"
    assert state["error"] == "the workflow was terminated"
