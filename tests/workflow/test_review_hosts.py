"""Reviews on many hosts: a code review's content read runs on the host holding its
directory; the quality review and the completeness check read the workspace on the task's
host and ask the model on the fleet's model queue, under its rate limit."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from refloop.contract import visibility
from refloop.contract.code_review import CodeReviewInput, CodeReviewResult
from refloop.contract.hosts import host_queue, model_queue
from refloop.contract.task import TaskInput
from refloop.store import hosts as host_rows
from refloop.store.db import store_for
from refloop.worker.replay import dump_history
from refloop.workflows.agent import AgentTaskWorkflow
from refloop.workflows.code_review import WAITING, CodeReviewWorkflow
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import (
    CODING,
    HISTORIES,
    SUMMARY,
    call,
    final,
    plan_of,
    result_of,
    run_task,
    wait_until,
)
from tests.workflow.test_code_review import issue, review, verify
from tests.workflow.test_completeness import COMPLETE
from tests.workflow.test_hosts import (
    host_settings,
    running_host,
    two_hosts,
    unique_host,
    where_activities_ran,
)
from tests.workflow.test_quality_review import PASS, RULES

pytestmark = pytest.mark.slow

def record(history, name: str) -> None:
    if os.environ.get("REFLOOP_RECORD_HISTORIES"):
        (HISTORIES / f"{name}.json").write_text(dump_history(history))


def file_review(workdir: Path, model: str, host: str | None, **extra) -> CodeReviewInput:
    (workdir / "m.py").write_text("a = 1\nb = 2\n")
    return CodeReviewInput(review_type="file", working_directory=str(workdir),
                           file_paths=["m.py"], model=model, host=host, **extra)


def reviewed(scripted_llm) -> str:
    return unique_scenario(scripted_llm, {
        "code_review": [review(issue("ISSUE-001", file="m.py", line=2))],
        "code_verify": [verify()]})


async def start_review(client: Client, inp: CodeReviewInput, task_queue: str):
    return await client.start_workflow(CodeReviewWorkflow.run, inp,
                                       id=f"cr-{uuid.uuid4().hex[:8]}", task_queue=task_queue,
                                       result_type=CodeReviewResult)


async def test_golden_each_reviews_content_is_read_on_its_hosts_worker(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    async with two_hosts(temporal_server, settings, tmp_path, task_queue) as hosts:
        handles = {}
        for host in hosts:
            workdir = tmp_path / f"{host}-root" / "repo"
            workdir.mkdir()
            handles[host] = await start_review(
                client, file_review(workdir, reviewed(scripted_llm), host), task_queue)
        results = {host: await handle.result() for host, handle in handles.items()}
    record(await handles[hosts[0]].fetch_history(), "code_review_on_its_host")
    for host, handle in handles.items():
        assert results[host].status == "completed", results[host]
        ran = where_activities_ran(await handle.fetch_history())
        read = [r for r in ran if r[0] == "refloop.code_review.load_content"]
        assert read and all(queue == host_queue(task_queue, host) and f"@{host} " in identity
                            for _, queue, identity in read), read
        agents = [r for r in ran if r[0] in ("refloop.code_review.review",
                                             "refloop.code_review.verify")]
        assert len(agents) == 2 and all(queue == model_queue(task_queue)
                                        for _, queue, _ in agents), agents


async def test_a_review_naming_an_unknown_host_or_one_not_holding_it_fails_at_once(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    host = unique_host("h")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"{host}-root" / "repo").mkdir(parents=True)
    cases = {"nosuch-host": tmp_path / f"{host}-root" / "repo", host: elsewhere}
    async with running_host(temporal_server, host_settings(settings, tmp_path, host),
                            task_queue) as own:
        for named, workdir in cases.items():
            model = reviewed(scripted_llm)
            started = time.monotonic()
            handle = await start_review(own, file_review(workdir, model, named), task_queue)
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
            assert time.monotonic() - started < 10
            expected = "unknown host 'nosuch-host'" if named != host else "does not hold"
            assert expected in str(failed.value.cause), failed.value.cause
            assert not scripted_llm.requests(model=model)


async def test_a_review_waits_for_its_host_and_resumes_when_it_is_back(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """No worker of the review's host: the review shows `waiting_for_host` (stage and
    search attribute) instead of failing, and completes once a worker of it polls."""
    serving, gone = unique_host("up"), unique_host("gone")
    gone_settings = host_settings(settings, tmp_path, gone)
    workdir = tmp_path / f"{gone}-root" / "repo"
    workdir.mkdir(parents=True)
    store = store_for(settings.effective_database_url)
    await asyncio.to_thread(host_rows.beat, store, gone, [str(workdir.parent)], [], "x@gone",
                            0.01, host_rows.utcnow())
    async with running_host(temporal_server, host_settings(settings, tmp_path, serving),
                            task_queue) as own:
        handle = await start_review(
            own, file_review(workdir, reviewed(scripted_llm), gone, host_wait_s=1),
            task_queue)

        async def waiting() -> bool:
            described = await handle.describe()
            return described.typed_search_attributes.get(visibility.STATUS) == WAITING

        await wait_until(waiting, "waiting_for_host", 30)
        assert (await handle.query(CodeReviewWorkflow.status))["stage"] == WAITING
        async with running_host(temporal_server, gone_settings, task_queue):
            result = await asyncio.wait_for(handle.result(), 60)
    assert result.status == "completed"
    read = [r for r in where_activities_ran(await handle.fetch_history())
            if r[0] == "refloop.code_review.load_content"]
    assert len(read) == 1 and f"@{gone} " in read[0][2]


async def test_golden_reviews_read_on_the_host_and_ask_the_model_apart(
        temporal_server, client, settings, scripted_llm, tmp_path, task_queue):
    """The quality review and the completeness check: the workspace read on the task's
    host, the model call apart from it: with no fleet rate limit here, on the workflow's
    own queue (eager); with one, on `<queue>.llm` (tests/workflow/test_llm_rate.py)."""
    async with two_hosts(temporal_server, settings, tmp_path, task_queue) as hosts:
        host = hosts[0]
        workspace = tmp_path / f"{host}-root" / "ws"
        workspace.mkdir()
        model = unique_scenario(scripted_llm, {
            "intent": [CODING], "plan": [plan_of("write_file")],
            "act": [call("write_file", path="report.md", content="# Report\n"),
                    final("wrote report.md")],
            "quality_review": [PASS], "completeness": [COMPLETE], "summary": [SUMMARY]})
        task = await client.start_workflow(
            AgentTaskWorkflow.run, TaskInput(
                task="write report.md", workspace=str(workspace), model=model, host=host,
                enable_quality_review=True, quality_review_rules=RULES,
                enable_reflection=True),
            id=f"test-{uuid.uuid4().hex[:10]}", task_queue=task_queue)
        outcome = await result_of(task)
    assert outcome.status == "completed", outcome.answer
    assert [e.data["outcome"] for e in outcome.events if e.type == "quality_review"] == \
        ["passed"]
    history = await task.fetch_history()
    record(history, "agent_task_reviews_apart")
    ran = {name: (queue, identity) for name, queue, identity in where_activities_ran(history)}
    for name in ("refloop.review.read_edit", "refloop.reflection.check_claimed_files"):
        queue, identity = ran[name]
        assert queue == host_queue(task_queue, host) and f"@{host} " in identity, ran
    for name in ("refloop.review.judge_edit", "refloop.llm.judge_completeness"):
        assert ran[name][0] == task_queue, ran
    assert "refloop.review.quality_review" not in ran
    assert "refloop.llm.check_completeness" not in ran
    assert len(scripted_llm.requests(model=model, purpose="quality_review")) == 1
    judged = str(scripted_llm.requests(model=model, purpose="completeness")[0]["body"])
    assert "does not exist" not in judged  # report.md is there: nothing decisive


async def test_a_missing_claimed_file_and_a_broken_edit_are_found_without_the_model(
        client, settings, scripted_llm, workspace, task_queue):
    """What the host read finds decides alone: invalid JSON fails its review with no model
    call; a claimed file that is not there makes the task incomplete."""
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("write_file")],
        "act": [call("write_file", path="data.json", content="{not json"),
                final("wrote data.json and notes.md")],
        "completeness": [COMPLETE, COMPLETE], "summary": [SUMMARY]})
    result = await run_task(client, settings, task_queue, model, workspace,
                            enable_quality_review=True, quality_review_rules=RULES,
                            enable_reflection=True, reflection_max_rounds=1)
    reviews = [e.data for e in result.events if e.type == "quality_review"]
    assert reviews and reviews[0]["outcome"] == "deterministic_failed"
    assert not scripted_llm.requests(model=model, purpose="quality_review")
    judged = str(scripted_llm.requests(model=model, purpose="completeness")[0]["body"])
    assert "notes.md was written, but it does not exist" in judged


async def test_the_cli_review_naming_a_host_that_cannot_read_it_fails_at_once(
        temporal_server, client, settings, tmp_path, task_queue):
    """`refloop review --file ... --host H` on a deployment: the host check refuses it with
    the reason, exit status 1, no traceback."""
    from tests.e2e.test_cli import refloop

    host = unique_host("cli")
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    (workdir / "m.py").write_text("a = 1\n")
    env = {"TEMPORAL_ADDRESS": temporal_server, "REFLOOP_TASK_QUEUE": task_queue,
           "DATABASE_URL": settings.effective_database_url}
    async with running_host(temporal_server, host_settings(settings, tmp_path, host),
                            task_queue):
        for named, expected in (("nosuch-host", "unknown host 'nosuch-host'"),
                                (host, f"host '{host}' does not hold")):
            started = time.monotonic()
            done = await asyncio.to_thread(
                refloop, "review", "--file", "m.py", "--workdir", str(workdir), "--host",
                named, tmp_path=tmp_path, **env)
            assert done.returncode == 1, done.stderr
            assert "code review failed" in done.stderr and expected in done.stderr
            assert "Traceback" not in done.stderr
            assert time.monotonic() - started < 30
