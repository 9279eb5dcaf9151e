"""The worker's MCP client connections: one per (server, workspace), started on first use.

Each connection is owned by one asyncio task that enters the transport and the session and
waits for `close`: anyio's cancel scopes must be entered and left by the same task, while
activities call the session from theirs. A connection whose transport fails (a stdio
server that died, an HTTP server that went away) is dropped; the next use starts a new one,
and the activity's retry makes that use.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refloop.contract.errors import McpConfigError, ToolError
from refloop.mcp.config import (
    McpConfig,
    McpServerConfig,
    load_config,
    resolved_env,
    resolved_headers,
)
from refloop.settings import Settings
from refloop.tools.sandbox import below, workspace_root

log = logging.getLogger("refloop.mcp")
# Starting, `initialize` and the listing: a server silent past this will not answer.
START_TIMEOUT_S = 20.0
STDERR_TAIL_CHARS = 1500
# One message from a stdio server, at most: a longer line (a 50 MB result) is replaced, in
# the sandbox, by a JSON-RPC error for its request id, before the client reads any of it.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_CAPPED = (  # awk (POSIX): pass each line on, or answer for it when it is too long
    '"$@" | awk -v cap="$CAP" \'length($0) <= cap { print; fflush(); next } '
    '{ id = "null"; if (match(substr($0, 1, 400), /"id" *: *("[^"]*"|[0-9]+)/)) { '
    'id = substr($0, RSTART, RLENGTH); sub(/^"id" *: */, "", id) } '
    'printf "{\\"jsonrpc\\":\\"2.0\\",\\"id\\":%s,\\"error\\":{\\"code\\":-32603,'
    '\\"message\\":\\"the result is over %d bytes (the MCP message cap)\\"}}\\n", id, cap; '
    'fflush() }\'')
SERVER_CPU_S = 10**8  # CPU seconds: no practical cap for a pooled server
# Servers are per (server, workspace): idle ones stop, and a worker keeps at most this many.
IDLE_S = 600.0
MAX_CONNECTIONS = 32
# Kernel views whose paths mean something else to each process (`/proc/self/cwd`): nothing
# bound for a server goes through them.
PSEUDO_FS = ("/proc", "/sys", "/dev")
MAX_LINKS = 40  # as the kernel's own limit on links in one path


class McpTransportError(Exception):
    """The server could not be reached or died mid-call: retried by Temporal's policy."""


class McpStartError(McpTransportError):
    """The server did not start, answer `initialize` or list its tools in time: doing it
    again would fail the same way, so the model reads it (with the server's stderr tail)."""


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    sandboxed: bool = False
    group: Any = None  # the server's cgroup (tools.cgroups.CommandGroup): closed with it


@functools.cache
def _private_dir() -> Path:
    """Where the sandbox's descriptors (its seccomp program) are kept for servers: the MCP
    client cannot pass descriptors, so a shell reopens them from here."""
    return Path(tempfile.mkdtemp(prefix="refloop-mcp-"))


def launch_spec(server: str, config: McpServerConfig, workspace: Path,
                settings: Settings, environ: Mapping[str, str] | None = None) -> LaunchSpec:
    """The one place a stdio server's command line is built: the configured command, its
    `${VAR}`s resolved from the worker's environment, inside the OS sandbox `run_cmd` uses
    (workspace bound read-write, the server's install read-only, the network only when its
    config says `"network": true`). `REFLOOP_SANDBOX=none` runs it unconfined.

    The sandbox's memory, file-size and process limits apply, and where the worker may make
    cgroups the server is one accounted unit as a command is (its group joined by a shell
    before bubblewrap: the MCP client passes no descriptor); its CPU-seconds cap, meant
    for one command (REFLOOP_CMD_TIMEOUT_S), would end a long-lived server, so a server
    gets SERVER_CPU_S instead.

    What is bound is read from the command (its links, its `#!` line), so the command, its
    interpreter and a script named in its arguments must be the operator's
    (`operator_path`): a file a task could write is refused with the reason, never read.
    A script named in the arguments (`python /path/server.py`, as Claude Desktop configs
    have it) has its directory mounted read-only too."""
    from refloop.tools.os_sandbox import sandbox_mode, sandboxed_command, with_fds_from_files

    assert config.command is not None
    command = os.path.abspath(shutil.which(config.command) or config.command)
    argv = ["/bin/sh", "-c", _CAPPED.replace("$CAP", str(MAX_MESSAGE_BYTES)), "sh", command,
            *config.args]
    env = resolved_env(server, config, environ)
    readable, derived = [*settings.sandbox_ro_paths], []
    if sandbox_mode(settings) != "none":  # unconfined, nothing is bound: nothing to read
        real = operator_path(server, "command", command, workspace, settings)
        readable += install_roots(command, real)
        interpreter = script_interpreter(real)
        if interpreter is not None:
            found = operator_path(server, "interpreter (its `#!` line)", interpreter,
                                  workspace, settings)
            # The tree the line names is read from the file: never bound as host root. Where
            # the operator's links lead from there is theirs, as for the command itself.
            named = install_roots(interpreter, interpreter)
            derived = [root for root in named if root not in readable]
            readable += [root for root in install_roots(interpreter, found)
                         if root not in named]
        readable += script_dirs(server, config.args, workspace, settings)
    confined = settings.model_copy(update={
        "refloop_sandbox_ro_paths": ",".join(dict.fromkeys(readable)),
        "refloop_cmd_timeout_s": float(SERVER_CPU_S)})
    wrapped = sandboxed_command(argv, workspace=workspace, allow_network=config.network,
                                env=env, settings=confined, passes_fds=False,
                                derived_ro=tuple(derived))
    group, wrapped.group = wrapped.group, None  # lives as long as the server, not the spec
    try:
        return LaunchSpec(with_fds_from_files(wrapped, _private_dir()), dict(wrapped.env),
                          wrapped.sandboxed, group)
    except BaseException:
        if group is not None:
            group.close()
        raise


def script_dirs(server: str, args: list[str], workspace: Path,
                settings: Settings) -> list[str]:
    """The directories of the arguments that name an existing file outside the workspace
    and the system directories (a server's script, its config file)."""
    found = []
    for arg in args:
        if not arg.startswith("/") or "\x00" in arg:
            continue
        path = Path(os.path.normpath(arg))
        with contextlib.suppress(OSError):
            if path.is_file() and workspace not in path.parents and not str(path).startswith(
                    ("/usr/", "/bin/", "/etc/", "/lib")):
                operator_path(server, "argument", arg, workspace, settings)
                found.append(str(path.parent))
    return found


def script_interpreter(command: str) -> str | None:
    """The program a script's `#!` line names (None for a binary or an unreadable file)."""
    try:
        with open(command, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    words = first[2:].split() if first.startswith(b"#!") else []
    return os.fsdecode(words[0]) if words else None


def install_roots(path: str, real: str) -> list[str]:
    """What a program at `path` (a link to `real`) needs to read beyond the system dirs:
    the tree it is installed in (a virtualenv: the dir above `bin`)."""
    roots = []
    for candidate in (Path(path), Path(real)):
        if not str(candidate).startswith(("/usr/", "/bin/")):
            parent = candidate.parent
            roots.append(str(parent.parent if parent.name == "bin" else parent))
    return list(dict.fromkeys(roots))


def operator_path(server: str, what: str, path: str, workspace: Path,
                  settings: Settings) -> str:
    """Where `path` really is, when it is the operator's: absolute with no `..`, and every
    entry on the way to it (each link's own path and its target's, followed here by hand,
    the same for every working directory) outside every workspace and the kernel's views
    (/proc), in directories only root or this worker may change, the file too. Else
    McpConfigError with the reason: the file is not read, nothing is bound from it."""
    from refloop.runtime.workspaces import system_refusal, workspace_roots

    def refused(why: str) -> McpConfigError:
        return McpConfigError(
            f"MCP server {server!r}: its {what} {path!r} {why}. refloop reads what a "
            "server's command names (its links, its `#!` line) to know what to bind, so it "
            "must be a file only root or this worker may change, outside every workspace "
            "(REFLOOP_WORKSPACE_ROOTS) and the task's own")

    if not path.startswith("/") or ".." in path.split("/"):
        raise refused("is not a plain absolute path")
    writable = [workspace, *(root for root in workspace_roots(settings)
                             if system_refusal(root) is None)]
    entry = "/"
    try:
        for entry in _entries_on_the_way(path):  # each judged before it is looked at
            if any(entry == top or below(Path(entry), Path(top)) for top in PSEUDO_FS):
                raise refused(f"goes through {entry}, whose meaning depends on the process")
            inside = next((str(w) for w in writable
                           if entry == str(w) or below(Path(entry), w)), None)
            if inside is not None:
                raise refused(f"goes through {entry}, inside {inside}, where a task may "
                              "write")
            who = _changer(posixpath.dirname(entry), directory=True)
            if who:
                raise refused(f"goes through {entry}, in a directory {who}")
        who = _changer(entry, directory=False)
    except OSError as err:
        raise refused(f"cannot be followed ({err.strerror or err})") from None
    if who:
        raise refused(f"ends at {entry}, a file {who}")
    return entry


def _entries_on_the_way(path: str) -> Iterator[str]:
    """Every entry the kernel looks up to resolve `path`, in order, each link followed as
    it would be (`..` in a link's target taken from where it resolved so far); the last is
    where it ends. Raises OSError (a missing entry, too many links)."""
    pending = [part for part in path.split("/") if part][::-1]
    current, links = "/", 0
    while pending:
        name = pending.pop()
        if name in (".", ".."):
            current = current if name == "." else posixpath.dirname(current)
            continue
        entry = posixpath.join(current, name)
        yield entry
        if not stat.S_ISLNK(os.lstat(entry).st_mode):
            current = entry
            continue
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        target = os.readlink(entry)
        current = "/" if target.startswith("/") else current
        pending += [part for part in target.split("/") if part][::-1]
    yield current


def _changer(path: str, directory: bool) -> str:
    """Who besides root and this worker may change `path` ('' when nobody): its owner, or
    its group and others through a write bit (a sticky directory lets them add names, not
    replace another's)."""
    info = os.lstat(path)
    if info.st_uid not in (0, os.geteuid()):
        return f"owned by uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (
            directory and info.st_mode & stat.S_ISVTX):
        return "that its group or others may write"
    return ""


@dataclass
class Connection:
    server: str
    errlog: Any = None  # the server's stderr (a file): its tail explains a failed start
    session: Any = None
    tools: list[Any] = field(default_factory=list)  # the server's own listing (mcp Tool)
    ready: asyncio.Future[None] | None = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    owner: asyncio.Task[None] | None = None
    broken: bool = False
    started_at: float = 0.0
    last_used: float = 0.0
    busy: int = 0  # calls in flight: never evicted while > 0
    group: Any = None  # a stdio server's cgroup: what is left in it is killed at close

    def alive(self) -> bool:
        """Not known to be dead: a stdio server that exited closes its session's dispatcher."""
        if self.broken or self.owner is None or self.owner.done():
            return False
        dispatcher = getattr(self.session, "_dispatcher", None)
        return not getattr(dispatcher, "_closed", False)


class McpPool:
    """Per worker: connections keyed by (server, workspace); closed at worker shutdown."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._connections: dict[tuple[str, str], Connection] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._config: tuple[float, McpConfig] | None = None
        self.starts = 0  # servers started (the bench reads it)

    def config(self) -> McpConfig:
        """The configuration file, re-read when it changes."""
        path = self.settings.refloop_mcp_config
        if not path:
            return McpConfig(mcpServers={})
        try:
            mtime = Path(path).stat().st_mtime
        except OSError as err:
            raise McpConfigError(f"MCP config {path}: {err.strerror or err}") from None
        if self._config is None or self._config[0] != mtime:
            self._config = (mtime, load_config(path))
        return self._config[1]

    def server_config(self, server: str) -> McpServerConfig:
        config = self.config().servers.get(server)
        if config is None:
            raise McpConfigError(f"unknown MCP server {server!r}")
        return config

    def key(self, server: str, workspace: str) -> tuple[str, str]:
        """A stdio server per workspace (its sandbox binds it); an HTTP server is shared."""
        return (server, workspace if self.server_config(server).transport == "stdio" else "")

    async def connection(self, server: str, workspace: str) -> Connection:
        key = self.key(server, workspace)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            await self._evict(keep=key)
            current = self._connections.get(key)
            if current is not None and current.alive():
                current.last_used = asyncio.get_running_loop().time()
                return current
            if current is not None:
                await self._close(current)
            config = self.server_config(server)
            connection = await self._start(server, config, Path(workspace))
            connection.last_used = asyncio.get_running_loop().time()
            self._connections[key] = connection
            return connection

    @contextlib.asynccontextmanager
    async def busy(self, connection: Connection) -> AsyncIterator[Connection]:
        """Mark a call in flight: the connection is not evicted meanwhile."""
        connection.busy += 1
        try:
            yield connection
        finally:
            connection.busy -= 1
            connection.last_used = asyncio.get_running_loop().time()

    async def _evict(self, keep: tuple[str, str]) -> None:
        """Stop servers idle for IDLE_S, and the least recently used beyond MAX_CONNECTIONS."""
        now = asyncio.get_running_loop().time()
        idle = sorted((c.last_used, key) for key, c in self._connections.items()
                      if key != keep and c.busy == 0)
        excess = len(self._connections) - MAX_CONNECTIONS + 1
        for rank, (last_used, key) in enumerate(idle):
            if rank < excess or now - last_used > IDLE_S:
                await self._close(self._connections.pop(key))
                lock = self._locks.get(key)
                if lock is not None and not lock.locked():
                    del self._locks[key]

    async def drop(self, server: str, workspace: str, connection: Connection) -> None:
        """Forget a failed connection (if it is still the current one) and stop it."""
        connection.broken = True
        for key, current in list(self._connections.items()):
            if current is connection:
                del self._connections[key]
        await self._close(connection)

    async def _start(self, server: str, config: McpServerConfig, workspace: Path) -> Connection:
        loop = asyncio.get_running_loop()
        connection = Connection(server=server, ready=loop.create_future(),
                                started_at=loop.time())
        if config.transport == "stdio":  # bound by path below: checked it is still the one
            try:
                workspace_root(workspace)
            except ToolError as err:
                raise McpStartError(str(err)) from None
        try:  # built before starting: a configuration problem is not worth a retry
            transport = self._transport(server, config, workspace, connection)
        except McpConfigError:
            raise
        except Exception as err:  # the OS sandbox cannot run (never a silent fallback)
            raise McpConfigError(f"MCP server {server!r}: {err}") from None
        connection.owner = asyncio.create_task(self._own(connection, config, transport),
                                               name=f"mcp:{server}")
        self.starts += 1
        try:
            await asyncio.wait_for(asyncio.shield(connection.ready), START_TIMEOUT_S)
        except Exception as err:
            why = "no answer to `initialize` within " \
                f"{START_TIMEOUT_S:g}s" if isinstance(err, TimeoutError) else _describe(err)
            tail = stderr_tail(connection)
            await self._close(connection, grace_s=0.0)  # a silent server gets no grace
            raise McpStartError(f"MCP server {server!r} did not start: {why}"
                                + (f"; its stderr ends with:\n{tail}" if tail else "")
                                ) from None
        return connection

    async def _own(self, connection: Connection, config: McpServerConfig,
                   transport: Any) -> None:
        """Enter the transport and session, serve until `closing`, leave them here."""
        from mcp import ClientSession, types

        assert connection.ready is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(
                    transport)
                session = await stack.enter_async_context(
                    ClientSession(read, write, read_timeout_seconds=config.timeout_s))
                await session.initialize()
                tools, cursor = [], None
                while True:
                    page = await session.list_tools(
                        params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools.extend(page.tools)
                    cursor = getattr(page, "next_cursor", None)
                    if not cursor:
                        break
                connection.session, connection.tools = session, tools
                connection.ready.set_result(None)
                await connection.closing.wait()
        except BaseException as err:  # noqa: BLE001 - reported to the waiting caller
            connection.broken = True
            if not connection.ready.done():
                connection.ready.set_exception(McpTransportError(_describe(err)))
            elif not connection.closing.is_set():
                log.warning("MCP server %s stopped: %s", connection.server, _describe(err))
            if isinstance(err, asyncio.CancelledError):
                raise

    def _transport(self, server: str, config: McpServerConfig, workspace: Path,
                   connection: Connection) -> Any:
        if config.transport == "http":
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=resolved_headers(server, config))
            return _http(streamable_http_client, config.url, client)
        from mcp import StdioServerParameters, stdio_client

        spec = launch_spec(server, config, workspace, self.settings)
        connection.group = spec.group
        params = StdioServerParameters(command=spec.argv[0], args=spec.argv[1:],
                                       env=spec.env, cwd=str(workspace))
        # Closed with the connection (_close_errlog), not here: the server writes to it.
        connection.errlog = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", errors="replace")
        return stdio_client(params, errlog=connection.errlog)

    async def _close(self, connection: Connection, grace_s: float = 10.0) -> None:
        connection.closing.set()
        owner = connection.owner
        if owner is None or owner.done():
            _close_errlog(connection)
            _close_group(connection)
            return
        try:
            await asyncio.wait_for(asyncio.shield(owner), grace_s)
        except TimeoutError:
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner
        except BaseException:  # noqa: BLE001 - the owner logged it
            pass
        _close_errlog(connection)
        _close_group(connection)

    async def close(self) -> None:
        """Stop every server (worker shutdown)."""
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(self._close(c) for c in connections), return_exceptions=True)


@contextlib.asynccontextmanager
async def _http(factory: Any, url: str | None, client: Any) -> Any:
    async with client, factory(url, http_client=client) as streams:
        yield streams[0], streams[1]


def stderr_tail(connection: Connection) -> str:
    """The last lines a server wrote to stderr (bounded), for the reason it did not start."""
    handle = connection.errlog
    if handle is None or handle.closed:
        return ""
    with contextlib.suppress(OSError, ValueError):
        handle.flush()
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 4 * STDERR_TAIL_CHARS))
        return handle.read()[-STDERR_TAIL_CHARS:].strip()
    return ""


def _close_group(connection: Connection) -> None:
    if connection.group is not None:
        connection.group.close()
        connection.group = None


def _close_errlog(connection: Connection) -> None:
    if connection.errlog is not None:
        with contextlib.suppress(OSError):
            connection.errlog.close()


def _describe(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in err.exceptions)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
