"""The everyday commands: the task list, one task, following it, the inbox, approving or
rejecting a call, cancelling. Each asks Temporal (TEMPORAL_ADDRESS, else the server a
running `refloop up` or `refloop run` of this data dir serves) and the database, through
the API's own code, so each says what GET /tasks, POST /tasks/{id}/approvals ... say.
`--json` prints the same pydantic models the API answers with.
"""

from __future__ import annotations

# isort: split
import argparse
import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from rich.console import Console
from rich.text import Text

from refloop.api.schemas import TaskState
from refloop.cli.output import err_console, fail, fit, print_event
from refloop.contract.task import Event
from refloop.contract.text import escape_controls, escape_json_controls
from refloop.settings import Settings

COMMANDS = ("tasks", "show", "watch", "inbox", "approve", "reject", "cancel")
NO_SERVER = ("no Temporal server: start `refloop up` (or run a task) on this data dir, or "
             "set TEMPORAL_ADDRESS")
WAITING = ("waiting_approval", "waiting_for_host", "waiting_for_budget")
out = Console(highlight=False, soft_wrap=False)


def add_commands(sub: Any) -> None:
    """The commands' parsers, on `refloop`'s subcommands."""
    tasks = sub.add_parser("tasks", help="list tasks, newest first, with their live status")
    tasks.add_argument("--status", help="only tasks with this status (running, "
                       "waiting_approval, waiting_for_host, completed, failed, ...)")
    tasks.add_argument("--host", help="only tasks whose workspace is on this worker host")
    tasks.add_argument("--limit", type=int, default=30, help="at most this many tasks")
    show = sub.add_parser("show", help="one task: status, plan and progress, tokens, files "
                          "changed, what it waits for")
    watch = sub.add_parser("watch", help="follow a task's events until it ends (across "
                           "rewinds and continue-as-new); exit 0 only for completed")
    for command in (show, watch):
        command.add_argument("task", help="the task ID")
    sub.add_parser("inbox", help="what waits for you: calls to approve, tasks waiting for "
                   "a host")
    approve = sub.add_parser("approve", help="approve a call waiting for approval")
    reject = sub.add_parser("reject", help="reject a call waiting for approval; the model "
                            "reads the reason")
    for command in (approve, reject):
        command.add_argument("task", help="the task ID")
        command.add_argument("call", nargs="?", help="the call ID (`refloop inbox` lists "
                             "them); omitted: the task's one waiting call")
    reject.add_argument("--reason", required=True, help="why, for the model")
    approve.add_argument("--arguments", metavar="JSON", help="run the call with these "
                         "arguments instead of the model's: its whole arguments as a JSON "
                         "object (or @FILE), checked as the tool checks the model's own")
    cancel = sub.add_parser("cancel", help="cancel a task that has not ended")
    cancel.add_argument("task", help="the task ID")
    for command in (tasks, show, watch, sub.choices["inbox"], approve, reject, cancel):
        command.add_argument("--json", action="store_true", help="JSON on stdout")


# ------------------------------------------------------------ what the commands print


class Waiting(BaseModel):
    """One thing a task waits for: a call's approval, a host, or a model endpoint."""

    kind: Literal["approval", "host", "model", "budget"]
    call_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    host: str | None = None
    endpoint: str | None = None
    # an approval's: when the task ends incomplete if nobody decides
    expires_at: str | None = None
    reason: str | None = None  # a budget wait's: what was spent of which limit


class PlanStepShown(BaseModel):
    step: int
    goal: str
    tool: str
    state: Literal["done", "current", "to do"]


class Spend(BaseModel):
    total_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    cost_usd: float = 0.0  # with its children's
    own_cost_usd: float = 0.0
    unpriced_calls: int = 0  # answered calls of a model with no price


class TaskShown(TaskState):
    """`refloop show --json`: GET /tasks/{id}'s fields, and what they add up to."""

    plan: list[PlanStepShown] = Field(default_factory=list)
    spend: Spend = Field(default_factory=Spend)
    files_changed: list[str] = Field(default_factory=list)
    commands_run: list[str] = Field(default_factory=list)
    waiting_for: list[Waiting] = Field(default_factory=list)


class InboxItem(BaseModel):
    task_id: str
    task: str | None = None
    status: str
    host: str | None = None
    waiting_for: list[Waiting] = Field(default_factory=list)


class Cancelled(BaseModel):
    task_id: str
    status: str


def print_json(value: BaseModel | list[BaseModel]) -> None:
    if isinstance(value, list):
        text = json.dumps([item.model_dump(mode="json") for item in value],
                          ensure_ascii=False, separators=(",", ":"))  # as model_dump_json
    else:
        text = value.model_dump_json()
    print(escape_json_controls(text))


def answer(args: argparse.Namespace, value: BaseModel, text: str) -> int:
    """A command's one answer: its model as JSON, or a line of text."""
    if args.json:
        print_json(value)
    else:
        line(text)
    return 0


def age(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = (datetime.now(UTC) - (when if when.tzinfo else when.replace(tzinfo=UTC))
               ).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def line(text: str) -> None:
    """One line on stdout, fit to the terminal (its indent kept), never read as markup or
    escapes."""
    text = escape_controls(text, keep="")
    if len(text) > out.width:  # cut on a word; a line that fits keeps its columns
        indent = len(text) - len(text.lstrip(" "))
        text = " " * indent + fit(text[indent:], max(out.width - indent, 20))
    out.print(Text(text), crop=False)


# ------------------------------------------------------------ reading a task


def waits_of(state: TaskState, events: list[Event]) -> list[Waiting]:
    """What the task waits for now: each approval asked and not yet decided, its host."""
    if state.status == "waiting_for_host":
        return [Waiting(kind="host", host=state.host)]
    if state.status == "waiting_for_budget":
        told = [e for e in events if e.type == "waiting_for_budget"]
        return [Waiting(kind="budget", reason=told[-1].data.get("reason") if told else None)]
    if state.status == "waiting_for_model":
        told = [e for e in events if e.type == "waiting_for_model"]
        return [Waiting(kind="model", endpoint=told[-1].data.get("endpoint") if told else None)]
    asked: dict[str, Waiting] = {}
    for event in events:
        call = str(event.data.get("call_id"))
        if event.type == "approval_required":
            asked[call] = Waiting(kind="approval", call_id=call, tool=event.data.get("tool"),
                                  args=event.data.get("args"),
                                  expires_at=event.data.get("expires_at"))
        elif event.type == "approval_decided":
            asked.pop(call, None)
    return list(asked.values()) if state.status == "waiting_approval" else []


def changes_of(events: list[Event]) -> tuple[list[str], list[str]]:
    """(files written, commands run) by the task's successful calls, from its events."""
    from refloop.contract.tool_catalog import tool_properties

    calls = {e.data.get("id"): e.data for e in events if e.type == "tool_call"}
    by_key: dict[str, Any] = {}  # "<iteration>.<index>", as approvals name calls -> its id
    for event in events:
        if event.type == "tool_call":
            iteration = event.data.get("iteration")
            index = sum(key.startswith(f"{iteration}.") for key in by_key)
            by_key[f"{iteration}.{index}"] = event.data.get("id")
        elif event.type == "approval_decided" and event.data.get("edited"):
            ran = by_key.get(str(event.data.get("call_id")))  # as the person approved it
            if ran in calls:
                calls[ran] = {**calls[ran], "args": event.data.get("arguments") or {}}
    files: dict[str, None] = {}
    commands: list[str] = []
    for event in events:
        if event.type != "tool_result" or not event.data.get("ok"):
            continue
        call = calls.get(event.data.get("id")) or {}
        args = call.get("args") or {}
        properties = tool_properties(call.get("tool", ""))
        kind = properties.kind_of(args) if properties else None
        if kind == "execute":
            commands.append(str(args.get("command", call.get("tool"))))
        elif kind == "write":
            paths = [args.get("path") or args.get("file_path")]
            if call.get("tool") == "apply_patch":
                paths = re.findall(r"^\+\+\+ (?:b/)?(\S+)", str(args.get("patch", "")), re.M)
            files.update((str(path), None) for path in paths if path)
    return list(files), commands


def plan_of(state: TaskState, events: list[Event]) -> list[PlanStepShown]:
    """The plan, each step done, current or to do: live from the workflow's progress, else
    from the task's result."""
    from refloop.contract.messages import Plan

    result = state.result or {}
    plan = state.progress.plan if state.progress else \
        Plan.model_validate(result["plan"]) if result.get("plan") else None
    done = set(result.get("completed_steps") or [])
    for event in events:
        if event.type == "step":
            done.update(event.data.get("completed") or [])
    current = state.progress.current_step if state.progress else None
    return [PlanStepShown(step=n, goal=step.goal, tool=step.tool,
                          state="done" if n in done else "current" if n == current
                          else "to do") for n, step in enumerate(plan.steps if plan else [], 1)]


def spend_of(state: TaskState) -> Spend:
    from refloop.contract.task import TaskStats

    stats = state.progress.stats if state.progress else \
        TaskStats.model_validate((state.result or {}).get("stats") or {})
    usage = stats.usage
    return Spend(total_tokens=usage.total_tokens or state.tokens or 0,
                 prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                 model_calls=stats.llm_calls, tool_calls=stats.tool_calls,
                 cost_usd=usage.cost_usd, unpriced_calls=usage.unpriced_calls,
                 own_cost_usd=round(usage.cost_usd - stats.children_usage.cost_usd, 9))


# ------------------------------------------------------------ talking to the stack


class Stack:
    """Temporal's client (None: no server runs, the stored rows answer) and the store."""

    def __init__(self, settings: Settings, client: Any) -> None:
        from refloop.store.db import store_for

        self.settings, self.client = settings, client
        self.store = store_for(settings.effective_database_url)

    @classmethod
    async def open(cls, settings: Settings, need_temporal: bool) -> Stack:
        from refloop.runtime.client import connect
        from refloop.worker.temporal_server import running_server

        address = settings.temporal_address
        if address is None and (server := running_server(settings.refloop_data_dir)):
            address = server.address
            if server.ui_url and not settings.refloop_temporal_ui_url:  # tasks' Web UI links
                settings = settings.model_copy(update={"refloop_temporal_ui_url": server.ui_url})
        if address is None:
            if need_temporal:
                fail(NO_SERVER)
            err_console.print(Text("no Temporal server runs for this data dir: the tasks as "
                                   "last stored (start `refloop up` for live status)"))
            return cls(settings, None)
        return cls(settings, await connect(address, settings.temporal_namespace))

    async def call(self, route: Any, *args: Any, **kwargs: Any) -> Any:
        """An API route's own function; its refusal (404, 409, 422) as one line, exit 2."""
        from fastapi import HTTPException

        try:
            return await route(*args, **kwargs)
        except HTTPException as err:
            fail(str(err.detail))

    async def state(self, task_id: str) -> TaskState:
        from refloop.api.routes.tasks import get_task

        if self.client is None:
            from refloop.api.task_view import public

            row = await asyncio.to_thread(self.store.get_task, task_id)
            if row is None:
                fail(f"task {task_id} not found")
            return public(row, self.settings, from_database=True)
        return await self.call(get_task, task_id, self.client, self.store, self.settings)

    async def events(self, state: TaskState) -> list[Event]:
        """The events the task keeps: its workflow's while it runs, else the stored ones."""
        from refloop.workflows.agent import AgentTaskWorkflow

        if self.client is not None and state.progress is not None:
            try:
                return await self.client.get_workflow_handle(state.workflow_id).query(
                    AgentTaskWorkflow.events, 0)
            except Exception:  # noqa: BLE001 (ended between the two asks: the stored ones)
                state = await self.state(state.task_id)
        return [Event.model_validate(e) for e in (state.result or {}).get("events", [])
                if isinstance(e, dict)]

    async def listed(self, status: str | None = None, host: str | None = None,
                     limit: int = 100) -> list[TaskState]:
        from refloop.api.task_view import TaskFilters, listed

        return await listed(self.client, self.store, self.settings,
                            TaskFilters(status=status, host=host, limit=limit))


# ------------------------------------------------------------ the commands


async def list_tasks(args: argparse.Namespace, stack: Stack) -> int:
    states = await stack.listed(args.status, args.host, args.limit)
    if args.json:
        print_json(states)
        return 0
    if not states:
        err_console.print("no tasks" + (" match" if args.status or args.host else ""))
        return 0
    width = max(len(s.status) for s in states)
    line(f"{'ID':<17}  {'STATUS':<{width}}  {'TOKENS':>7}  {'COST':>8}  {'AGE':>4}  TASK")
    for s in states:
        line(f"{s.task_id:<17}  {s.status:<{width}}  {s.tokens or 0:>7}  "
             f"{listed_cost(s.cost_usd, s.unpriced_calls):>8}  {age(s.created_at):>4}  "
             f"{s.task or s.kind}")
    return 0


def listed_cost(cost_usd: float | None, unpriced_calls: int) -> str:
    """USD with its children's; "-" when nothing it spent has a price (tokens only)."""
    if not cost_usd and unpriced_calls:
        return "-"
    return f"${cost_usd or 0:.4f}"


async def show_task(args: argparse.Namespace, stack: Stack) -> int:
    state = await stack.state(args.task)
    events = await stack.events(state)
    files, commands = changes_of(events)
    shown = TaskShown(**state.model_dump(), plan=plan_of(state, events),
                      spend=spend_of(state), files_changed=files, commands_run=commands,
                      waiting_for=waits_of(state, events))
    if args.json:
        print_json(shown)
        return 0
    line(f"task {shown.task_id}: {shown.status}"
         + (" (as last stored)" if shown.from_database else ""))
    line(f"  {shown.task or shown.kind}")
    line(f"model: {shown.model}" + (f", host {shown.host}" if shown.host else ""))
    if shown.plan:
        line(f"plan: {sum(s.state == 'done' for s in shown.plan)} of {len(shown.plan)} "
             "steps done")
        marks = {"done": "[x]", "current": "[>]", "to do": "[ ]"}
        for step in shown.plan:
            line(f"  {marks[step.state]} {step.step}. {step.goal} ({step.tool})")
    spend = shown.spend
    line(f"tokens: {spend.total_tokens} ({spend.prompt_tokens} prompt, "
         f"{spend.completion_tokens} completion) in {spend.model_calls} model calls; "
         f"{spend.tool_calls} tool calls")
    line(f"cost: {cost_of(spend)}")
    line(f"files changed: {', '.join(shown.files_changed) or 'none'}")
    if shown.commands_run:
        line(f"commands run: {len(shown.commands_run)} (the last: {shown.commands_run[-1]})")
    for wait in shown.waiting_for:
        line(f"waits for: {describe_wait(wait)}")
        if until := expiry(wait):
            line(f"  {until}")
    answer = (shown.result or {}).get("answer")
    if answer:
        line(f"answer: {answer}")
    if shown.error:
        line(f"error: {shown.error}")
    if shown.web_ui:
        line(f"Web UI: {shown.web_ui}")
    return 0


def cost_of(spend: Spend) -> str:
    text = f"${spend.cost_usd:.4f}"
    if spend.cost_usd != spend.own_cost_usd:
        text += f" (its own ${spend.own_cost_usd:.4f}, the rest its supplement children's)"
    if spend.unpriced_calls:
        text += f"; {spend.unpriced_calls} model calls unpriced (tokens only)"
    return text


def expiry(wait: Waiting) -> str | None:
    """When an approval's wait ends, in UTC: unanswered by then, the task ends incomplete."""
    if wait.expires_at is None:
        return None
    try:
        when = datetime.fromisoformat(wait.expires_at).astimezone(UTC)
    except ValueError:
        return None
    return f"unanswered by {when:%Y-%m-%d %H:%M} UTC, the task ends incomplete"


def describe_wait(wait: Waiting) -> str:
    if wait.kind == "approval":
        return (f"approval of call {wait.call_id}: {wait.tool} "
                f"{json.dumps(wait.args, ensure_ascii=False)}")
    if wait.kind == "host":
        return f"host {wait.host} (start its worker, or `refloop move` the task)"
    if wait.kind == "budget":
        return f"a higher spend limit ({wait.reason}; `refloop budget` raises it)"
    return f"the model at {wait.endpoint}"


async def inbox(args: argparse.Namespace, stack: Stack) -> int:
    items: list[InboxItem] = []
    for status in WAITING:
        for state in await stack.listed(status=status):
            waits = waits_of(state, await stack.events(await stack.state(state.task_id)))
            items.append(InboxItem(task_id=state.task_id, task=state.task,
                                   status=state.status, host=state.host, waiting_for=waits))
    if args.json:
        print_json(items)
        return 0
    if not items:
        line("Nothing waits for you.")
    for item in items:
        line(f"{item.task_id}  {item.status}  {item.task or ''}")
        for wait in item.waiting_for:
            line(f"  {describe_wait(wait)}")
            if until := expiry(wait):
                line(f"  {until}")
            if wait.kind == "approval":
                line(f"  refloop approve {item.task_id} {wait.call_id}  |  refloop reject "
                     f"{item.task_id} {wait.call_id} --reason ...")
            elif wait.kind == "budget":
                line(f"  refloop budget {item.task_id} --max-cost-usd X  (or --max-tokens N)")
    return 0


async def decide(args: argparse.Namespace, stack: Stack) -> int:
    from refloop.api.routes.tasks import decide as decide_route
    from refloop.api.schemas import ApprovalBody

    approved = args.command == "approve"
    call = args.call
    if call is None:
        state = await stack.state(args.task)
        waits = [w for w in waits_of(state, await stack.events(state)) if w.kind == "approval"]
        if len(waits) != 1:
            fail(f"task {args.task} waits for no approval" if not waits else
                 f"task {args.task} waits for {len(waits)} approvals: name the call, one of "
                 + ", ".join(str(w.call_id) for w in waits))
        call = waits[0].call_id
    edited = edited_arguments(args.arguments) if approved else None
    outcome = await stack.call(decide_route, args.task, ApprovalBody(
        call_id=call, approved=approved, comment=None if approved else args.reason,
        arguments=edited), stack.client, stack.store)
    how = " with your arguments" if edited is not None else ""
    return answer(args, outcome,
                  f"task {args.task}: call {outcome.call_id} {outcome.outcome}{how}")


def edited_arguments(text: str | None) -> dict[str, Any] | None:
    """`--arguments`: a JSON object, given as is or as @FILE."""
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as err:
            fail(f"--arguments: cannot read {text[1:]}: {err.strerror}")
    try:
        value = json.loads(text)
    except ValueError as err:
        fail(f"--arguments: not JSON ({err})")
    if not isinstance(value, dict):
        fail("--arguments: a JSON object of the call's arguments, e.g. "
             '\'{"path": "notes.md", "content": "..."}\'')
    return value


async def cancel(args: argparse.Namespace, stack: Stack) -> int:
    from refloop.api.routes.tasks import cancel_task

    done = Cancelled(**await stack.call(cancel_task, args.task, stack.client, stack.store))
    return answer(args, done, f"task {done.task_id}: {done.status}")


async def watch(args: argparse.Namespace, stack: Stack) -> int:
    """Events as they come, from the API's own stream code; a new run (a rewind's reset, a
    continue-as-new) is read from its start, and what was printed already is skipped."""
    from refloop.api.sse import fetch_events

    state = await stack.state(args.task)
    if stack.client is None and state.status not in ("completed", "failed", "incomplete",
                                                     "cancelled", "lost"):
        fail(NO_SERVER)
    seen: set[tuple[int, str]] = set()
    after, run_id, ended = 0, None, False
    while not ended:
        if stack.client is not None and state.kind == "agent_task":
            latest = await current_run(stack.client, state.workflow_id)
            if latest is not None and latest != run_id:
                after, run_id = 0, latest
        try:
            events, ended = await fetch_events(stack.client, stack.store, state.task_id,
                                               state.workflow_id, after)
        except Exception:  # noqa: BLE001 (Temporal silent a moment: ask again)
            events = []
        for event in events:
            after = max(after, event.seq)
            if (event.seq, event.ts) in seen:
                continue
            seen.add((event.seq, event.ts))
            if args.json:
                print(escape_json_controls(event.model_dump_json()), flush=True)
            else:
                print_event(event, out)
        if not ended:
            await asyncio.sleep(0.3)
    final = await stack.state(state.task_id)
    if not args.json:
        line(f"task {final.task_id}: {final.status}")
    return 0 if final.status == "completed" else 1


async def current_run(client: Any, workflow_id: str) -> str | None:
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).run_id
    except Exception:  # noqa: BLE001 (not there yet, or Temporal silent: keep the last)
        return None


RUNNERS = {"tasks": list_tasks, "show": show_task, "watch": watch, "inbox": inbox,
           "approve": decide, "reject": decide, "cancel": cancel}


async def run(args: argparse.Namespace, settings: Settings) -> int:
    """One of COMMANDS: read commands answer from the database when no server runs."""
    need = args.command not in ("tasks", "show", "watch")
    stack = await Stack.open(settings, need_temporal=need)
    return await RUNNERS[args.command](args, stack)
