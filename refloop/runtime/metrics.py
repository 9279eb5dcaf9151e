"""Metrics an operator can alert on, exported by the Temporal SDK's own runtime: its worker
metrics (task slots, polls, schedule-to-start latency...) and refloop's, from one place.

- `REFLOOP_METRICS_ADDRESS` (host:port): a Prometheus scrape endpoint at /metrics;
- else `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (or `OTEL_EXPORTER_OTLP_ENDPOINT`): OTLP,
  gRPC, or HTTP when `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` is `http/protobuf`.
One exporter per process (the SDK's runtime takes one): with both set, the scrape endpoint
wins and a collector scrapes it. Neither: no metrics, at no cost.

refloop's own:
- `refloop_tasks{status}`: tasks by stored status, waits included (waiting_approval,
  waiting_for_host, waiting_for_model), and `refloop_oldest_wait_seconds{status}`: how long
  the oldest task in each open status has been in it (for "waiting > 10 min" alerts);
  counted from the database every REFLOOP_METRICS_EVERY_S by each worker;
- `refloop_model_requests{endpoint,purpose,outcome}`, `refloop_model_request_seconds
  {endpoint}`, `refloop_model_tokens{endpoint,kind}`: every model request, from the gateway;
- `refloop_model_cost_usd_total{model,purpose}`: USD spent on answered model requests at
  REFLOOP_MODEL_PRICES, since the process started (a float gauge that only grows: the
  SDK's counters count integers).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from temporalio.common import MetricMeter

from refloop.runtime.client import RUNTIME, metrics_exporter

log = logging.getLogger("refloop.metrics")
OPEN_WAITS = ("queued", "running", "waiting_approval", "waiting_for_host", "waiting_for_model",
              "waiting_for_budget")


class Instruments:
    """refloop's instruments on the runtime's meter (a no-op meter without an exporter)."""

    def __init__(self, meter: MetricMeter) -> None:
        self.tasks = meter.create_gauge("refloop_tasks", "tasks by stored status")
        self.oldest_wait = meter.create_gauge_float(
            "refloop_oldest_wait_seconds",
            "seconds the oldest task in each open status has been in it", "s")
        self.requests = meter.create_counter(
            "refloop_model_requests", "model requests by endpoint, purpose and outcome")
        self.latency = meter.create_histogram_float(
            "refloop_model_request_seconds", "model request latency by endpoint", "s")
        self.tokens = meter.create_counter(
            "refloop_model_tokens", "model tokens by endpoint and kind (prompt, completion)")
        self.cost = meter.create_gauge_float(
            "refloop_model_cost_usd_total", "USD spent on model requests by model and purpose "
            "since the process started", "USD")
        self.cost_totals: dict[tuple[str, str], float] = {}


@functools.cache
def instruments() -> Instruments:
    return Instruments(RUNTIME.metric_meter)


def model_request(endpoint: str, purpose: str, outcome: str, seconds: float,
                  prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
    """One model request as the gateway saw it; never raises (metrics must not fail it)."""
    with contextlib.suppress(Exception):
        meter = instruments()
        meter.requests.add(1, {"endpoint": endpoint, "purpose": purpose, "outcome": outcome})
        meter.latency.record(seconds, {"endpoint": endpoint})
        if prompt_tokens:
            meter.tokens.add(prompt_tokens, {"endpoint": endpoint, "kind": "prompt"})
        if completion_tokens:
            meter.tokens.add(completion_tokens, {"endpoint": endpoint, "kind": "completion"})


def model_cost(model: str, purpose: str, cost_usd: float) -> None:
    """An answered request's cost added to its (model, purpose) total; never raises."""
    with contextlib.suppress(Exception):
        meter = instruments()
        key = (model, purpose)
        total = round(meter.cost_totals.get(key, 0.0) + cost_usd, 9)
        meter.cost_totals[key] = total
        meter.cost.set(total, {"model": model, "purpose": purpose})


def record_task_counts(counts: dict[str, tuple[int, float | None]]) -> None:
    """status -> (tasks, seconds the oldest has been in it): every open status is set,
    0 when none is in it, so a wait that ended reads 0, not its last value."""
    meter = instruments()
    for status in sorted({*OPEN_WAITS, *counts}):
        number, oldest = counts.get(status, (0, None))
        meter.tasks.set(number, {"status": status})
        if status in OPEN_WAITS:
            meter.oldest_wait.set(oldest or 0.0, {"status": status})


@contextlib.asynccontextmanager
async def counting_tasks(store: Any, every_s: float) -> AsyncIterator[None]:
    """While a worker runs (metrics exported): the task gauges from the database."""
    if metrics_exporter() is None:
        yield
        return

    async def loop() -> None:
        while True:
            try:
                record_task_counts(await asyncio.to_thread(store.count_by_status))
            except Exception as err:  # noqa: BLE001 (a database outage: the next round)
                log.warning("task metrics not counted: %s", str(err).splitlines()[0][:200])
            await asyncio.sleep(every_s)

    counting = asyncio.create_task(loop())
    try:
        yield
    finally:
        counting.cancel()
