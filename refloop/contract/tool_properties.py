"""What the rest of refloop knows about a tool, as plain data on its definition.

Approval, quality review, early-reflection triggers, output windowing, task rules and the
tool's activity options read these properties, never a tool's name. Workflows read them
too: frozen data, no I/O, the same on every replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio.common import RetryPolicy

from refloop.contract.errors import UnknownToolError, non_retryable
from refloop.contract.policies import HEARTBEAT, ActivityOptions

# read: looks only; write: changes files; execute: runs a program (any effect);
# control: steers the agent loop (complete_step), never an activity.
ToolKind = Literal["read", "write", "execute", "control"]
APPROVAL_MODES = ("auto", "confirm_writes", "confirm_all")

# The approval modes under which a call of each kind waits for a human's decision.
DEFAULT_APPROVAL: Mapping[ToolKind, frozenset[str]] = {
    "read": frozenset({"confirm_all"}),
    "write": frozenset({"confirm_writes", "confirm_all"}),
    "execute": frozenset({"confirm_writes", "confirm_all"}),
    "control": frozenset(),
}


@dataclass(frozen=True)
class ToolActivityOptions:
    """Timeouts and retries of one tool's activity."""

    start_to_close: timedelta = timedelta(minutes=10)
    heartbeat: timedelta | None = HEARTBEAT
    max_attempts: int = 3
    initial_interval: timedelta = timedelta(seconds=1)
    maximum_interval: timedelta = timedelta(seconds=10)
    non_retryable: tuple[str, ...] = tuple(non_retryable(UnknownToolError))

    def as_options(self) -> ActivityOptions:
        """The same, in the form every activity call takes."""
        return ActivityOptions(
            start_to_close=self.start_to_close,
            heartbeat=self.heartbeat,
            retry=RetryPolicy(
                initial_interval=self.initial_interval,
                maximum_interval=self.maximum_interval,
                maximum_attempts=self.max_attempts,
                non_retryable_error_types=list(self.non_retryable),
            ),
        )

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `workflow.execute_activity`."""
        return self.as_options().kwargs()


# Commands carry their own timeout, so start-to-close only guards against a hung worker.
TOOL_ACTIVITY = ToolActivityOptions()


@dataclass(frozen=True)
class ToolProperties:
    """A tool's properties. Only `kind` is required: the rest default from it.

    - approval: the approval modes under which a call waits for a decision;
    - reviewed: its successful edits get the quality review;
    - windowed: a long output is windowed around the task's keywords (else cut at the end);
    - expects_output: an empty result is an anomaly for the reflection triggers;
    - idempotent: running it twice does no harm; journaled: a repeat returns the first
      result. A tool that is neither runs at most once (one activity attempt);
    - generates: writes a whole document, so plans put it in the final step(s);
    - command_arg, read_commands, unreviewed_commands: a tool with sub-commands (`view`,
      `insert`...) names the argument that selects one, the sub-commands that only read,
      and the editing ones that are not reviewed (an undo restores reviewed content);
    - activity: its activity's timeouts and retries.
    """

    kind: ToolKind
    approval: frozenset[str] | None = None
    reviewed: bool | None = None
    windowed: bool | None = None
    expects_output: bool | None = None
    idempotent: bool | None = None
    journaled: bool = False
    generates: bool = False
    command_arg: str | None = None
    read_commands: frozenset[str] = frozenset()
    unreviewed_commands: frozenset[str] = frozenset()
    activity: ToolActivityOptions = TOOL_ACTIVITY

    def __post_init__(self) -> None:
        kind = self.kind
        if kind not in DEFAULT_APPROVAL:
            raise ValueError(f"tool kind {kind!r}: one of {', '.join(DEFAULT_APPROVAL)}")
        defaults = {
            "approval": DEFAULT_APPROVAL[kind],
            "reviewed": kind == "write",
            "windowed": kind in ("read", "execute"),
            "expects_output": kind == "read",
            "idempotent": kind in ("read", "control"),
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        unknown = set(self.approval or ()) - set(APPROVAL_MODES)
        if unknown:
            raise ValueError(f"unknown approval mode(s): {', '.join(sorted(unknown))}")
        if not self.retry_safe and self.activity.max_attempts != 1:
            if self.activity is not TOOL_ACTIVITY:
                raise ValueError("a tool that is neither idempotent nor journaled runs at "
                                 "most once: its activity's max_attempts must be 1")
            object.__setattr__(self, "activity",
                               dataclasses.replace(TOOL_ACTIVITY, max_attempts=1))

    @property
    def retry_safe(self) -> bool:
        """A second attempt after a crash does no harm."""
        return bool(self.idempotent) or self.journaled

    def command(self, arguments: Mapping[str, Any]) -> Any:
        return arguments.get(self.command_arg) if self.command_arg else None

    def kind_of(self, arguments: Mapping[str, Any]) -> ToolKind:
        """The kind of one call: a read-only sub-command of a write tool reads."""
        return "read" if self.command(arguments) in self.read_commands else self.kind

    def needs_approval(self, mode: str, arguments: Mapping[str, Any]) -> bool:
        modes = self.approval if self.kind_of(arguments) == self.kind \
            else DEFAULT_APPROVAL[self.kind_of(arguments)]
        return mode in (modes or ())

    def edit_reviewed(self, arguments: Mapping[str, Any]) -> bool:
        """Whether this call's edit (if it succeeds) is one the review looks at, leaving
        aside the tool-wide `reviewed` switch."""
        command = self.command(arguments)
        return command not in self.read_commands and command not in self.unreviewed_commands


def not_run_again(tool: str, cause: str) -> str:
    """Why a call that is neither idempotent nor journaled was not retried (its worker died
    mid-call, or the activity failed): retrying could apply it twice."""
    return (f"{tool} did not finish ({cause}); it is not safe to repeat, so it was not run "
            "again. Its effects may be partial: check the workspace before running it "
            "again.")


# complete_step: handled by the workflow itself.
CONTROL = ToolProperties(kind="control")
