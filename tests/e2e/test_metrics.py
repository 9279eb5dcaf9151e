"""Metrics an operator can alert on: `refloop up` with REFLOOP_METRICS_ADDRESS serves a
Prometheus scrape endpoint with the Temporal SDK's worker metrics and refloop's own, and a
scrape during a wait for approval shows the task waiting (and for how long), beside the
model requests that led there."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from refloop.runtime.net import free_port
from tests.api.test_api import writing_scenario
from tests.e2e.test_up_restart import Up

pytestmark = pytest.mark.slow


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        match = re.match(rf"{name}\{{([^}}]*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            return float(match.group(2))
    return None


async def test_a_scrape_during_a_wait_for_approval_shows_it(scripted_llm, tmp_path: Path):
    metrics_port = free_port()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = writing_scenario(scripted_llm)
    up = Up(tmp_path, scripted_llm.base_url, REFLOOP_METRICS_ADDRESS=f"127.0.0.1:{metrics_port}",
            REFLOOP_METRICS_EVERY_S="0.5", REFLOOP_WORKSPACE_ROOTS=str(tmp_path),
            REFLOOP_MODEL_PRICES=json.dumps({model: {"input_usd_per_mtok": 1000,
                                                     "output_usd_per_mtok": 1000}}))
    try:
        await asyncio.to_thread(up.start)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{up.api_port}",
                                     timeout=30) as http:
            session = (await http.post("/agent/interactive/start", json={
                "workspace": str(workspace), "model": model,
                "approval_mode": "confirm_writes"})).json()["session_id"]
            task = (await http.post("/agent/interactive/task", json={
                "session_id": session, "task": "write r.md"})).json()["task_id"]
            deadline = time.monotonic() + 60
            scraped = ""
            while time.monotonic() < deadline:
                scraped = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
                if sample(scraped, "refloop_tasks", status="waiting_approval") == 1:
                    break
                await asyncio.sleep(0.5)
            assert sample(scraped, "refloop_tasks", status="waiting_approval") == 1, scraped
            assert (await http.get(f"/tasks/{task}")).json()["status"] == "waiting_approval"
            deadline = time.monotonic() + 30
            while not (sample(scraped, "refloop_oldest_wait_seconds",
                              status="waiting_approval") or 0) > 0 \
                    and time.monotonic() < deadline:  # the wait has lasted a while
                await asyncio.sleep(0.25)
                scraped = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        waited = sample(scraped, "refloop_oldest_wait_seconds", status="waiting_approval")
        assert waited is not None and waited > 0
        # The model requests that led to the wait, by endpoint and purpose, with tokens.
        assert (sample(scraped, "refloop_model_requests", purpose="act", outcome="ok")
                or 0) >= 1
        assert (sample(scraped, "refloop_model_tokens", kind="prompt") or 0) > 0
        assert "refloop_model_request_seconds_bucket" in scraped
        # What they cost at the model's price, by model and purpose
        assert (sample(scraped, "refloop_model_cost_usd_total", model=model, purpose="act")
                or 0) > 0
        # The Temporal SDK's own worker metrics, from the same endpoint.
        assert "temporal_worker_task_slots_available" in scraped or \
            "temporal_request" in scraped, scraped[:2000]
    finally:
        up.cleanup()
