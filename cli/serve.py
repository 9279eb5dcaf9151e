"""Long-running commands (`up`, `api`) and how a command stops: signals, a grace period, a
watchdog, one-line logs.
"""

from __future__ import annotations

# isort: split
import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from refloop.cli.output import (
    err_console,
    fail,
    print_link,
)
from refloop.settings import Settings

# The uvicorn servers of this process, from just before they serve: uvicorn handles
# SIGTERM/SIGINT itself once serving (a graceful HTTP shutdown, then `serve` returns), so the
# signal must not also cancel the command mid-shutdown. A signal that comes before uvicorn
# takes the handlers tells these servers to exit (it reached nobody, and only the watchdog
# ended the command).
_UVICORN_SERVES: list[Any] = []



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


def listening_socket(command: str, host: str, port: int) -> socket.socket:
    """The API's socket, bound before anything says the API is up (it printed its ready
    banner, then failed to bind a taken port): a taken port ends the command here, saying
    so, and no other process can take it between a check and uvicorn's bind."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        fail(f"refloop {command}: cannot listen on {host}:{port}: "
             f"{err.strerror or err} (--port or REFLOOP_API_PORT)")
    sock.set_inheritable(True)
    return sock


async def serve_api(settings: Settings, client: Any, host: str, port: int,
                    sock: socket.socket | None = None, servers: list[Any] | None = None
                    ) -> None:
    """`servers` gets the uvicorn server, for a caller that must stop it gracefully."""
    import uvicorn

    from refloop.api.bind import console_url, secure_bind
    from refloop.api.main import create_app

    settings, generated = secure_bind(settings, host)
    if generated:  # off loopback, nothing is served without a token
        err_console.print(f"[bold yellow]REFLOOP_API_TOKEN is unset and {host} is not "
                          "loopback: generated a token for this run.[/] Open "
                          f"{console_url(host, port, generated)}")
    config = server_config(create_app(settings, client=client), settings, host, port)
    grace_s = settings.refloop_graceful_shutdown_s

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn holds SIGTERM/SIGINT while it serves and hands them on only after its
            # own shutdown: the bound starts now, not then.
            start_watchdog(grace_s, sig)
            super().handle_exit(sig, frame)

    server = Server(config)
    _UVICORN_SERVES.append(server)
    if servers is not None:
        servers.append(server)
    await server.serve(sockets=[sock] if sock is not None else None)


DATABASE_RETRY_S = 2.0


def database_problem(settings: Settings) -> str | None:
    """Why the database does not answer (its first line), or None."""
    from sqlalchemy.exc import SQLAlchemyError

    from refloop.store.db import store_for

    try:
        store_for(settings.effective_database_url).ping()
    except (SQLAlchemyError, OSError) as err:
        return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return None


async def wait_for_database(command: str, settings: Settings) -> bool:
    """True once the database answers. An unreachable one is said once, retried every
    DATABASE_RETRY_S for REFLOOP_DATABASE_WAIT_S (a compose stack starts it beside us),
    then said again with the command's end: never a server answering 500s."""
    from sqlalchemy.engine import make_url

    where = make_url(settings.effective_database_url).render_as_string(hide_password=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.refloop_database_wait_s
    problem = await asyncio.to_thread(database_problem, settings)
    if problem is None:
        return True
    err_console.print(f"[bold yellow]refloop {command}: the database at {where} does not "
                      f"answer ({problem}); retrying every {DATABASE_RETRY_S:g} s for up "
                      f"to {settings.refloop_database_wait_s:g} s (REFLOOP_DATABASE_WAIT_S)[/]")
    while problem is not None and loop.time() < deadline:
        await asyncio.sleep(min(DATABASE_RETRY_S, max(deadline - loop.time(), 0)))
        problem = await asyncio.to_thread(database_problem, settings)
    if problem is None:
        err_console.print(f"refloop {command}: the database at {where} answers now")
        return True
    err_console.print(f"[bold red]refloop {command}: the database at {where} is unreachable "
                      f"({problem}); exiting.[/]")
    return False


async def run_up(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.api.bind import console_url
    from refloop.worker.stack import embedded_stack

    if not await wait_for_database("up", settings):
        return 2
    sock = listening_socket("up", args.host, args.port)
    async with embedded_stack(settings, long_lived=True) as stack:
        where = stack.temporal.address if stack.temporal else settings.temporal_address
        ui = stack.temporal.ui_url if stack.temporal else None
        if ui and not stack.settings.refloop_temporal_ui_url:  # the console links to it
            stack.settings = stack.settings.model_copy(update={"refloop_temporal_ui_url": ui})
        err_console.print(f"[bold]refloop up[/]: Temporal {where}, Web UI {ui or '(none)'}, "
                          f"API http://{args.host}:{args.port} (docs at /docs); worker on "
                          f"{settings.task_queue}; Ctrl-C to stop")
        print_link("Console:", console_url(args.host, args.port, None))
        return await serve_supervised(stack, args.host, args.port, sock)


async def serve_supervised(stack: Any, host: str, port: int,
                           sock: socket.socket | None = None) -> int:
    """The API while the embedded Temporal server is watched: restarted when it dies, or
    the command exits non-zero (3) saying why, never a server that answers for nothing."""
    from refloop.worker.temporal_server import TemporalServerLost

    servers: list[Any] = []
    serving = asyncio.create_task(serve_api(stack.settings, stack.client, host, port, sock,
                                            servers))
    temporal = stack.temporal
    if temporal is None or temporal.owned_pid is None:  # not ours to supervise
        await serving
        return 0
    watching = asyncio.create_task(temporal.supervise(stack.settings.refloop_temporal_restarts))
    await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
    if watching.done() and isinstance(watching.exception(), TemporalServerLost):
        err_console.print(f"[bold red]refloop up: {watching.exception()}; stopping.[/]")
        for server in servers:  # a graceful stop: a cancelled uvicorn printed a traceback
            server.should_exit = True
        with contextlib.suppress(TimeoutError):  # past the bound, wait_for cancels it
            await asyncio.wait_for(serving, stack.settings.refloop_graceful_shutdown_s + 2)
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
            servers.stop_owned_servers(timeout_s=HARD_EXIT_STOP_S)
    os._exit(code)


# The promise: a signalled command is gone by the grace period + 5 s. The watchdog thread
# fires at grace + WATCHDOG_AFTER_S and gives the servers it owns HARD_EXIT_STOP_S to stop;
# faulthandler's C thread (no GIL, no event loop needed: a main thread stuck in a native
# call that holds the GIL stops every Python thread) ends it at grace + LAST_RESORT_AFTER_S,
# printing every thread's stack to say where it hung.
WATCHDOG_AFTER_S = 3.0
HARD_EXIT_STOP_S = 1.0
LAST_RESORT_AFTER_S = 5.0
_ARMED: list[int] = []
_ARMING = threading.Lock()


def start_watchdog(grace_s: float, signum: int) -> None:
    """Arm the watchdogs once, at the first SIGTERM/SIGINT, whoever sees the signal first
    (the signal witness's thread, uvicorn's own handler while it serves, asyncio's, or the
    plain one)."""
    with _ARMING:
        if _ARMED:
            return
        _ARMED.append(signum)
    watchdog = threading.Timer(grace_s + WATCHDOG_AFTER_S, hard_exit, args=(128 + signum,))
    watchdog.daemon = True
    watchdog.start()
    faulthandler.dump_traceback_later(grace_s + LAST_RESORT_AFTER_S, exit=True)


class SignalWitness:
    """Arms the watchdog at the moment SIGTERM/SIGINT arrives, whatever the main thread is
    doing. Python runs its signal handlers (the loop's included) only when the main thread
    returns to the interpreter's loop: a main thread busy with synchronous work (the API's
    imports and app build, 15-20 s on a loaded machine) or blocked in a native call armed
    nothing until that ended, and a signalled start-up took 25 s against a 15 s bound.

    Python's C-level handler writes each signal's number to the wakeup fd at once. Here that
    fd is a pipe read by a thread of its own, which arms the watchdog and passes the bytes on
    to the fd it took the place of: asyncio's loop takes the wakeup fd for its own signal
    handlers (`add_signal_handler`), so `take_wakeup_fd` is called again after them, and the
    loop still hears every signal. The Python-level handlers are left as they are."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # the C handler never blocks on it
        self._forward: tuple[int, int, int] | None = None  # fd, device, inode
        threading.Thread(target=self._watch, name="refloop-signal-witness",
                         daemon=True).start()

    def take_wakeup_fd(self) -> None:
        """Become the wakeup fd (main thread only), passing signals on to the one before."""
        previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        if previous not in (-1, self._write):
            status = os.fstat(previous)
            self._forward = (previous, status.st_dev, status.st_ino)

    def _watch(self) -> None:
        while data := os.read(self._read, 64):
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    start_watchdog(self.grace_s, signum)
            if self._forward is not None:
                fd, device, inode = self._forward
                with contextlib.suppress(OSError):  # closed with its loop, or full: dropped
                    status = os.fstat(fd)
                    if (status.st_dev, status.st_ino) == (device, inode):  # not reused
                        os.write(fd, data)


_WITNESS: list[SignalWitness] = []


def witness_signals(grace_s: float) -> None:
    """Start the signal witness once, and make it the wakeup fd again (after asyncio's)."""
    if not _WITNESS:
        _WITNESS.append(SignalWitness(grace_s))
    _WITNESS[0].take_wakeup_fd()


async def until_signalled(runner: Any, settings: Settings) -> int:
    """Run a long-lived command until SIGTERM or SIGINT, then let its clean-up run (the
    worker drains in-flight activities for the grace period; the embedded server stops).
    A clean-up that hangs is cut short: the process exits by the grace period + 5 s."""
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
        for server in _UVICORN_SERVES:  # not serving yet: it exits once started
            if not server.started:
                server.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    witness_signals(settings.refloop_graceful_shutdown_s)  # after the loop took the fd
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
    if not await wait_for_database("api", settings):
        return 2
    await serve_api(settings, None, args.host, args.port,
                    listening_socket("api", args.host, args.port))
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
    (a model call a slow local server never answers) short by the grace period + 5 s."""
    def handler(signum: int, frame: object) -> NoReturn:
        start_watchdog(grace_s, signum)
        raise Terminated

    return handler


def _not_a_cancellation(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not isinstance(error, asyncio.CancelledError)
