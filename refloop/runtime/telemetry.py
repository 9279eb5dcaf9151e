"""OpenTelemetry: tracing follows the standard OTEL_* variables, and is off without them.

Temporal spans come from temporalio's TracingInterceptor (replay-safe: a replayed workflow
does not emit its spans again); model calls get GenAI spans from the gateway.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import trace

log = logging.getLogger("refloop.telemetry")
tracer = trace.get_tracer("refloop")


def configure_tracing() -> bool:
    """Export over OTLP when an endpoint is configured; True when exporting."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the exporter is not installed: "
                    "pip install 'refloop[otel]'")
        return False
    service = os.environ.get("OTEL_SERVICE_NAME", "refloop")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
