"""Where a step's milliseconds go, from one task's event history, the scripted model's own
timestamps, the dev server's metrics and the worker's blob store: pure functions over
what a run left behind (bench.bench_steps runs the tasks)."""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.history.v1 import History

from refloop.contract import activity_calls
from refloop.contract.activity_io import RunToolInput, ToolResult
from refloop.runtime.client import DATA_CONVERTER

MODEL_PREFIX = "refloop.llm."


def model_overhead(requests: list[dict[str, Any]]) -> tuple[float, float, int]:
    """(span from the first request's arrival to the last answer, the model's own time in
    it, calls): the ratio span / model time is the orchestration's overhead."""
    if not requests:
        return 0.0, 0.0, 0
    span = max(r["answered"] for r in requests) - min(r["time"] for r in requests)
    return span, sum(r["answered"] - r["time"] for r in requests), len(requests)


def _ms(later: Any, earlier: Any) -> float:
    return (later.ToDatetime() - earlier.ToDatetime()).total_seconds() * 1000


@dataclass
class HistoryTimes:
    """Milliseconds summed over one run, by where they were spent."""

    workflow_tasks: int = 0
    wft_schedule_to_start: float = 0.0
    wft_start_to_close: float = 0.0
    activities: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    schedule_to_start: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    start_to_close: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    local_activities: int = 0
    events: int = 0


def activity_kind(name: str) -> str:
    if name.startswith(MODEL_PREFIX):
        return "model"
    if name.startswith(activity_calls.TOOL_PREFIX):
        return "tool"
    return name.rsplit(".", 1)[-1]


def history_times(history: History) -> HistoryTimes:
    times = HistoryTimes(events=len(history.events))
    by_id = {event.event_id: event for event in history.events}
    scheduled_wft = None
    started_wft = None
    for event in history.events:
        kind = event.WhichOneof("attributes")
        if kind == "workflow_task_scheduled_event_attributes":
            scheduled_wft = event
        elif kind == "workflow_task_started_event_attributes" and scheduled_wft is not None:
            started_wft = event
            times.wft_schedule_to_start += _ms(event.event_time, scheduled_wft.event_time)
        elif kind == "workflow_task_completed_event_attributes" and started_wft is not None:
            times.workflow_tasks += 1
            times.wft_start_to_close += _ms(event.event_time, started_wft.event_time)
        elif kind == "marker_recorded_event_attributes" \
                and event.marker_recorded_event_attributes.marker_name == "core_local_activity":
            times.local_activities += 1
        elif kind == "activity_task_completed_event_attributes":
            attrs = event.activity_task_completed_event_attributes
            scheduled = by_id[attrs.scheduled_event_id]
            started = by_id[attrs.started_event_id]
            name = activity_kind(
                scheduled.activity_task_scheduled_event_attributes.activity_type.name)
            times.activities[name] += 1
            times.schedule_to_start[name] += _ms(started.event_time, scheduled.event_time)
            times.start_to_close[name] += _ms(event.event_time, started.event_time)
    return times


def step_history(history: History) -> tuple[float, float]:
    """(events, bytes) of the history per step, medians: a step runs from a model call's
    scheduling to the next one's, and holds a tool call (the final answer's and the
    planning's do not)."""
    events, sizes = [], []
    segment: list[Any] = []
    with_tool = False
    for event in [*history.events, None]:
        name = (event.activity_task_scheduled_event_attributes.activity_type.name
                if event is not None
                and event.HasField("activity_task_scheduled_event_attributes") else "")
        kind = activity_kind(name) if name else ""
        if event is None or kind == "model":
            if segment and with_tool:
                events.append(len(segment))
                sizes.append(sum(e.ByteSize() for e in segment))
            segment, with_tool = [], False
        if event is not None:
            segment.append(event)
            with_tool = with_tool or kind == "tool"
    return median([float(n) for n in events]), median([float(n) for n in sizes])


def _types(name: str) -> tuple[type | None, type | None]:
    """An activity's argument and result types, by its registered name."""
    if name.startswith(activity_calls.TOOL_PREFIX):
        return RunToolInput, ToolResult
    for call in activity_calls.FIXED:
        if call.name == name:
            return call.arg_type, call.result_type
    return None, None


def payload_seconds(history: History, repeat: int = 3) -> tuple[float, int]:
    """(seconds to decode and encode again every activity payload of the run with the
    worker's converter, bytes): each crosses the converter once each way in the run."""
    converter = DATA_CONVERTER.payload_converter
    work: list[tuple[Any, type | None]] = []
    by_id = {event.event_id: event for event in history.events}
    size = 0
    for event in history.events:
        kind = event.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            attrs = event.activity_task_scheduled_event_attributes
            arg, _ = _types(attrs.activity_type.name)
            payloads = list(attrs.input.payloads)
        elif kind == "activity_task_completed_event_attributes":
            attrs = event.activity_task_completed_event_attributes
            name = by_id[attrs.scheduled_event_id].activity_task_scheduled_event_attributes \
                .activity_type.name
            _, arg = _types(name)
            payloads = list(attrs.result.payloads)
        else:
            continue
        for payload in payloads:
            size += payload.ByteSize()
            work.append((payload, arg))
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for payload, kind in work:
            value = converter.from_payloads([payload], [kind] if kind else None)[0]
            converter.to_payloads([value])
        best = min(best, time.perf_counter() - started)
    return best, size


METRIC = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.e+-]+)$')


def parse_metrics(text: str, names: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """{(metric, operation): value} summed over other labels, for the named metrics."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in text.splitlines():
        match = METRIC.match(line)
        if not match or match.group(1) not in names:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if match.group(1).startswith("service_") and labels.get("service_name") != "frontend":
            continue  # the history service reports the same calls again
        out[(match.group(1), labels.get("operation", ""))] += float(match.group(3))
    return out


def metrics_delta(before: dict, after: dict) -> dict[tuple[str, str], float]:
    return {key: after[key] - before.get(key, 0.0) for key in after
            if after[key] - before.get(key, 0.0)}


@dataclass
class Timer:
    """Seconds and calls of the wrapped methods."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


@contextmanager
def timed_methods(cls: type, names: list[str], timer: Timer) -> Iterator[Timer]:
    """Time calls of `cls.<name>` while inside (the bench's own instrumentation)."""
    originals: dict[str, Callable[..., Any]] = {name: getattr(cls, name) for name in names}

    def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                timer.seconds[name] += time.perf_counter() - started
                timer.calls[name] += 1
        return timed

    for name, method in originals.items():
        setattr(cls, name, wrap(name, method))
    try:
        yield timer
    finally:
        for name, method in originals.items():
            setattr(cls, name, method)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
