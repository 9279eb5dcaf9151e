"""Every `workflow.patched()` of the agent workflow names a patch in `AGENT_PATCHES`, so a
new run settles it in its first activation."""

from __future__ import annotations

import ast
from pathlib import Path

import refloop.workflows.agent as agent
from refloop.workflows import patches

WORKFLOWS = Path(agent.__file__).parent
# The code-review workflow's patches are asked before its one local activity (the host
# check) or after scheduled ones only.
OTHER_WORKFLOWS = {"code_review.py", "patches.py"}


def patched_ids(source: str) -> list[str]:
    ids = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("patched", "deprecate_patch")):
            arg = node.args[0]
            assert isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) \
                and arg.value.id == "patches", f"a patch id outside patches: {ast.unparse(arg)}"
            ids.append(getattr(patches, arg.attr))
    return ids


def test_every_patch_of_the_agent_workflow_is_settled_at_start():
    asked = {pid for path in WORKFLOWS.glob("*.py") if path.name not in OTHER_WORKFLOWS
             for pid in patched_ids(path.read_text())}
    assert asked == set(patches.AGENT_PATCHES)
    assert len(set(patches.AGENT_PATCHES)) == len(patches.AGENT_PATCHES)


def test_a_deprecated_patch_has_no_old_branch_left():
    """Deprecated patches are only `deprecate_patch`ed (their old branch is gone); the rest
    are only asked with `patched`."""
    for path in WORKFLOWS.glob("*.py"):
        if path.name in OTHER_WORKFLOWS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("patched", "deprecate_patch"):
                pid = getattr(patches, node.args[0].attr)
                deprecated = node.func.attr == "deprecate_patch"
                assert deprecated == (pid in patches.DEPRECATED), (path.name, pid)


def test_a_patch_id_written_inline_is_refused():
    try:
        patched_ids('workflow.patched("new-feature")')
    except AssertionError as err:
        assert "outside patches" in str(err)
    else:
        raise AssertionError("an inline patch id went unnoticed")
