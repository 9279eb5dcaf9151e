"""Every event of a task page says what it means, in English: each card's text is asserted.

The task is a stored one (its row and events, in the shapes the workflows emit them), served
by the real API's event stream to a real headless Chromium: one page holds a review, a
supplement, MCP tools, a host wait and move, reflections, an index and a failure, which no
single scripted run reaches together in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ui.browser import chromium_page
from tests.ui.test_console import ARTIFACTS, CHROMIUM

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): "
    "browser tests skipped")
TASK = "t-cards"
WRITE_ARGS = {"path": "report.md", "content": "# Report\n\nBody.\n"}
PLAN = {"task_type": "creation", "steps": [
    {"goal": "write the report", "tool": "write_file"},
    {"goal": "check the repository", "tool": "git__status"}]}

# (event type, data, the words its card must say)
EVENTS: list[tuple[str, dict, list[str]]] = [
    ("intent", {"intent": "CODING_TASK", "confidence": 0.9, "reason": "asks for a file"},
     ["Intent: CODING_TASK — asks for a file"]),
    ("workspace", {"context_chars": 5120, "indexing": True},
     ["Workspace read: 5120 characters of context for the model; semantic index building "
      "in the background"]),
    ("mcp_tools", {"servers": ["git", "broken"], "tools": ["git__status"],
                   "dropped": ["broken: connection refused"]},
     ["MCP servers git, broken: 1 tool offered (git__status); left out:",
      "broken: connection refused"]),
    ("constraints", {"task_type": "creation", "forbidden": ["run_cmd"], "allowed": []},
     ["Task type creation; tools it may not use: run_cmd"]),
    ("plan_rejected", {"attempt": 1, "violations": ["unknown tool: fly"]},
     ["Plan attempt 1 rejected, planning again:", "unknown tool: fly"]),
    ("plan", PLAN, ["Plan (2 steps)"]),
    ("step", {"step": 1, "goal": "write the report", "completed": []},
     ["Now on step 1: write the report"]),
    ("approval_required", {"call_id": "c1", "tool": "write_file", "args": WRITE_ARGS},
     ["Waiting for approval of write_file (call c1)"]),
    ("approval_decided", {"call_id": "c1", "approved": True, "comment": "fine"},
     ["Approval granted for call c1: fine"]),
    ("tool_call", {"iteration": 1, "id": "a", "tool": "write_file", "args": WRITE_ARGS},
     ["→ write_file path: report.md · content: # Report (+3 lines)"]),
    ("tool_result", {"iteration": 1, "id": "a", "tool": "write_file", "ok": True,
                     "error": None, "output": "wrote 16 bytes", "data": None,
                     "checkpoint": "c0ffee" * 10 + "abcd"},
     ["← write_file succeeded · checkpoint c0ffeec0ffee", "wrote 16 bytes"]),
    ("quality_review", {"file_path": "report.md", "pass": False, "outcome": "failed",
                        "reasons": ["no Summary section"], "summary": "missing summary",
                        "cap_reached": False},
     ["Quality review of report.md: FAIL", "missing summary", "no Summary section"]),
    ("reflection", {"trigger": "quality_review", "message": "add a Summary section"},
     ["Reflection (after a failed quality review)", "add a Summary section"]),
    ("quality_review", {"file_path": "report.md", "pass": True, "outcome": "passed",
                        "reasons": [], "summary": "good", "cap_reached": False},
     ["Quality review of report.md: PASS", "good"]),
    ("quality_review_skipped", {"file_path": "notes.md", "reason": "cap"},
     ["Quality review of notes.md skipped: its review rounds are used up"]),
    ("step", {"step": 2, "goal": "check the repository", "completed": [1]},
     ["Now on step 2: check the repository"]),
    ("waiting_for_host", {"host": "h-east", "activity": "refloop.tool.write_file",
                          "after_s": 60.0},
     ["Waiting for host h-east: no worker of it took refloop.tool.write_file within 60 s. "
      "Start a worker there, or move the task to another host."]),
    ("moved_to_host", {"from": "h-east", "to": "h-west"},
     ["Moved from host h-east to host h-west"]),
    ("rewind", {"step": 2},
     ["Rewind asked to checkpoint 2: the task stops at its next safe point to put it "
      "back"]),
    ("rewound", {"step": 2, "checkpoint": "c0ffee" * 10 + "abcd", "call": "t.r.3.0",
                 "edits_taken_back": 2, "rewound_tokens": 1200, "rewound_calls": 3,
                 "written": 1, "removed": 2, "unchanged": 7, "seconds": 0.01},
     ["Rewound to checkpoint 2 (c0ffeec0ffee): files, conversation and plan progress as "
      "they were just after that call; 2 edits taken back, 1 path written, 2 paths "
      "removed; the 3 model calls taken back (1200 tokens) stay in the task's stats, "
      "marked rewound"]),
    ("rewind_failed", {"step": 2, "error": "the workspace could not be put back"},
     ["Rewind to checkpoint 2 failed: the workspace could not be put back"]),
    ("workspace_restored", {"checkpoint": "c0ffee" * 10 + "abcd", "written": 1, "removed": 2,
                            "unchanged": 7, "seconds": 0.01},
     ["Workspace put back to checkpoint c0ffeec0ffee: 1 path written, 2 paths removed, "
      "7 unchanged"]),
    ("rewound_cost", {"step": 2, "tokens": 1200, "calls": 3},
     ["The rewound steps cost 1200 tokens in 3 model calls: kept in the task's stats, "
      "marked rewound"]),
    ("forked_from", {"task_id": "t-origin", "step": 4, "checkpoint": "c0ffee" * 10 + "abcd",
                     "instruction": "use the other library"},
     ["Forked from t-origin at checkpoint 4 (c0ffeec0ffee), with a new instruction: "
      "use the other library"]),
    ("forked", {"task_id": "t-fork", "step": 3},
     ["A fork of this task started: t-fork, from checkpoint 3"]),
    ("host_back", {"host": "h-west", "since": "2026-11-28T06:00:00+00:00"},
     ["Host h-west is back; the task goes on (it waited from"]),
    ("waiting_for_model", {"endpoint": "http://llm.example/v1", "error": "HTTP 503",
                           "since": "2026-11-28T06:00:00+00:00"},
     ["Waiting for the model at http://llm.example/v1: HTTP 503. The call is tried again "
      "until the endpoint answers or the outage bound is reached."]),
    ("model_back", {"endpoint": "http://llm.example/v1", "waited_s": 42.4},
     ["Model back: http://llm.example/v1 answers again after 42 s; the task goes on"]),
    ("compacted", {"kind": "masked", "masked": 3, "turns_folded": 0, "tokens_before": 7400,
                   "tokens_after": 5100, "window": 12000},
     ["Masked to fit the model's window: 3 older tool outputs masked to a line each, "
      "7400 → 5100 tokens (window 12000)"]),
    ("compacted", {"kind": "summary", "turns_folded": 60, "tokens_before": 8348,
                   "tokens_after": 2970, "summary_ref": "ab" * 32, "by_model": True,
                   "window": 16000, "summary_tokens": 3912},
     ["Compacted: 60 earlier messages folded into a summary the model wrote, 8348 → 2970 "
      "tokens (window 16000); the notes, the files written and the plan's progress kept; "
      "the summary cost 3912 tokens"]),
    ("tool_call", {"iteration": 2, "id": "b", "tool": "git__status", "args": {}},
     ["→ git__status"]),
    ("tool_result", {"iteration": 2, "id": "b", "tool": "git__status", "ok": False,
                     "error": "E_MCP: the server closed the connection", "output": "",
                     "data": None},
     ["← git__status failed: E_MCP: the server closed the connection"]),
    ("tool_violation", {"tool": "run_cmd", "step": 2, "iteration": 2, "justified": False,
                        "justification": None},
     ["Tool run_cmd is not allowed for this task type; refused"]),
    ("reflection", {"trigger": "repetition", "evidence": "git__status called 3 times alike",
                    "level": 2, "iteration": 3},
     ["Reflection (the same call repeated, iteration 3) 2 times",
      "git__status called 3 times alike"]),
    ("index", {"status": "done", "available": True, "files_seen": 12, "files_indexed": 3,
               "files_unchanged": 9, "files_removed": 0, "chunks_embedded": 7,
               "chunks_total": 40, "seconds": 1.25, "note": None},
     ["Semantic index ready: 12 files seen, 3 indexed, 9 unchanged, 0 removed; 40 chunks "
      "in all (1.3 s)"]),
    ("reflection", {"trigger": "completeness", "round": 1, "is_complete": False,
                    "analysis": "the report is not saved in docs/", "missing_count": 1,
                    "supplements_count": 1, "missing_aspects": ["a copy in docs/"],
                    "evidence": [], "fail_open": False},
     ["Reflection (completeness check, round 1): the work is incomplete: 1 missing aspect",
      "the report is not saved in docs/", "a copy in docs/"]),
    ("reflection_plan", {"plan": {"task_type": "creation", "steps": [
        {"goal": "copy the report to docs/", "tool": "write_file"}]}, "supplements_count": 1},
     ["Supplement planned for 1 missing action:", "copy the report to docs/"]),
    ("reflection_exec", {"used": True, "attempted": 2, "succeeded": 1, "success_rate": 0.5,
                         "child_workflow_id": f"{TASK}-supplement-1"},
     [f"Supplement run {TASK}-supplement-1: 1 of 2 tool calls succeeded"]),
    ("continued_as_new", {"iteration": 4, "history_length": 10_240},
     ["Continued as a new run after iteration 4 (history of 10240 events)"]),
    ("summary", {"summary": "wrote report.md and a copy in docs/"},
     ["Summary wrote report.md and a copy in docs/"]),
    ("failed", {"stop_reason": "activity_failed",
                "error": "the model endpoint refused the request (HTTP 400)"},
     ["Failed (activity failed): the model endpoint refused the request (HTTP 400)"]),
]


def store_task(tmp_path: Path) -> None:
    from refloop.contract.task import Event, RecordTaskInput, TaskResult
    from refloop.store.db import Store

    events = [Event(seq=n, type=kind, ts="2026-11-28T06:00:00+00:00", data=data)
              for n, (kind, data, _) in enumerate(EVENTS, start=1)]
    result = TaskResult(task_id=TASK, workflow_id=TASK, status="failed",
                        stop_reason="activity_failed", answer="the model endpoint refused",
                        plan=PLAN, completed_steps=[1], events=events)
    store = Store(f"sqlite:///{(tmp_path / 'data' / 'refloop.db').resolve()}")
    store.record_task(RecordTaskInput(
        task_id=TASK, workflow_id=TASK, status="failed", result=result.model_dump(mode="json"),
        session_id="sess-cards",
        input={"task": "write report.md\n\n【需要补充的操作】\n1. copy it to docs/",
               "host": "h-west", "model": "m-one"},
        error="the model endpoint refused the request (HTTP 400)"))
    # Its supplement child, and a task of another session
    store.record_task(RecordTaskInput(
        task_id=f"{TASK}-supplement-1", workflow_id=f"{TASK}-supplement-1",
        session_id="sess-cards", status="completed", input={"task": "copy it to docs/"}))
    store.record_task(RecordTaskInput(task_id="t-elsewhere", workflow_id="t-elsewhere",
                                      session_id="sess-other", status="completed",
                                      input={"task": "another session's task"}))


def test_every_event_card_says_what_it_means(console, tmp_path):
    from playwright.sync_api import expect

    store_task(tmp_path)
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(height=1200) as page:
        page.goto(f"{console}/ui/task.html?id={TASK}")
        expect(page.locator("#status")).to_have_text("failed")
        cards = page.locator("#events .event")
        expect(cards).to_have_count(len(EVENTS))  # one card per event, in order
        texts = cards.evaluate_all("cards => cards.map((c) => [c.dataset.event, c.innerText])")
        shown = [(kind, " ".join(text.split())) for kind, text in texts]
        assert [kind for kind, _ in shown] == [kind for kind, _, _ in EVENTS]
        for (kind, text), (_, _, says) in zip(shown, EVENTS, strict=True):
            for words in says:
                assert words in text, f"{kind}: {words!r} not in {text!r}"
        # A pass is said once; the page is in English, the legacy marker included.
        passed = [text for kind, text in shown if text.endswith("PASS good")]
        assert passed and "passed" not in passed[0]
        assert "【" not in page.locator("body").inner_text()
        expect(page.locator("#task-text")).to_contain_text("Missing actions to supplement:")
        # The plan at the end: step 1 done, nothing highlighted as current.
        expect(page.locator("#plan li.current")).to_have_count(0)
        expect(page.locator("#plan li.done")).to_have_text("write the report write_file done")
        # Its children, and its session's page: the tasks of that session alone.
        expect(page.locator("#child-list li")).to_have_text(
            f"{TASK}-supplement-1 completed")
        page.screenshot(path=str(ARTIFACTS / "task-every-card.png"), full_page=True)
        page.get_by_role("link", name="sess-cards").click()
        expect(page.locator("#f-session")).to_have_value("sess-cards")
        expect(page.locator("#rows tr[data-task]")).to_have_count(2)
        expect(page.locator('#rows tr[data-task="t-elsewhere"]')).to_have_count(0)
