"""The workflow sandbox, without a per-payload cost that buys nothing when the data
converter ignores serialization context.

For every payload of every activation and completion (three visitor passes each way),
the SDK asks the workflow instance for the payload's serialization context, and the
sandboxed instance answers by compiling and `exec`ing code inside the sandbox. That
context only matters to a converter, codec or external store that reads it; refloop's
default (pydantic JSON, no codec) does not, and the lookups cost a busy worker about a
sixth of its CPU. This runner keeps the sandbox for workflow code and answers those
lookups with "no context" directly, but only when the converter provably ignores
context; an encryption codec or external storage that uses it gets the stock runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import Info

# Contexts of each kind a converter could read; one that changes under any of them
# reads context.
_PROBE_CONTEXTS = (
    WorkflowSerializationContext(namespace="probe", workflow_id="probe"),
    ActivitySerializationContext(
        namespace="probe", activity_id="probe", activity_type="probe",
        activity_task_queue="probe", workflow_id="probe", workflow_type="probe",
        is_local=False,
    ),
)


def ignores_serialization_context(converter: DataConverter) -> bool:
    """True when no part of `converter` reads serialization or store context.

    `DataConverter.with_context` returns the converter itself when none of its parts
    take the context, which is the SDK's own definition of "context-free".
    """
    return converter.external_storage is None and all(
        converter.with_context(context) is converter for context in _PROBE_CONTEXTS
    )


class _ContextFreeInstance(WorkflowInstance):
    """A sandboxed instance whose payloads need no context: lookups skip the sandbox."""

    def __init__(self, sandboxed: WorkflowInstance) -> None:
        self._sandboxed = sandboxed

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._sandboxed.activate(act)

    def get_serialization_context(self, command_info: Any) -> None:
        return None  # the SDK then uses the worker's converter, which ignores context

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        return StorageDriverStoreContext(target=None)  # no external storage configured

    def get_info(self) -> Info:
        return self._sandboxed.get_info()

    def get_thread_id(self) -> int | None:
        return self._sandboxed.get_thread_id()  # deadlock detection names the thread


@dataclass(frozen=True)
class ContextFreeSandboxedWorkflowRunner(SandboxedWorkflowRunner):
    """The stock sandbox; only the context lookups above are answered outside it."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _ContextFreeInstance(super().create_instance(det))


def sandbox_runner(converter: DataConverter,
                   restrictions: SandboxRestrictions) -> SandboxedWorkflowRunner:
    """The fastest sandboxed runner that is exact for `converter`."""
    if ignores_serialization_context(converter):
        return ContextFreeSandboxedWorkflowRunner(restrictions=restrictions)
    return SandboxedWorkflowRunner(restrictions=restrictions)
