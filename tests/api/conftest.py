"""The API under test: the app in-process over ASGI, a worker on its own task queue."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from refloop.api.main import create_app
from refloop.worker.main import build_worker


@pytest.fixture
def api_settings(settings, task_queue):
    return settings.model_copy(update={"refloop_task_queue": task_queue,
                                       "enable_reflection": False})


@pytest.fixture
async def api(client, api_settings, task_queue) -> AsyncIterator[httpx.AsyncClient]:
    settings = api_settings
    app = create_app(settings, client=client)
    async with build_worker(client, settings, task_queue):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            http.app = app  # type: ignore[attr-defined]
            yield http
