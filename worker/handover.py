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

from temporalio.client import Client, WorkflowUpdateFailedError
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
RUNNING = f"WorkflowType = '{AGENT_WORKFLOW}' AND ExecutionStatus = 'Running'"
PARKED = f"{RUNNING} AND {visibility.STATUS.name} = '{HANDED_OVER}'"
NOT_PARKED = f"{RUNNING} AND {visibility.STATUS.name} != '{HANDED_OVER}'"


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


async def take_over(client: Client, build: str) -> int:
    """Signal every task another build handed over: they go on on this build. Returns how
    many were signalled (a task handed over by this build ignores it)."""
    taken = 0
    for workflow_id in await _ids(client, PARKED):
        with contextlib.suppress(RPCError):  # ended meanwhile
            await client.get_workflow_handle(workflow_id).signal(
                TAKE_OVER_SIGNAL, TakeOver(build=build))
            taken += 1
    return taken


def taking_over(client: Client, build: str, every_s: float
                ) -> contextlib.AbstractAsyncContextManager[None]:
    """While a worker runs: take over handed-over tasks at its start and every `every_s`
    (a drain may end after this worker started)."""

    async def loop() -> None:
        while True:
            try:
                taken = await take_over(client, build)
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


async def drain(client: Client, build: str, timeout_s: float,
                poll_s: float = 1.0) -> DrainReport:
    """Ask every running task that is not parked to hand over from `build`, then wait up
    to `timeout_s` until none is left running unparked."""
    report = DrainReport()
    deadline = time.monotonic() + timeout_s
    for workflow_id in await _ids(client, NOT_PARKED):
        handle = client.get_workflow_handle(workflow_id)
        try:
            # A task whose workflow does not answer (its worker gone, a task failing) is
            # reported, not waited for past the drain's own bound.
            await asyncio.wait_for(handle.execute_update(
                HAND_OVER_UPDATE, HandOverRequest(build=build), result_type=str),
                max(deadline - time.monotonic(), 1.0))
            report.asked.append(workflow_id)
        except WorkflowUpdateFailedError as err:
            report.refused[workflow_id] = str(err.cause or err)
        except RPCError as err:  # ended meanwhile
            report.refused[workflow_id] = err.message
        except TimeoutError:
            report.refused[workflow_id] = "its workflow did not answer in time"
    while True:
        left = set(await _ids(client, NOT_PARKED)) & set(report.asked)
        if not left or time.monotonic() >= deadline:
            report.still_running = sorted(left)
            return report
        await asyncio.sleep(poll_s)
