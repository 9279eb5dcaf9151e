"""`refloop fork` on the real dev server and PostgreSQL: a task forked at step 4 with a new
instruction goes on from there in a new workspace; the original and its workspace are left
as they were. And `refloop rewind` keeps the cost of the steps it takes out, marked."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from refloop.store.db import store_for
from refloop.worker.main import build_worker
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from tests.e2e.test_cli import refloop
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    events_of,
    final,
    plan_of,
    result_of,
    wait_until,
)
from tests.workflow.test_rewind import checkpoints_taken, start_writing, write


def files_of(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


async def test_golden_a_fork_at_step_four_goes_on_in_its_own_workspace(
        temporal_server, client, settings, scripted_llm, workspace, task_queue,
        tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file", "write_file")],
        "act": [write("a.txt", "first\n"), write("b.txt", "b\n"),
                {"tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "third\n"}},
                    {"name": "complete_step", "arguments": {"step": 1, "summary": "a, b"}}]},
                write("c.txt", "c\n"), write("d.txt", "d\n"),
                call("complete_step", step=2, summary="c, d"), final("original done"),
                # the fork's turns: it takes up after c.txt with the new instruction
                write("e.txt", "e\n", delay_ms=3000),  # while its row says it runs
                call("complete_step", step=2, summary="c, e"),
                final("fork done")],
        "summary": [SUMMARY, SUMMARY],
    })
    env = {"TEMPORAL_ADDRESS": temporal_server, "DATABASE_URL": settings.effective_database_url,
           "REFLOOP_WORKSPACE_ROOTS": str(tmp_path), "REFLOOP_TASK_QUEUE": task_queue,
           "COLUMNS": "400"}
    fork_dir = tmp_path / "forked"
    async with build_worker(client, settings, task_queue):
        original_id = await start_writing(client, task_queue, workspace, model)
        original = client.get_workflow_handle_for(AgentTaskWorkflow.run, original_id)
        done = await result_of(original)
        assert done.status == "completed", done.answer
        before = files_of(workspace)
        assert before == {"a.txt": "third\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "d\n"}

        forked = await asyncio.to_thread(
            refloop, "fork", original_id, "--at-step", "4", "--task",
            "write e.txt instead of d.txt", "--workspace", str(fork_dir),
            tmp_path=tmp_path, **env)
        assert forked.returncode == 0, forked.stderr
        fork_id = forked.stdout.strip()
        assert f"forked from {original_id} at step 4" in forked.stderr
        handle = client.get_workflow_handle_for(AgentTaskWorkflow.run, fork_id)
        store = store_for(settings.effective_database_url)
        await wait_until(lambda: store.get_task(fork_id).status == "running",
                         "the fork's row told it runs")
        result = await result_of(handle)
        if os.environ.get("REFLOOP_RECORD_HISTORIES"):  # `make histories`
            (HISTORIES / "agent_task_forked.json").write_text(
                dump_history(await handle.fetch_history()))

    assert result.status == "completed", result.answer
    # The fork: the files of step 4 (a.txt rewritten, b, c; no d.txt), then its own e.txt
    assert files_of(fork_dir) == {"a.txt": "third\n", "b.txt": "b\n", "c.txt": "c\n",
                                  "e.txt": "e\n"}
    assert files_of(workspace) == before  # the original's workspace is untouched
    origin, = events_of(result, "forked_from")
    assert origin["task_id"] == original_id and origin["step"] == 4
    assert origin["instruction"] == "write e.txt instead of d.txt"
    assert events_of(result, "workspace_restored")[0]["written"] == 3
    assert result.plan is not None and len(result.plan.steps) == 2
    assert result.completed_steps == [1, 2]  # step 1 carried, step 2 its own
    # Its first model turn read the original's conversation up to c.txt, and the
    # instruction last; the system prompt names its own workspace.
    first = scripted_llm.requests(model, "act")[7]["body"]["messages"]
    assert first[-1]["role"] == "user" and first[-1]["content"].endswith(
        "write e.txt instead of d.txt")
    assert first[-2]["role"] == "tool" and "c.txt" in str(first[-3]["tool_calls"])
    assert "d.txt" not in str(first[:-1])  # nothing after step 4 came along
    assert str(fork_dir) in first[0]["content"]
    # Linked both ways: the fork's input and memo, the original's task view
    assert [row.task_id for row in store.forks_of(original_id)] == [fork_id]
    described = await handle.describe()
    assert (await described.memo_value("forked_from")) == {"task_id": original_id, "step": 4}
    # The original ran to its end: the same result as before the fork
    assert (await result_of(original)).answer == "original done"


async def test_a_rewind_keeps_the_cost_of_the_steps_it_took_out_marked_rewound(
        temporal_server, client, settings, scripted_llm, workspace, task_queue,
        tmp_path: Path):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [write("a.txt", "a\n"), write("b.txt", "b\n"), write("c.txt", "c\n"),
                write("d.txt", "d\n", delay_ms=60_000),  # the run is here when rewound
                call("complete_step", step=1, summary="ok"), final("ok")],
        "summary": [SUMMARY],
    })
    async with build_worker(client, settings, task_queue):
        workflow_id = await start_writing(client, task_queue, workspace, model)
        await checkpoints_taken(client, workflow_id, 3)
        done = await asyncio.to_thread(
            refloop, "rewind", workflow_id, "--to-step", "1", tmp_path=tmp_path,
            TEMPORAL_ADDRESS=temporal_server, COLUMNS="400")
        assert done.returncode == 0, done.stderr
        assert "stay in its ledger, marked rewound" in done.stderr
        result = await client.get_workflow_handle_for(AgentTaskWorkflow.run,
                                                      workflow_id).result()
    assert result.status == "completed"
    stats = result.stats
    # The act calls after checkpoint 1 (the ones that wrote b.txt and c.txt) were paid for
    rewound = stats.rewound_usage
    assert rewound.calls == 2 and rewound.total_tokens > 0
    assert sum(u.calls for u in stats.rewound_by_model.values()) == 2
    assert stats.usage.calls == sum(u.calls for u in stats.usage_by_model.values())
    assert stats.usage.calls >= rewound.calls + 4  # intent, plan, acts of the run, summary
    assert events_of(result, "rewound")[0]["rewound_calls"] == 2
