"""The everyday commands (`refloop tasks`, `show`, `watch`, `inbox`, `approve`, `reject`,
`cancel`) as a person runs them: fresh processes beside a real `refloop up` (its Temporal
dev server, its database, the scripted model), found through the shared data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ui.test_console import console_and_model

pytestmark = pytest.mark.slow  # a `refloop up` for the module and a process per command


def writes(*names: str) -> dict:
    """A scenario that writes each file in turn, one plan step each, marked done."""
    acts = [{"tool_calls": [
        {"name": "write_file", "arguments": {"path": name, "content": name}},
        {"name": "complete_step", "arguments": {"step": n, "summary": f"wrote {name}"}}]}
        for n, name in enumerate(names, 1)]
    return {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "w"}}],
        "plan": [{"json": {"task_type": "creation", "steps": [
            {"goal": f"write {name}", "tool": "write_file"} for name in names]}}],
        "act": [*acts, {"content": "done"}, {"content": "done"}],
        "summary": [{"content": "wrote them"}, {"content": "wrote them"}],
    }


class People:
    """`refloop up` and its model; starts tasks over HTTP, runs `refloop` commands."""

    def __init__(self, base: str, llm, data: Path, root: Path) -> None:
        self.base, self.llm, self.data, self.root = base, llm, data, root
        self.workspaces: dict[str, Path] = {}

    def start(self, *files: str, approval_mode: str = "auto", **fields) -> str:
        model = f"p-{uuid.uuid4().hex[:8]}"
        self.llm.load(model, {"name": model, "responses": writes(*files)})
        workspace = self.root / model
        workspace.mkdir()
        started = httpx.post(f"{self.base}/tasks", timeout=30, json={
            "workspace": str(workspace), "task": f"write {' and '.join(files)}",
            "model": model, "approval_mode": approval_mode, "enable_reflection": False,
            **fields})
        assert started.status_code == 202, started.text
        self.workspaces[started.json()["task_id"]] = workspace
        return started.json()["task_id"]

    def status(self, task_id: str) -> str:
        # A task started past the API has no row until its workflow records one.
        return httpx.get(f"{self.base}/tasks/{task_id}", timeout=30).json().get("status", "")

    def wait(self, task_id: str, *statuses: str, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while (now := self.status(task_id)) not in statuses:
            assert time.monotonic() < deadline, f"{task_id} is {now}, not {statuses}"
            time.sleep(0.2)

    def refloop(self, *args: str, data: Path | None = None,
                timeout: float = 90) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
        env.update({"REFLOOP_DATA_DIR": str(data or self.data), "COLUMNS": "200"})
        return subprocess.run([sys.executable, "-m", "refloop", *args], env=env,
                              capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self.refloop(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    root = tmp_path_factory.mktemp("people")
    with console_and_model(root, REFLOOP_SEMANTIC_INDEX="false") as (base, llm):
        yield People(base, llm, root / "data", root)


def test_list_show_and_watch_a_finished_task(people: People):
    done = people.start("a.txt", "b.txt")
    people.wait(done, "completed")
    listed = people.ok("tasks")
    assert listed.stdout.splitlines()[0].split() == ["ID", "STATUS", "TOKENS", "COST", "AGE",
                                                       "TASK"]
    row = next(line for line in listed.stdout.splitlines() if line.startswith(done))
    assert "completed" in row and row.endswith("write a.txt and b.txt")
    assert row.split()[3] == "-"  # the scripted model has no price: tokens only
    as_json = json.loads(people.ok("tasks", "--json").stdout)
    assert done in [t["task_id"] for t in as_json]
    assert json.loads(people.ok("tasks", "--host", "nosuch", "--json").stdout) == []

    shown = people.ok("show", done).stdout
    assert f"task {done}: completed" in shown
    assert "plan: 2 of 2 steps done" in shown and "[x] 1. write a.txt (write_file)" in shown
    assert "files changed: a.txt, b.txt" in shown
    detail = json.loads(people.ok("show", done, "--json").stdout)
    assert detail["files_changed"] == ["a.txt", "b.txt"] and detail["waiting_for"] == []
    assert [s["state"] for s in detail["plan"]] == ["done", "done"]
    assert detail["spend"]["total_tokens"] > 0 and detail["spend"]["tool_calls"] >= 2

    watched = people.refloop("watch", done)  # an ended task: its events, then its end
    assert watched.returncode == 0, watched.stderr
    assert "→ write_file" in watched.stdout
    assert watched.stdout.rstrip().endswith(f"task {done}: completed")
    lines = people.ok("watch", done, "--json").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert events[-1]["type"] == "completed"
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})  # once each


def test_inbox_approve_reject_and_watch_to_the_end(people: People):
    task = people.start("a.txt", "b.txt", approval_mode="confirm_writes")
    people.wait(task, "waiting_approval")
    watcher = subprocess.Popen(  # follows the task live while it is decided below
        [sys.executable, "-m", "refloop", "watch", task, "--json"],
        env={**{k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS",
                                                                   "DATABASE_URL")},
             "REFLOOP_DATA_DIR": str(people.data)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        inbox = people.ok("inbox").stdout
        assert task in inbox and "approval of call 1.0: write_file" in inbox
        assert f"refloop approve {task} 1.0" in inbox
        assert "UTC, the task ends incomplete" in inbox  # when its wait ends
        waiting = json.loads(people.ok("inbox", "--json").stdout)
        mine = next(item for item in waiting if item["task_id"] == task)
        assert mine["waiting_for"][0]["call_id"] == "1.0"
        assert mine["waiting_for"][0]["args"] == {"path": "a.txt", "content": "a.txt"}
        shown = json.loads(people.ok("show", task, "--json").stdout)
        assert shown["status"] == "waiting_approval"
        assert [s["state"] for s in shown["plan"]] == ["current", "to do"]
        assert people.ok("show", task).stdout.count("waits for: approval of call 1.0") == 1
        listed = json.loads(people.ok("tasks", "--status", "waiting_approval", "--json").stdout)
        assert task in [t["task_id"] for t in listed]

        approved = people.ok("approve", task)  # its one waiting call
        assert f"task {task}: call 1.0 approved" in approved.stdout
        people.wait(task, "waiting_approval")  # the second write
        second = json.loads(people.ok("inbox", "--json").stdout)
        call = next(i for i in second if i["task_id"] == task)["waiting_for"][0]["call_id"]
        assert call != "1.0"
        rejected = json.loads(people.ok("reject", task, call, "--reason", "not b",
                                        "--json").stdout)
        assert rejected == {"call_id": call, "outcome": "rejected"}
        stdout, stderr = watcher.communicate(timeout=90)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    events = [json.loads(line) for line in stdout.splitlines()]
    decided = [e["data"] for e in events if e["type"] == "approval_decided"]
    assert [d["approved"] for d in decided] == [True, False]
    assert decided[1]["comment"] == "not b"
    assert events[-1]["type"] in ("completed", "incomplete")
    assert watcher.returncode == (0 if events[-1]["type"] == "completed" else 1), stderr
    # Deciding again: the API's own refusal, one line, exit 2.
    again = people.refloop("approve", task, call)
    assert again.returncode == 2 and "has already ended" in again.stderr


def test_approve_with_edited_arguments(people: People):
    """`refloop approve --arguments` and POST /tasks/{id}/approvals' `arguments`: the call
    runs with them; ones its tool would refuse are refused with the reason (422, exit 2)
    and the call still waits."""
    task = people.start("a.txt", approval_mode="confirm_writes")
    people.wait(task, "waiting_approval")
    bad = people.refloop("approve", task, "--arguments", '{"path": "a.txt"}')
    assert bad.returncode == 2, bad.stdout
    assert "invalid arguments for write_file: content: Field required" in bad.stderr
    not_json = people.refloop("approve", task, "--arguments", "{path")
    assert not_json.returncode == 2 and "--arguments: not JSON" in not_json.stderr
    not_object = people.refloop("approve", task, "--arguments", "[1]")
    assert not_object.returncode == 2 and "a JSON object" in not_object.stderr
    refused = httpx.post(f"{people.base}/tasks/{task}/approvals", timeout=30, json={
        "call_id": "1.0", "approved": True, "arguments": {"path": "a.txt", "content": 1}})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == ("invalid arguments for write_file: content: Input "
                                        "should be a valid string")
    assert people.status(task) == "waiting_approval"
    edited = people.root / "edited.json"
    edited.write_text(json.dumps({"path": "a.txt", "content": "edited by hand"}))
    approved = people.ok("approve", task, "--arguments", f"@{edited}", "--json")
    assert json.loads(approved.stdout) == {"call_id": "1.0", "outcome": "approved"}
    people.wait(task, "completed", "incomplete")
    assert (people.workspaces[task] / "a.txt").read_text() == "edited by hand"
    events = [json.loads(line) for line in people.ok("watch", task, "--json").stdout.splitlines()]
    decided = next(e["data"] for e in events if e["type"] == "approval_decided")
    assert decided["original_arguments"] == {"path": "a.txt", "content": "a.txt"}
    assert decided["arguments"] == {"path": "a.txt", "content": "edited by hand"}


def test_an_unanswered_approval_ends_the_task_incomplete(people: People):
    """POST /tasks' approval_timeout_s: the call waits that long, then the task ends
    incomplete naming it (never completed, and the write never runs)."""
    task = people.start("a.txt", approval_mode="confirm_writes", approval_timeout_s=1)
    people.wait(task, "incomplete")
    shown = json.loads(people.ok("show", task, "--json").stdout)
    assert shown["error"] == "incomplete: no decision on call 1.0 (write_file a.txt) " \
        "within 1 s"
    assert not (people.workspaces[task] / "a.txt").exists()


def test_cancel_and_what_is_refused(people: People):
    task = people.start("a.txt", approval_mode="confirm_writes")
    people.wait(task, "waiting_approval")
    cancelled = json.loads(people.ok("cancel", task, "--json").stdout)
    assert cancelled == {"task_id": task, "status": "cancelling"}
    watched = people.refloop("watch", task)
    assert watched.returncode == 1 and f"task {task}: cancelled" in watched.stdout
    assert json.loads(people.ok("show", task, "--json").stdout)["status"] == "cancelled"

    missing = people.refloop("show", "task-000000000000")
    assert missing.returncode == 2 and "task task-000000000000 not found" in missing.stderr
    none = people.refloop("approve", task)
    assert none.returncode == 2 and "waits for no approval" in none.stderr
    # Another data dir, where nothing runs: the list is the stored one; deciding needs a
    # server and says how to get one.
    elsewhere = people.root / "elsewhere"
    listed = people.refloop("tasks", data=elsewhere)
    assert listed.returncode == 0 and "as last stored" in listed.stderr
    inbox = people.refloop("inbox", data=elsewhere)
    assert inbox.returncode == 2 and "start `refloop up`" in inbox.stderr


def test_up_on_other_ports_prints_each_address(tmp_path: Path):
    """The quick start's `refloop up --port --temporal-port --ui-port`: every address moved,
    printed, the console's whole on its own line."""
    import signal

    from refloop.runtime.net import free_port
    from tests.http_wait import wait_until_healthy

    api, temporal, ui = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL")}
    env.update({"REFLOOP_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "80"})
    log = tmp_path / "up.log"
    with log.open("w") as stderr:
        up = subprocess.Popen([sys.executable, "-m", "refloop", "up", "--port", str(api),
                               "--temporal-port", str(temporal), "--ui-port", str(ui)],
                              env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until_healthy(f"http://127.0.0.1:{api}", timeout_s=60)
        printed = log.read_text()
        assert f"Temporal 127.0.0.1:{temporal}, Web UI http://127.0.0.1:{ui}, API " \
               f"http://127.0.0.1:{api}" in " ".join(printed.split()), printed
        assert f"Console:\nhttp://127.0.0.1:{api}/ui/\n" in printed, printed
        assert httpx.get(f"http://127.0.0.1:{api}/ui/", timeout=10).status_code == 200
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)


def test_watch_follows_a_task_across_continue_as_new(people: People):
    """A task that continues as new between its approvals: `refloop watch` started before
    the first run ends prints every event once, in order, to the end of the last run."""
    import asyncio

    from refloop.contract.visibility import start_metadata
    from refloop.runtime.client import connect
    from refloop.settings import Settings
    from refloop.worker.temporal_server import find_running_address
    from refloop.workflows.agent import AgentTaskWorkflow

    files = ("a.txt", "b.txt", "c.txt")
    model = f"p-{uuid.uuid4().hex[:8]}"
    people.llm.load(model, {"name": model, "responses": writes(*files)})
    workspace = people.root / model
    workspace.mkdir()
    settings = Settings(refloop_data_dir=people.data)
    task_id = f"task-{uuid.uuid4().hex[:12]}"
    # POST /tasks sets no continue-as-new bound: the workflow is started as the API would,
    # with a low one (a run hands over after ~40 history events)
    inp = settings.task_input(task="write three files", workspace=str(workspace),
                              task_id=task_id, model=model, approval_mode="confirm_writes",
                              enable_reflection=False, host=settings.refloop_host_id,
                              continue_as_new_after_events=40)

    async def start() -> None:
        client = await connect(find_running_address(people.data), "default")
        await client.start_workflow(AgentTaskWorkflow.run, inp, id=task_id,
                                    task_queue=settings.task_queue,
                                    **start_metadata(inp.task, inp.workspace))

    asyncio.run(start())
    people.wait(task_id, "waiting_approval")
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS",
                                                               "DATABASE_URL")}
    watcher = subprocess.Popen([sys.executable, "-m", "refloop", "watch", task_id, "--json"],
                               env={**env, "REFLOOP_DATA_DIR": str(people.data)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in files:
            people.wait(task_id, "waiting_approval")
            people.ok("approve", task_id)
        stdout, stderr = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)) and seqs[0] == 1, seqs  # each once, in order, from 1
    assert sum(e["type"] == "continued_as_new" for e in events) >= 1
    assert [e["data"]["approved"] for e in events if e["type"] == "approval_decided"] == \
        [True] * len(files)
    assert events[-1]["type"] == "completed"
    assert sorted(p.name for p in workspace.iterdir()) == list(files)


def test_watch_follows_a_task_across_a_rewind(people: People):
    """`refloop rewind` while `refloop watch` follows: the rewind happens inside the run,
    so its events go on printing, numbered on from the ones before it, to the end."""
    task = people.start("a.txt", "b.txt", approval_mode="confirm_writes")
    people.wait(task, "waiting_approval")
    people.ok("approve", task)
    people.wait(task, "waiting_approval")  # b.txt waits; a.txt's checkpoint is taken
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS",
                                                               "DATABASE_URL")}
    errors = people.root / f"watch-{task}.err"
    with errors.open("w") as err:
        watcher = subprocess.Popen([sys.executable, "-m", "refloop", "watch", task, "--json"],
                                   env={**env, "REFLOOP_DATA_DIR": str(people.data)},
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in watcher.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # The watcher has printed the events so far: up to b.txt's approval the task waits on.
        deadline = time.monotonic() + 60
        while sum(json.loads(line)["type"] == "approval_required" for line in lines) < 2:
            assert time.monotonic() < deadline and watcher.poll() is None, lines
            time.sleep(0.1)
        people.ok("rewind", task, "--to-step", "1")
        watcher.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    stderr = errors.read_text()
    events = [json.loads(line) for line in lines]
    types = [e["type"] for e in events]
    assert types.index("rewind") < types.index("rewound"), types
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})  # on, once each
    assert events[-1]["type"] == "completed" and watcher.returncode == 0, stderr
    assert len({(e["seq"], e["ts"]) for e in events}) == len(events)  # none twice
