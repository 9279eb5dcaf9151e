"""Two projects on one machine, each with its own data dir, on the same default ports: a
refloop process never joins another data dir's server or queue. Project one runs
`refloop up`; project two's `run`, `review` and `mcp` start their own server on free ports
(and say so in one line), and every task lands in its own project's database."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from refloop.runtime.net import free_port
from tests.http_wait import wait_until_healthy
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of

pytestmark = pytest.mark.slow  # a `refloop up` and several fresh `refloop` processes

# Both projects ask for these: the defaults of two checkouts (never 7233 itself, which
# other servers on this machine may hold).
PORTS = {"REFLOOP_TEMPORAL_PORT": str(free_port()), "REFLOOP_UI_PORT": str(free_port())}
BIG = 1200  # characters per written line block: past the blob threshold below


@dataclass
class Project:
    root: Path
    env: dict[str, str]

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def rows(self, sql: str) -> list[tuple]:
        database = self.data_dir / "refloop.db"
        if not database.exists():
            return []
        with sqlite3.connect(database) as conn:
            return conn.execute(sql).fetchall()

    def task_ids(self) -> set[str]:
        return {row[0] for row in self.rows("SELECT workflow_id FROM tasks")}


def project(root: Path, model_url: str | None, model: str | None = None) -> Project:
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_BASE_URL", "TEMPORAL_ADDRESS", "DATABASE_URL",
                        "REFLOOP_TASK_QUEUE", "REFLOOP_MODEL")}
    env.update({"REFLOOP_DATA_DIR": str(root / "data"), "REFLOOP_SEMANTIC_INDEX": "false",
                "REFLOOP_BLOB_THRESHOLD_BYTES": "256", "REFLOOP_WORKSPACE_ROOTS": str(root),
                **PORTS})
    if model_url:
        env.update({"OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "test"})
    if model:
        env["REFLOOP_MODEL"] = model
    return Project(root, env)


def writes_and_reads(tag: str) -> dict:
    """A model that writes a file large enough for the blob store, reads it back (a large
    tool output: another blob) and answers with its own name."""
    content = f"model {tag}\n" + ("x" * BIG + "\n") * 3
    return {"intent": [CODING], "plan": [plan_of("write_file", "read_file")],
            "act": [call("write_file", path="out.txt", content=content),
                    call("read_file", path="out.txt"), final(f"answered by model {tag}")],
            "summary": [SUMMARY]}


@pytest.fixture(scope="module")
def first(scripted_llm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """Project one: `refloop up` on the shared default ports, model A."""
    one = project(tmp_path_factory.mktemp("one"), scripted_llm.base_url,
                  unique_scenario(scripted_llm, writes_and_reads("A"), latency_ms=150))
    api = free_port()
    log = one.root / "up.log"
    with log.open("w") as stderr:
        up = subprocess.Popen([sys.executable, "-m", "refloop", "up", "--port", str(api)],
                              env=one.env, stdout=subprocess.DEVNULL, stderr=stderr,
                              start_new_session=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{api}", timeout_s=120)
        started = log.read_text()
        assert f"at 127.0.0.1:{PORTS['REFLOOP_TEMPORAL_PORT']}" in started, started
        yield one
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=40) == 143
        assert "Traceback" not in log.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


async def refloop(proj: Project, *args: str) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "refloop", *args, env=proj.env, cwd=proj.root,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode is not None
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), err.decode())


def moved_aside(second: Project, first: Project, stderr: str) -> None:
    """Project two's server took free ports, in one line naming project one's data dir."""
    taken = f"127.0.0.1:{PORTS['REFLOOP_TEMPORAL_PORT']}"
    lines = [line for line in stderr.splitlines() if "never joined" in line]
    assert len(lines) == 1, stderr
    assert f"{taken} serves another data dir ({first.data_dir.resolve()})" in lines[0]
    assert "attached to" not in stderr
    assert f"started dev server (SQLite {second.data_dir.resolve()}" in stderr


async def test_two_projects_run_at_once_each_with_its_own_model_and_database(
        first: Project, scripted_llm, tmp_path: Path):
    """Project one's `refloop run` (beside its `refloop up`) and project two's run at the
    same time, with different scripted models: each ends with its own model's answer, in
    its own database, with its blobs in its own store."""
    second = project(tmp_path / "two", scripted_llm.base_url,
                     unique_scenario(scripted_llm, writes_and_reads("B"), latency_ms=150))
    for proj in (first, second):
        (proj.root / "ws").mkdir(exist_ok=True)
    before = first.task_ids()
    one, two = await asyncio.gather(*(
        refloop(proj, "run", "write out.txt and read it back", "--workspace",
                str(proj.root / "ws"), "--json", "--no-reflection")
        for proj in (first, second)))
    results = {}
    for name, done in (("A", one), ("B", two)):
        assert done.returncode == 0, done.stderr[-3000:]
        results[name] = json.loads(done.stdout)
        assert results[name]["status"] == "completed", results[name]["answer"]
        assert results[name]["answer"] == f"answered by model {name}"
        outcomes = [e["data"] for e in results[name]["events"] if e["type"] == "tool_result"]
        assert [o["tool"] for o in outcomes] == ["write_file", "read_file"]
        assert all(o["ok"] for o in outcomes), outcomes  # no blob missing
    assert (first.root / "ws" / "out.txt").read_text().startswith("model A\n")
    assert (second.root / "ws" / "out.txt").read_text().startswith("model B\n")
    moved_aside(second, first, two.stderr)
    assert "attached to the dev server of another refloop process on this data dir" in (
        one.stderr)
    # Each task in its own database, never in the other's.
    assert first.task_ids() - before == {results["A"]["workflow_id"]}
    assert second.task_ids() == {results["B"]["workflow_id"]}
    for proj in (first, second):
        assert proj.rows("SELECT count(*) FROM blobs")[0][0] >= 2  # written, and read


async def test_refloop_review_in_a_second_project(first: Project, tmp_path: Path):
    second = project(tmp_path / "two", None)  # the offline demo model
    before = first.rows("SELECT task_id FROM code_review_contents")
    done = await refloop(second, "review", "--snippet", "eval(user_input)", "--format",
                         "simple", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["status"] == "completed"
    moved_aside(second, first, done.stderr)
    reviews = second.rows("SELECT task_id FROM code_review_contents")
    assert len(reviews) == 1 and reviews[0][0].startswith("review-")
    assert first.rows("SELECT task_id FROM code_review_contents") == before


async def test_refloop_mcp_in_a_second_project(first: Project, tmp_path: Path):
    from mcp import ClientSession, StdioServerParameters, stdio_client

    second = project(tmp_path / "two", None)
    workspace = second.root / "ws"
    workspace.mkdir()
    before = first.task_ids()
    errlog = (second.root / "mcp.log").open("w")
    params = StdioServerParameters(command=sys.executable, args=["-m", "refloop", "mcp"],
                                   env=second.env, cwd=str(second.root))
    with errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            started = await session.call_tool("start_task", {
                "task": "write a report", "workspace": str(workspace)})
            task_id = json.loads(started.content[0].text)["task_id"]
            for _ in range(120):
                page = json.loads((await session.call_tool("task_events", {
                    "task_id": task_id, "after_seq": 0, "wait_s": 2})).content[0].text)
                if page["ended"]:
                    break
            state = json.loads((await session.call_tool("get_task", {"task_id": task_id}))
                               .content[0].text)
            assert state["status"] == "completed", state
    moved_aside(second, first, (second.root / "mcp.log").read_text())
    assert task_id in second.task_ids() and task_id not in first.task_ids()
    assert first.task_ids() == before
