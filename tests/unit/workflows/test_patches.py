"""Workflow code changes reach running tasks by a hand-over, not by patches: a patch is the
exception, named in `refloop.workflows.patches.PATCHES` with its reason and the date it
goes."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import refloop.workflows.agent as agent
from refloop.workflows import patches

WORKFLOWS = Path(agent.__file__).parent
PATCH_CALLS = ("patched", "deprecate_patch")


def patch_calls(source: str) -> list[str]:
    """The ids every `workflow.patched(...)` / `deprecate_patch(...)` of the source asks."""
    asked = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in PATCH_CALLS):
            arg = node.args[0]
            asked.append(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return asked


def test_every_patch_asked_is_registered_with_a_reason():
    asked = {pid for path in WORKFLOWS.glob("*.py")
             for pid in patch_calls(path.read_text())}
    registered = {f"patches.{name}" for name in dir(patches)} | set(patches.PATCHES)
    assert asked <= registered, f"patches asked outside the registry: {asked - registered}"
    for patch in patches.PATCHES.values():
        assert patch.reason.strip(), patch.patch_id


def test_no_patch_outlives_its_date():
    today = datetime.date.today()
    late = [p.patch_id for p in patches.PATCHES.values() if p.remove_by < today]
    assert not late, f"patches past the date they go (remove them and their histories): {late}"


def test_the_check_sees_a_patch_call():
    assert patch_calls('workflow.patched("new-feature")') == ["new-feature"]
    assert patch_calls("workflow.deprecate_patch(patches.X)") == ["patches.X"]
