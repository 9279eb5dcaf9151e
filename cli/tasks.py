"""The commands that run work: a task, a code review, the eval suite, history export and replay."""

from __future__ import annotations

# isort: split
import argparse
import asyncio
import contextlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from rich.text import Text

from refloop.cli.output import (
    emit_result,
    err_console,
    fail,
    follow_events,
    print_link,
)
from refloop.contract.task import TaskResult
from refloop.settings import Settings


def read_rules(value: str | None) -> str | None:
    """`--review-rules TEXT|@FILE`."""
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    if not path.is_file():
        fail(f"--review-rules: file not found: {path}")
    return path.read_text(encoding="utf-8")


def chosen_mcp_servers(value: str | None, settings: Settings) -> list[str]:
    """`--mcp git,time`: names REFLOOP_MCP_CONFIG must know."""
    from refloop.contract.errors import McpConfigError
    from refloop.mcp.config import choose, load_config, parse_server_list

    names = parse_server_list(value)
    if not names:
        return []
    if not settings.refloop_mcp_config:
        fail("--mcp needs REFLOOP_MCP_CONFIG (a JSON file with an `mcpServers` map)")
    try:
        return list(choose(load_config(settings.refloop_mcp_config), names))
    except McpConfigError as err:
        fail(f"--mcp: {err}")


async def queue_pollers(client: Any, namespace: str, queue: str) -> set[str]:
    """Identities of the workers polling `queue` for activities (model calls run there)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    described = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=namespace, task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
    return {poller.identity for poller in described.pollers}


async def whose_model(stack: Any, model: str | None, scripted: bool) -> str:
    """The line that says which model runs the task: this command's only when no other
    worker serves its queue (a `refloop up` beside it would take the calls, with its own
    model settings), so it never names a model it does not use."""
    settings = stack.settings
    queue = settings.task_queue
    try:
        mine = f"{os.getpid()}@"  # this process's worker, whatever it appends
        others = {identity for identity in await queue_pollers(
            stack.client, settings.temporal_namespace, queue) if not identity.startswith(mine)}
    except Exception:  # noqa: BLE001 (no answer: say what is known)
        others = set()
    if others or settings.temporal_address:
        names = ", ".join(sorted(others)) or "the queue's workers"
        return (f"[bold magenta]model: the workers serving task queue {queue!r} ({names}) "
                "run this task with their own model settings (a `refloop up` beside this "
                "command: the server's model), not this command's[/]")
    name = model or settings.refloop_model
    if scripted:
        return (f"[bold magenta]model: SCRIPTED offline test double ({name}) at "
                f"{settings.openai_base_url}[/]")
    return f"[bold]model[/]: {name} at {settings.openai_base_url}"


async def on_host(raw: str, host: str, settings: Settings) -> str:
    """`refloop run --host H --workspace PATH` for another machine's host: PATH checked
    against H's roots in the hosts table (this machine need not have it); a host the table
    does not know yet is waited for by the task (REFLOOP_HOST_WAIT_S)."""
    from refloop.contract.hosts import HostRefused, UnknownHost, check_host
    from refloop.runtime.workspaces import WorkspaceError, host_workspace
    from refloop.store.db import store_for
    from refloop.store.hosts import list_hosts

    path = host_workspace(raw, host)
    store = store_for(settings.effective_database_url)
    try:
        check_host(host, path, await asyncio.to_thread(list_hosts, store))
    except UnknownHost as err:
        err_console.print(f"{err}: the task waits for it to register")
    except HostRefused as err:
        raise WorkspaceError(str(err)) from None
    return path


def state_refusal(workspace: Path, settings: Settings) -> str | None:
    """The API's refusal of refloop's own state (`guard_refusal`), except that a user's
    workspace may sit in the data dir (`make demo`'s does) if it neither holds nor lies in
    the journal or the index."""
    from refloop.runtime.workspaces import data_dir, guard_refusal, guarded_dirs

    data = data_dir(settings)
    others = [d for _, d in guarded_dirs(settings) if d != data]
    beside = data in workspace.parents and not any(
        d == workspace or workspace in d.parents or d in workspace.parents for d in others)
    return None if beside else guard_refusal(workspace, settings)


async def run_task(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from refloop.contract.visibility import start_metadata
    from refloop.runtime.workspaces import WorkspaceError, check_user_workspace, workspace_roots
    from refloop.worker.replay import dump_history
    from refloop.worker.stack import embedded_stack
    from refloop.workflows.agent import AgentTaskWorkflow

    try:
        if args.host is not None and args.host != settings.refloop_host_id:
            # On that host's disk: its roots decide, through the hosts table, not this one.
            workspace = await on_host(args.workspace, args.host, settings)
        else:  # any directory of the user's, but never `/`, a system directory, or one
            workspace = check_user_workspace(args.workspace)  # holding refloop's own state
            reason = state_refusal(workspace, settings)
            if reason:
                raise WorkspaceError(reason)
    except WorkspaceError as err:
        fail(f"--workspace: {err}")
    if args.approval_timeout is not None and args.approval_timeout < 1:
        fail("--approval-timeout: at least 1 second")
    rules = read_rules(args.review_rules)
    mcp_servers = chosen_mcp_servers(args.mcp, settings)
    task = settings.task_input(
        task=args.task,
        workspace=str(workspace),
        model=args.model,
        enable_quality_review=bool(rules) and not args.no_quality_review,
        quality_review_rules=rules,
        enable_reflection=False if args.no_reflection else None,
        max_iterations=args.max_iterations,
        max_cost_usd=args.max_cost_usd,
        max_tokens=args.max_tokens,
        approval_mode=args.approval_mode,
        approval_timeout_s=args.approval_timeout,
        mcp_servers=mcp_servers,
        # A deployment's workers are hosts: the workspace is on this one (or --host's).
        host=args.host or (settings.refloop_host_id if settings.temporal_address else None),
    )
    workflow_id = f"task-{uuid.uuid4().hex[:12]}"
    if settings.temporal_address is None:  # this command's own worker holds the workspace
        roots = [*map(str, workspace_roots(settings)), str(workspace)]
        settings = settings.model_copy(update={"refloop_workspace_roots": ",".join(roots)})
    # With TEMPORAL_ADDRESS a separate `refloop worker` does the work.
    async with embedded_stack(settings, with_worker=settings.temporal_address is None) as stack:
        err_console.print(await whose_model(stack, task.model, settings.uses_scripted_model))
        handle = await stack.client.start_workflow(
            AgentTaskWorkflow.run,
            task,
            id=workflow_id,
            task_queue=stack.settings.task_queue,
            **start_metadata(task.task, task.workspace),
        )
        web_ui = stack.temporal.workflow_url(workflow_id) if stack.temporal else None
        err_console.print(f"[bold]workflow[/] {workflow_id}")
        err_console.print(f"follow it from another terminal: refloop watch {workflow_id}")
        if args.approval_mode != "auto":
            err_console.print(Text(
                f"Approvals ({args.approval_mode}): decide with `refloop approve "
                f"{workflow_id}` (or `refloop reject ... --reason ...`; `refloop inbox` lists "
                "what waits), in the console's inbox (`refloop up` on this data dir), or "
                f"with `temporal workflow update execute --workflow-id {workflow_id} --name "
                "decide_approval`."))
        if web_ui:
            print_link("Web UI:", web_ui)
        done = asyncio.Event()
        # the latest run's events: a rewound task goes on in a new run
        follower = asyncio.create_task(follow_events(
            stack.client.get_workflow_handle(workflow_id), done))
        try:
            result = await result_across_rewinds(stack.client, workflow_id,
                                                 handle.result_run_id)
        except WorkflowFailureError as failure:
            cause = failure.cause
            if isinstance(cause, ApplicationError) and cause.details:
                result = TaskResult.model_validate(cause.details[0])
            else:
                result = TaskResult(
                    task_id=workflow_id, workflow_id=workflow_id, status="failed",
                    stop_reason="workflow_failed", answer=str(cause or failure),
                )
        done.set()
        await follower
        if args.save_history:
            history = await handle.fetch_history()
            Path(args.save_history).write_text(dump_history(history), encoding="utf-8")
        owned = stack.temporal is not None and stack.temporal.owned_pid is not None
        moved = stack.temporal is not None and stack.temporal.asked_port is not None
    emit_result(result, args.json)
    if web_ui:
        # A server on a free port (another data dir held the asked one) may be elsewhere next
        # time: the link's port is then the one `refloop up` prints.
        if owned:
            err_console.print(Text(
                "This command's server has stopped: `refloop up` serves the task from "
                f"{settings.refloop_data_dir}"
                + (", on the Web UI port it prints." if moved else ".")))
        print_link("Web UI:", web_ui)
    return 0 if result.status == "completed" else 1


async def result_across_rewinds(client: Any, workflow_id: str, run_id: str | None
                                ) -> TaskResult:
    """The task's result, followed across rewinds: a reset ends the run it replaces as
    terminated, and the task goes on in the new run (`refloop run` said `failed` there)."""
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import TerminatedError

    from refloop.workflows.agent import AgentTaskWorkflow

    while True:
        try:
            return await client.get_workflow_handle_for(
                AgentTaskWorkflow.run, workflow_id, run_id=run_id).result()
        except WorkflowFailureError as failure:
            latest = (await client.get_workflow_handle(workflow_id).describe()).run_id
            if not isinstance(failure.cause, TerminatedError) or latest == run_id:
                raise
            run_id = latest


async def export_history(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.runtime.client import connect
    from refloop.worker.replay import dump_history

    address = settings.temporal_address
    if not address:
        fail(
            "no Temporal server to read from: start `refloop up` (its dev server keeps "
            "every task's history) or set TEMPORAL_ADDRESS"
        )
    client = await connect(address, settings.temporal_namespace)
    history = await client.get_workflow_handle(args.workflow_id).fetch_history()
    Path(args.output).write_text(dump_history(history), encoding="utf-8")
    err_console.print(f"saved {len(history.events)} events to {args.output}")
    return 0


async def rewind_task(args: argparse.Namespace, settings: Settings) -> int:
    """`refloop rewind TASK --to-step N`: as POST /tasks/{id}/rewind (api/branching.py)."""
    from refloop.api.branching import BranchRefused, rewind
    from refloop.runtime.client import connect

    if not settings.temporal_address:
        fail("no Temporal server: start `refloop up` or set TEMPORAL_ADDRESS")
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    try:
        done = await rewind(client, args.task, args.to_step)
    except BranchRefused as err:
        fail(err.message if err.message.startswith(f"task {args.task}")
             else f"task {args.task} not rewound: {err.message}")
    err_console.print(f"task {args.task} rewound to step {done.step} (checkpoint "
                      f"{done.checkpoint_id[:12]}, after call {done.call_id}): "
                      f"{done.edits_taken_back} later "
                      f"{'edit' if done.edits_taken_back == 1 else 'edits'} taken back; it goes "
                      "on from there"
                      + (f"; {done.rewound_tokens} tokens of the calls taken back stay in "
                         "its ledger, marked rewound" if done.rewound_tokens else ""))
    return 0


async def fork_task(args: argparse.Namespace, settings: Settings) -> int:
    """`refloop fork TASK --at-step N [--task TEXT] [--workspace DIR]`: as POST
    /tasks/{id}/fork (api/branching.py)."""
    from refloop.api.branching import BranchRefused, fork
    from refloop.runtime.client import connect
    from refloop.store.db import store_for

    if not settings.temporal_address:
        fail("no Temporal server: start `refloop up` or set TEMPORAL_ADDRESS")
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    store = store_for(settings.effective_database_url)
    try:
        done = await fork(client, store, settings, args.task, args.at_step,
                          args.instruction, args.workspace)
    except BranchRefused as err:
        fail(err.message if err.message.startswith(f"task {args.task}")
             else f"task {args.task} not forked: {err.message}")
    err_console.print(f"task {done.task_id} forked from {args.task} at step {done.step} "
                      f"(checkpoint {done.checkpoint_id[:12]}), its workspace {done.workspace}"
                      + (f" on host {done.host}" if done.host else ""))
    err_console.print(f"follow it: refloop watch {done.task_id}")
    print(done.task_id)
    return 0


async def replay_histories(args: argparse.Namespace) -> int:
    from refloop.worker.replay import replay_files

    failures = await replay_files([Path(p) for p in args.files])
    for path, error in failures.items():
        err_console.print(f"[bold red]NON-DETERMINISTIC[/] {path}: {error}")
    if not failures:
        count = len(args.files)
        err_console.print(f"[green]{count} {'history' if count == 1 else 'histories'} "
                          "replayed cleanly[/]")
    return 1 if failures else 0


def review_host(args: argparse.Namespace, settings: Settings | None) -> str | None:
    """The host whose disk a review reads: --host, else (a file review on a deployment,
    where workers are hosts) this machine. A diff or snippet carries its content."""
    host = getattr(args, "host", None)
    if host is None and args.file and settings is not None and settings.temporal_address:
        host = settings.refloop_host_id
    return host


def review_request(args: argparse.Namespace, settings: Settings | None = None) -> Any:
    """The code-review supervisor's unified task JSON from the command line."""
    from refloop.contract.code_review import CodeReviewInput
    from refloop.tools.safe_git import GitError, git_diff

    workdir = Path(args.workdir).resolve()
    if not workdir.is_dir():
        fail(f"--workdir: not a directory: {workdir}")
    common = {"working_directory": str(workdir), "task_desc": args.desc,
              "output_format": args.format, "model": args.model,
              "host": review_host(args, settings), **review_limit(args, settings)}
    if args.snippet is not None:
        return CodeReviewInput(review_type="snippet", content=args.snippet, **common)
    if args.file:
        return CodeReviewInput(review_type="file", file_paths=args.file, **common)
    if args.git_range:
        try:  # sandboxed, and no program the repository's config names runs
            diff = git_diff(workdir, args.git_range, settings or Settings())
        except GitError as err:
            fail(f"--git-range: git diff failed: {err}")
    elif args.diff == "-":
        diff = sys.stdin.read()
    else:
        path = Path(args.diff)
        if not path.is_file():
            fail(f"--diff: file not found: {path}")
        diff = path.read_text(encoding="utf-8")
    if not diff.strip():
        fail("the diff is empty: nothing to review")
    return CodeReviewInput(review_type="diff", content=diff, **common)


def review_limit(args: argparse.Namespace, settings: Settings | None) -> dict[str, Any]:
    """--max-cost-usd and --max-tokens, with the operator's bound on the wait for a raise."""
    cost, tokens = getattr(args, "max_cost_usd", None), getattr(args, "max_tokens", None)
    if cost is None and tokens is None:
        return {}
    if (cost is not None and cost <= 0) or (tokens is not None and tokens <= 0):
        fail("--max-cost-usd and --max-tokens: above 0")
    return {"max_cost_usd": cost, "max_tokens": tokens,
            "budget_wait_s": (settings or Settings()).refloop_budget_wait_s}


async def tell_budget_wait(handle: Any, workflow_id: str, done: asyncio.Event) -> None:
    """A line when the review waits for budget (and how to raise it), one when it goes on."""
    from refloop.workflows.code_review import CodeReviewWorkflow

    waiting = False
    while not done.is_set():
        try:
            told = await handle.query(CodeReviewWorkflow.status)
        except Exception:  # noqa: BLE001 - not on a worker yet, or ended: ask again
            told = {}
        now = told.get("stage") == "waiting_for_budget"
        if now and not waiting:
            spend = told.get("budget") or {}
            err_console.print(Text(
                f"waiting for budget: ${spend.get('cost_usd', 0):.4f}, "
                f"{spend.get('tokens', 0)} tokens spent; raise it with `refloop budget "
                f"{workflow_id} --max-cost-usd X` (or `--max-tokens N`)"))
        elif waiting and not now:
            err_console.print("budget raised: the review goes on")
        waiting = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 1.0)


def failure_text(failure: BaseException) -> str:
    """The innermost message of a failed workflow (our activities word it for users)."""
    cause: BaseException | None = failure
    text = str(failure)
    while cause is not None:
        text = getattr(cause, "message", None) or str(cause) or text
        cause = cause.__cause__
    return text


async def run_review(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError

    from refloop.contract.code_review import CodeReviewResult
    from refloop.contract.visibility import start_metadata
    from refloop.worker.stack import embedded_stack
    from refloop.workflows.code_review import CodeReviewWorkflow

    request = review_request(args, settings)
    workflow_id = f"review-{uuid.uuid4().hex[:12]}"
    limited = request.max_cost_usd is not None or request.max_tokens is not None
    async with embedded_stack(settings, with_worker=settings.temporal_address is None) as stack:
        err_console.print(f"[bold]code review[/] {workflow_id} ({request.review_type})")
        if limited:  # a row, so `refloop budget` and `refloop tasks` find it
            await asyncio.to_thread(record_review_row, stack.settings, request, workflow_id,
                                    "running")
        handle = await stack.client.start_workflow(
            CodeReviewWorkflow.run, request, id=workflow_id,
            task_queue=stack.settings.task_queue, result_type=CodeReviewResult,
            **start_metadata(f"code review ({request.review_type}) {args.desc}".strip()))
        done = asyncio.Event()
        teller = asyncio.create_task(tell_budget_wait(handle, workflow_id, done)) \
            if limited else None
        try:
            result: CodeReviewResult = await handle.result()
        except WorkflowFailureError as failure:  # e.g. a host that cannot read --workdir
            err_console.print(f"[bold red]code review failed:[/] {failure_text(failure)}")
            return 1
        finally:
            done.set()
            if teller is not None:
                await teller
        if limited:
            await asyncio.to_thread(record_review_row, stack.settings, request, workflow_id,
                                    result.status, result)
    for attempt in result.attempts:
        err_console.print(f"[yellow]attempt {attempt['attempt']} ({attempt['agent']}): "
                          f"{attempt['error']}[/]")
    if result.dropped_hallucinations:
        err_console.print(f"dropped {result.dropped_hallucinations} findings citing lines "
                          "that are not in the content")
    if result.skipped_content:
        err_console.print(f"skipped (over the size cap): {', '.join(result.skipped_content)}")
    if result.stop_reason:
        err_console.print(f"[yellow]stopped: {result.stop_reason}[/]")
    usage = result.usage
    err_console.print(f"cost: ${usage.cost_usd:.4f}, {usage.calls} model calls, "
                      f"{usage.total_tokens} tokens" + (
                          f"; {usage.unpriced_calls} unpriced (a model not in "
                          "REFLOOP_MODEL_PRICES)" if usage.unpriced_calls else ""))
    if args.json:
        print(result.model_dump_json())
    elif isinstance(result.output, str):
        print(result.output)
    else:
        print(json.dumps(result.output, ensure_ascii=False, indent=2))
    return 0 if result.status == "completed" else 1


def record_review_row(settings: Settings, request: Any, workflow_id: str, status: str,
                      result: Any = None) -> None:
    """The review's task row (kind code_review), as POST /code-reviews keeps it: found by
    `refloop budget` and `refloop tasks`."""
    from refloop.contract.task import RecordTaskInput
    from refloop.store.db import store_for

    ended = {} if result is None else {"result": result.model_dump(mode="json"),
                                       "usage": {"usage": result.usage.model_dump(mode="json")}}
    store_for(settings.effective_database_url).record_task(RecordTaskInput(
        task_id=workflow_id, workflow_id=workflow_id, kind="code_review", status=status,
        input=request.model_copy(update={"task_id": workflow_id}).model_dump(mode="json"),
        **ended))


async def run_eval(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.cli.eval_harness import load_suite, render, run_suite, summarise

    try:
        scenarios = load_suite(args.suite)
    except ValueError as err:
        fail(str(err))
    outcomes = await run_suite(scenarios, settings)
    table = summarise(outcomes)
    if args.json:
        print(json.dumps({"metrics": table,
                          "runs": [o.model_dump(mode="json") for o in outcomes]}))
    else:
        print(render(table, outcomes))
    return 0


async def move_task(args: argparse.Namespace, settings: Settings) -> int:
    """`refloop move TASK --host H [--workspace PATH]`: a task waiting for a host that will
    never return goes to H (live, its roots holding the task's workspace, copied there
    first: at the same path, or at PATH)."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from refloop.api.routes.hosts import live_host_holding
    from refloop.api.routes.tasks import describe_update_failure, move_session
    from refloop.contract.hosts import HostMove, HostRefused
    from refloop.runtime.client import connect
    from refloop.runtime.workspaces import WorkspaceError, host_workspace
    from refloop.store.db import store_for
    from refloop.store.hosts import list_hosts
    from refloop.workflows.agent import AgentTaskWorkflow

    if not settings.temporal_address:
        fail("refloop move needs the deployment: set TEMPORAL_ADDRESS and DATABASE_URL")
    store = store_for(settings.effective_database_url)
    row = await asyncio.to_thread(store.get_task, args.task)
    if row is None or row.kind != "agent":
        fail(f"no agent task {args.task!r} in the database")
    workspace = row.input.get("workspace", "")
    try:
        if args.workspace is not None:  # the copy's path on the new host
            workspace = host_workspace(args.workspace, args.host)
        target = live_host_holding(await asyncio.to_thread(list_hosts, store), args.host,
                                   workspace)
    except (HostRefused, WorkspaceError) as err:
        fail(str(err))
    moved_to = workspace if args.workspace is not None else None
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    try:
        await client.get_workflow_handle(row.workflow_id).execute_update(
            AgentTaskWorkflow.move_to_host, HostMove(host=target, workspace=moved_to))
    except WorkflowUpdateFailedError as err:
        fail(f"task {args.task} not moved: {describe_update_failure(err)}")
    except RPCError as err:
        fail(f"task {args.task} not moved: {err.message}")
    if row.session_id:
        await asyncio.to_thread(move_session, store, row.session_id, args.host, moved_to)
    err_console.print(f"task {args.task} moved from {row.input.get('host')} to {args.host}"
                      + (f", its workspace at {moved_to}" if moved_to else ""))
    return 0
