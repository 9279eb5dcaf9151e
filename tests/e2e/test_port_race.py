"""Four projects started at the same moment, each with its own data dir, all asking for
the same Temporal port: the free-port check and the server's bind race, and a server that
loses the port to another process starts again on free ports (it died with `bind: address
already in use`, and its command failed). A pinned port fails, saying so."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from refloop.runtime.net import free_port
from tests.e2e.test_data_dirs import project, refloop, writes_and_reads
from tests.llm_fixtures import unique_scenario

pytestmark = pytest.mark.slow  # four `refloop run` with four dev servers


async def test_four_runs_started_together_on_one_asked_port_all_complete(
        scripted_llm, tmp_path: Path):
    asked = {"REFLOOP_TEMPORAL_PORT": str(free_port()), "REFLOOP_UI_PORT": str(free_port())}
    projects = []
    for n in range(4):
        proj = project(tmp_path / f"p{n}", scripted_llm.base_url,
                       unique_scenario(scripted_llm, writes_and_reads(str(n))))
        proj.env.update(asked)
        (proj.root / "ws").mkdir()
        projects.append(proj)
    done = await asyncio.gather(*(
        refloop(proj, "run", "write out.txt and read it back", "--workspace",
                str(proj.root / "ws"), "--json", "--no-reflection") for proj in projects))
    for n, (proj, result) in enumerate(zip(projects, done, strict=True)):
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads(result.stdout)["answer"] == f"answered by model {n}"
        assert "Traceback" not in result.stderr and "panic" not in result.stderr
        assert (proj.root / "ws" / "out.txt").exists()


async def test_a_pinned_port_held_by_another_process_fails_saying_so(
        scripted_llm, tmp_path: Path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, not listening: the server's bind fails, as
        port = holder.getsockname()[1]  # when another process wins the race
        proj = project(tmp_path / "pinned", scripted_llm.base_url,
                       unique_scenario(scripted_llm, writes_and_reads("pinned")))
        proj.env.update({"REFLOOP_TEMPORAL_PORT": str(port),
                         "REFLOOP_TEMPORAL_PORT_PINNED": "true",
                         "REFLOOP_UI_PORT": str(free_port())})
        (proj.root / "ws").mkdir()
        result = await refloop(proj, "run", "write out.txt", "--workspace",
                               str(proj.root / "ws"), "--no-reflection")
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr and "pinned" in result.stderr, \
        result.stderr[-2000:]


async def test_a_port_lost_between_check_and_bind_is_left_for_a_free_one(
        scripted_llm, tmp_path: Path):
    """The race made certain: the port is bound (not listening, so the check finds it
    free) by another process; the server's bind fails, and it starts again elsewhere."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        proj = project(tmp_path / "lost", scripted_llm.base_url,
                       unique_scenario(scripted_llm, writes_and_reads("lost")))
        proj.env.update({"REFLOOP_TEMPORAL_PORT": str(port),
                         "REFLOOP_UI_PORT": str(free_port())})
        (proj.root / "ws").mkdir()
        result = await refloop(proj, "run", "write out.txt and read it back", "--workspace",
                               str(proj.root / "ws"), "--json", "--no-reflection")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"127.0.0.1:{port} was taken by another process as the server started; " \
           "starting again on 127.0.0.1:" in " ".join(result.stderr.split())
    assert json.loads(result.stdout)["answer"] == "answered by model lost"
