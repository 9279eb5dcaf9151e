"""`python -m refloop.worker.health`: exit 0 while a worker of this host polls the task
queue (the compose file's health check of the worker service), 1 otherwise."""

from __future__ import annotations

import asyncio
import sys

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from refloop.runtime.client import connect
from refloop.settings import load_settings


async def polled_here() -> bool:
    settings = load_settings()
    if not settings.temporal_address:
        return False
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    described = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=settings.temporal_namespace,
        task_queue=TaskQueue(name=settings.task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    host = settings.refloop_host_id  # default: the machine's name
    # A worker's identity starts "<pid>@<host id>" (then the store it writes to).
    return any(poller.identity.split(" ", 1)[0].endswith(f"@{host}")
               for poller in described.pollers)


def main() -> None:
    try:
        healthy = asyncio.run(asyncio.wait_for(polled_here(), 8))
    except Exception as err:  # noqa: BLE001 (a health probe answers, never raises)
        print(f"unhealthy: {type(err).__name__}", file=sys.stderr)
        healthy = False
    sys.exit(0 if healthy else 1)


if __name__ == "__main__":
    main()
