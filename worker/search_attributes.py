"""refloop's search attributes on the Temporal server a worker connects to.

Workflows upsert them (status, kind, session...): on a server that lacks them every
workflow task fails with `BadSearchAttributes` and the task hangs without a word, whoever
started it (refloop's client, the stock `temporal` CLI). The worker registers the missing
ones through the operator service at start; where it may not (a managed namespace, no
permission), it stops at once with the `temporal operator` commands to run.
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from refloop.contract.visibility import SEARCH_ATTRIBUTES

log = logging.getLogger("refloop.worker")
KINDS = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
         "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}


class SearchAttributesMissing(SystemExit):
    """The server lacks refloop's search attributes and this worker may not add them."""


def operator_commands(names: list[str], namespace: str) -> str:
    return "\n".join(f"  temporal operator search-attribute create --namespace {namespace} "
                     f"--name {name} --type {SEARCH_ATTRIBUTES[name]}" for name in names)


async def missing_attributes(client: Client, namespace: str) -> list[str]:
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace))
    return [name for name in SEARCH_ATTRIBUTES if name not in listed.custom_attributes]


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register the missing ones; returns their names. SearchAttributesMissing when the
    server refuses."""
    try:
        missing = await missing_attributes(client, namespace)
        if missing:
            await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={name: KINDS[SEARCH_ATTRIBUTES[name]] for name in missing}))
            log.warning("registered refloop's search attributes on %s: %s", namespace,
                        ", ".join(missing))
        return missing
    except RPCError as err:
        names = list(SEARCH_ATTRIBUTES)
        raise SearchAttributesMissing(
            f"this worker cannot register refloop's search attributes on namespace "
            f"{namespace!r} ({err.status.name}: {err.message}); without them every task "
            f"fails. Run, with an operator's rights:\n{operator_commands(names, namespace)}"
        ) from None
