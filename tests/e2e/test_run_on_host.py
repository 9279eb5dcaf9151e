"""`refloop run --host B --workspace X` checked that X exists on the client, not on B:
the workspace of another machine's host is checked against that host's roots (the hosts
table), never against this machine's disk."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from refloop.cli.tasks import on_host
from refloop.runtime.workspaces import WorkspaceError
from refloop.store import hosts as host_rows
from refloop.store.db import store_for, utcnow
from tests.e2e.test_cli import refloop


@pytest.fixture
def host_b(settings, tmp_path: Path) -> str:
    """Host b, registered with a root this machine does not have."""
    host = f"b-{uuid.uuid4().hex[:6]}"
    host_rows.beat(store_for(settings.effective_database_url), host,
                   [str(tmp_path / "only-on-b")], [], f"1@{host}", 60.0, utcnow())
    return host


async def test_a_workspace_only_host_b_has_is_accepted_for_b(settings, tmp_path, host_b,
                                                              capsys):
    there = tmp_path / "only-on-b" / "repo"
    assert not there.exists()  # not on this machine: only b's roots say
    assert await on_host(str(there), host_b, settings) == str(there)
    assert await on_host(f"{there}/../repo/", host_b, settings) == str(there)
    refusals = {str(tmp_path / "elsewhere"): "does not hold",
                "repo": "name an absolute path on host",
                "/etc/x": "system directory"}
    for raw, expected in refusals.items():
        with pytest.raises(WorkspaceError, match=expected):
            await on_host(raw, host_b, settings)
    # A host the table does not know yet: the task waits for it, and says so.
    assert await on_host(str(there), "not-yet", settings) == str(there)
    assert "unknown host 'not-yet'" in capsys.readouterr().err


def test_refloop_run_refuses_a_path_outside_bs_roots_before_starting(settings, tmp_path,
                                                                      host_b):
    done = refloop("run", "x", "--host", host_b, "--workspace", str(tmp_path / "elsewhere"),
                   tmp_path=tmp_path, DATABASE_URL=settings.effective_database_url,
                   TEMPORAL_ADDRESS="127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    assert "does not hold" in done.stderr and "not a directory" not in done.stderr
