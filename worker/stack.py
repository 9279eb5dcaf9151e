"""The embedded stack: Temporal (embedded or TEMPORAL_ADDRESS), the model endpoint
(scripted when OPENAI_BASE_URL is unset) and a worker, in one process."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib import resources

from temporalio.client import Client

from refloop.llm.scripted import ScriptedLLMServer
from refloop.settings import Settings
from refloop.worker.main import build_worker, connect
from refloop.worker.temporal_server import EmbeddedTemporal

log = logging.getLogger("refloop.stack")

DEMO_SCENARIO = "demo.yaml"


def demo_scenario_path() -> str:
    return str(resources.files("refloop") / "scenarios" / DEMO_SCENARIO)


@contextlib.contextmanager
def model_endpoint(settings: Settings) -> Iterator[Settings]:
    """Settings with a model endpoint: the configured one, or the scripted offline model."""
    if not settings.uses_scripted_model:
        yield settings
        return
    server = ScriptedLLMServer(demo_scenario_path())
    url = server.start()
    log.warning(
        "OPENAI_BASE_URL is unset: using the SCRIPTED offline model at %s (scenario %s). "
        "Its answers are canned test-double output, not a real model.",
        url,
        DEMO_SCENARIO,
    )
    try:
        yield settings.model_copy(update={"openai_base_url": url})
    finally:
        server.stop()


@dataclass
class Stack:
    client: Client
    settings: Settings
    temporal: EmbeddedTemporal | None


@contextlib.asynccontextmanager
async def embedded_stack(settings: Settings, with_worker: bool = True) -> AsyncIterator[Stack]:
    temporal = None
    address = settings.temporal_address
    if address is None:
        temporal = EmbeddedTemporal(settings.refloop_data_dir, settings.refloop_temporal_port,
                                    settings.refloop_ui_port)
        address = await temporal.start()
    try:
        with model_endpoint(settings) as effective:
            client = await connect(address, settings.temporal_namespace)
            if with_worker:
                async with build_worker(client, effective):
                    yield Stack(client, effective, temporal)
            else:
                yield Stack(client, effective, temporal)
    finally:
        if temporal is not None:
            temporal.stop()
