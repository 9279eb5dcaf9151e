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

# The code-review workflow's own, asked in its first activation when the review has a host.
CODE_REVIEW_HOST = "code-review-host"  # the content read on the shared queue

AGENT_PATCHES = (
    WORKSPACE_CONTEXT, INDEX_SETTLE, SEARCH_ATTRIBUTES, HOST_QUEUES, STORE_WRITES_LOCAL,
    MCP_TOOLS, COMPLETENESS_REFLECTION, DIRECT_ANSWER_UNPLANNABLE,
    DIRECT_ANSWER_PLANNED_AS_EDIT, TEXT_TOOL_CALL_FORMS, INTERRUPTED_CALL, INCOMPLETE_STATUS,
    WORKSPACE_READS_APART, UNPLANNED_EDIT_TASKS, UNKNOWN_INTENT_EDIT_TASKS,
)


def ask_every_patch() -> None:
    """In a run's first activation: settle every patch before any activity is scheduled."""
    if workflow.patched(PATCHES_AT_START):
        for patch in AGENT_PATCHES:
            workflow.patched(patch)
