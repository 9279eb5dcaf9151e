"""`refloop` command line: a thin client over the embedded stack or a running deployment.

Progress goes to stderr, results to stdout, so `--json` output pipes cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from refloop.cli import budget, people, upgrade
from refloop.cli.output import (
    err_console,
)
from refloop.cli.serve import (
    Terminated,
    _not_a_cancellation,
    _terminate_within,
    configure_logging,
    hard_exit,
    run_api,
    run_up,
    until_signalled,
    witness_signals,
)
from refloop.cli.tasks import (
    export_history,
    fork_task,
    move_task,
    replay_histories,
    rewind_task,
    run_eval,
    run_review,
    run_task,
)
from refloop.settings import Settings, SettingsError, load_settings

# Commands that only talk to a Temporal server: no worker, no server of their own.
CLIENT_ONLY = ("history", "move", "rewind", "fork", upgrade.COMMAND, budget.COMMAND,
               *people.COMMANDS)
# Commands that run until signalled, with their own clean-up (worker drain, servers stopped).
LONG_LIVED = ("worker", "up", "api")


class UsageFormatter(argparse.HelpFormatter):
    """argparse keeps a group of alternatives on one usage line however wide (`review`'s
    sources were 96 columns): a line wider than the terminal is broken after a `|`."""

    def _format_usage(self, usage, actions, groups, prefix) -> str:  # noqa: ANN001
        lines = []
        for line in super()._format_usage(usage, actions, groups, prefix).split("\n"):
            while len(line) > self._width and " | " in line[:self._width]:
                cut = line.rfind(" | ", 0, self._width - 1) + 2
                indent = len(line) - len(line.lstrip()) + 1
                lines.append(line[:cut])
                line = " " * indent + line[cut:].lstrip()
            lines.append(line)
        return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refloop", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="full tracebacks of failed activity attempts on stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run one agent task to the end")
    run.add_argument("task", help="the task, in words")
    run.add_argument("--workspace", required=True,
                     help="the directory the task works in (any of yours but / and system "
                          "directories)")
    run.add_argument("--review-rules", help="TEXT or @FILE; turns quality review on")
    run.add_argument("--no-quality-review", action="store_true",
                     help="no quality review, even with --review-rules")
    run.add_argument("--no-reflection", action="store_true",
                     help="no completeness check at the end (so no supplement runs)")
    run.add_argument("--json", action="store_true", help="one JSON object on stdout")
    run.add_argument("--model", help="model name (default REFLOOP_MODEL)")
    run.add_argument("--max-iterations", type=int, default=20,
                     help="model turns of the ReAct loop before the task stops")
    run.add_argument("--approval-mode", choices=("auto", "confirm_writes", "confirm_all"),
                     default="auto", help="auto: writes and commands run at once; "
                     "confirm_writes / confirm_all: each write and command (or every tool) "
                     "waits for a person's decision, given in the console's inbox, with "
                     "POST /tasks/{id}/approvals or `temporal workflow update`")
    run.add_argument("--approval-timeout", type=float, metavar="SECONDS",
                     help="how long a call waits for that decision (default "
                          "REFLOOP_APPROVAL_TIMEOUT_S, 3 days); unanswered, the task ends "
                          "incomplete")
    run.add_argument("--host", help="the worker host holding the workspace (default: this "
                     "machine's REFLOOP_HOST_ID when TEMPORAL_ADDRESS names a deployment); "
                     "another machine's: --workspace is an absolute path on its disk, "
                     "checked against its roots in the hosts table")
    run.add_argument("--save-history", metavar="FILE", help="write the event history")
    run.add_argument("--max-cost-usd", type=float, metavar="USD",
                     help="the task's spend limit in USD, its children's included (at "
                          "REFLOOP_MODEL_PRICES); at it the task waits for `refloop budget`")
    run.add_argument("--max-tokens", type=int, metavar="N",
                     help="the task's token limit, its children's included")
    run.add_argument("--mcp", metavar="NAMES",
                     help="MCP servers whose tools the task may use, e.g. git,time "
                          "(names in the REFLOOP_MCP_CONFIG file)")

    move = sub.add_parser("move", help="move a task waiting for a host that will never "
                          "return to another host (copy its workspace there first)")
    move.add_argument("task", help="the task ID")
    move.add_argument("--host", required=True, help="the live host to run it on; its "
                      "roots must hold the task's workspace path (or --workspace)")
    move.add_argument("--workspace", metavar="PATH", help="where the copy of the workspace "
                      "is on the new host (absolute; default: the task's path)")

    fleet = sub.add_parser("fleet-rate", help="show or set the fleet's model-call rate "
                           "limit (every worker of REFLOOP_TASK_QUEUE on DATABASE_URL polls "
                           "with it; restart them to apply a change)")
    fleet.add_argument("rate", nargs="?", help="calls a second, or `off` for none")

    rewind = sub.add_parser("rewind", help="put a running task back to one of its "
                            "workspace checkpoints: its files and its run go on from there")
    rewind.add_argument("task", help="the task's workflow ID")
    rewind.add_argument("--to-step", type=int, required=True, metavar="N",
                        help="the checkpoint to go back to, counted from 1 in the order "
                             "the run took them (each after a call that changed the "
                             "workspace; the call's tool_result event names it)")

    fork = sub.add_parser("fork", help="start a new task from one step of a task (running "
                          "or ended): a new workspace put back to that step's checkpoint, "
                          "its plan and conversation up to there; the original is left as "
                          "it is")
    fork.add_argument("task", help="the original task's workflow ID")
    fork.add_argument("--at-step", type=int, required=True, metavar="N",
                      help="the checkpoint to branch from, counted as for `rewind`")
    fork.add_argument("--task", dest="instruction", metavar="TEXT",
                      help="a new instruction, the fork's next user turn")
    fork.add_argument("--workspace", metavar="DIR", help="the fork's directory on the "
                      "original's host, new or empty, under its roots (default: beside the "
                      "original's, named <it>-fork-<id>)")

    sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS")
    upgrade.add_parser(sub)
    budget.add_parser(sub)
    sub.add_parser("mcp", help="serve refloop's tasks as an MCP server over stdio "
                               "(TEMPORAL_ADDRESS, else the embedded stack)")
    for name, text in (("up", "the embedded stack: Temporal, worker and API"),
                       ("api", "the HTTP API against TEMPORAL_ADDRESS")):
        serve = sub.add_parser(name, help=text)
        serve.add_argument("--port", type=int,
                           help="API port (default REFLOOP_API_PORT or 8000)")
        serve.add_argument("--host", default="127.0.0.1", help="the address the API binds "
                           "to; off loopback it needs REFLOOP_API_TOKEN (else one is made)")
        if name == "up":
            serve.add_argument("--temporal-port", type=int, help="embedded Temporal gRPC "
                               "port (default REFLOOP_TEMPORAL_PORT or 7233)")
            serve.add_argument("--ui-port", type=int, help="Temporal Web UI port (default "
                               "REFLOOP_UI_PORT or 8233)")
            serve.add_argument("--scripted-port", type=int, help="the scripted offline "
                               "model's port, when OPENAI_BASE_URL is unset (default "
                               "REFLOOP_SCRIPTED_PORT, else a free one)")

    history = sub.add_parser("history", help="export a workflow's event history")
    history.add_argument("workflow_id", help="the task's workflow ID")
    history.add_argument("-o", "--output", required=True, help="the JSON file to write")
    replay = sub.add_parser("replay", help="replay histories against the current code")
    replay.add_argument("files", nargs="+", help="history JSON files (`refloop history`, "
                        "`temporal workflow show -o json`)")

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
    review.add_argument("--max-cost-usd", type=float, metavar="USD",
                        help="the review's spend limit in USD (at REFLOOP_MODEL_PRICES); at "
                             "it the review waits for `refloop budget`")
    review.add_argument("--max-tokens", type=int, metavar="N",
                        help="the review's token limit")

    evaluate = sub.add_parser(
        "eval", help="early-reflection metrics over a scenario suite, triggers on vs off")
    evaluate.add_argument("--suite", help="a folder of scenario YAML files")
    evaluate.add_argument("--json", action="store_true", help="the metrics as JSON")

    scripted = sub.add_parser("scripted-llm", help="the scripted OpenAI-compatible model")
    scripted.add_argument("--scenario", help="scenario file (else load them over HTTP)")
    scripted.add_argument("--port", type=int, default=8089, help="the port it serves on")
    scripted.add_argument("--host", default="127.0.0.1", help="the address it binds to")
    people.add_commands(sub)
    for command in sub.choices.values():
        command.formatter_class = UsageFormatter
    return parser




def fleet_rate(raw: str | None, settings: Settings) -> int:
    """`refloop fleet-rate [N|off]`: the fleet's model-call rate limit, from the database."""
    from refloop.store.db import store_for
    from refloop.store.fleet import fleet_llm_rate, set_fleet_llm_rate

    store = store_for(settings.effective_database_url)
    queue = settings.task_queue
    if raw is not None:
        try:
            rate = None if raw == "off" else float(raw)
        except ValueError:
            rate = -1.0
        if rate is not None and not rate > 0:
            err_console.print(f"[bold red]rate {raw!r}: a positive number of calls a second, "
                              "or `off`[/]")
            return 2
        set_fleet_llm_rate(store, queue, rate, "refloop fleet-rate")
    current = fleet_llm_rate(store, queue, None, "")
    print(f"task queue {queue}: model calls "
                  f"{f'{current:g} a second' if current is not None else 'not limited'}"
          + ("; restart its workers to apply it" if raw is not None else ""))
    return 0


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
                 "refloop_ui_port": getattr(args, "ui_port", None),
                 "refloop_scripted_port": getattr(args, "scripted_port", None)}
        settings = settings.model_copy(update={k: v for k, v in ports.items() if v})
        if ports["refloop_temporal_port"]:
            settings = settings.model_copy(update={"refloop_temporal_port_pinned": True})
    if args.command in ("worker", "api", "history", "move", "rewind", "fork",
                        upgrade.COMMAND) \
            and not settings.temporal_address:
        from refloop.worker.temporal_server import find_running_address

        # The server a running `refloop up` of this data dir serves, wherever its port.
        found = find_running_address(settings.refloop_data_dir)
        settings = settings.model_copy(update={"temporal_address": found})
    if args.command == "fleet-rate":
        sys.exit(fleet_rate(args.rate, settings))
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
        runner = run_eval(args, settings)
    elif args.command == "review":
        runner = run_review(args, settings)
    elif args.command == "history":
        runner = export_history(args, settings)
    elif args.command == "move":
        runner = move_task(args, settings)
    elif args.command == "rewind":
        runner = rewind_task(args, settings)
    elif args.command == "fork":
        runner = fork_task(args, settings)
    elif args.command == upgrade.COMMAND:
        runner = upgrade.run(args, settings)
    elif args.command in people.COMMANDS:
        runner = people.run(args, settings)
    elif args.command == budget.COMMAND:
        runner = budget.run(args, settings)
    else:
        runner = replay_histories(args)
    if args.command in ("run", "review"):
        # The worker stops with the command: background work the task left (indexing) is
        # cancelled then, which is expected, not a failure worth a traceback.
        logging.getLogger("temporalio.activity").addFilter(_not_a_cancellation)
    try:
        signal.signal(signal.SIGTERM, _terminate_within(settings.refloop_graceful_shutdown_s))
        if args.command in LONG_LIVED:  # the watchdog armed at the signal, whatever runs
            witness_signals(settings.refloop_graceful_shutdown_s)
        code = asyncio.run(runner)
    except KeyboardInterrupt:
        code = 130
    except Terminated:
        code = 143  # 128 + SIGTERM, as a shell reports it
    except SystemExit as exiting:
        code = exiting.code if isinstance(exiting.code, int) else 1
    if args.command in CLIENT_ONLY or args.command in LONG_LIVED:
        # The Temporal bridge's threads can abort or hang the interpreter's finalization
        # (temporalio/sdk-python#300: "PyGILState_Release ... must be current"), and a
        # finalizing interpreter runs no watchdog thread: a signalled `up` hung there past
        # its bound. The command's clean-up has run by now; nothing is left to finalize.
        sys.stdout.flush()
        sys.stderr.flush()
        hard_exit(code or 0)
    sys.exit(code or 0)
