"""Which data dir a Temporal server belongs to, and which store a queue's workers use.

An embedded dev server carries its data dir's owner id as a namespace the server answers
(`refloop-owner-<id>`, described with the data dir's path): a process of another data dir
sees it is not its own and never joins it. Workers announce their store in their identity
(`refloop-store=<id>`), so a worker of another store polling the same queue can be seen
(DescribeTaskQueue) and reported: tasks would split between the two stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

from temporalio.client import Client

from refloop.runtime.background import in_background

log = logging.getLogger("refloop.ownership")

OWNER_FILE = "owner.id"
OWNER_NAMESPACE_PREFIX = "refloop-owner-"
STORE_TAG = "refloop-store="
STORE_OF_IDENTITY = re.compile(re.escape(STORE_TAG) + r"([0-9a-f]+)")
# A probe of a port must not hang a command's start on something that is not Temporal.
PROBE_TIMEOUT_S = 5.0
# The first look at the queue waits for the others' pollers to show. The gaps then double
# up to a slow watch: a worker started just after this one is seen within seconds, not at
# the next minute.
FIRST_LOOK_AFTER_S = 2.0
LOOK_EVERY_S = 60.0


def owner_id(data_dir: Path) -> str:
    """The data dir's owner id, made once: two processes racing both read the winner's."""
    path = data_dir / OWNER_FILE
    with contextlib.suppress(FileNotFoundError):
        text = path.read_text().strip()
        if text:
            return text
    data_dir.mkdir(parents=True, exist_ok=True)
    draft = data_dir / f"{OWNER_FILE}.{os.getpid()}.tmp"
    draft.write_text(uuid.uuid4().hex[:16] + "\n")
    try:
        os.link(draft, path)  # atomic and never replaces: the first writer wins
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text().strip()


def owner_namespace(owner: str) -> str:
    return OWNER_NAMESPACE_PREFIX + owner


def owner_description(data_dir: Path) -> str:
    return json.dumps({"data_dir": str(data_dir.resolve())})


async def _connect(address: str) -> Client | None:
    """A client of whatever answers on `address`, or None when it is not Temporal."""
    try:
        return await asyncio.wait_for(Client.connect(address), PROBE_TIMEOUT_S)
    except (RuntimeError, OSError, TimeoutError):
        return None


async def belongs(address: str, owner: str) -> bool:
    """Whether the Temporal server on `address` carries this owner's marker."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.service import RPCError

    client = await _connect(address)
    if client is None:
        return False
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=owner_namespace(owner)))
    except RPCError:
        return False
    return True


async def owning_data_dir(address: str) -> str | None:
    """The data dir whose embedded server answers on `address`, as its marker names it."""
    from temporalio.api.workflowservice.v1 import ListNamespacesRequest
    from temporalio.service import RPCError

    client = await _connect(address)
    if client is None:
        return None
    try:
        listed = await client.workflow_service.list_namespaces(ListNamespacesRequest())
    except RPCError:
        return None
    for namespace in listed.namespaces:
        if namespace.namespace_info.name.startswith(OWNER_NAMESPACE_PREFIX):
            with contextlib.suppress(ValueError, AttributeError):
                return json.loads(namespace.namespace_info.description)["data_dir"]
    return None


async def claim(address: str, owner: str, data_dir: Path) -> None:
    """Mark the server on `address` as this data dir's: its namespace (made at launch, or
    here for a server an older refloop started) describes the data dir's path."""
    from datetime import timedelta

    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.namespace.v1 import UpdateNamespaceInfo
    from temporalio.api.workflowservice.v1 import (
        RegisterNamespaceRequest,
        UpdateNamespaceRequest,
    )
    from temporalio.service import RPCError, RPCStatusCode

    client = await Client.connect(address)
    name, description = owner_namespace(owner), owner_description(data_dir)
    try:
        await client.workflow_service.register_namespace(RegisterNamespaceRequest(
            namespace=name, description=description,
            workflow_execution_retention_period=Duration(
                seconds=int(timedelta(days=1).total_seconds()))))
    except RPCError as err:
        if err.status != RPCStatusCode.ALREADY_EXISTS:
            raise
        await client.workflow_service.update_namespace(UpdateNamespaceRequest(
            namespace=name, update_info=UpdateNamespaceInfo(description=description)))


def worker_identity(store: str, host: str | None = None) -> str:
    """`<pid>@<host> refloop-store=<id>`: the SDK's default, plus the store it writes to
    (`host`: the worker's host id, REFLOOP_HOST_ID, instead of the machine's name)."""
    return f"{os.getpid()}@{host or socket.gethostname()} {STORE_TAG}{store}"


def foreign_pollers(identities: Iterable[str], store: str) -> list[str]:
    """The identities announcing a store other than `store` (others cannot be told)."""
    foreign = []
    for identity in identities:
        found = STORE_OF_IDENTITY.search(identity)
        if found and found.group(1) != store:
            foreign.append(identity)
    return foreign


async def queue_pollers(client: Client, queue: str) -> list[str]:
    """Identities of the workflow and activity pollers the server has seen on `queue`."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    identities: list[str] = []
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        described = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue),
            task_queue_type=kind))
        identities += [p.identity for p in described.pollers if p.identity not in identities]
    return identities


def look_delays(first_after_s: float = FIRST_LOOK_AFTER_S,
                every_s: float = LOOK_EVERY_S) -> Iterator[float]:
    """The waits before each look at the queue: `first_after_s`, doubling up to `every_s`."""
    delay = first_after_s
    while True:
        yield delay
        delay = min(delay * 2, every_s)


async def watch_queue(client: Client, queue: str, store: str,
                      first_after_s: float = FIRST_LOOK_AFTER_S,
                      every_s: float = LOOK_EVERY_S) -> None:
    """Report, loudly and once each, workers of another store polling `queue`."""
    from temporalio.service import RPCError

    reported: set[str] = set()
    for delay in look_delays(first_after_s, every_s):
        await asyncio.sleep(delay)
        with contextlib.suppress(RPCError):  # a server restarting: look again later
            for identity in foreign_pollers(await queue_pollers(client, queue), store):
                if identity not in reported:
                    reported.add(identity)
                    log.error(
                        "!! task queue %s is also polled by a worker of ANOTHER store "
                        "(%s; this worker: %s%s). Their tasks would split between the two "
                        "databases (rows in one, blobs missing in the other): give each "
                        "store its own REFLOOP_TASK_QUEUE, or one DATABASE_URL to all.",
                        queue, identity, STORE_TAG, store)


@contextlib.asynccontextmanager
async def watching(client: Client, queue: str, store: str) -> AsyncIterator[None]:
    """Watch `queue` for workers of another store while the block runs."""
    async with in_background(watch_queue(client, queue, store)):
        yield
