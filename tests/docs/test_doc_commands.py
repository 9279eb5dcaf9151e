"""What a page shows, a test runs: every shell command of the README and docs/ is run here
(or by the test RUN_BY names) against a real stack, or is in EXCLUDED with its reason.

The stacks: `make demo` on a fresh data dir; `refloop up` with the scripted model for the
HTTP API's curl commands and `refloop rewind`; `refloop run --mcp git` on its embedded
stack; the certificates in a temporary directory. The Temporal page's commands run in
tests/e2e/test_temporal_cli.py, against the session's dev server.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from refloop.runtime.net import free_port
from tests.docs.commands import (
    EXCLUDED,
    EXPECT,
    ROOT,
    RUN_BY,
    SHELL_FENCES,
    DocShell,
    blocks,
    commands,
    every_command,
    key_of,
    pages,
    shell_env,
)


def test_every_command_is_run_or_excluded_with_a_reason():
    found = every_command()
    assert len(found) > 30  # the pages were read
    neither = [f"{c.page}:{c.line}: {c.key}" for c in found
               if c.key not in EXPECT and c.key not in EXCLUDED]
    assert not neither, "a page shows a command no test runs and EXCLUDED does not " \
        "name (add it to EXPECT and run it, or to EXCLUDED with the reason):\n" + \
        "\n".join(neither)
    assert not set(EXPECT) & set(EXCLUDED)
    shown = {c.key for c in found}
    stale = sorted((set(EXPECT) | set(EXCLUDED)) - shown)
    assert not stale, f"entries for commands no page shows any more: {stale}"
    assert all(reason.strip() for reason in EXCLUDED.values())


def test_each_page_with_commands_to_run_has_its_test():
    to_run = {c.page for c in every_command() if c.key in EXPECT}
    assert to_run == set(RUN_BY), sorted(to_run ^ set(RUN_BY))
    for test in set(RUN_BY.values()):
        path, name = test.split("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {node.name for node in ast.walk(tree)
                        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}, test


def test_every_block_names_its_language_and_commands_are_in_shell_blocks():
    """A command in a block without a shell language would escape the check above."""
    for page in pages():
        for language, line, body in blocks(page):
            assert language, f"{page}:{line}: a fenced block without a language " \
                "(`sh` for commands, `text` for output)"
            if language in SHELL_FENCES:
                continue
            prompts = [text for text in body if text.lstrip().startswith("$ ")]
            assert not prompts, f"{page}:{line}: commands in a `{language}` block: {prompts}"


def test_commands_are_cut_as_bash_reads_them():
    cut = commands("docs/deploying.md")
    sign = next(c for c in cut if c.text.startswith("sign() {"))
    assert sign.text.rstrip().endswith("}") and sign.text.count("\n") == 5
    assert key_of("make demo   # creates .venv") == "make demo"


@pytest.mark.slow  # a stack of its own
def test_make_demo(tmp_path: Path):
    """README.md, docs/index.md and docs/quick-start.md: `make demo` as a newcomer runs it
    (a fresh data dir and demo workspace, the offline model), then `make test` (excluded:
    this is it)."""
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=ROOT).returncode != 0:
        pytest.skip("the venv is not make's (no up-to-date .venv/.installed): `make demo` "
                    "would install it")
    demo = tmp_path / "demo-workspace"
    env = shell_env(REFLOOP_DATA_DIR=str(tmp_path / "data"), DEMO_WS=str(demo),
                    REFLOOP_TEMPORAL_PORT=str(free_port()), REFLOOP_UI_PORT=str(free_port()),
                    COLUMNS="80")
    with DocShell(ROOT, env) as shell:
        for page in ("README.md", "docs/index.md", "docs/quick-start.md"):
            if "make demo" not in shell.ran:
                ran = shell.run_page(page)
                # As the quick start shows it: the link whole, on its own line, last.
                assert re.fullmatch(r"Web UI:\nhttp://127\.0\.0\.1:\d+/namespaces/default/"
                                    r"workflows/task-[0-9a-f]{12}", "\n".join(
                                        ran[0].err.splitlines()[-2:])), ran[0].err[-500:]
            shell.assert_ran_page(page)
    assert (demo / "report.md").read_text().startswith("# refloop")


REWIND_SCENARIO = {
    "intent": [{"json": {"intent": "CODING_TASK", "confidence": 0.9, "reason": "write"}}],
    "plan": [{"json": {"task_type": "creation", "steps": [
        {"goal": "write a.txt", "tool": "write_file"},
        {"goal": "write b.txt", "tool": "write_file"}]}}],
    "act": [{"tool_calls": [{"name": "write_file",
                             "arguments": {"path": "a.txt", "content": "one"}}]},
            {"tool_calls": [{"name": "write_file",
                             "arguments": {"path": "b.txt", "content": "two"}}]},
            {"content": "done"}, {"content": "done"}],
    "summary": [{"content": "wrote a.txt"}, {"content": "wrote a.txt"}],
}


def approval(base: str, task_id: str, after: int = 0) -> tuple[str, int]:
    """The call_id of the task's next approval_required event after `after`, and its id."""
    with httpx.stream("GET", f"{base}/tasks/{task_id}/events", timeout=30,
                      headers={"Last-Event-ID": str(after)}) as events:
        seq, kind = 0, ""
        for line in events.iter_lines():
            if line.startswith("id:"):
                seq = int(line[3:])
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:") and kind == "approval_required":
                return json.loads(line[5:])["call_id"], seq
    raise AssertionError(f"{task_id} ended without asking for an approval")


@pytest.mark.slow  # a stack of its own
def test_http_api_and_rewind(tmp_path: Path):
    """docs/http-api.md's curl commands against `refloop up` (the scripted model), then
    docs/operations.md's `refloop rewind` on a task waiting for its second approval."""
    from tests.ui.test_console import SCENARIO, console_and_model

    workspace = tmp_path / "ws"
    workspace.mkdir()
    with console_and_model(tmp_path, REFLOOP_SEMANTIC_INDEX="false") as (base, llm):
        port = base.rsplit(":", 1)[1]
        env = shell_env(REFLOOP_DATA_DIR=str(tmp_path / "data"))
        with DocShell(tmp_path, env, subs={"localhost:8000": f"localhost:{port}",
                                           "/path/to/ws": str(workspace)}) as shell:
            first, second, one_call = commands("docs/http-api.md")
            start = shell.run(first)
            shell.subs["sess-..."] = json.loads(start.out)["session_id"]
            stream = shell.run(second)
            assert "event: quality_review" in stream.out  # the session's review ran
            assert (workspace / "report.md").read_text().endswith("Done.\n")
            (workspace / "report.md").unlink()
            llm.load(SCENARIO["name"], SCENARIO)  # its script again, from the start
            task_id = json.loads(shell.run(one_call).out)["task_id"]
            shell.assert_ran_page("docs/http-api.md")
            for _ in range(300):
                if httpx.get(f"{base}/tasks/{task_id}", timeout=30).json()["status"] \
                        not in ("queued", "running"):
                    break
                time.sleep(0.1)
            assert (workspace / "report.md").read_text().startswith("# Report")

            llm.load("rewind", {"name": "rewind", "responses": REWIND_SCENARIO})
            (tmp_path / "ws2").mkdir()
            session = httpx.post(f"{base}/agent/interactive/start", timeout=30, json={
                "workspace": str(tmp_path / "ws2"), "model": "rewind",
                "approval_mode": "confirm_writes"}).json()
            task_id = httpx.post(f"{base}/agent/interactive/task", timeout=30, json={
                "session_id": session["session_id"], "task": "write a.txt and b.txt",
                "enable_reflection": False}).json()["task_id"]
            call_id, seq = approval(base, task_id)
            decided = httpx.post(f"{base}/tasks/{task_id}/approvals", timeout=30,
                                 json={"call_id": call_id, "approved": True})
            assert decided.status_code == 200, decided.text
            approval(base, task_id, seq)  # the second write waits: a.txt's checkpoint is taken
            shell.subs.update({"TASK": task_id, "--to-step N": "--to-step 1",
                               "--at-step N": "--at-step 1"})
            rewind, fork, drain = (command for command in commands("docs/operations.md")
                                   if command.key in EXPECT)
            rewound = shell.run(rewind)
            assert f"task {task_id} rewound to step 1" in rewound.err
            assert (tmp_path / "ws2" / "a.txt").read_text() == "one"
            assert not (tmp_path / "ws2" / "b.txt").exists()
            forked = shell.run(fork)  # from the same step, into a new workspace beside it
            fork_id = forked.out.split()[-1]
            assert f"task {fork_id} forked from {task_id} at step 1" in forked.err
            for _ in range(300):  # the fork restores its workspace as its first work
                forks = list(tmp_path.glob("ws2-fork-*/a.txt"))
                if forks:
                    break
                time.sleep(0.1)
            assert len(forks) == 1 and forks[0].read_text() == "one"
            # A task waiting for its approval hands over for an upgrade; this build's own
            # worker leaves it parked.
            llm.load("rewind", {"name": "rewind", "responses": REWIND_SCENARIO})
            (tmp_path / "ws3").mkdir()
            waiting = httpx.post(f"{base}/tasks", timeout=30, json={
                "workspace": str(tmp_path / "ws3"), "model": "rewind", "task": "write a.txt",
                "approval_mode": "confirm_writes", "enable_reflection": False}).json()
            approval(base, waiting["task_id"])
            shell.subs["refloop drain"] = "refloop drain --timeout 90"
            drained = shell.run(drain)
            assert "parked for the next build" in drained.out, drained.out
            assert httpx.get(f"{base}/tasks/{waiting['task_id']}", timeout=30).json()[
                "status"] == "handed_over"
            shell.assert_ran_page("docs/operations.md")
            for task in (task_id, fork_id, waiting["task_id"]):
                httpx.post(f"{base}/tasks/{task}/cancel", timeout=30)


@pytest.mark.slow  # a stack of its own
def test_everyday_commands(tmp_path: Path):
    """docs/cli.md's everyday commands beside `refloop up` (the scripted model): a task
    waiting for its first approval listed, in the inbox and shown; approved with edited
    arguments, then its second call rejected, and watched to its end; another task's first
    call approved as asked, then the task cancelled while its second waits."""
    from tests.e2e.test_cli_people import writes
    from tests.ui.test_console import console_and_model

    with console_and_model(tmp_path, REFLOOP_SEMANTIC_INDEX="false") as (base, llm):
        def waiting(model: str, *files: str) -> tuple[str, int]:
            llm.load(model, {"name": model, "responses": writes(*files)})
            (tmp_path / model).mkdir()
            task = httpx.post(f"{base}/tasks", timeout=30, json={
                "workspace": str(tmp_path / model), "task": f"write {' and '.join(files)}",
                "model": model, "approval_mode": "confirm_writes",
                "enable_reflection": False}).json()["task_id"]
            return task, approval(base, task)[1]

        task, seq = waiting("everyday", "a.txt", "b.txt")
        env = shell_env(REFLOOP_DATA_DIR=str(tmp_path / "data"), COLUMNS="100")
        shown = {c.key: c for c in commands("docs/cli.md")}
        edit = ('refloop approve TASK --arguments {"path": "a.txt", "content": "a.txt, as I '
                'want it"}')
        with DocShell(tmp_path, env, subs={"TASK": task}) as shell:
            outputs = {key: shell.run(shown[key]).out for key in (
                "refloop tasks", "refloop inbox", "refloop show TASK", edit)}
            shell.subs["CALL"] = approval(base, task, seq)[0]  # the second write waits
            key = "refloop reject TASK CALL --reason keep b.txt as it is"
            outputs[key] = shell.run(shown[key]).out
            outputs["refloop watch TASK"] = shell.run(shown["refloop watch TASK"]).out
            assert (tmp_path / "everyday" / "a.txt").read_text() == "a.txt, as I want it"
            assert not (tmp_path / "everyday" / "b.txt").exists()
            shell.subs["TASK"], seq = waiting("cancelled", "c.txt", "d.txt")
            outputs["refloop approve TASK"] = shell.run(shown["refloop approve TASK"]).out
            approval(base, shell.subs["TASK"], seq)  # its second write waits
            listed = shell.run(shown["refloop tasks --status waiting_approval --json"])
            assert [t["task_id"] for t in json.loads(listed.out)] == [shell.subs["TASK"]]
            shell.run(shown["refloop cancel TASK"])
            shell.assert_ran_page("docs/cli.md")
    for key, out in outputs.items():  # what the page shows, to compare by eye
        print(f"$ {key}\n{out}")


@pytest.mark.slow  # a stack of its own
def test_mcp_git_server(tmp_path: Path):
    """docs/mcp.md: the page's own mcp.json, `refloop run --mcp git` on a git repository;
    the task lists mcp-server-git's tools (the offline model calls none of them)."""
    config = next(body for language, _, body in blocks("docs/mcp.md")
                  if language == "json" and "mcpServers" in "\n".join(body))
    work = tmp_path / "here"
    work.mkdir()
    (work / "mcp.json").write_text("\n".join(config))
    repo = tmp_path / "myrepo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    for n in range(2):
        (repo / f"f{n}.txt").write_text(str(n))
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", f"commit {n}"], check=True)
    env = shell_env(REFLOOP_DATA_DIR=str(tmp_path / "data"), COLUMNS="200",
                    REFLOOP_TEMPORAL_PORT=str(free_port()), REFLOOP_UI_PORT=str(free_port()))
    with DocShell(work, env, subs={"~/src/myrepo": str(repo)}) as shell:
        ran = shell.run_page("docs/mcp.md")
        shell.assert_ran_page("docs/mcp.md")
    assert "mcp-server-git" in ran[0].out
    assert "completed" in ran[-1].output


def test_certificates(tmp_path: Path):
    """docs/deploying.md's certificates: a CA, the proxy's and PostgreSQL's server
    certificates and host c's client certificate, each signed by the CA with its names
    (the `sudo chown` and the compose commands are excluded)."""
    started = time.monotonic()
    with DocShell(tmp_path, shell_env()) as shell:
        shell.run_page("docs/deploying.md")
        shell.assert_ran_page("docs/deploying.md")
    certs = tmp_path / "certs"

    def openssl(*args: str) -> str:
        done = subprocess.run(["openssl", *args], cwd=certs, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for name, names, usage in (("temporal", "DNS:refloop-fleet", "TLS Web Server"),
                               ("server", "IP Address:10.0.0.1, DNS:fleet.example",
                                "TLS Web Server"),
                               ("worker", "DNS:worker-c", "TLS Web Client")):
        assert openssl("verify", "-CAfile", "ca.crt", f"{name}.crt").strip() == \
            f"{name}.crt: OK"
        text = openssl("x509", "-in", f"{name}.crt", "-noout", "-text")
        assert names in text and usage in text, text
    print(f"certificates made in {time.monotonic() - started:.1f} s")


def test_commands_named_in_the_text_exist_with_their_flags():
    """`refloop SUB --flag` written in a sentence (not run: a synopsis, or half a command)
    names a subcommand and flags that exist."""
    import argparse

    from refloop.cli.main import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    top = {option for action in parser._actions for option in action.option_strings}
    seen = 0
    for page in pages():
        for span in re.findall(r"`(refloop [^`]+)`", (ROOT / page).read_text()):
            words = span.split()
            sub = subs.choices.get(words[1])
            assert sub is not None or words[1] in top, f"{page}: `{span}`: no such command"
            known = top | ({o for a in sub._actions for o in a.option_strings} if sub else set())
            for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", span):
                assert flag in known, f"{page}: `{span}`: refloop {words[1]} has no {flag}"
            seen += 1
    assert seen > 10
