"""Prompt builders for the structured purposes; the JSON shapes are fixed by DESIGN.md."""

from __future__ import annotations

from refloop.models import ChatMessage, ToolSpec

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


def intent_messages(task: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=INTENT_SYSTEM),
        ChatMessage(role="user", content=task),
    ]


def plan_messages(task: str, tools: list[ToolSpec], feedback: str | None) -> list[ChatMessage]:
    catalog = "\n".join(f"- {spec.name}: {spec.description}" for spec in tools)
    user = f"Task: {task}\n\nTools:\n{catalog}"
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
