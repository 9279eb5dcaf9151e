"""The real-model lane's window case: llama-cpp-python's server started with `--n_ctx 4096`
(its own server, not the lane's 8192-token one), and one task that reads files holding
together more than the window. Nothing tells refloop the window: the server states it
nowhere refloop asks (no `/props`, no window in `/v1/models`), so its first refusal of a
longer prompt teaches it. The task completes, with old outputs masked and a summary
written by the model; every compaction and the time the summary took (the
`refloop.llm.compact` activity, and the model's request within it) go to the lane's
report. The model's act turns are narrowed to reading the files in order (ReadInOrder)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from refloop.contract.task import TaskInput
from refloop.llm.prompts import NO_TOOL, TOOL_PICK_NAME
from refloop.llm.window import length_refusal
from tests.real_model.conftest import gguf_path, served
from tests.real_model.llm_proxy import LoggingProxy
from tests.real_model.test_real_model import NOTES, RUN_BOUND_S, lane_settings, write_report
from tests.workflow.helpers import events_of, run_with_history

WINDOW = 4096
MODEL = os.environ.get("REFLOOP_REAL_MODEL_WINDOW_MODEL", "smollm2-135m")
FILES = 14
FILE_CHARS = 2_300
SUMMARY_AT = 0.65
WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "ledger", "window",
         "budget", "signal", "orbit", "harbor", "meadow", "copper", "lantern")
TASK = (f"Read part1.txt, then part2.txt, and so on up to part{FILES}.txt: one read_file "
        f"call each. After part{FILES}.txt, answer DONE.")


class ReadInOrder:
    """Steers the tiny model's act turns, as a grammar narrows its choices: its pick is
    `read_file` until every file is read, then `none`; its read_file call's path is the
    next file. The model still reads every prompt whole and writes every token of its
    answers, its text and the compaction's summaries: what the case measures is the
    window on a real server, not a 135M model's choice of files (which it cannot make)."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.read = 0

    @staticmethod
    def named(body: dict[str, Any]) -> str | None:
        choice = body.get("tool_choice")
        function = choice.get("function") if isinstance(choice, dict) else None
        return function.get("name") if isinstance(function, dict) else None

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self.named(body)
        for tool in body.get("tools") or []:
            function = tool.get("function") or {}
            if name == TOOL_PICK_NAME == function.get("name"):
                function["parameters"]["properties"]["tool"]["enum"] = (
                    ["read_file"] if self.read < len(self.files) else [NO_TOOL])
            elif name == "read_file" == function.get("name") and self.read < len(self.files):
                function["parameters"] = {
                    "type": "object", "required": ["path"],
                    "properties": {"path": {"type": "string",
                                            "enum": [self.files[self.read]]}}}
        return body

    def answered(self, body: dict[str, Any], status: int) -> None:
        if status == 200 and self.named(body) == "read_file":
            self.read += 1


@pytest.fixture(scope="module")
def small_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggingProxy]:
    log = tmp_path_factory.mktemp("llama") / f"{MODEL}-{WINDOW}.log"
    with served(MODEL, log, n_ctx=WINDOW) as proxy:
        yield proxy


def write_parts(workspace: Path) -> None:
    """Files of 2,300 characters (each shown whole: under a tool output's share of the
    prompt), each a different sequence of the words."""
    for n in range(1, FILES + 1):
        words = [WORDS[(n * 7 + i * (n + 3)) % len(WORDS)] for i in range(FILE_CHARS // 5)]
        text = f"part {n}\n" + " ".join(words)
        (workspace / f"part{n}.txt").write_text(text[:FILE_CHARS])


def model_tokens(texts: list[str]) -> int:
    """Tokens as the lane's model counts them (its own tokenizer, no weights loaded)."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(gguf_path(MODEL)), vocab_only=True, verbose=False)
    return sum(len(vocab.tokenize(text.encode(), add_bos=False)) for text in texts)


def activity_seconds(history: Any, activity_type: str) -> list[float]:
    """How long each completed `activity_type` ran: its last attempt's start to its end."""
    scheduled = {e.event_id for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == activity_type}
    started: dict[int, float] = {}
    seconds = []
    for event in history.events:
        at = event.event_time.ToDatetime().timestamp()
        if event.HasField("activity_task_started_event_attributes"):
            started[event.activity_task_started_event_attributes.scheduled_event_id] = at
        elif event.HasField("activity_task_completed_event_attributes"):
            key = event.activity_task_completed_event_attributes.scheduled_event_id
            if key in scheduled:
                seconds.append(at - started[key])
    return seconds


async def test_a_task_reading_more_than_a_4096_token_window_completes(
        small_window, client, tmp_path, task_queue):
    proxy = small_window
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write_parts(workspace)
    # A summary sooner than the default 0.75 (an operator's setting): the case is short,
    # and the time a summary takes on this model is what it measures
    settings = lane_settings(proxy.base_url, MODEL, tmp_path / "data").model_copy(
        update={"refloop_compact_summary_at": SUMMARY_AT})
    inp = TaskInput(task=TASK, workspace=str(workspace), model=MODEL, enable_planning=False,
                    enable_reflection=False, max_iterations=FILES + 6)
    proxy.steer = steer = ReadInOrder([f"part{n}.txt" for n in range(1, FILES + 1)])
    mark = proxy.mark()
    began = time.monotonic()
    result, history = await run_with_history(client, settings, task_queue, inp)
    seconds = time.monotonic() - began
    proxy.wait_idle(120)
    proxy.steer = None
    sent = proxy.since(mark)
    answered = [r for r in sent if r["status"] == 200]
    reads = [e.data for e in result.events if e.type == "tool_call"
             and e.data.get("tool") == "read_file"]
    read_texts = [(workspace / str(r["args"].get("path", ""))).read_text()
                  for r in reads if (workspace / str(r["args"].get("path", ""))).is_file()]
    read_tokens = model_tokens(read_texts)
    compactions = events_of(result, "compacted")
    compact_s = activity_seconds(history, "refloop.llm.compact")
    compact_requests = [r for r in answered if r.get("purpose") == "compact"]
    figures = {
        "model": MODEL, "window": WINDOW, "outcome": f"{result.status} ({result.stop_reason})",
        "seconds": round(seconds), "reads": len(reads), "read_tokens": read_tokens,
        "answer": (result.answer or "")[:200],
        "steered_reads": steer.read, "requests": len(sent),
        "refused": [r["status"] for r in sent if r["status"] != 200],
        "refused_for_length": [r.get("error", "")[:200] for r in sent
                               if length_refusal(r["status"], r.get("error", ""))],
        "compactions": [{k: c.get(k) for k in ("kind", "turns_folded", "tokens_before",
                                                "tokens_after", "by_model")}
                        for c in compactions],
        "compact_activity_s": [round(s, 1) for s in compact_s],
        "compact_request_s": [round(r["end"] - r["start"], 1) for r in compact_requests],
        "compact_request_tokens": [(r.get("prompt_tokens"), r.get("completion_tokens"))
                                   for r in compact_requests],
    }
    print(json.dumps(figures))
    NOTES.append("\n".join([
        f"### window {WINDOW} tokens ({MODEL})", "",
        f"One task reading {len(reads)} files ({read_tokens} tokens by the model's tokenizer) "
        f"through a {WINDOW}-token window: {figures['outcome']} in {seconds:.0f} s, "
        f"{len(sent)} requests (refused: {figures['refused'] or 'none'}).", "",
        f"Compactions: {json.dumps(figures['compactions'])}; a summary took "
        f"{figures['compact_activity_s'] or '-'} s as an activity "
        f"({figures['compact_request_s'] or '-'} s of model request, tokens in/out "
        f"{figures['compact_request_tokens'] or '-'}).", ""]))
    write_report()

    assert seconds < RUN_BOUND_S, f"took {seconds:.0f} s"
    assert result.status == "completed", figures
    assert read_tokens > WINDOW, figures  # it read more than the window holds
    assert any(c.get("kind") == "masked" for c in compactions), figures
    assert any(c.get("kind") == "summary" and c.get("by_model") for c in compactions), figures
    # At most one request refused for length: the one that taught the window
    assert len(figures["refused_for_length"]) <= 1, figures
