"""What the command line prints: progress events, the result (or its JSON), and failures."""

from __future__ import annotations

# isort: split
import asyncio
import json
from typing import Any, NoReturn

from rich.console import Console

from refloop.contract.messages import TokenUsage
from refloop.contract.task import Event, TaskResult

err_console = Console(stderr=True, highlight=False)

EVENT_STYLE = {
    "plan": "bold cyan",
    "step": "cyan",
    "tool_call": "yellow",
    "tool_result": "green",
    "completed": "bold green",
    "incomplete": "bold yellow",
    "failed": "bold red",
}


def fail(message: str) -> NoReturn:
    """Bad input: one clear line on stderr, exit code 2."""
    err_console.print(f"[bold red]error:[/] {message}")
    raise SystemExit(2)


def describe_event(event: Event) -> str:
    data = event.data
    match event.type:
        case "plan":
            steps = "; ".join(f"{n}. {s['goal']} [{s['tool']}]" for n, s in enumerate(
                data.get("steps", []), start=1))
            return f"plan ({data.get('task_type')}): {steps}"
        case "step":
            return f"step {data.get('step')}: {data.get('goal')}" if data.get("step") else (
                "all plan steps complete")
        case "tool_call":
            return f"→ {data.get('tool')} {json.dumps(data.get('args'), ensure_ascii=False)[:120]}"
        case "tool_result":
            status = "ok" if data.get("ok") else f"error: {data.get('error')}"
            unconfined = str(data.get("output", "")).startswith("[UNSANDBOXED]")
            return f"← {data.get('tool')} {status}" + (" [UNSANDBOXED]" if unconfined else "")
        case "mcp_tools":
            return (f"MCP tools ({', '.join(data.get('servers', []))}): "
                    f"{', '.join(data.get('tools', [])) or 'none'}")
        case _:
            return f"{event.type}: {json.dumps(data, ensure_ascii=False)[:160]}"


def print_event(event: Event) -> None:
    style = EVENT_STYLE.get(event.type, "dim")
    err_console.print(f"[{style}]{describe_event(event)}[/{style}]")


async def follow_events(handle: Any, done: asyncio.Event) -> None:
    """Print events as they appear, by polling the workflow's query."""
    from refloop.workflows.agent import AgentTaskWorkflow

    seen = 0
    while True:
        finished = done.is_set()
        try:
            events = await handle.query(AgentTaskWorkflow.events, seen)
        except Exception:  # the run may have closed between polls; the result has all
            events = []
        for event in events:
            print_event(event)
            seen = event.seq
        if finished:
            return
        await asyncio.sleep(0.3)


def emit_result(result: TaskResult, as_json: bool) -> None:
    if as_json:
        payload = {
            "workflow_id": result.workflow_id,
            "status": result.status,
            "answer": result.answer,
            "events": [event.model_dump(mode="json") for event in result.events],
            "stats": result.stats.model_dump(mode="json"),
            "quality_reviews": [r.model_dump(mode="json") for r in result.quality_reviews],
            "stop_reason": result.stop_reason,
            "missing": result.missing,
            "summary": result.summary,
        }
        print(json.dumps(payload, ensure_ascii=False))
        return
    print(f"status: {result.status} ({result.stop_reason})")
    for item in result.missing:
        print(f"missing: {item}")
    print(f"answer: {result.answer}")
    if result.summary:
        print(f"summary: {result.summary}")
    stats = result.stats
    print(
        f"stats: {stats.iterations} iterations, {stats.llm_calls} model calls"
        f"{failed_calls_note(stats.usage)}, {stats.tool_calls} tool calls, "
        f"{stats.usage.total_tokens} tokens"
    )


def failed_calls_note(usage: TokenUsage) -> str:
    """" (3 failed; 1 abandoned, usage unknown: at most 384 more completion tokens)"."""
    if not usage.failed_calls:
        return ""
    note = f" ({usage.failed_calls} failed"
    if usage.abandoned_calls:
        note += (f"; {usage.abandoned_calls} abandoned, usage unknown: at most "
                 f"{usage.abandoned_max_tokens} more completion tokens")
    return note + ")"
