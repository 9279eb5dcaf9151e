"""The tool registry on real temp directories: sandbox, edits, journal, commands."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path

import pytest

from refloop.contract.activity_io import RunToolInput
from refloop.contract.errors import UnknownToolError
from refloop.contract.tool_catalog import tool_specs
from refloop.settings import Settings
from refloop.tools.command import evaluate_command
from refloop.tools.journal import Journal
from refloop.tools.registry import execute_tool


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("one\ntwo\nthree\n")
    return root


SETTINGS = Settings(refloop_max_read_bytes=400, refloop_max_output_bytes=300,
                    refloop_cmd_timeout_s=5, refloop_data_dir=Path(tempfile.mkdtemp()))


async def run(ws: Path, name: str, call_id: str | None = None, allow_network: bool = False,
              allow_shell_operators: bool = False, **arguments):
    call = RunToolInput(call_id=call_id or uuid.uuid4().hex, name=name, arguments=arguments,
                        workspace=str(ws), allow_network=allow_network,
                        allow_shell_operators=allow_shell_operators)
    return await execute_tool(call, SETTINGS)


# ---------------------------------------------------------------- registry


def test_specs_cover_every_tool_with_object_schemas():
    specs = {spec.name: spec for spec in tool_specs()}
    assert set(specs) == {
        "list_dir", "read_file", "glob_file_search", "grep", "write_file", "apply_patch",
        "undo_patch", "run_cmd", "str_replace_based_edit_tool", "json_edit_tool", "search_semantic",
        "complete_step",
    }
    for spec in specs.values():
        assert spec.parameters["type"] == "object" and spec.description
    assert specs["read_file"].parameters["required"] == ["path"]


async def test_unknown_tool_raises(ws):
    with pytest.raises(UnknownToolError):
        await run(ws, "teleport")


async def test_invalid_arguments_are_reported(ws):
    result = await run(ws, "read_file", start_line=1)
    assert not result.ok and result.error.startswith("E_INVALID_ARGS") and "path" in result.error


async def test_missing_workspace_is_a_clear_error(tmp_path):
    result = await run(tmp_path / "nope", "list_dir", path=".")
    assert not result.ok and "E_NO_WORKSPACE" in result.error


# ---------------------------------------------------------------- sandbox


@pytest.mark.parametrize("path", ["../outside.txt", "sub/../../outside.txt", "/etc/passwd"])
async def test_escapes_are_refused(ws, path):
    result = await run(ws, "read_file", path=path)
    assert not result.ok and "E_PATH_ESCAPE" in result.error


async def test_symlink_out_of_the_workspace_is_refused(ws, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", ws / "link.txt")
    result = await run(ws, "read_file", path="link.txt")
    assert not result.ok and "E_SYMLINK" in result.error and "secret" not in result.output
    write = await run(ws, "write_file", path="link.txt", content="x")
    assert not write.ok and (tmp_path / "secret.txt").read_text() == "secret"


async def test_absolute_path_inside_is_fine_and_internal_state_is_reserved(ws):
    assert (await run(ws, "read_file", path=str(ws / "a.txt"))).ok
    result = await run(ws, "write_file", path=".refloop/journal/x.json", content="{}")
    assert not result.ok and "E_PATH_RESERVED" in result.error


# ---------------------------------------------------------------- read-only tools


async def test_read_file_numbers_lines_and_honours_range(ws):
    result = await run(ws, "read_file", path="a.txt", start_line=2, end_line=3)
    assert result.output.splitlines() == ["     2\ttwo", "     3\tthree"]


async def test_read_file_is_capped_with_a_marker(ws):
    (ws / "big.txt").write_text("x" * 2000)
    result = await run(ws, "read_file", path="big.txt")
    assert result.ok and "truncated" in result.output and len(result.output) < 500


async def test_list_glob_grep(ws):
    (ws / "src").mkdir()
    (ws / "src" / "m.py").write_text("def retry_policy():\n    pass\n")
    assert (await run(ws, "list_dir", path=".")).output.splitlines() == ["a.txt", "src/"]
    assert (await run(ws, "glob_file_search", pattern="**/*.py")).output == "src/m.py"
    hits = await run(ws, "grep", pattern=r"def \w+_policy", glob="*.py")
    assert hits.output == "src/m.py:1: def retry_policy():"
    assert not (await run(ws, "grep", pattern="(")).ok
    assert not (await run(ws, "glob_file_search", pattern="../*")).ok


# ---------------------------------------------------------------- edits


async def test_write_file_reports_edit_data(ws):
    result = await run(ws, "write_file", path="docs/r.md", content="# R\n\nbody\n")
    assert result.ok and (ws / "docs" / "r.md").read_text() == "# R\n\nbody\n"
    assert result.data == {"file_path": "docs/r.md", "edit_kind": "create", "start_line": 1,
                           "end_line": 3, "lines_before": 0, "lines_after": 3}


async def test_str_replace_unique_and_errors(ws):
    ok = await run(ws, "str_replace_based_edit_tool", command="str_replace", path="a.txt",
                   old_str="two", new_str="2\n2b")
    assert ok.ok and (ws / "a.txt").read_text() == "one\n2\n2b\nthree\n"
    assert ok.data["start_line"] == 2 and ok.data["end_line"] == 3
    assert "cat -n" in ok.output
    missing = await run(ws, "str_replace_based_edit_tool", command="str_replace", path="a.txt",
                        old_str="zzz", new_str="y")
    assert not missing.ok and "did not appear" in missing.error
    (ws / "d.txt").write_text("x x\n")
    dup = await run(ws, "str_replace_based_edit_tool", command="str_replace", path="d.txt",
                    old_str="x", new_str="y")
    assert not dup.ok and "appeared 2 times" in dup.error


async def test_insert_create_view_and_undo_edit(ws):
    ins = await run(ws, "str_replace_based_edit_tool", command="insert", path="a.txt",
                    insert_line=1, new_str="one-and-a-half")
    assert ins.ok and (ws / "a.txt").read_text() == "one\none-and-a-half\ntwo\nthree\n"
    view = await run(ws, "str_replace_based_edit_tool", command="view", path="a.txt",
                     view_range=[2, 2])
    assert view.output == "     2\tone-and-a-half"
    undo = await run(ws, "str_replace_based_edit_tool", command="undo_edit", path="a.txt")
    assert undo.ok and (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    again = await run(ws, "str_replace_based_edit_tool", command="undo_edit", path="a.txt")
    assert not again.ok and "E_NO_HISTORY" in again.error
    created = await run(ws, "str_replace_based_edit_tool", command="create", path="n.md",
                        file_text="# N\n")
    assert created.ok
    exists = await run(ws, "str_replace_based_edit_tool", command="create", path="n.md",
                       file_text="x")
    assert not exists.ok and "E_EXISTS" in exists.error


async def test_json_edit_operations(ws):
    (ws / "c.json").write_text(json.dumps({"a": {"b": 1}, "list": [1]}))
    assert (await run(ws, "json_edit_tool", operation="set", file_path="c.json",
                      json_path="$.a.b", value=2)).ok
    add = await run(ws, "json_edit_tool", operation="add", file_path="c.json",
                    json_path="$.list[-]", value=5)
    assert add.ok and add.data["json_path"] == "$.list[-]" and add.data["value"] == 5
    assert (await run(ws, "json_edit_tool", operation="add", file_path="c.json",
                      json_path="$['new key']", value="v")).ok
    assert (await run(ws, "json_edit_tool", operation="remove", file_path="c.json",
                      json_path="$.list[0]")).ok
    assert json.loads((ws / "c.json").read_text()) == {"a": {"b": 2}, "list": [5],
                                                        "new key": "v"}
    view = await run(ws, "json_edit_tool", operation="view", file_path="c.json",
                     json_path="$.a")
    assert json.loads(view.output) == {"b": 2}
    bad = await run(ws, "json_edit_tool", operation="set", file_path="c.json",
                    json_path="$.nope.x", value=1)
    assert not bad.ok and "does not exist" in bad.error


PATCH = """--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+hello
+world
"""


async def test_apply_patch_multi_file_and_undo(ws):
    result = await run(ws, "apply_patch", call_id="p1", patch=PATCH)
    assert result.ok and result.data["files"] == ["a.txt", "new.txt"]
    assert (ws / "a.txt").read_text() == "one\nTWO\nthree\n"
    assert (ws / "new.txt").read_text() == "hello\nworld\n"
    undo = await run(ws, "undo_patch", patch_id="p1")
    assert undo.ok and (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    assert not (ws / "new.txt").exists()
    assert not (await run(ws, "undo_patch")).ok  # nothing left to undo


async def test_mismatched_patch_changes_nothing(ws):
    bad = PATCH.replace(" three", " THREE-not-there") + ""
    result = await run(ws, "apply_patch", patch=bad)
    assert not result.ok and "does not match" in result.error
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n" and not (ws / "new.txt").exists()


# ---------------------------------------------------------------- idempotency


async def test_same_call_id_applies_once(ws):
    for _ in range(3):
        result = await run(ws, "str_replace_based_edit_tool", call_id="wf.1.0", command="insert",
                           path="a.txt", insert_line=3, new_str="four")
        assert result.ok
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\nfour\n"


async def test_crash_mid_apply_restores_then_applies_once(ws):
    # Simulate a worker that died after writing but before recording the result.
    journal = Journal(ws.resolve(), SETTINGS.journal_dir, "wf.2.0")
    entry = journal.begin("wf.2.0", "str_replace_based_edit_tool")
    journal.snapshot(entry, ws.resolve() / "a.txt")
    (ws / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    result = await run(ws, "str_replace_based_edit_tool", call_id="wf.2.0", command="insert",
                       path="a.txt", insert_line=3, new_str="four")
    assert result.ok and (ws / "a.txt").read_text() == "one\ntwo\nthree\nfour\n"


async def test_a_rewind_drops_the_journal_of_the_calls_it_took_back(ws):
    """After a rewind, an undo never undoes a call that is gone, and an edit an undo that
    is gone had undone can be undone again."""
    task = "task-rw"
    ids = [f"{task}.0123abcd.{i}.0" for i in range(1, 5)]
    edit = {"command": "str_replace", "path": "a.txt"}
    assert (await run(ws, "str_replace_based_edit_tool", call_id=ids[0], old_str="one",
                      new_str="ONE", **edit)).ok
    assert (await run(ws, "str_replace_based_edit_tool", call_id=ids[1], old_str="two",
                      new_str="TWO", **edit)).ok
    undo = await run(ws, "str_replace_based_edit_tool", call_id=ids[2], command="undo_edit",
                     path="a.txt")
    assert undo.ok and undo.data["undone_call"] == ids[1]
    # Rewound to just after the first edit: the tree is put back (as the restore does)
    # and the second edit and the undo are taken back with their journal entries
    (ws / "a.txt").write_text("ONE\ntwo\nthree\n")
    journal = Journal(ws.resolve(), SETTINGS.journal_dir, ids[0])
    assert journal.discard([ids[1], ids[2]]) == 2
    again = await run(ws, "str_replace_based_edit_tool", call_id=ids[3], command="undo_edit",
                      path="a.txt")
    assert again.ok and again.data["undone_call"] == ids[0]  # not the edit taken back
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n"
    assert journal.discard(["nothing-here.0123abcd.9.9"]) == 0


async def test_a_discarded_undo_makes_the_edit_it_undid_undoable_again(ws):
    task = "task-rw2"
    ids = [f"{task}.0123abcd.{i}.0" for i in range(1, 4)]
    assert (await run(ws, "str_replace_based_edit_tool", call_id=ids[0],
                      command="str_replace", path="a.txt", old_str="one", new_str="ONE")).ok
    assert (await run(ws, "str_replace_based_edit_tool", call_id=ids[1],
                      command="undo_edit", path="a.txt")).ok
    (ws / "a.txt").write_text("ONE\ntwo\nthree\n")  # back to just after the edit
    Journal(ws.resolve(), SETTINGS.journal_dir, ids[0]).discard([ids[1]])
    undo = await run(ws, "str_replace_based_edit_tool", call_id=ids[2], command="undo_edit",
                     path="a.txt")
    assert undo.ok and undo.data["undone_call"] == ids[0]
    assert (ws / "a.txt").read_text() == "one\ntwo\nthree\n"


# ---------------------------------------------------------------- commands


def test_command_policy():
    assert evaluate_command("pytest -q", False).ok
    for bad in ("sudo ls", "rm -rf /", "rm -rf ~", "mkfs.ext4 /dev/sda", "shutdown now",
                ":(){ :|:& };:", "echo x > /etc/passwd"):
        assert not evaluate_command(bad, True).ok, bad
    assert not evaluate_command("curl https://example.com", False).ok
    assert evaluate_command("curl https://example.com", True).ok
    assert not evaluate_command("pip install requests", False).ok


async def test_run_cmd_success_failure_and_truncation(ws):
    ok = await run(ws, "run_cmd", command="cat a.txt")
    assert ok.ok and ok.output == "exit code 0\none\ntwo\nthree\n"
    failed = await run(ws, "run_cmd", command="echo oops; exit 3", allow_shell_operators=True)
    assert not failed.ok and failed.data["exit_code"] == 3 and "oops" in failed.output
    long = await run(ws, "run_cmd", command="yes | head -c 5000")
    assert long.ok and "truncated" in long.output and len(long.output) < 500


async def test_run_cmd_timeout_kills_the_process_group(ws):
    result = await run(ws, "run_cmd", command="sleep 30 & sleep 30", timeout_s=0.5,
                 allow_shell_operators=True)
    assert not result.ok and "E_TIMEOUT" in result.error


async def test_run_cmd_denied_and_env_sanitised(ws, monkeypatch):
    denied = await run(ws, "run_cmd", command="wget http://x")
    assert not denied.ok and "E_POLICY" in denied.error
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("MY_TOKEN", "t0k")
    env = await run(ws, "run_cmd", command="env")
    assert "sk-secret" not in env.output and "t0k" not in env.output


def test_shell_operators_redirects_and_allowlist():
    for chained in ("ls; rm x", "make && make install", "a || b", "echo `id`", "echo $(id)"):
        decision = evaluate_command(chained, False)
        assert not decision.ok and "one command per call" in decision.reason, chained
        assert evaluate_command(chained, False, allow_shell_operators=True).ok
    for redirect in ("echo x > /tmp/x", "echo x >> ../up.txt", "cat a > ~/x", "echo > sub/../../x"):
        assert not evaluate_command(redirect, False).ok, redirect
    for fine in ("echo x > out.txt", "pytest -q 2>&1", "make > /dev/null", "yes | head -3"):
        assert evaluate_command(fine, False).ok, fine
    allow = ["pytest", "ls"]
    assert evaluate_command("pytest -q", False, allowlist=allow).ok
    assert "not in the allowlist" in evaluate_command("rm -f a", False, allowlist=allow).reason


def test_newline_and_ampersand_chain_and_every_command_meets_the_allowlist():
    for chained in ("ls\nrm x", "ls\r\nrm x", "sleep 9 & rm x", "cat <(id)"):
        assert not evaluate_command(chained, False).ok, chained
    assert evaluate_command("pytest -q 2>&1 | tail -3", False).ok
    allow = ["pytest", "ls", "tail"]
    assert evaluate_command("pytest -q | tail -3", False, allowlist=allow).ok
    for smuggled in ("ls\nrm -rf x", "ls & rm x", "ls | sh", "pytest && rm x", "ls $(rm x)",
                     "X=1 rm x"):
        decision = evaluate_command(smuggled, False, allow_shell_operators=True,
                                    allowlist=allow)
        assert not decision.ok and "not in the allowlist" in decision.reason, smuggled
