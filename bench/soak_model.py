"""The soak's model: an OpenAI-compatible server that keeps no state at all. Each answer is
decided from the request alone (the task's spec in the pinned task message, the last tool
call and its result), so the server can be stopped, restarted or answer garbage at any
moment without losing track, and every file a task leaves can be predicted
(`expected_files`).

A task's spec is a line `soak-spec: {"name": ..., "steps": N}` in its text. Step k is:
- k % 7 == 6: `run_cmd` of `echo` (changes nothing);
- else k % 5 == 4 after a write: `str_replace_based_edit_tool` in the previous step's file;
- else: `write_file f<k>.txt` with lines that name the task and the step.
A failed write, or an edit the disk refused (E_IO), is asked again after RETRY_WRITE_S, as
a model that reads the error would (asked again at once, a full disk burns a task's
iterations in seconds); another failed edit, or a command, goes on (the file check then
tells whether the edit landed once). After step N-1: the final answer.
A spec with `"supplement": true` has the completeness judge find `supplement.txt` missing
until the history it is shown or the task's workspace has it; the supplement child then
writes it.

    python -m bench.soak_model --port 8123 --workspaces DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from refloop.contract.messages import Purpose
from refloop.llm.prompts import is_tool_pick
from refloop.llm.scenario import Scenario, ScriptedResponse
from refloop.llm.scripted import _render, pick_answer

SPEC = re.compile(r"soak-spec: (\{[^}\n]*\})")
STEP_FILE = re.compile(r"^f(\d{3})\.txt$")
SCENARIO = Scenario(name="soak")
SUPPLEMENT_FILE = "supplement.txt"
RETRY_WRITE_S = 5.0
# The judge's supplement action carries it, so the child's objective (the task, then the
# actions) tells the model it is the supplement, whatever header refloop puts between.
SUPPLEMENT_MARK = "soak-supplement:"
PASS_REVIEW = {"pass": True, "reasons": [], "suggestions": "", "summary": "ok"}


def task_text(name: str, steps: int, supplement: bool = False) -> str:
    spec = {"name": name, "steps": steps, **({"supplement": True} if supplement else {})}
    return (f"Soak task {name}: write the files the spec asks for, one step at a time.\n"
            f"soak-spec: {json.dumps(spec)}")


def supplement_text(name: str) -> str:
    return f"{name} supplement: the closing note\n"


def step_kind(k: int) -> str:
    if k % 7 == 6:
        return "cmd"
    if k % 5 == 4 and step_kind(k - 1) == "write":
        return "edit"
    return "write"


def file_of(k: int) -> str:
    return f"f{k:03d}.txt"


def written(name: str, k: int) -> str:
    return "".join(f"{name} step {k} line {line}\n" for line in range(4))


def edit_strings(name: str, k: int) -> tuple[str, str]:
    """The edit of step k: in the previous step's file, its first line gains a mark."""
    old = f"{name} step {k - 1} line 0\n"
    return old, old.replace("line 0", f"line 0 edited at step {k}")


def expected_files(name: str, steps: int, supplement: bool = False) -> dict[str, str]:
    """Every file a completed task leaves, with its exact content."""
    files: dict[str, str] = {SUPPLEMENT_FILE: supplement_text(name)} if supplement else {}
    for k in range(steps):
        kind = step_kind(k)
        if kind == "write":
            files[file_of(k)] = written(name, k)
        elif kind == "edit":
            old, new = edit_strings(name, k)
            files[file_of(k - 1)] = files[file_of(k - 1)].replace(old, new, 1)
    return files


def step_call(name: str, k: int) -> dict[str, Any]:
    kind = step_kind(k)
    if kind == "cmd":
        return {"name": "run_cmd", "arguments": {"command": f"echo soak step {k}"}}
    if kind == "edit":
        old, new = edit_strings(name, k)
        return {"name": "str_replace_based_edit_tool", "arguments": {
            "command": "str_replace", "path": file_of(k - 1), "old_str": old, "new_str": new}}
    return {"name": "write_file", "arguments": {"path": file_of(k), "content": written(name, k)}}


def spec_of(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    for message in messages:
        found = SPEC.search(str(message.get("content") or ""))
        if found:
            return json.loads(found.group(1))
    return None


def _step_of_call(call: dict[str, Any]) -> int | None:
    """The step a tool call made (its arguments name it); None for another call."""
    try:
        arguments = json.loads(call["function"]["arguments"])
        name = call["function"]["name"]
    except (KeyError, TypeError, ValueError):
        return None
    if name == "write_file":
        found = STEP_FILE.match(str(arguments.get("path", "")))
        return int(found.group(1)) if found else None
    if name == "run_cmd":
        found = re.search(r"soak step (\d+)", str(arguments.get("command", "")))
        return int(found.group(1)) if found else None
    if name == "str_replace_based_edit_tool":
        found = re.search(r"edited at step (\d+)", str(arguments.get("new_str", "")))
        return int(found.group(1)) if found else None
    return None


def calls_newest_first(messages: list[dict[str, Any]]
                       ) -> Iterator[tuple[dict[str, Any], bool]]:
    """Each tool call the conversation shows, the last first, and whether its result
    says ok."""
    for call, result in calls_and_results(messages):
        yield call, "] ok" in result[:80]


def calls_and_results(messages: list[dict[str, Any]]
                      ) -> Iterator[tuple[dict[str, Any], str]]:
    """Each tool call the conversation shows, the last first, with its result's text."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        results = [m for m in messages[index + 1:] if m.get("role") == "tool"]
        yield (message["tool_calls"][0],
               str(results[0].get("content") or "") if results else "")


def _supplement_answer(name: str, messages: list[dict[str, Any]]) -> ScriptedResponse:
    """A supplement child: write the supplement file, then end."""
    for call, ok in calls_newest_first(messages):
        if ok and call["function"].get("name") == "write_file" \
                and SUPPLEMENT_FILE in call["function"].get("arguments", ""):
            return ScriptedResponse(content=f"{SUPPLEMENT_FILE} written")
        break
    return ScriptedResponse(tool_calls=[{"name": "write_file", "arguments": {
        "path": SUPPLEMENT_FILE, "content": supplement_text(name)}}])


def _judge(spec: dict[str, Any] | None, messages: list[dict[str, Any]],
           workspaces: Path | None) -> ScriptedResponse:
    """Complete, unless the spec wants a supplement that is neither in the history shown nor
    in the task's workspace (the second judge is shown the parent's history only)."""
    shown = json.dumps(messages[1:], ensure_ascii=False)
    on_disk = workspaces is not None and spec is not None \
        and (workspaces / str(spec.get("name")) / SUPPLEMENT_FILE).is_file()
    if spec and spec.get("supplement") and SUPPLEMENT_FILE not in shown and not on_disk:
        return ScriptedResponse(json={
            "is_complete": False, "analysis": "the closing note is missing",
            "missing_aspects": [SUPPLEMENT_FILE], "supplements": [{
                "action": f"{SUPPLEMENT_MARK} write {SUPPLEMENT_FILE}",
                "reason": "the spec asks for it",
                "suggested_tools": ["write_file"]}]})
    return ScriptedResponse(json={"is_complete": True, "analysis": "all files are there",
                                  "missing_aspects": [], "supplements": []})


def next_step(messages: list[dict[str, Any]]) -> int:
    """The step to take now: after the last call's step, or that step again when a write
    failed or the disk refused an edit."""
    for call, result in calls_and_results(messages):
        step = _step_of_call(call)
        if step is None:
            continue
        name, failed = call["function"]["name"], "] ok" not in result[:80]
        if failed and (name == "write_file"
                       or (name == "str_replace_based_edit_tool" and "E_IO" in result)):
            return step
        return step + 1
    return 0


def decide(purpose: Purpose, body: dict[str, Any],
           workspaces: Path | None = None) -> ScriptedResponse:
    """The answer to one request, from the request alone (and, for the completeness judge,
    whether the task's workspace under `workspaces` holds its supplement)."""
    messages = body.get("messages") or []
    spec = spec_of(messages)
    if purpose is Purpose.intent:
        return ScriptedResponse(json={"intent": "CODING_TASK", "confidence": 1,
                                      "reason": "a soak task"})
    if purpose is Purpose.plan:
        return ScriptedResponse(json={"task_type": "coding", "steps": [
            {"goal": "write, edit and check the files", "tool": "write_file"}]})
    if purpose is Purpose.quality_review:
        return ScriptedResponse(json=PASS_REVIEW)
    if purpose is Purpose.completeness:
        return _judge(spec, messages, workspaces)
    if purpose is Purpose.supplement_plan:
        return ScriptedResponse(json={"task_type": "coding", "steps": [
            {"goal": f"write {SUPPLEMENT_FILE}", "tool": "write_file"}]})
    if purpose is Purpose.act and spec is not None and any(
            SUPPLEMENT_MARK in str(m.get("content") or "") for m in messages
            if m.get("role") == "user"):
        return _supplement_answer(spec["name"], messages)
    if purpose is Purpose.act and spec is not None:
        step = next_step(messages)
        if step >= spec["steps"]:
            return ScriptedResponse(content=f"done: {spec['steps']} steps")
        again = any(_step_of_call(call) == step for call, _ in calls_newest_first(messages))
        return ScriptedResponse(tool_calls=[step_call(spec["name"], step)],
                                delay_ms=int(RETRY_WRITE_S * 1000) if again else 0)
    return ScriptedResponse(content="summary of the soak task")


def build_app(workspaces: Path | None = None) -> FastAPI:
    app = FastAPI(title="refloop soak model (stateless, scripted)")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        try:
            purpose = Purpose(request.headers.get("x-refloop-purpose", ""))
        except ValueError:
            return JSONResponse({"error": {"message": "unknown purpose"}}, status_code=400)
        entry = decide(purpose, body, workspaces)
        if is_tool_pick(body):
            entry = pick_answer(entry)
        if entry.delay_ms:
            await asyncio.sleep(entry.delay_ms / 1000)
        return _render(SCENARIO, entry, body, {})

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workspaces", type=Path, help="where the tasks' workspaces are")
    args = parser.parse_args()
    uvicorn.run(build_app(args.workspaces), host="127.0.0.1", port=args.port, log_level="warning")
