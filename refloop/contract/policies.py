"""Named timeouts and retry policies: every activity call takes one of these, except a
tool call, whose timeouts and retries are its tool's properties
(`refloop.contract.tool_catalog.tool_activity_options` for a built-in tool,
`refloop.contract.mcp.mcp_tool_properties` for an MCP tool: MCP_CALL is its default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from refloop.contract.errors import (
    InvalidModelOutput,
    LLMClientError,
    McpConfigError,
    ToolError,
    UnknownToolError,
    non_retryable,
)
from refloop.contract.hosts import HostRefused

NON_RETRYABLE_LLM_ERRORS = non_retryable(LLMClientError, InvalidModelOutput)


@dataclass(frozen=True)
class ActivityOptions:
    """Timeouts and retries of one kind of activity call."""

    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None
    schedule_to_close: timedelta | None = None

    def kwargs(self) -> dict[str, Any]:
        return {**self.local_kwargs(), "heartbeat_timeout": self.heartbeat}

    def local_kwargs(self) -> dict[str, Any]:
        """The options a local activity takes (it has no heartbeats)."""
        return {
            "start_to_close_timeout": self.start_to_close,
            "schedule_to_close_timeout": self.schedule_to_close,
            "retry_policy": self.retry,
        }


# A dead worker's call is retried on another worker once its heartbeats stop for this
# long: seconds of recovery, not minutes. Start-to-close still bounds a worker that is
# alive but hung.
HEARTBEAT = timedelta(seconds=6)
# How often activities beat: a third of the timeout, so two beats may be lost.
HEARTBEAT_INTERVAL = HEARTBEAT / 3

# Model calls: transport errors back off exponentially; a dead worker is noticed by
# the heartbeat timeout; a whole call with its retries is bounded at 15 minutes.
LLM_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=3),
    heartbeat=HEARTBEAT,
    schedule_to_close=timedelta(minutes=15),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=6,
        non_retryable_error_types=NON_RETRYABLE_LLM_ERRORS,
    ),
)

# Reading a workspace for a code review. (A tool call's options are its tool's properties:
# `refloop.contract.tool_catalog.tool_activity_options`.)
REVIEW_CONTENT_READ = ActivityOptions(
    start_to_close=timedelta(minutes=10),
    heartbeat=HEARTBEAT,
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=3,
        non_retryable_error_types=non_retryable(UnknownToolError),
    ),
)

# MCP: a transport failure or a stdio server that died is retried on a fresh connection.
# A tool call's own options are its properties (`refloop.contract.mcp.mcp_tool_properties`).
MCP_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    heartbeat=timedelta(seconds=10),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
        non_retryable_error_types=non_retryable(McpConfigError),
    ),
)
# Listing at task start: starts the servers not yet running (each within a minute).
MCP_LIST = dataclasses.replace(MCP_CALL, start_to_close=timedelta(minutes=3),
                               heartbeat=timedelta(seconds=30))

# Persistence: a database outage is waited out, never turned into a lost record. Writes
# run as local activities (idempotent upserts, milliseconds long): no task-queue round
# trip and no extra workflow task per write.
STORE_WRITE = ActivityOptions(
    start_to_close=timedelta(seconds=30),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,
    ),
)

# A task's host checked in the database at its start: an outage is retried, a refusal
# (unknown host, roots not holding the workspace) fails the task at once.
HOST_CHECK = ActivityOptions(
    start_to_close=timedelta(seconds=30),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=10,
        non_retryable_error_types=non_retryable(HostRefused),
    ),
)

# Quality review: a bounded budget, because a broken reviewer fails open instead.
REVIEW_CALL = ActivityOptions(
    start_to_close=timedelta(seconds=90),
    heartbeat=HEARTBEAT,
    schedule_to_close=timedelta(minutes=4),
    retry=dataclasses.replace(LLM_CALL.retry, maximum_interval=timedelta(seconds=10),
                              maximum_attempts=3),
)

MAX_REPLANS = 2
CARRIED_EVENTS = 200  # events a continued run carries over (older ones keep their seq gap)
TOOL_RESULT_CHARS = 8_000

# Environment and repo map: a bounded walk of the workspace; a missing one is non-fatal.
WORKSPACE_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    retry=RetryPolicy(maximum_attempts=3, non_retryable_error_types=non_retryable(ToolError)),
)

# Background semantic indexing: long, heartbeating progress; resumable (content hashes).
# The short heartbeat timeout also brings a cancel (the task ended) within seconds.
INDEX_CALL = ActivityOptions(
    start_to_close=timedelta(hours=2),
    heartbeat=HEARTBEAT,
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=5),
        maximum_interval=timedelta(minutes=1),
        maximum_attempts=3,
    ),
)
