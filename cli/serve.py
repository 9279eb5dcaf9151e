"""Long-running commands (`up`, `api`) and how a command stops: signals, a grace period, a
watchdog, one-line logs.
"""

from __future__ import annotations

# isort: split
import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from refloop.cli.output import (
    err_console,
    fail,
)
from refloop.settings import Settings

# Set while uvicorn serves: it handles SIGTERM/SIGINT itself (a graceful HTTP shutdown,
# then `serve` returns), so the signal must not also cancel the command mid-shutdown.
_UVICORN_SERVES: list[bool] = []



def server_config(app: Any, settings: Settings, host: str, port: int) -> Any:
    """uvicorn's settings for the API. Open event streams must not hold a stop past the
    grace period; slow or idle clients are cut off (headers, body, keep-alive), so none can
    hold connections open (slowloris)."""
    import uvicorn

    from refloop.api.slow_clients import protocol_with

    return uvicorn.Config(app, host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=int(settings.refloop_graceful_shutdown_s),
                          http=protocol_with(settings.refloop_http_header_timeout_s,
                                             settings.refloop_http_body_timeout_s),
                          timeout_keep_alive=int(settings.refloop_http_keep_alive_s))


async def serve_api(settings: Settings, client: Any, host: str, port: int) -> None:
    import uvicorn

    from refloop.api.bind import console_url, secure_bind
    from refloop.api.main import create_app

    settings, generated = secure_bind(settings, host)
    if generated:  # off loopback, nothing is served without a token
        err_console.print(f"[bold yellow]REFLOOP_API_TOKEN is unset and {host} is not "
                          "loopback: generated a token for this run.[/] Open "
                          f"{console_url(host, port, generated)}")
    config = server_config(create_app(settings, client=client), settings, host, port)
    _UVICORN_SERVES.append(True)
    await uvicorn.Server(config).serve()


async def run_up(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.worker.stack import embedded_stack

    async with embedded_stack(settings, long_lived=True) as stack:
        where = stack.temporal.address if stack.temporal else settings.temporal_address
        ui = stack.temporal.ui_url if stack.temporal else None
        err_console.print(f"[bold]refloop up[/]: Temporal {where}, Web UI {ui or '(none)'}, "
                          f"API http://{args.host}:{args.port} (docs at /docs); worker on "
                          f"{settings.task_queue}; Ctrl-C to stop")
        return await serve_supervised(stack, args.host, args.port)


async def serve_supervised(stack: Any, host: str, port: int) -> int:
    """The API while the embedded Temporal server is watched: restarted when it dies, or
    the command exits non-zero (3) saying why, never a server that answers for nothing."""
    from refloop.worker.temporal_server import TemporalServerLost

    serving = asyncio.create_task(serve_api(stack.settings, stack.client, host, port))
    temporal = stack.temporal
    if temporal is None or temporal.owned_pid is None:  # not ours to supervise
        await serving
        return 0
    watching = asyncio.create_task(temporal.supervise(stack.settings.refloop_temporal_restarts))
    await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
    if watching.done() and isinstance(watching.exception(), TemporalServerLost):
        err_console.print(f"[bold red]refloop up: {watching.exception()}; stopping.[/]")
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return 3
    watching.cancel()
    await serving
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
