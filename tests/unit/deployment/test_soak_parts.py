"""The soak's own parts (bench/soak_model.py, bench/soak_proxy.py): the stateless model
leads a task to exactly the files it predicts, whatever it is asked again; the proxy
breaks the endpoint the way the soak says it does."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import uvicorn

from bench.soak_model import (
    SUPPLEMENT_FILE,
    SUPPLEMENT_MARK,
    build_app,
    decide,
    expected_files,
    task_text,
)
from bench.soak_proxy import ModelFaultProxy
from refloop.contract.messages import Purpose
from refloop.runtime.net import free_port, wait_for_port


def tool_turn(call_id: str, name: str, arguments: dict, ok: bool = True) -> list[dict]:
    """An assistant's tool call and its result, as the workflow sends them."""
    return [{"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": call_id,
             "content": f"[{name}] ok\n" if ok else f"[{name}] error: E_IO: No space left "
                                                   "on device"}]


def run_conversation(name: str, steps: int, fail_writes: set[int] = frozenset()
                     ) -> tuple[dict[str, str], int]:
    """Plays the agent against `decide`: applies each tool call to a dict of files (a write
    or an edit whose step is in `fail_writes` fails once, as on a full disk); (files,
    turns)."""
    messages = [{"role": "system", "content": "tools..."},
                {"role": "user", "content": task_text(name, steps)}]
    files: dict[str, str] = {}
    failed: set[int] = set()
    for turn in range(steps * 2 + 10):
        answer = decide(Purpose.act, {"messages": messages})
        if not answer.tool_calls:
            return files, turn
        call = answer.tool_calls[0]
        args = call.arguments
        ok = True
        if call.name == "write_file":
            step = int(args["path"][1:4])
            # a write asked again after it failed comes after a pause, the others at once
            assert (answer.delay_ms > 0) == (step in failed), (step, answer.delay_ms)
            if step in fail_writes and step not in failed:
                failed.add(step)
                ok = False
            else:
                files[args["path"]] = args["content"]
        elif call.name == "str_replace_based_edit_tool":
            step = int(args["new_str"].split("edited at step ")[1].split()[0])
            assert (answer.delay_ms > 0) == (step in failed), (step, answer.delay_ms)
            assert files[args["path"]].count(args["old_str"]) == 1
            if step in fail_writes and step not in failed:
                failed.add(step)
                ok = False
            else:
                files[args["path"]] = files[args["path"]].replace(args["old_str"],
                                                                  args["new_str"])
        else:
            assert call.name == "run_cmd"
        messages += tool_turn(f"c{turn}", call.name, args, ok)
        # the workflow trims the middle of a long conversation; the model must not care
        if len(messages) > 12:
            messages = messages[:2] + messages[-8:]
    raise AssertionError("the model never gave its final answer")


def test_the_model_leads_a_task_to_exactly_its_predicted_files() -> None:
    files, turns = run_conversation("t1", 40)
    assert files == expected_files("t1", 40)
    assert turns == 40  # one step a turn, then the final answer
    assert any("edited at step" in text for text in files.values())


def test_a_failed_write_is_asked_again_and_the_files_stay_exact() -> None:
    files, turns = run_conversation("t2", 20, fail_writes={0, 7, 18})
    assert files == expected_files("t2", 20)
    assert turns == 23


def test_an_edit_the_full_disk_refused_is_asked_again() -> None:
    # Step 4 edits f003.txt; the soak once saw the model go on after "No space left on
    # device", and the check then reported the file wrong.
    files, turns = run_conversation("t3", 10, fail_writes={4})
    assert files == expected_files("t3", 10)
    assert "edited at step 4" in files["f003.txt"]
    assert turns == 11


def test_the_other_purposes_answer_without_a_spec() -> None:
    assert decide(Purpose.intent, {"messages": []}).json_["intent"] == "CODING_TASK"
    assert decide(Purpose.plan, {"messages": []}).json_["steps"][0]["tool"] == "write_file"
    assert decide(Purpose.quality_review, {"messages": []}).json_["pass"] is True
    assert decide(Purpose.summary, {"messages": []}).content


@pytest.fixture
async def model_behind_proxy():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(), host="127.0.0.1", port=port,
                                           log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await asyncio.to_thread(wait_for_port, port, 10)
    proxy = ModelFaultProxy(port, free_port())
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
        server.should_exit = True
        await serving


async def test_the_proxy_passes_breaks_and_cuts_kept_connections(model_behind_proxy) -> None:
    proxy = model_behind_proxy
    request = {"model": "soak", "messages": [{"role": "user", "content": task_text("p", 3)}]}
    headers = {"x-refloop-purpose": "act"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}/v1") as client:
        passed = await client.post("/chat/completions", json=request, headers=headers)
        assert passed.status_code == 200
        call = passed.json()["choices"][0]["message"]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"])["path"] == "f000.txt"

        proxy.set_mode("5xx")  # the kept-alive connection is cut: the next request sees it
        await asyncio.sleep(0.2)  # the close reaches the client's pool
        failing = await client.post("/chat/completions", json=request, headers=headers)
        assert failing.status_code == 500
        assert failing.json()["error"]["type"] == "server_error"

        proxy.set_mode("garbage")
        await asyncio.sleep(0.2)
        garbage = await client.post("/chat/completions", json=request, headers=headers)
        assert garbage.status_code == 200
        with pytest.raises(UnicodeDecodeError):
            garbage.content.decode("utf-8")
        with pytest.raises(ValueError):
            json.loads(garbage.content)

        proxy.set_mode("pass")
        await asyncio.sleep(0.2)
        again = await client.post("/chat/completions", json=request, headers=headers)
        assert again.status_code == 200
    assert proxy.answered["5xx"] == 1 and proxy.answered["garbage"] == 1


def test_a_supplement_task_is_judged_incomplete_until_its_supplement_is_written(
        tmp_path) -> None:
    task = task_text("s1", 5, supplement=True)
    judged = decide(Purpose.completeness, {"messages": [
        {"role": "system", "content": "judge"},
        {"role": "user", "content": f"Task goal: {task}\n\nExecution history: write_file "
                                    '{"path": "f000.txt"} -> ok'}]})
    assert judged.json_["is_complete"] is False
    action = judged.json_["supplements"][0]["action"]
    assert action == f"{SUPPLEMENT_MARK} write {SUPPLEMENT_FILE}"

    child = [{"role": "system", "content": "tools"},
             {"role": "user", "content": f"{task}\n\nMissing actions to supplement:\n"
                                         f"1. {action} (reason: the spec asks for it)"}]
    first = decide(Purpose.act, {"messages": child}).tool_calls[0]
    content = expected_files("s1", 5, supplement=True)[SUPPLEMENT_FILE]
    assert first.arguments == {"path": SUPPLEMENT_FILE, "content": content}
    failed = decide(Purpose.act, {"messages": child + tool_turn("c0", first.name,
                                                                first.arguments, ok=False)})
    assert failed.tool_calls[0].arguments["path"] == SUPPLEMENT_FILE  # asked again
    child += tool_turn("c1", first.name, first.arguments)
    assert decide(Purpose.act, {"messages": child}).content  # the child ends

    again = decide(Purpose.completeness, {"messages": [
        {"role": "system", "content": "judge"},
        {"role": "user", "content": f"Task goal: {task}\n\nExecution history: write_file "
                                    f'{{"path": "{SUPPLEMENT_FILE}"}} -> ok'}]})
    assert again.json_["is_complete"] is True
    judge_round_2 = {"messages": [{"role": "user", "content": f"Task goal: {task}"}]}
    assert decide(Purpose.completeness, judge_round_2, tmp_path).json_["is_complete"] is False
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / SUPPLEMENT_FILE).write_text(content)
    assert decide(Purpose.completeness, judge_round_2, tmp_path).json_["is_complete"] is True
    plain = decide(Purpose.completeness, {"messages": [
        {"role": "user", "content": f"Task goal: {task_text('s2', 5)}"}]})
    assert plain.json_["is_complete"] is True
