"""Upgrading with tasks in flight (`docs/operations.md`): the build a worker runs, the
hand-over `refloop drain` asks of every running task, and the take-over a worker of a new
build gives every task another build handed over."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

from refloop.contract import visibility
from refloop.contract.handover import (
    HAND_OVER_UPDATE,
    HANDED_OVER,
    TAKE_OVER_SIGNAL,
    HandOverRequest,
    TakeOver,
)
from refloop.runtime.background import in_background

log = logging.getLogger("refloop.worker")

AGENT_WORKFLOW = "AgentTaskWorkflow"
# Updates in flight at once, and how long one task may take to answer its own.
CONCURRENT_UPDATES = 32
UPDATE_ANSWER_S = 20.0


def running(task_queue: str, parked: bool) -> str:
    """The visibility query of the running agent tasks of one deployment's task queue,
    parked (handed over) or not."""
    queue = task_queue.replace("'", "")
    op = "=" if parked else "!="
    return (f"WorkflowType = '{AGENT_WORKFLOW}' AND ExecutionStatus = 'Running' AND "
            f"TaskQueue = '{queue}' AND {visibility.STATUS.name} {op} '{HANDED_OVER}'")


def workflow_build_id() -> str:
    """The build of the workflow code: a digest of the workflows and the contract they
    carry (their state crosses the hand-over), so two installs of the same code agree."""
    from refloop import contract, workflows

    digest = hashlib.sha256()
    for package in (workflows, contract):
        for path in sorted(Path(next(iter(package.__path__))).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"refloop-{digest.hexdigest()[:12]}"


async def _ids(client: Client, query: str) -> list[str]:
    return [execution.id async for execution in client.list_workflows(query)]


async def take_over(client: Client, build: str, task_queue: str) -> int:
    """Signal every task of the queue another build handed over: they go on on this build.
    Returns how many were signalled (a task handed over by this build ignores it)."""
    taken = 0
    for workflow_id in await _ids(client, running(task_queue, parked=True)):
        with contextlib.suppress(RPCError):  # ended meanwhile
            await client.get_workflow_handle(workflow_id).signal(
                TAKE_OVER_SIGNAL, TakeOver(build=build))
            taken += 1
    return taken


def taking_over(client: Client, build: str, task_queue: str, every_s: float
                ) -> contextlib.AbstractAsyncContextManager[None]:
    """While a worker runs: take over handed-over tasks at its start and every `every_s`
    (a drain may end after this worker started)."""

    async def loop() -> None:
        while True:
            try:
                taken = await take_over(client, build, task_queue)
                if taken:
                    log.warning("took over %d task(s) handed over by another build", taken)
            except RPCError as err:
                log.warning("could not look for handed-over tasks: %s", err)
            await asyncio.sleep(every_s)

    return in_background(loop())


@dataclass
class DrainReport:
    asked: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # id -> why
    still_running: list[str] = field(default_factory=list)  # not handed over in time


async def drain(client: Client, build: str, task_queue: str, timeout_s: float,
                poll_s: float = 1.0) -> DrainReport:
    """Ask every running task of the queue that is not parked to hand over from `build`,
    then wait up to `timeout_s` until none is left running unparked."""
    report = DrainReport()
    deadline = time.monotonic() + timeout_s
    gate = asyncio.Semaphore(CONCURRENT_UPDATES)

    async def ask(workflow_id: str) -> None:
        handle = client.get_workflow_handle(workflow_id)
        async with gate:
            try:
                # A task whose workflow does not answer (no worker polls its queue, its
                # workflow task fails) is reported, not waited for.
                await asyncio.wait_for(handle.execute_update(
                    HAND_OVER_UPDATE, HandOverRequest(build=build), result_type=str),
                    min(UPDATE_ANSWER_S, max(deadline - time.monotonic(), 1.0)))
                report.asked.append(workflow_id)
            except WorkflowUpdateFailedError as err:
                report.refused[workflow_id] = str(err.cause or err)
            except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
                report.refused[workflow_id] = "its workflow did not answer in time (is a " \
                    "worker of this build polling its queue?)"
            except RPCError as err:  # ended meanwhile
                report.refused[workflow_id] = err.message

    await asyncio.gather(*(ask(workflow_id) for workflow_id
                           in await _ids(client, running(task_queue, parked=False))))
    while True:
        left = set(await _ids(client, running(task_queue, parked=False))) & set(report.asked)
        if not left or time.monotonic() >= deadline:
            report.still_running = sorted(left)
            return report
        await asyncio.sleep(poll_s)
