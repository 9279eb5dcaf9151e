"""The embedded stack: Temporal (embedded or TEMPORAL_ADDRESS), the model endpoint
(scripted when OPENAI_BASE_URL is unset) and a worker, in one process."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from temporalio.client import Client

from refloop.runtime.client import connect
from refloop.settings import Settings
from refloop.worker.main import serving
from refloop.worker.model_endpoint import model_endpoint
from refloop.worker.search_attributes import ensure_search_attributes
from refloop.worker.temporal_server import EmbeddedTemporal

log = logging.getLogger("refloop.stack")

@dataclass
class Stack:
    client: Client
    settings: Settings
    temporal: EmbeddedTemporal | None


@contextlib.asynccontextmanager
async def embedded_stack(settings: Settings, with_worker: bool = True,
                         long_lived: bool = False) -> AsyncIterator[Stack]:
    """`long_lived` (`refloop up`): the worker warms the search up once it polls."""
    temporal = None
    address = settings.temporal_address
    if address is None:
        temporal = EmbeddedTemporal(
            settings.refloop_data_dir, settings.refloop_temporal_port, settings.refloop_ui_port,
            pinned=settings.refloop_temporal_port_pinned)
        address = await temporal.start()
    try:
        with model_endpoint(settings) as effective:
            client = await connect(address, settings.temporal_namespace)
            if with_worker:
                await ensure_search_attributes(client, settings.temporal_namespace)
                async with serving(client, effective, warm_search=long_lived):
                    yield Stack(client, effective, temporal)
            else:
                yield Stack(client, effective, temporal)
    finally:
        if temporal is not None:
            temporal.stop()
