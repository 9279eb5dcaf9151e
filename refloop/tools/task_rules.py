"""Task-type tool constraints: loading and task-type inference. The rules name tools only
in allow and forbid lists; which tools read or generate documents, their properties say."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError

from refloop.contract.activity_io import ToolConstraints
from refloop.contract.tool_catalog import TOOLS


class TaskTypeRule(BaseModel):
    allowed: list[str] = Field(default_factory=list)
    forbidden: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


class TaskRules(BaseModel):
    # Added to the tools whose properties say so (`generates`; kind `read`).
    generation_tools: list[str] = Field(default_factory=list)
    read_only_tools: list[str] = Field(default_factory=list)
    types: dict[str, TaskTypeRule]

    def generators(self) -> list[str]:
        """Document generators: only in the final step(s) of a plan."""
        found = [name for name, d in TOOLS.items() if d.properties.generates]
        return list(dict.fromkeys([*found, *self.generation_tools]))

    def read_only(self) -> list[str]:
        """Tools every task type may use."""
        found = [name for name, d in TOOLS.items() if d.properties.kind == "read"]
        return list(dict.fromkeys([*found, *self.read_only_tools]))


@functools.cache
def load_task_rules(path: str | None = None) -> TaskRules:
    """The shipped defaults, or a user's file; a bad file fails naming the problem."""
    source = Path(path) if path else resources.files("refloop") / "task_rules.yaml"
    try:
        return TaskRules.model_validate(yaml.safe_load(source.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise ValueError(f"task rules {source}: {err}") from None


def keyword_type(task: str, rules: TaskRules) -> str | None:
    """The type whose keywords occur most often in the task (ties: file order)."""
    text = task.lower()
    scores = {name: sum(text.count(k.lower()) for k in rule.keywords)
              for name, rule in rules.types.items()}
    best = max(scores, key=lambda name: scores[name], default=None)
    return best if best is not None and scores[best] > 0 else None


def infer_task_type(task: str, model_type: str | None, rules: TaskRules) -> str | None:
    """Keywords first; where the model disagrees, take its type only if the rules know it."""
    by_keywords = keyword_type(task, rules)
    if model_type and model_type != by_keywords and model_type in rules.types:
        return model_type
    return by_keywords or (model_type if model_type in rules.types else None)


def constraints_for(task_type: str | None, rules: TaskRules) -> ToolConstraints:
    rule = rules.types.get(task_type or "")
    if rule is None:
        return ToolConstraints(task_type=task_type, generation_tools=rules.generators())
    allowed = sorted(set(rule.allowed) | set(rules.read_only()))
    return ToolConstraints(task_type=task_type, allowed=allowed, forbidden=rule.forbidden,
                           generation_tools=rules.generators())
