"""A Temporal client as every refloop process makes it: the pydantic data converter, the
tracing interceptor (one trace per task; workers built on the client inherit it) and a
runtime whose core SDK logs only errors."""

from __future__ import annotations

import functools

from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

from refloop.runtime.telemetry import configure_tracing

DATA_CONVERTER: DataConverter = pydantic_data_converter

# Core SDK warnings would drown the CLI's progress.
RUNTIME = Runtime(
    telemetry=TelemetryConfig(
        logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    )
)


@functools.cache
def tracing_interceptor() -> TracingInterceptor:
    """One instance: the client and its workers share it, so a worker never adds it twice."""
    return TracingInterceptor()


def client_interceptors() -> list[ClientInterceptor]:
    return [tracing_interceptor()]


async def connect(address: str, namespace: str) -> Client:
    configure_tracing()
    return await Client.connect(
        address, namespace=namespace, data_converter=DATA_CONVERTER, runtime=RUNTIME,
        interceptors=client_interceptors(),
    )
