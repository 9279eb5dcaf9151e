"""A task on a real worker: repo map in the system prompt, background index, the tool."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import ActivityEnvironment

from refloop.activities.workspace_activities import WorkspaceActivities
from refloop.contract.task import WorkspaceInput
from refloop.search.index import CodeIndex
from refloop.store.blobs import MARKER
from refloop.store.db import store_for
from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, events_of, final, plan_of, run_task


async def test_task_sees_the_repo_map_and_searches_the_index(
        client, settings, scripted_llm, repo: Path, task_queue):
    settings = settings.model_copy(update={"refloop_semantic_index": True})
    CodeIndex(settings.index_dir, repo).update()  # the background pass then finds it current
    model = unique_scenario(scripted_llm, {
        "intent": [CODING],
        "plan": [plan_of("search_semantic")],
        "act": [call("search_semantic", query="where is the retry policy configured"),
                call("complete_step", step=1, summary="found it"), final("net/retries.py")],
        # Room for the (quick, up-to-date) index pass to report before the run ends.
        "summary": [{**SUMMARY, "delay_ms": 500}],
    })
    result = await run_task(client, settings, task_queue, model, repo,
                            task="Where is the retry policy configured?",
                            record_as="agent_task_with_workspace_context")
    assert result.status == "completed"
    [workspace] = events_of(result, "workspace")
    assert workspace["indexing"] is True and workspace["context_chars"] > 200
    [index] = events_of(result, "index")
    assert index["status"] == "done" and index["note"] == "up to date"
    assert index["files_unchanged"] == 14
    [found] = [e for e in events_of(result, "tool_result") if e["tool"] == "search_semantic"]
    assert found["ok"] and found["data"]["hits"][0]["path"] == "net/retries.py"

    system = scripted_llm.requests(model=model, purpose="act")[0]["body"]["messages"][0]
    assert f"workspace: {repo}" in system["content"]
    assert "Environment: Linux" in system["content"]
    assert "  def default_retry_policy (line 14)" in system["content"]
    assert "search_semantic" in system["content"]


async def test_task_without_indexing_still_gets_the_map(client, settings, scripted_llm,
                                                        repo: Path, task_queue):
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [final("ok")], "summary": [SUMMARY],
    })
    result = await run_task(client, settings, task_queue, model, repo, task="look around")
    assert events_of(result, "workspace")[0]["indexing"] is False
    assert events_of(result, "index") == []
    system = scripted_llm.requests(model=model, purpose="act")[0]["body"]["messages"][0]
    assert "Repo map (most referenced symbols first)" in system["content"]


async def test_index_activity_runs_in_a_child_process_and_heartbeats(settings, repo: Path):
    settings = settings.model_copy(update={"refloop_semantic_index": True})
    beats: list[tuple] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    activities = WorkspaceActivities(settings, store_for(settings.effective_database_url))
    report = await env.run(activities.index, WorkspaceInput(workspace=str(repo)))
    assert (report.files_indexed, report.files_unchanged) == (14, 0)
    assert report.chunks_embedded == report.chunks_total > 0
    assert {"files_done": 14, "files_to_index": 14,
            "chunks_embedded": report.chunks_total} in [b[0] for b in beats if b]
    again = await env.run(activities.index, WorkspaceInput(workspace=str(repo)))
    assert again.note == "up to date" and again.files_indexed == 0
    hits = CodeIndex(settings.index_dir, repo).search("how are user passwords hashed", 1)
    assert hits[0].path == "auth/passwords.py"


async def test_a_large_workspace_description_travels_as_a_blob(settings, repo: Path):
    settings = settings.model_copy(update={"refloop_blob_threshold_bytes": 256})
    store = store_for(settings.effective_database_url)
    described = await ActivityEnvironment().run(WorkspaceActivities(settings, store).describe,
                                                WorkspaceInput(workspace=str(repo)))
    marker = MARKER.search(described.context)
    assert marker and len(described.context) < 1_000
    assert "def default_retry_policy" in store.get_blob(marker.group(1))


async def test_a_finished_task_leaves_no_pending_activity(client, settings, scripted_llm,
                                                          repo: Path, task_queue):
    """The Web UI showed "Pending Activities 1" on a completed task: the background index,
    cancel requested. The run now ends once the worker has stopped it."""
    from refloop.contract.task import TaskInput
    from refloop.worker.main import build_worker
    from tests.workflow.helpers import result_of, start

    settings = settings.model_copy(update={"refloop_semantic_index": True,
                                           "refloop_index_dir": repo.parent / "fresh-index"})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("search_semantic")],
        "act": [final("answered before the index is built")], "summary": [SUMMARY]})
    async with build_worker(client, settings, task_queue):
        handle = await start(client, task_queue, TaskInput(
            task="where is the retry policy?", workspace=str(repo), model=model,
            enable_reflection=False))
        result = await result_of(handle)
    assert [e["status"] for e in events_of(result, "index")] == ["cancelled"]
    described = await handle.describe()
    assert list(described.raw_description.pending_activities) == []


async def test_indexing_goes_on_after_a_continue_as_new(client, settings, scripted_llm,
                                                        repo: Path, task_queue):
    """Each run of a long task indexes its workspace, not only the first (a run ends by
    cancelling its index pass; the next one starts it again)."""
    from refloop.contract.task import TaskInput
    from tests.workflow.helpers import run_with_history

    settings = settings.model_copy(update={"refloop_semantic_index": True})
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("search_semantic")],
        "act": [*[call("read_file", path="net/retries.py") for _ in range(6)],
                final("read it")],
        "summary": [SUMMARY],
    })
    result, last_run = await run_with_history(client, settings, task_queue, TaskInput(
        task="Where is the retry policy configured?", workspace=str(repo), model=model,
        enable_reflection=False, continue_as_new_after_events=30))
    assert result.status == "completed"
    assert events_of(result, "continued_as_new")
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in last_run.events if e.HasField("activity_task_scheduled_event_attributes")]
    assert "refloop.workspace.index" in scheduled
