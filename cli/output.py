"""What the command line prints: progress events, the result (or its JSON), and failures."""

from __future__ import annotations

# isort: split
import asyncio
import json
from typing import Any, NoReturn

from rich.console import Console
from rich.text import Text

from refloop.contract.messages import TokenUsage
from refloop.contract.task import Event, TaskResult, TaskStats
from refloop.contract.text import escape_controls, escape_json_controls

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
    err_console.print(Text("error:", style="bold red"), Text(escape_controls(message)))
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
            return f"→ {data.get('tool')} {json.dumps(data.get('args'), ensure_ascii=False)}"
        case "tool_result":
            status = "ok" if data.get("ok") else f"error: {data.get('error')}"
            unconfined = str(data.get("output", "")).startswith("[UNSANDBOXED]")
            return f"← {data.get('tool')} {status}" + (" [UNSANDBOXED]" if unconfined else "")
        case "mcp_tools":
            dropped = data.get("dropped") or []
            return (f"MCP tools ({', '.join(data.get('servers', []))}): "
                    f"{', '.join(data.get('tools', [])) or 'none'}"
                    + (f"; left out: {'; '.join(dropped)}" if dropped else ""))
        case "workspace":
            if data.get("error"):
                return f"workspace could not be read: {data['error']}"
            return (f"workspace read: {data.get('context_chars')} characters of context; "
                    + ("semantic index building" if data.get("indexing") else "no index"))
        case "index":
            if data.get("status") == "done":
                return (f"semantic index ready: {data.get('files_seen')} files, "
                        f"{data.get('chunks_total')} chunks")
            return f"semantic index {data.get('status')}: " \
                   f"{data.get('error') or data.get('reason') or ''}"
        case "reflection":
            if data.get("trigger") == "completeness":
                verdict = "complete" if data.get("is_complete") else "incomplete"
                return f"completeness check: {verdict}: {data.get('analysis', '')}"
            return (f"reflection ({data.get('trigger')}): "
                    f"{data.get('evidence') or data.get('message') or ''}")
        case "reflection_plan":
            steps = "; ".join(s["goal"] for s in (data.get("plan") or {}).get("steps", []))
            return f"supplement planned: {steps}"
        case "reflection_exec":
            if data.get("error"):
                return f"supplement run {data.get('child_workflow_id')} failed: {data['error']}"
            return (f"supplement run {data.get('child_workflow_id')}: {data.get('succeeded')} "
                    f"of {data.get('attempted')} tool calls succeeded")
        case "waiting_for_host":
            return (f"waiting for host {data.get('host')}: no worker of it took "
                    f"{data.get('activity')} within {data.get('after_s', 0):.0f} s")
        case "waiting_for_model":
            return (f"waiting for the model at {data.get('endpoint')}: {data.get('error')} "
                    "(tried again until it answers)")
        case "waiting_for_budget":
            return (f"waiting for budget: {data.get('reason')} (raise it with `refloop budget "
                    "TASK --max-cost-usd X` or `--max-tokens N`)")
        case "budget_raised":
            return (f"limit set: ${data.get('max_cost_usd') or '-'} / "
                    f"{data.get('max_tokens') or '-'} tokens")
        case "budget_resumed":
            return f"the limit covers the next call: going on after {data.get('waited_s'):.0f} s"
        case "model_back":
            return (f"the model at {data.get('endpoint')} answers again after "
                    f"{data.get('waited_s') or 0:.0f} s")
        case "compacted":
            saved = f"{data.get('tokens_before')} → {data.get('tokens_after')} tokens"
            if data.get("kind") == "summary":
                return (f"compacted: {data.get('turns_folded')} earlier messages summarised "
                        f"({saved}, window {data.get('window')})")
            return (f"{data.get('kind')} to fit the window: {data.get('masked') or 0} outputs "
                    f"masked, {data.get('turns_folded') or 0} messages folded ({saved})")
        case "host_back":
            return f"host {data.get('host')} is back"
        case "moved_to_host":
            return f"moved from host {data.get('from')} to host {data.get('to')}"
        case "approval_required":
            return f"waiting for approval of {data.get('tool')} (call {data.get('call_id')})"
        case "approval_decided":
            verdict = "approved" if data.get("approved") else "rejected"
            why = f": {data['comment']}" if data.get("comment") else ""
            if data.get("edited"):
                changed = sorted(k for k in {**data.get("original_arguments", {}),
                                             **data.get("arguments", {})}
                                 if data.get("original_arguments", {}).get(k)
                                 != data.get("arguments", {}).get(k))
                verdict += f" with edited arguments ({', '.join(changed)})"
            return f"call {data.get('call_id')} {verdict}{why}"
        case "approval_expired":
            return (f"no decision on call {data.get('call_id')} ({data.get('tool')}) within "
                    f"{data.get('waited')}: the task ends incomplete")
        case "quality_review":
            verdict = "PASS" if data.get("pass") else "FAIL"
            if data.get("outcome") == "unavailable":
                verdict = "UNAVAILABLE"
            return f"quality review of {data.get('file_path')}: {verdict} {data.get('summary', '')}"
        case "failed":
            return f"failed ({data.get('stop_reason')}): {data.get('error')}"
        case _:
            return f"{event.type}: {json.dumps(data, ensure_ascii=False)}"


ELLIPSIS = " …"


def fit(text: str, width: int) -> str:
    """One line of at most `width` characters, never ending mid-word: a longer line is cut
    at its last space that leaves room for the marker " …". A first word longer than the
    line is cut where it must, still marked."""
    line = " ".join(text.split())
    if len(line) <= width:
        return line
    room = max(width - len(ELLIPSIS), 1)
    cut = line.rfind(" ", 0, room + 1)
    if cut <= 0:
        return line[: max(width - 1, 1)] + "…"
    return line[:cut].rstrip() + ELLIPSIS


def print_event(event: Event, console: Console | None = None) -> None:
    """One progress line that fits the terminal, printed as text: what the model or a tool
    wrote never reads as markup (rich's `[link=...]`) nor reaches the terminal as an escape
    sequence."""
    out = console or err_console
    style = EVENT_STYLE.get(event.type, "dim")
    line = escape_controls(describe_event(event), keep="")
    out.print(Text(fit(line, out.width), style=style))


def print_link(label: str, url: str, console: Console | None = None) -> None:
    """A link whole on its own line, never wrapped or cut, so it can be clicked or copied."""
    out = console or err_console
    out.print(Text(label, style="bold"))
    out.print(Text(url), soft_wrap=True, crop=False, overflow="ignore")


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
        print(escape_json_controls(json.dumps(payload, ensure_ascii=False)))
        return
    print(f"status: {result.status} ({result.stop_reason})")
    for item in result.missing:
        print(f"missing: {escape_controls(item)}")
    print(f"answer: {escape_controls(result.answer or '')}")
    if result.summary:
        print(f"summary: {escape_controls(result.summary)}")
    stats = result.stats
    print(
        f"stats: {stats.iterations} iterations, {stats.llm_calls} model calls"
        f"{failed_calls_note(stats.usage)}, {stats.tool_calls} tool calls, "
        f"{stats.usage.total_tokens} tokens"
    )
    print(f"cost: {cost_line(stats)}")


def cost_line(stats: TaskStats) -> str:
    """"$0.11 ($0.03 of it by supplement children)", and what no price covers."""
    usage, children = stats.usage, stats.children_usage
    text = f"${usage.cost_usd:.4f}"
    if children.cost_usd:
        text += f" (${children.cost_usd:.4f} of it by supplement children)"
    if usage.unpriced_calls:
        text += (f"; {usage.unpriced_calls} model calls unpriced (a model not in "
                 "REFLOOP_MODEL_PRICES: counted in tokens only)")
    return text


def failed_calls_note(usage: TokenUsage) -> str:
    """" (3 failed; 1 abandoned, usage unknown: at most 384 more completion tokens)"."""
    if not usage.failed_calls:
        return ""
    note = f" ({usage.failed_calls} failed"
    if usage.abandoned_calls:
        note += (f"; {usage.abandoned_calls} abandoned, usage unknown: at most "
                 f"{usage.abandoned_max_tokens} more completion tokens")
    return note + ")"
