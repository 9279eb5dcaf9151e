"""OpenTelemetry: one trace per task, Temporal spans plus GenAI spans for model calls."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.llm_fixtures import unique_scenario
from tests.workflow.helpers import CODING, SUMMARY, call, final, plan_of, run_task

EXPORTER = InMemorySpanExporter()


def install_provider() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


async def test_one_task_gives_one_trace_with_llm_spans(client, settings, scripted_llm,
                                                       workspace, task_queue):
    install_provider()
    EXPORTER.clear()
    model = unique_scenario(scripted_llm, {
        "intent": [CODING], "plan": [plan_of("list_dir")],
        "act": [call("list_dir", path="."), final("ok")], "summary": [SUMMARY]})
    result = await run_task(client, settings, task_queue, model, workspace)
    assert result.status == "completed"
    spans = EXPORTER.get_finished_spans()
    names = [span.name for span in spans]
    assert "StartWorkflow:AgentTaskWorkflow" in names
    assert "RunWorkflow:AgentTaskWorkflow" in names
    assert "RunActivity:refloop.llm.act" in names
    assert "RunActivity:refloop.tool.list_dir" in names
    chats = [span for span in spans if span.name == f"chat {model}"]
    assert len(chats) == 5  # intent, plan, 2 acts, summary
    purposes = sorted(span.attributes["refloop.purpose"] for span in chats)
    assert purposes == ["act", "act", "intent", "plan", "summary"]
    assert all(span.attributes["gen_ai.usage.input_tokens"] > 0 for span in chats)
    start = next(s for s in spans if s.name == "StartWorkflow:AgentTaskWorkflow")
    assert {span.context.trace_id for span in chats} == {start.context.trace_id}
    # Each workflow span is emitted once, though the workflow code ran many activations.
    assert names.count("RunWorkflow:AgentTaskWorkflow") == 1


async def test_api_continues_the_callers_trace(client, settings, scripted_llm, workspace,
                                               task_queue):
    import httpx

    from refloop.api.main import create_app
    from refloop.worker.main import build_worker

    install_provider()
    EXPORTER.clear()
    model = unique_scenario(scripted_llm, {"intent": [CODING], "plan": [plan_of("list_dir")],
                                           "act": [final("ok")], "summary": [SUMMARY]})
    settings = settings.model_copy(update={"refloop_task_queue": task_queue,
                                           "enable_reflection": False})
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    app = create_app(settings, client=client)
    async with build_worker(client, settings, task_queue), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        session = (await http.post("/agent/interactive/start", json={
            "workspace": str(workspace), "model": model})).json()["session_id"]
        response = await http.post(
            "/agent/interactive/task", json={"session_id": session, "task": "hi"},
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        assert response.status_code == 202
        handle = client.get_workflow_handle(response.json()["workflow_id"])
        await handle.result()
    started = [s for s in EXPORTER.get_finished_spans()
               if s.name == "StartWorkflow:AgentTaskWorkflow"]
    assert started and format(started[0].context.trace_id, "032x") == trace_id
