"""Every patch the agent workflow asks for, and when a run asks for them.

A patch asked for the first time right after a local activity resolves can be recorded in
the next workflow task while the local activity's marker closes this one. Replay then
reaches the `patched()` call inside the first task, finds no marker there, takes the old
branch, and fails the run as non-deterministic when the marker turns up. Runs started since
`PATCHES_AT_START` therefore ask for every patch in their first activation, before any
activity; later calls return the remembered answer and record nothing. Runs recorded before
it keep asking where the code first needs each patch, as they did.

Append new patches to `AGENT_PATCHES`: a run recorded with a shorter list replays with the
new patch off, as Temporal intends for a run that started before it.

Supported histories (the window): runs started on code from the last 5 days' patches on.
A patch older than that is deprecated (`workflow.deprecate_patch`, in `DEPRECATED`: its old
branch is gone; a history recorded before it no longer replays, and its golden history is
removed); a release later, once no run recorded with it as `patched` can be in flight, it is
removed from `AGENT_PATCHES` and the code. `docs/deploying.md` says how an operator upgrades
with tasks in flight.
"""

from __future__ import annotations

from temporalio import workflow

PATCHES_AT_START = "patches-at-start"

# Each patch, with what a run recorded before it does instead.
WORKSPACE_CONTEXT = "workspace-context"  # no workspace description in the prompts
INDEX_SETTLE = "index-cancel-settles"  # a cancelled index is not waited for
SEARCH_ATTRIBUTES = "refloop-search-attributes"  # no custom search attributes
HOST_QUEUES = "host-task-queues"  # every activity on the workflow's own queue
STORE_WRITES_LOCAL = "store-writes-local"  # DB writes as scheduled activities
MCP_TOOLS = "mcp-tool-servers"  # no MCP tools
COMPLETENESS_REFLECTION = "completeness-reflection"  # no completeness check
DIRECT_ANSWER_UNPLANNABLE = "direct-answer-for-unplannable-questions"
DIRECT_ANSWER_PLANNED_AS_EDIT = "direct-answer-for-questions-planned-as-edits"
TEXT_TOOL_CALL_FORMS = "text-tool-call-forms"  # only one textual tool-call form
INTERRUPTED_CALL = "interrupted-call-is-a-tool-error"  # it failed the task
INCOMPLETE_STATUS = "incomplete-task-status"  # unfinished work was "completed"
# The quality review and the completeness check read the workspace on the task's host and
# ask the model on the model queue; before, one activity did both on the host queue.
WORKSPACE_READS_APART = "workspace-reads-apart-from-model-calls"
# A task run without a plan whose intent is to change files, and that changed none, is
# incomplete; before, only a plan's edit steps or the completeness check could say so.
UNPLANNED_EDIT_TASKS = "unplanned-edit-tasks-need-an-edit"
# Such a run whose intent is unknown (classification failed or UNCERTAIN) needs an edit
# when the task's words ask for one; before, it could end `completed` without it.
UNKNOWN_INTENT_EDIT_TASKS = "unknown-intent-edit-tasks-need-an-edit"
# A model call tells its task it waits for the endpoint (`waiting_for_model`: status,
# search attribute, row, event); before, no such signal came and a failing endpoint
# failed the call after about 31 s of retries.
MODEL_OUTAGE_WAIT = "model-outage-wait"
# The end of a run decides from counters in its state (changes made, by tool; a child's
# edits; the last completeness verdict); before, it re-read events that continue-as-new
# trims, so a long task whose change came early could end `incomplete`.
DECISIONS_FROM_STATE = "decisions-from-state"
# State and results stay bounded at any length: tool records beyond a chunk go to the blob
# store, the triggers keep a window of hashed calls, the result and a continued run carry
# recent events within a byte bound; before, all of it grew with every call.
BOUNDED_STATE = "bounded-state"
# A run reads the tool catalogue once, at its start (a local activity), and keeps it in its
# state; before, replay read the code's catalogue, so changing a tool changed the commands.
TOOLS_PER_RUN = "tools-per-run"
# A store write that fails locally past STORE_WRITE_LOCAL's bound is scheduled and waits on
# the server; before, it retried locally forever, adding history events all along.
STORE_WRITE_WAITS = "store-write-waits-on-the-server"
# A workspace checkpoint after each call that may change the workspace, its id in the
# call's tool_result event; before, no checkpoint was taken.
WORKSPACE_CHECKPOINTS = "workspace-checkpoints"
# A supplement objective's marker in English (before: the original Chinese marker, shown
# as boxes where no CJK font is installed)
ENGLISH_SUPPLEMENT_MARKER = "english-supplement-marker"
# A task naming a host the database does not know waits for it to register, within its
# host bound (`waiting_for_host`); before, it failed at once.
UNKNOWN_HOST_WAITED = "unknown-host-is-waited-for"
# Without a fleet rate limit, model calls run on the workflow's own queue, dispatched
# eagerly to the worker that scheduled them; before, always on the model queue.
EAGER_MODEL_CALLS = "eager-model-calls-without-a-fleet-rate"
# A task moved to another host puts its latest workspace checkpoint there first (the
# directory made under that host's roots if missing); before, a person copied it.
MOVE_RESTORES = "move-restores-the-workspace"
# A wait for approval is in the task's row too (`waiting_approval`, then `running` again):
# reads that fall back on the database told `running` for a task that waited.
APPROVAL_WAIT_IN_ROW = "approval-wait-in-row"
# A workspace call scheduled while the task waits for its host is claimed by the host's
# worker before it runs (`claim_call`); a move is refused once it is, and the status is
# `running` again from the claim; before, a move could take back a call the returning host
# had started, and run it again on the new host.
MOVE_CLAIMS = "move-cannot-double-a-claimed-call"
# The state and result carry the recent quality reviews (a count of them all), and an
# approval's decision leaves the state once its call has read it; before, both grew with
# every review and approval, across continue-as-new.
BOUNDED_REVIEWS_AND_APPROVALS = "bounded-reviews-and-approvals"
# A fork (`refloop fork`): its workspace restored from the original's checkpoint, then its
# plan, progress and conversation taken over (a `forked_from` event); before, a task with
# a fork origin in its input would have planned from nothing in an empty directory.
FORK_FROM_CHECKPOINT = "fork-from-checkpoint"
# The state and result carry the recent tool violations (a count of them all); the review
# cap remembers the files of the recent failures and caps; the kept tool records are a
# chain in the blob store, the state holding its newest link; before, the three lists and
# the records' references grew with the task, across continue-as-new.
BOUNDED_LISTS = "bounded-violations-caps-and-record-chain"

# The code-review workflow's own, asked in its first activation when the review has a host.
CODE_REVIEW_HOST = "code-review-host"  # the content read on the shared queue

AGENT_PATCHES = (
    WORKSPACE_CONTEXT, INDEX_SETTLE, SEARCH_ATTRIBUTES, HOST_QUEUES, STORE_WRITES_LOCAL,
    MCP_TOOLS, COMPLETENESS_REFLECTION, DIRECT_ANSWER_UNPLANNABLE,
    DIRECT_ANSWER_PLANNED_AS_EDIT, TEXT_TOOL_CALL_FORMS, INTERRUPTED_CALL, INCOMPLETE_STATUS,
    WORKSPACE_READS_APART, UNPLANNED_EDIT_TASKS, UNKNOWN_INTENT_EDIT_TASKS, MODEL_OUTAGE_WAIT,
    DECISIONS_FROM_STATE, BOUNDED_STATE, TOOLS_PER_RUN, STORE_WRITE_WAITS, WORKSPACE_CHECKPOINTS,
    ENGLISH_SUPPLEMENT_MARKER,
    UNKNOWN_HOST_WAITED, EAGER_MODEL_CALLS, MOVE_RESTORES,
    APPROVAL_WAIT_IN_ROW, MOVE_CLAIMS, BOUNDED_REVIEWS_AND_APPROVALS,
    FORK_FROM_CHECKPOINT, BOUNDED_LISTS,
)


# Outside the window (added 2026-11-22): always on; histories from before them are not
# supported.
DEPRECATED = frozenset({WORKSPACE_CONTEXT, COMPLETENESS_REFLECTION})


def ask_every_patch() -> None:
    """In a run's first activation: settle every patch before any activity is scheduled."""
    if workflow.patched(PATCHES_AT_START):
        for patch in AGENT_PATCHES:
            if patch in DEPRECATED:
                workflow.deprecate_patch(patch)
            else:
                workflow.patched(patch)
