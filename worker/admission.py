"""Admission: how much work one worker takes on at once, sized to the CPUs it may use.

A worker that accepts more than its CPUs can run does not go faster: its event loop, which
also sends every heartbeat, falls behind, a live call misses its heartbeat timeout and is
retried (a model call paid for twice, a tool's attempts used up). With bounded slots the
rest of the work waits in Temporal's task queue, where waiting costs nothing.

Fixed counts, not the SDK's resource-based tuner: that tuner reads the whole machine's CPU,
so a neighbour's load (a CI runner, the sandboxed commands of this very worker) would hold
the worker at its minimum slots whatever its own share.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from refloop.settings import Settings

# Activities mostly wait on a model endpoint, the database or a command: a CPU keeps about
# this many busy (a scripted model answering in 300 ms costs a worker about 46 ms a call).
ACTIVITIES_PER_CPU = 16
# Workflow tasks hold the GIL while they run: more than a few a CPU only queue inside the
# process, where they starve the event loop instead of waiting on the server.
WORKFLOW_TASKS_PER_CPU = 2
MIN_WORKFLOW_TASKS = 2  # the sticky and the shared workflow queue are polled at once


@dataclass(frozen=True)
class Slots:
    """Work one worker runs at once on each of its task queues."""

    activities: int
    workflow_tasks: int

    def worker_kwargs(self) -> dict[str, Any]:
        """The SDK's `Worker` arguments (local activities share the activity count)."""
        return {
            "max_concurrent_activities": self.activities,
            "max_concurrent_local_activities": self.activities,
            "max_concurrent_workflow_tasks": self.workflow_tasks,
        }


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. `taskset` or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_slots(max_activities: int, max_workflow_tasks: int, cpus: int) -> Slots:
    """The settings' counts, each 0 replaced by its size for `cpus`."""
    return Slots(
        activities=max_activities or ACTIVITIES_PER_CPU * cpus,
        workflow_tasks=max_workflow_tasks or max(MIN_WORKFLOW_TASKS,
                                                 WORKFLOW_TASKS_PER_CPU * cpus),
    )


def slots_for(settings: Settings) -> Slots:
    return worker_slots(settings.refloop_worker_max_activities,
                        settings.refloop_worker_max_workflow_tasks, usable_cpus())


# A worker holds the live state of many tasks, and with Python's default thresholds its
# collector re-scans all of it: 7% of its CPU at 200 concurrent tasks (`python -m
# bench.bench_scale --levels 200` prints the collector's seconds). What start-up made is
# frozen out of the scans, and young and full collections run less often.
COLLECTOR_THRESHOLDS = (7_000, 20, 20)


@contextlib.contextmanager
def collector_tuned() -> Iterator[None]:
    """While a worker serves: start-up's objects frozen, the collector's thresholds raised;
    both as they were afterwards."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
