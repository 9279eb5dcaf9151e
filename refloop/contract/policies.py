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
    ModelUnavailable,
    ToolError,
    UnknownToolError,
    non_retryable,
)
from refloop.contract.hosts import HostRefused

NON_RETRYABLE_LLM_ERRORS = non_retryable(LLMClientError, InvalidModelOutput, ModelUnavailable)


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
# long: seconds of recovery, not minutes. Long enough that a live worker short of CPU (its
# event loop, the Temporal server beside it) never loses a call it is still making: with
# 6 s, a worker beside a CPU hog had calls timed out and their model requests sent twice.
# Start-to-close still bounds a worker that is alive but hung.
HEARTBEAT = timedelta(seconds=20)
# How often activities beat: every 2 s, so a beat may be late by most of the timeout.
HEARTBEAT_INTERVAL = timedelta(seconds=2)

# Model calls. An outage of the endpoint (errors it may recover from) is waited out
# between attempts, never inside one: an attempt that finds its endpoint down ends at once
# (EndpointWaiting), its retry delay the next probe (`refloop.llm.outage`), so a waiting
# call holds no worker slot; after REFLOOP_MODEL_OUTAGE_S (default 6 h; 401/403:
# REFLOOP_MODEL_AUTH_WAIT_S) it fails with ModelUnavailable, never retried. Attempts are
# unbounded: waiting ones are many, and a worker lost mid-call (restarts included) must not
# use up a budget. Start-to-close covers the requests of one attempt (up to 3 structured
# answers, each re-asked once when cut off, each maybe picking its tool first: 12 requests
# of REFLOOP_LLM_TIMEOUT_S, 24 min at 120 s).
LLM_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=30),
    heartbeat=HEARTBEAT,
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=0,
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
# Quality reviews a task's state and result carry: the recent ones (each is in the
# `quality_reviews` table; the state counts them all)
REVIEWS_CARRIED = 20
# Tool violations a task's state and result carry: the recent ones (each is a
# `tool_violation` event; the state counts them all, the result says how many it left out)
VIOLATIONS_CARRIED = 20
# Files the quality-review cap remembers: those of the recent failures not yet capped, and
# the recently capped ones (a file forgotten is reviewed again when edited again)
REVIEW_FILES_KEPT = 100
# Files the step summaries of a long task's kept tool records claim written, which the
# completeness check verifies exist: the most recently claimed
KEPT_CLAIMS = 100
TOOL_RESULT_CHARS = 8_000

# Environment and repo map: a bounded walk of the workspace; a missing one is non-fatal.
WORKSPACE_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=2),
    retry=RetryPolicy(maximum_attempts=3, non_retryable_error_types=non_retryable(ToolError)),
)

# Workspace checkpoints: the first of a large tree reads all of it (heartbeating); a retry
# finds the content it stored already.
CHECKPOINT_CALL = ActivityOptions(
    start_to_close=timedelta(minutes=30),
    heartbeat=HEARTBEAT,
    # about 25 s of retries: a database restart is outlasted; a longer outage costs that
    # step's checkpoint only (the next one holds every file again)
    retry=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                      maximum_interval=timedelta(seconds=10), maximum_attempts=6,
                      non_retryable_error_types=non_retryable(ToolError)),
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


# The tool catalogue read once at a run's start (no I/O: it fails only on a bug).
TOOL_CATALOG_READ = ActivityOptions(
    start_to_close=timedelta(seconds=10),
    retry=RetryPolicy(maximum_attempts=3),
)

# A store write as a local activity, for a few attempts (about 7 s): past them (a database
# outage) the write is scheduled with STORE_WRITE and waits on the server, whose retries add
# no history events; a local activity retrying on adds about 24 events a minute. (Attempts,
# not a schedule-to-close: the local activity's retries ran on past one.)
STORE_WRITE_LOCAL = dataclasses.replace(
    STORE_WRITE, retry=dataclasses.replace(STORE_WRITE.retry, maximum_attempts=4))
