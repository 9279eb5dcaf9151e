"""Prompt builders for the structured purposes; the JSON shapes are fixed by the
models they validate into."""

from __future__ import annotations

from refloop.contract.activity_io import ToolConstraints
from refloop.contract.messages import ChatMessage, ToolSpec

INTENT_SYSTEM = (
    "Classify the user's request. Answer only JSON: "
    '{"intent": "CODING_TASK"|"CAPABILITY_QUERY"|"REPO_ANALYSIS"|"GENERAL_CHAT"|"UNCERTAIN", '
    '"confidence": 0..1, "reason": str}. CODING_TASK: change or create files or code. '
    "REPO_ANALYSIS: explain or inspect existing code. CAPABILITY_QUERY: questions about what "
    "you can do. GENERAL_CHAT: small talk or general questions."
)

PLAN_SYSTEM = (
    "Plan the task as a short list of steps, each done with one tool. Answer only JSON: "
    '{"task_type": "research"|"creation"|"data_processing"|"coding"|"other", '
    '"steps": [{"goal": str, "tool": str}]}. Use only the tools listed. Put writing steps last.'
)

SUMMARY_SYSTEM = (
    "Summarise in a few sentences what the agent did for the task and the outcome, "
    "naming the files it changed. Plain text."
)

COMPACT_SYSTEM = (
    "You compact the older part of an AI agent's working conversation so that it can go on "
    "within its context window. Write a dense summary the agent can continue from: what it "
    "has found out (facts, values, names, line numbers), what it has done and changed, what "
    "failed and why, and what it still meant to do. Keep exact identifiers. Plain text, at "
    "most about 300 words."
)


def compact_messages(task: str, transcript: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=COMPACT_SYSTEM),
        ChatMessage(role="user", content=f"The agent's task: {task}\n\n"
                    f"The turns to summarise:\n{transcript}"),
    ]


def intent_messages(task: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=INTENT_SYSTEM),
        ChatMessage(role="user", content=task),
    ]


def plan_messages(task: str, tools: list[ToolSpec], feedback: str | None,
                  constraints: ToolConstraints | None = None) -> list[ChatMessage]:
    catalog = "\n".join(f"- {spec.name}: {spec.description}" for spec in tools)
    user = f"Task: {task}\n\nTools:\n{catalog}"
    if constraints and constraints.task_type:
        user += f"\n\nThis looks like a {constraints.task_type} task."
        if constraints.allowed:
            user += f" Prefer these tools: {', '.join(constraints.allowed)}."
        if constraints.forbidden:
            user += f" Never use: {', '.join(constraints.forbidden)}."
        user += (" Every step names one tool; generation tools "
                 f"({', '.join(constraints.generation_tools)}) belong in the final steps only.")
    if feedback:
        user += f"\n\nYour previous plan was rejected:\n{feedback}\nFix these problems."
    return [
        ChatMessage(role="system", content=PLAN_SYSTEM),
        ChatMessage(role="user", content=user),
    ]


def summary_messages(task: str, transcript: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=SUMMARY_SYSTEM),
        ChatMessage(role="user", content=f"Task: {task}\n\nWhat happened:\n{transcript}"),
    ]


COMPLETENESS_SYSTEM = (
    "You check whether an agent fully completed the user's task, judging by the task goal "
    "and the execution history. Complete: the goal is achieved, necessary operations are "
    "covered, nothing obvious is missing, and more steps would add little. Incomplete: an "
    "obvious key operation is missing (e.g. content generated but not saved), an explicitly "
    "requested step was not done, or a result needing verification was not verified. "
    "Do not over-supplement: suggest only operations that substantially serve the goal, "
    "never unrelated or repeated ones, at most {max_supplements}, and suggested_tools only "
    "from the available tools (empty if unsure). Answer only JSON: "
    '{{"is_complete": bool, "analysis": str, "missing_aspects": [str], '
    '"supplements": [{{"action": str, "reason": str, "suggested_tools": [str]}}]}}.'
)

SUPPLEMENT_PLAN_SYSTEM = PLAN_SYSTEM + (
    " This is a supplement plan: cover only the missing operations listed under "
    "'Missing actions to supplement:' (in older runs: 【需要补充的操作】) and never repeat "
    "a completed step."
)


def completeness_messages(
    task: str, history: list[str], tools: list[str], evidence: list[str], final_answer: str,
    max_supplements: int,
) -> list[ChatMessage]:
    lines = "\n".join(f"{n}. {item}" for n, item in enumerate(history, start=1)) or "(none)"
    user = (f"Task goal: {task}\n\nExecution history (tool, arguments, outcome):\n{lines}\n\n"
            f"Final answer: {final_answer or '(none)'}\n\nAvailable tools: {', '.join(tools)}")
    if evidence:
        user += "\n\nDeterministic checks found:\n" + "\n".join(f"- {e}" for e in evidence)
    return [
        ChatMessage(role="system",
                    content=COMPLETENESS_SYSTEM.format(max_supplements=max_supplements)),
        ChatMessage(role="user", content=user),
    ]


def supplement_plan_messages(
    objective: str, tools: list[ToolSpec], completed: list[str]
) -> list[ChatMessage]:
    catalog = "\n".join(f"- {spec.name}: {spec.description}" for spec in tools)
    done = "\n".join(f"- {step}" for step in completed) or "(none)"
    return [
        ChatMessage(role="system", content=SUPPLEMENT_PLAN_SYSTEM),
        ChatMessage(role="user", content=f"Task: {objective}\n\nAlready completed (do not "
                                         f"repeat):\n{done}\n\nTools:\n{catalog}"),
    ]


CODE_REVIEW_SYSTEM = (
    "You are the Review agent of a code-review supervisor. Review the content for the task "
    "and answer only JSON: {\"task_id\": str, \"issues\": [{\"id\": \"ISSUE-001\", "
    "\"relevantFile\": str, \"existingCode\": str, \"suggestionContent\": str, "
    "\"improvedCode\": str, \"label\": \"Quality|Security|Performance|Functionality\", "
    "\"suggestionLine\": int, \"severity\": \"Critical|High|Medium|Low\"}], \"summary\": "
    "{\"total_issues\": int, \"severity_distribution\": {...}, \"overall_assessment\": str, "
    "\"priority_recommendations\": [str]}}. Cite only files and line numbers present in the "
    "content. If you cannot review, answer {\"task_id\": str, \"status\": \"ERROR\", "
    "\"message\": str}."
)

CODE_VERIFY_SYSTEM = (
    "You are the Verify agent. Check the Review agent's findings against the content: "
    "accuracy, rule compliance (the task's requirements), and overall quality (0-100; "
    "below 50 means the review must be redone). Answer only JSON: {\"task_id\": str, "
    "\"verification_result\": {\"accuracy_check\": [{\"issue_id\", \"accuracy_status\", "
    "\"evidence\", \"deletion_required\": bool, \"deletion_reason\"}], "
    "\"rule_compliance_check\": [{\"issue_id\", \"compliance_status\", \"violated_rules\", "
    "\"deletion_required\": bool, \"violation_reason\"}], \"quality_assessment\": "
    "{\"overall_score\": int, \"quality_level\", \"strengths\": [str], \"weaknesses\": [str], "
    "\"missing_issues\": [{\"description\", \"evidence\", \"suggested_severity\"}]}}}."
)


def code_agent_messages(system: str, task_json: dict, files: dict[str, str],
                        review: dict | None = None) -> list[ChatMessage]:
    import json

    body = "Task JSON:\n" + json.dumps(task_json, ensure_ascii=False, indent=1)
    body += "\n\nContent under review:\n" + "\n\n".join(
        f"=== {name} ===\n{text}" for name, text in files.items())
    if review is not None:
        body += "\n\nReview agent output:\n" + json.dumps(review, ensure_ascii=False)
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=body)]


# An endpoint that cannot stream a tool call it chose itself is asked which tool first, as
# a call of one more tool offered with the others, on the same messages: the prompts of
# the pick and of the call then differ only at their end, so a server's prompt cache
# serves the call. (A question appended to the messages made smollm2 pick worse.)
TOOL_PICK_NAME = "next_tool"
NO_TOOL = "none"


def tool_pick_spec(names: list[str]) -> ToolSpec:
    return ToolSpec(name=TOOL_PICK_NAME, description="Say which tool you call next.",
                    parameters={"type": "object", "required": ["tool"], "properties": {
                        "tool": {"type": "string", "enum": [*names, NO_TOOL],
                                 "description": "the tool you call next, or none to "
                                                "answer in text"}}})


def is_tool_pick(body: dict) -> bool:
    """A request asking which tool (the scripted model answers it from its script)."""
    choice = body.get("tool_choice")
    return (isinstance(choice, dict) and isinstance(choice.get("function"), dict)
            and choice["function"].get("name") == TOOL_PICK_NAME)
