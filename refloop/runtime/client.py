"""A Temporal client as every refloop process makes it: the pydantic data converter, the
tracing interceptor (one trace per task; workers built on the client inherit it), a
runtime whose core SDK logs only errors, and TLS when the standard TEMPORAL_TLS_* variables
ask for it (a worker on another machine than its Temporal server)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from datetime import timedelta

from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import (
    LoggingConfig,
    OpenTelemetryConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import TLSConfig

from refloop.runtime.converter import DATA_CONVERTER as LEAN_DATA_CONVERTER
from refloop.runtime.telemetry import configure_tracing

DATA_CONVERTER: DataConverter = LEAN_DATA_CONVERTER


def metrics_exporter() -> PrometheusConfig | OpenTelemetryConfig | None:
    """The runtime's exporter, from the environment (read once, at the first client)."""
    address = os.environ.get("REFLOOP_METRICS_ADDRESS")
    if address:
        return PrometheusConfig(bind_address=address, durations_as_seconds=True)
    url = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    http = protocol.startswith("http")
    if not url and base:  # the signal's path, as the OTLP exporters add it over HTTP
        url = f"{base.rstrip('/')}/v1/metrics" if http else base
    if url:
        return OpenTelemetryConfig(url=url, http=http,
                                   metric_periodicity=timedelta(seconds=10),
                                   durations_as_seconds=True)
    return None


def make_runtime() -> Runtime:
    """Core SDK warnings would drown the CLI's progress. Metrics (refloop/runtime/metrics.py)
    when configured; an exporter that cannot start (the scrape address taken by another
    process) is said and left out: metrics never stop a command."""
    quiet = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    exporter = metrics_exporter()
    if exporter is not None:
        try:
            return Runtime(telemetry=TelemetryConfig(logging=quiet, metrics=exporter))
        except Exception as err:  # noqa: BLE001 (the SDK raises a bare RuntimeError)
            logging.getLogger("refloop.metrics").error("metrics not exported: %s", err)
    return Runtime(telemetry=TelemetryConfig(logging=quiet))


RUNTIME = make_runtime()


@functools.cache
def tracing_interceptor() -> TracingInterceptor:
    """One instance: the client and its workers share it, so a worker never adds it twice."""
    return TracingInterceptor()


def client_interceptors() -> list[ClientInterceptor]:
    return [tracing_interceptor()]


def temporal_tls(env: Mapping[str, str] | None = None) -> bool | TLSConfig:
    """TLS to Temporal from the standard variables (the `temporal` CLI and the SDK's
    environment configuration read the same): TEMPORAL_TLS, TEMPORAL_TLS_SERVER_CA_CERT_PATH,
    TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_CLIENT_KEY_PATH, TEMPORAL_TLS_SERVER_NAME.
    None set: plain gRPC, as on one machine."""
    profile = ClientConfigProfile.load(disable_file=True, override_env_vars=env)
    return profile.tls.to_connect_tls_config() if profile.tls is not None else False


async def connect(address: str, namespace: str) -> Client:
    configure_tracing()
    return await Client.connect(
        address, namespace=namespace, data_converter=DATA_CONVERTER, runtime=RUNTIME,
        interceptors=client_interceptors(), tls=temporal_tls(),
    )
