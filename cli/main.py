"""`refloop` command line: a thin client over the embedded stack or a running deployment.

Progress goes to stderr, results to stdout, so `--json` output pipes cleanly.
"""

from __future__ import annotations

import refloop.search.warm_start  # noqa: F401  (first: a worker's search model loads meanwhile)

# isort: split
import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from refloop.contract.messages import TokenUsage
from refloop.contract.task import Event, TaskResult
from refloop.settings import Settings, SettingsError, load_settings

err_console = Console(stderr=True, highlight=False)

EVENT_STYLE = {
    "plan": "bold cyan",
    "step": "cyan",
    "tool_call": "yellow",
    "tool_result": "green",
    "completed": "bold green",
    "incomplete": "bold yellow",
    "failed": "bold red",
}


def fail(message: str) -> NoReturn:
    """Bad input: one clear line on stderr, exit code 2."""
    err_console.print(f"[bold red]error:[/] {message}")
    raise SystemExit(2)


def read_rules(value: str | None) -> str | None:
    """`--review-rules TEXT|@FILE`."""
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    if not path.is_file():
        fail(f"--review-rules: file not found: {path}")
    return path.read_text(encoding="utf-8")


def describe_event(event: Event) -> str:
    data = event.data
    match event.type:
        case "plan":
            steps = "; ".join(f"{n}. {s['goal']} [{s['tool']}]" for n, s in enumerate(
                data.get("steps", []), start=1))
            return f"plan ({data.get('task_type')}): {steps}"
        case "step":
            return f"step {data.get('step')}: {data.get('goal')}" if data.get("step") else (
                "all plan steps complete")
        case "tool_call":
            return f"→ {data.get('tool')} {json.dumps(data.get('args'), ensure_ascii=False)[:120]}"
        case "tool_result":
            status = "ok" if data.get("ok") else f"error: {data.get('error')}"
            unconfined = str(data.get("output", "")).startswith("[UNSANDBOXED]")
            return f"← {data.get('tool')} {status}" + (" [UNSANDBOXED]" if unconfined else "")
        case "mcp_tools":
            return (f"MCP tools ({', '.join(data.get('servers', []))}): "
                    f"{', '.join(data.get('tools', [])) or 'none'}")
        case _:
            return f"{event.type}: {json.dumps(data, ensure_ascii=False)[:160]}"


def print_event(event: Event) -> None:
    style = EVENT_STYLE.get(event.type, "dim")
    err_console.print(f"[{style}]{describe_event(event)}[/{style}]")


async def follow_events(handle: Any, done: asyncio.Event) -> None:
    """Print events as they appear, by polling the workflow's query."""
    from refloop.workflows.agent import AgentTaskWorkflow

    seen = 0
    while True:
        finished = done.is_set()
        try:
            events = await handle.query(AgentTaskWorkflow.events, seen)
        except Exception:  # the run may have closed between polls; the result has all
            events = []
        for event in events:
            print_event(event)
            seen = event.seq
        if finished:
            return
        await asyncio.sleep(0.3)


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


async def run_task(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from refloop.contract.visibility import start_metadata
    from refloop.runtime.workspaces import WorkspaceError, check_user_workspace
    from refloop.worker.replay import dump_history
    from refloop.worker.stack import embedded_stack
    from refloop.workflows.agent import AgentTaskWorkflow

    try:  # any directory of the user's, but never `/` or a system directory
        workspace = check_user_workspace(args.workspace)
    except WorkspaceError as err:
        fail(f"--workspace: {err}")
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
        mcp_servers=mcp_servers,
    )
    workflow_id = f"task-{uuid.uuid4().hex[:12]}"
    # With TEMPORAL_ADDRESS a separate `refloop worker` does the work.
    async with embedded_stack(settings, with_worker=settings.temporal_address is None) as stack:
        if settings.uses_scripted_model:
            err_console.print("[bold magenta]model: SCRIPTED offline test double[/]")
        handle = await stack.client.start_workflow(
            AgentTaskWorkflow.run,
            task,
            id=workflow_id,
            task_queue=stack.settings.refloop_task_queue,
            **start_metadata(task.task, task.workspace),
        )
        web_ui = stack.temporal.workflow_url(workflow_id) if stack.temporal else None
        err_console.print(f"[bold]workflow[/] {workflow_id}"
                          + (f"  Web UI {web_ui}" if web_ui else ""))
        done = asyncio.Event()
        follower = asyncio.create_task(follow_events(handle, done))
        try:
            result = await handle.result()
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
    emit_result(result, args.json)
    if web_ui:
        later = (" (this command's server has stopped: `refloop up` serves the task from "
                 f"{settings.refloop_data_dir})") if owned else ""
        err_console.print(f"[bold]Web UI[/] {web_ui}{later}")
    return 0 if result.status == "completed" else 1


def emit_result(result: TaskResult, as_json: bool) -> None:
    if as_json:
        payload = {
            "workflow_id": result.workflow_id,
            "status": result.status,
            "answer": result.answer,
            "events": [event.model_dump(mode="json") for event in result.events],
            "stats": result.stats.model_dump(mode="json"),
            "quality_reviews": [r.model_dump(mode="json") for r in result.quality_reviews],
            "stop_reason": result.stop_reason,
            "missing": result.missing,
            "summary": result.summary,
        }
        print(json.dumps(payload, ensure_ascii=False))
        return
    print(f"status: {result.status} ({result.stop_reason})")
    for item in result.missing:
        print(f"missing: {item}")
    print(f"answer: {result.answer}")
    if result.summary:
        print(f"summary: {result.summary}")
    stats = result.stats
    print(
        f"stats: {stats.iterations} iterations, {stats.llm_calls} model calls"
        f"{failed_calls_note(stats.usage)}, {stats.tool_calls} tool calls, "
        f"{stats.usage.total_tokens} tokens"
    )


def failed_calls_note(usage: TokenUsage) -> str:
    """" (3 failed; 1 abandoned, usage unknown: at most 384 more completion tokens)"."""
    if not usage.failed_calls:
        return ""
    note = f" ({usage.failed_calls} failed"
    if usage.abandoned_calls:
        note += (f"; {usage.abandoned_calls} abandoned, usage unknown: at most "
                 f"{usage.abandoned_max_tokens} more completion tokens")
    return note + ")"


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


async def replay_histories(args: argparse.Namespace) -> int:
    from refloop.worker.replay import replay_files

    failures = await replay_files([Path(p) for p in args.files])
    for path, error in failures.items():
        err_console.print(f"[bold red]NON-DETERMINISTIC[/] {path}: {error}")
    if not failures:
        err_console.print(f"[green]{len(args.files)} histories replayed cleanly[/]")
    return 1 if failures else 0


def review_request(args: argparse.Namespace) -> Any:
    """The code-review supervisor's unified task JSON from the command line."""
    import subprocess

    from refloop.contract.code_review import CodeReviewInput

    workdir = Path(args.workdir).resolve()
    if not workdir.is_dir():
        fail(f"--workdir: not a directory: {workdir}")
    common = {"working_directory": str(workdir), "task_desc": args.desc,
              "output_format": args.format, "model": args.model}
    if args.snippet is not None:
        return CodeReviewInput(review_type="snippet", content=args.snippet, **common)
    if args.file:
        return CodeReviewInput(review_type="file", file_paths=args.file, **common)
    if args.git_range:
        done = subprocess.run(["git", "diff", args.git_range], cwd=workdir,
                              capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"--git-range: git diff failed: {done.stderr.strip()}")
        diff = done.stdout
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


async def run_review(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.contract.code_review import CodeReviewResult
    from refloop.contract.visibility import start_metadata
    from refloop.worker.stack import embedded_stack
    from refloop.workflows.code_review import CodeReviewWorkflow

    request = review_request(args)
    workflow_id = f"review-{uuid.uuid4().hex[:12]}"
    async with embedded_stack(settings, with_worker=settings.temporal_address is None) as stack:
        err_console.print(f"[bold]code review[/] {workflow_id} ({request.review_type})")
        result: CodeReviewResult = await stack.client.execute_workflow(
            CodeReviewWorkflow.run, request, id=workflow_id,
            task_queue=stack.settings.refloop_task_queue, result_type=CodeReviewResult,
            **start_metadata(f"code review ({request.review_type}) {args.desc}".strip()))
    for attempt in result.attempts:
        err_console.print(f"[yellow]attempt {attempt['attempt']} ({attempt['agent']}): "
                          f"{attempt['error']}[/]")
    if result.dropped_hallucinations:
        err_console.print(f"dropped {result.dropped_hallucinations} findings citing lines "
                          "that are not in the content")
    if result.skipped_content:
        err_console.print(f"skipped (over the size cap): {', '.join(result.skipped_content)}")
    if args.json:
        print(result.model_dump_json())
    elif isinstance(result.output, str):
        print(result.output)
    else:
        print(json.dumps(result.output, ensure_ascii=False, indent=2))
    return 0 if result.status == "completed" else 1


async def run_eval(args: argparse.Namespace) -> int:
    from refloop.cli.eval_harness import load_suite, render, run_suite, summarise

    try:
        scenarios = load_suite(args.suite)
    except ValueError as err:
        fail(str(err))
    outcomes = await run_suite(scenarios)
    table = summarise(outcomes)
    if args.json:
        print(json.dumps({"metrics": table,
                          "runs": [o.model_dump(mode="json") for o in outcomes]}))
    else:
        print(render(table, outcomes))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refloop", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="full tracebacks of failed activity attempts on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one agent task to the end")
    run.add_argument("task")
    run.add_argument("--workspace", required=True)
    run.add_argument("--review-rules", help="TEXT or @FILE; turns quality review on")
    run.add_argument("--no-quality-review", action="store_true")
    run.add_argument("--no-reflection", action="store_true")
    run.add_argument("--json", action="store_true", help="one JSON object on stdout")
    run.add_argument("--model", help="model name (default REFLOOP_MODEL)")
    run.add_argument("--max-iterations", type=int, default=20)
    run.add_argument("--save-history", metavar="FILE", help="write the event history")
    run.add_argument("--mcp", metavar="NAMES",
                     help="MCP servers whose tools the task may use, e.g. git,time "
                          "(names in the REFLOOP_MCP_CONFIG file)")

    sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS")
    sub.add_parser("mcp", help="serve refloop's tasks as an MCP server over stdio "
                               "(TEMPORAL_ADDRESS, else the embedded stack)")
    for name, text in (("up", "the embedded stack: Temporal, worker and API"),
                       ("api", "the HTTP API against TEMPORAL_ADDRESS")):
        serve = sub.add_parser(name, help=text)
        serve.add_argument("--port", type=int,
                           help="API port (default REFLOOP_API_PORT or 8000)")
        serve.add_argument("--host", default="127.0.0.1")
        if name == "up":
            serve.add_argument("--temporal-port", type=int, help="embedded Temporal gRPC "
                               "port (default REFLOOP_TEMPORAL_PORT or 7233)")
            serve.add_argument("--ui-port", type=int, help="Temporal Web UI port (default "
                               "REFLOOP_UI_PORT or 8233)")

    history = sub.add_parser("history", help="export a workflow's event history")
    history.add_argument("workflow_id")
    history.add_argument("-o", "--output", required=True)
    replay = sub.add_parser("replay", help="replay histories against the current code")
    replay.add_argument("files", nargs="+")

    review = sub.add_parser(
        "review", help="the code-review supervisor: Review, then Verify, then merge")
    source = review.add_mutually_exclusive_group(required=True)
    source.add_argument("--diff", metavar="FILE", help="a unified diff file, or - for stdin")
    source.add_argument("--git-range", metavar="A..B", help="git diff A..B in --workdir")
    source.add_argument("--file", nargs="+", metavar="PATH", help="files to review")
    source.add_argument("--snippet", metavar="TEXT", help="inline code")
    review.add_argument("--format", default="detailed",
                        help='detailed | simple | "a free-text format instruction"')
    review.add_argument("--workdir", default=".", help="working directory (default: .)")
    review.add_argument("--desc", default="", help="task description / focus")
    review.add_argument("--json", action="store_true", help="the whole result as JSON")
    review.add_argument("--model", help="model name (default REFLOOP_REVIEW_MODEL)")

    evaluate = sub.add_parser(
        "eval", help="early-reflection metrics over a scenario suite, triggers on vs off")
    evaluate.add_argument("--suite", help="a folder of scenario YAML files")
    evaluate.add_argument("--json", action="store_true")

    scripted = sub.add_parser("scripted-llm", help="the scripted OpenAI-compatible model")
    scripted.add_argument("--scenario", help="scenario file (else load them over HTTP)")
    scripted.add_argument("--port", type=int, default=8089)
    scripted.add_argument("--host", default="127.0.0.1")
    return parser


# Set while uvicorn serves: it handles SIGTERM/SIGINT itself (a graceful HTTP shutdown,
# then `serve` returns), so the signal must not also cancel the command mid-shutdown.
_UVICORN_SERVES: list[bool] = []


async def serve_api(settings: Settings, client: Any, host: str, port: int) -> None:
    import uvicorn

    from refloop.api.bind import console_url, secure_bind
    from refloop.api.main import create_app

    settings, generated = secure_bind(settings, host)
    if generated:  # off loopback, nothing is served without a token
        err_console.print(f"[bold yellow]REFLOOP_API_TOKEN is unset and {host} is not "
                          "loopback: generated a token for this run.[/] Open "
                          f"{console_url(host, port, generated)}")
    # Open event streams must not hold a stop past the grace period.
    config = uvicorn.Config(create_app(settings, client=client), host=host, port=port,
                            log_level="warning",
                            timeout_graceful_shutdown=int(settings.refloop_graceful_shutdown_s))
    _UVICORN_SERVES.append(True)
    await uvicorn.Server(config).serve()


async def run_up(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.worker.stack import embedded_stack

    async with embedded_stack(settings) as stack:
        where = stack.temporal.address if stack.temporal else settings.temporal_address
        ui = stack.temporal.ui_url if stack.temporal else None
        err_console.print(f"[bold]refloop up[/]: Temporal {where}, Web UI {ui or '(none)'}, "
                          f"API http://{args.host}:{args.port} (docs at /docs); worker on "
                          f"{settings.refloop_task_queue}; Ctrl-C to stop")
        await serve_api(stack.settings, stack.client, args.host, args.port)
    return 0


def hard_exit(code: int) -> NoReturn:
    """End the process now (its clean-up hung), stopping the embedded Temporal server it
    owns first: no server outlives its command."""
    servers = sys.modules.get("refloop.worker.temporal_server")  # loaded only if one was started
    if servers is not None:
        with contextlib.suppress(Exception):  # exiting regardless
            servers.stop_owned_servers()
    os._exit(code)


def start_watchdog(grace_s: float, signum: int) -> None:
    """Cut a clean-up that hangs (a model call a slow local server never answers) short at
    the grace period + 4 s."""
    watchdog = threading.Timer(grace_s + 4, hard_exit, args=(128 + signum,))
    watchdog.daemon = True
    watchdog.start()


async def until_signalled(runner: Any, settings: Settings) -> int:
    """Run a long-lived command until SIGTERM or SIGINT, then let its clean-up run (the
    worker drains in-flight activities for the grace period; the embedded server stops).
    A clean-up that hangs is cut short: the process exits at the grace period + 4 s."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:
            return
        received.append(signum)
        start_watchdog(settings.refloop_graceful_shutdown_s, signum)
        assert main_task is not None
        if not _UVICORN_SERVES:
            main_task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        code = await runner
    except asyncio.CancelledError:
        if not received:
            raise
        return 128 + received[0]  # 143 (SIGTERM) or 130 (SIGINT), as a shell reports it
    return 128 + received[0] if received else code


async def run_api(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.temporal_address:
        fail("refloop api needs a Temporal server: set TEMPORAL_ADDRESS or start `refloop up`")
    await serve_api(settings, None, args.host, args.port)
    return 0


class OneLineFailures(logging.Filter):
    """Without --verbose: a failed activity attempt is one line, never a traceback. Model
    calls already logged theirs ("act attempt 2/6 failed: HTTP 500 ...; retrying in 4 s");
    any other activity gets one line here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "__temporal_error_identifier", None) != "ActivityFailure":
            return True
        err = record.exc_info[1] if record.exc_info else None
        from refloop.contract.errors import LLMError

        if err is not None and isinstance(err.__cause__, LLMError):
            return False
        info = getattr(record, "temporal_activity", {}) or {}
        name = str(info.get("activity_type", "activity")).rsplit(".", 1)[-1]
        text = " ".join(str(err).split())[:240] if err is not None else record.getMessage()
        record.msg, record.args = "%s attempt %s failed: %s", (name, info.get("attempt", "?"),
                                                               text)
        record.exc_info, record.exc_text = None, None
        return True


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(OneLineFailures())


class Terminated(BaseException):
    """SIGTERM (docker stop, systemd, a supervisor), raised like Ctrl-C's
    KeyboardInterrupt so every command's clean-up runs. The default handler ends the
    process at once: `refloop up` then left its embedded Temporal server running, since
    uvicorn re-raises the signal after its own graceful shutdown."""


def _terminate_within(grace_s: float) -> Callable[[int, object], NoReturn]:
    """The SIGTERM handler: raise Terminated so clean-up runs, and cut a clean-up that hangs
    (a model call a slow local server never answers) short at the grace period + 4 s."""
    def handler(signum: int, frame: object) -> NoReturn:
        start_watchdog(grace_s, signum)
        raise Terminated

    return handler


def _not_a_cancellation(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not isinstance(error, asyncio.CancelledError)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        settings = load_settings()
    except SettingsError as err:
        err_console.print(f"[bold red]{err}[/]")
        raise SystemExit(2) from None
    if args.command in ("up", "api"):
        args.port = args.port or settings.refloop_api_port
        ports = {"refloop_temporal_port": getattr(args, "temporal_port", None),
                 "refloop_ui_port": getattr(args, "ui_port", None)}
        settings = settings.model_copy(update={k: v for k, v in ports.items() if v})
    if args.command in ("worker", "api", "history") and not settings.temporal_address:
        from refloop.worker.temporal_server import find_running_address

        # The server a running `refloop up` (or anything on the Temporal port) serves.
        found = find_running_address(settings.refloop_data_dir, settings.refloop_temporal_port)
        settings = settings.model_copy(update={"temporal_address": found})
    if args.command == "scripted-llm":
        from refloop.llm.scripted import serve

        serve(args.scenario, args.host, args.port)
        return
    if args.command in ("worker", "up") and settings.refloop_semantic_index:
        # Long-lived workers load LanceDB and the model while we import; one-shot commands
        # (run, review) do not pay for a load their task may never use.
        from refloop.search.runtime import start_warm_up

        start_warm_up(settings.refloop_embedding_model)
    if args.command == "worker":
        from refloop.worker.main import run_worker

        runner = until_signalled(run_worker(settings), settings)
    elif args.command == "run":
        runner = run_task(args, settings)
    elif args.command == "mcp":
        from refloop.cli.mcp_stdio import serve_stdio

        runner = serve_stdio(settings)
    elif args.command == "up":
        runner = until_signalled(run_up(args, settings), settings)
    elif args.command == "api":
        runner = until_signalled(run_api(args, settings), settings)
    elif args.command == "eval":
        runner = run_eval(args)
    elif args.command == "review":
        runner = run_review(args, settings)
    elif args.command == "history":
        runner = export_history(args, settings)
    else:
        runner = replay_histories(args)
    if args.command in ("run", "review"):
        # The worker stops with the command: background work the task left (indexing) is
        # cancelled then, which is expected, not a failure worth a traceback.
        logging.getLogger("temporalio.activity").addFilter(_not_a_cancellation)
    try:
        signal.signal(signal.SIGTERM, _terminate_within(settings.refloop_graceful_shutdown_s))
        code = asyncio.run(runner)
    except KeyboardInterrupt:
        code = 130
    except Terminated:
        code = 143  # 128 + SIGTERM, as a shell reports it
    sys.exit(code or 0)
