"""Session-wide real Temporal server (the `temporal` CLI dev server, in memory, on free
ports), scripted model and DB URL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from refloop.net import free_port
from refloop.settings import Settings
from tests.constants import TEST_DATABASE_URL
from tests.llm_fixtures import scripted_llm  # noqa: F401  (session fixture)
from worker.main import connect
from worker.temporal_server import EmbeddedTemporal


@pytest.fixture(scope="session")
async def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    server = EmbeddedTemporal(tmp_path_factory.mktemp("temporal"), port=free_port(),
                              ui_port=None, persistent=False)
    address = await server.start()
    yield address
    server.stop()


@pytest.fixture(scope="session")
async def client(temporal_server: str) -> Client:
    return await connect(temporal_server, "default")


@pytest.fixture
def settings(scripted_llm, tmp_path: Path) -> Settings:  # noqa: F811
    return Settings(
        openai_base_url=scripted_llm.base_url,
        openai_api_key="test",
        database_url=TEST_DATABASE_URL,
        refloop_data_dir=tmp_path / "data",
        refloop_workspace_roots=str(tmp_path),
        # Indexing spawns an embedding process per task: only the semantic tests want it.
        refloop_semantic_index=False,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:8]}"
