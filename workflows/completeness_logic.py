"""Pure decisions of the completeness reflection: the evidence handed to the judge,
how its verdict is reconciled with deterministic findings, the supplement objective,
the prior context a supplement child starts from, and the merged statistics."""

from __future__ import annotations

import json
import re
from typing import Any

from refloop.contract.activity_io import CompletenessVerdict, HistoryItem, Supplement, ToolRecord
from refloop.contract.messages import COMPLETE_STEP, Plan
from refloop.contract.task import Event, ReviewCounts, TaskStats
from refloop.workflows.accounting import merged_usage

# The marker the supplement planner looks for in its objective.
SUPPLEMENT_HEADER = "Missing actions to supplement:"
_CLAIMED_FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:md|txt|json|ya?ml|toml|csv|py|js|ts|html|css|"
    r"ini|cfg|rst|sh|sql|xml))(?![\w/-])"
)
_WRITE_VERBS = re.compile(r"\b(wrote|written|write|saved|save|created|create|generated|"
                          r"updated|added|exported|stored)\b|写入|保存|生成|创建", re.IGNORECASE)


def claimed_files(texts: list[str]) -> list[str]:
    """Files the model *says* it wrote: a file name in a sentence with a writing verb."""
    found: list[str] = []
    for text in texts:
        for sentence in re.split(r"(?<=[.!?。])\s+|\n", text or ""):
            if not _WRITE_VERBS.search(sentence):
                continue
            for name in _CLAIMED_FILE.findall(sentence):
                if name not in found:
                    found.append(name)
    return found


def kept_claims(kept: list[str], notes: list[str], keep: int) -> list[str]:
    """What a task keeps of the step summaries of records it put in the blob store: one
    sentence per file they claim written ("wrote a.md."), which `claimed_files` reads as
    the summaries themselves; each file once, the most recently claimed last, at most
    `keep` of them."""
    names = claimed_files([*kept, *notes])
    recent = claimed_files(notes)
    ordered = [name for name in names if name not in recent] + recent
    return [f"wrote {name}." for name in ordered[-keep:]]


def missing_steps(plan: Plan | None, completed: list[int]) -> list[str]:
    if plan is None:
        return []
    return [f"step {n}: {step.goal}" for n, step in enumerate(plan.steps, start=1)
            if n not in completed]


def tool_record(tool: str, arguments: dict[str, Any], ok: bool, error: str | None,
                output: str = "", data: dict[str, Any] | None = None,
                limit: int = 300) -> ToolRecord:
    """A tool call's compact record: short arguments and outcome, never raw outputs."""
    args = json.dumps(arguments, ensure_ascii=False)
    outcome = "ok" if ok else f"error: {error}"
    if ok and output:
        outcome += f": {output[:120]}"
    file_path = (data or {}).get("file_path") if ok else None
    note = arguments.get("summary") if tool == COMPLETE_STEP else None
    return ToolRecord(
        tool=tool,
        arguments=args if len(args) <= limit else args[:limit] + "…",
        ok=ok,
        outcome=outcome[:limit],
        file_path=file_path if isinstance(file_path, str) else None,
        note=str(note or "")[:1000],
    )


def records_from_events(events: list[Event]) -> list[ToolRecord]:
    """The records a run kept only as events (state written before the ledger existed)."""
    calls: dict[str, dict[str, Any]] = {}
    records: list[ToolRecord] = []
    for event in events:
        if event.type == "tool_call":
            calls[event.data["id"]] = event.data
        elif event.type == "tool_result":
            call = calls.get(event.data["id"], {})
            records.append(tool_record(
                event.data.get("tool", ""), call.get("args", {}), bool(event.data.get("ok")),
                event.data.get("error"), event.data.get("output") or "",
                event.data.get("data")))
    return records


# Tool records a run keeps in its state; more go to the blob store (one blob per chunk).
RECORDS_IN_STATE = 200


def condensed_history(records: list[ToolRecord]) -> list[HistoryItem]:
    """Per tool call: tool, short arguments and outcome - the judge's evidence."""
    return [HistoryItem(tool=r.tool, arguments=r.arguments, outcome=r.outcome)
            for r in records]


def claim_texts(records: list[ToolRecord], answer: str,
                kept_notes: list[str] | None = None) -> list[str]:
    """Where the model says what it wrote: the answer and each step's summary (those of
    records kept in the blob store first)."""
    return [answer, *(kept_notes or [])] + [r.note for r in records if r.tool == COMPLETE_STEP]


def reconcile(
    verdict: CompletenessVerdict, evidence: list[str], tools: list[str], max_supplements: int
) -> CompletenessVerdict:
    """Deterministic findings can make a task incomplete on their own; supplements only
    name available tools and are capped."""
    supplements = [
        supplement.model_copy(update={
            "suggested_tools": [t for t in supplement.suggested_tools if t in tools]})
        for supplement in verdict.supplements
    ]
    missing = list(verdict.missing_aspects)
    is_complete = verdict.is_complete and not evidence
    if evidence and not supplements:
        supplements = [Supplement(action=f"Resolve: {item}", reason="deterministic check",
                                  suggested_tools=[]) for item in evidence]
    if evidence:
        missing = missing + [item for item in evidence if item not in missing]
    if is_complete:
        supplements = []
    return verdict.model_copy(update={
        "is_complete": is_complete,
        "missing_aspects": missing,
        "supplements": supplements[:max_supplements],
    })


def supplement_objective(task: str, supplements: list[Supplement],
                         header: str = SUPPLEMENT_HEADER) -> str:
    lines = [f"{n}. {s.action} (reason: {s.reason}"
             + (f"; tools: {', '.join(s.suggested_tools)})" if s.suggested_tools else ")")
             for n, s in enumerate(supplements, start=1)]
    return f"{task}\n\n{header}\n" + "\n".join(lines)


def supplement_metadata(round_number: int, supplements: list[Supplement]
                        ) -> dict[str, Any]:
    """The Web UI's summary and details of a supplement child, in English: what it adds and
    why (the objective itself carries the planner's marker, which is for the model)."""
    actions = "; ".join(s.action for s in supplements) or "nothing listed"
    details = "\n".join(f"{n}. {s.action} (reason: {s.reason})"
                        for n, s in enumerate(supplements, start=1))
    return {"static_summary": f"supplement {round_number}: {actions}"[:200],
            "static_details": f"Supplement round {round_number}: actions the completeness "
                              f"check found missing.\n\n{details}"}


def drop_repeated_steps(plan: Plan, done_steps: list[tuple[str, str]]) -> Plan | None:
    """A supplement plan must not redo completed work: identical (goal, tool) steps go."""
    done = {(goal.strip().lower(), tool) for goal, tool in done_steps}
    steps = [step for step in plan.steps if (step.goal.strip().lower(), step.tool) not in done]
    return plan.model_copy(update={"steps": steps}) if steps else None


def prior_context(records: list[ToolRecord], answer: str, limit: int = 4000,
                  earlier_calls: int = 0) -> str:
    """What a supplement child inherits: condensed results, files touched, the answer
    (of a long task: its latest calls, saying how many came before)."""
    files: list[str] = []
    for record in records:
        if record.file_path and record.file_path not in files:
            files.append(record.file_path)
    lines = ["Results of the earlier run (do not redo these):"]
    if earlier_calls:
        lines.append(f"({earlier_calls} earlier calls not listed)")
    lines += [f"- {r.tool} {r.arguments} -> {r.outcome}" for r in records]
    if files:
        lines.append("Files touched: " + ", ".join(files))
    if answer:
        lines.append(f"Earlier final answer: {answer}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n[... earlier context trimmed ...]"


def merge_stats(parent: TaskStats, child: TaskStats) -> TaskStats:
    """Global statistics over the parent run and a supplement child."""
    reviews = ReviewCounts(**{
        name: getattr(parent.reviews, name) + getattr(child.reviews, name)
        for name in ReviewCounts.model_fields
    })
    return TaskStats(
        iterations=parent.iterations + child.iterations,
        llm_calls=parent.llm_calls + child.llm_calls,
        llm_failed_calls=parent.llm_failed_calls + child.llm_failed_calls,
        tool_calls=parent.tool_calls + child.tool_calls,
        tool_errors=parent.tool_errors + child.tool_errors,
        reviews=reviews,
        usage=parent.usage.add(child.usage),
        usage_by_purpose=merged_usage(parent.usage_by_purpose, child.usage_by_purpose),
        usage_by_model=merged_usage(parent.usage_by_model, child.usage_by_model),
        children_usage=parent.children_usage.add(child.usage),
    )
