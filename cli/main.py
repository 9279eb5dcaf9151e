"""`refloop` command line: a thin client over the embedded stack or a running deployment.

Progress goes to stderr, results to stdout, so `--json` output pipes cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from refloop.cli.output import (
    err_console,
)
from refloop.cli.serve import (
    Terminated,
    _not_a_cancellation,
    _terminate_within,
    configure_logging,
    run_api,
    run_up,
    until_signalled,
)
from refloop.cli.tasks import (
    export_history,
    move_task,
    replay_histories,
    run_eval,
    run_review,
    run_task,
)
from refloop.settings import SettingsError, load_settings


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
    run.add_argument("--host", help="the worker host holding the workspace (default: this "
                     "machine's REFLOOP_HOST_ID when TEMPORAL_ADDRESS names a deployment)")
    run.add_argument("--save-history", metavar="FILE", help="write the event history")
    run.add_argument("--mcp", metavar="NAMES",
                     help="MCP servers whose tools the task may use, e.g. git,time "
                          "(names in the REFLOOP_MCP_CONFIG file)")

    move = sub.add_parser("move", help="move a task waiting for a host that will never "
                          "return to another host (copy its workspace there first)")
    move.add_argument("task", help="the task ID")
    move.add_argument("--host", required=True, help="the live host to run it on; its "
                      "roots must hold the task's workspace path")

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
    review.add_argument("--host", help="the worker host holding --workdir, for --file "
                        "(default: this machine's REFLOOP_HOST_ID when TEMPORAL_ADDRESS "
                        "names a deployment)")

    evaluate = sub.add_parser(
        "eval", help="early-reflection metrics over a scenario suite, triggers on vs off")
    evaluate.add_argument("--suite", help="a folder of scenario YAML files")
    evaluate.add_argument("--json", action="store_true")

    scripted = sub.add_parser("scripted-llm", help="the scripted OpenAI-compatible model")
    scripted.add_argument("--scenario", help="scenario file (else load them over HTTP)")
    scripted.add_argument("--port", type=int, default=8089)
    scripted.add_argument("--host", default="127.0.0.1")
    return parser




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
    if args.command in ("worker", "api", "history", "move") and not settings.temporal_address:
        from refloop.worker.temporal_server import find_running_address

        # The server a running `refloop up` of this data dir serves, wherever its port.
        found = find_running_address(settings.refloop_data_dir)
        settings = settings.model_copy(update={"temporal_address": found})
    if args.command == "scripted-llm":
        from refloop.llm.scripted import serve

        serve(args.scenario, args.host, args.port)
        return
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
    elif args.command == "move":
        runner = move_task(args, settings)
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
