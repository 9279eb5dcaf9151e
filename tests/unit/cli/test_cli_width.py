"""`refloop run`'s progress at 80 columns: no line cut mid-word, the Web UI link whole."""

from __future__ import annotations

import io

from rich.console import Console

from refloop.cli.output import fit, print_event, print_link
from refloop.contract.task import Event

WIDTH = 80
URL = ("http://127.0.0.1:8233/namespaces/default/workflows/task-0123456789ab/"
       "01936f6e-8c41-7d2a-9f61-3f1b2a4c5d6e/history")


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=WIDTH, force_terminal=False, highlight=False), out


def events() -> list[Event]:
    long_args = {"command": "str_replace", "path": "docs/report.md", "old_str": "Body.",
                 "new_str": "Body.\n\n## Summary\n\nThe supplement wrote [bold]this[/bold]."}
    return [
        Event(seq=1, type="tool_call", ts="t", data={"tool": "str_replace_based_edit_tool",
                                                     "args": long_args}),
        Event(seq=2, type="plan", ts="t", data={"task_type": "creation", "steps": [
            {"goal": "read the supplement material carefully", "tool": "read_file"},
            {"goal": "write the supplemented report", "tool": "str_replace_based_edit_tool"}]}),
        Event(seq=3, type="reflection_exec", ts="t", data={
            "child_workflow_id": "task-0123456789ab-supplement-1", "attempted": 3,
            "succeeded": 3, "supplemen": "supplementary"}),
    ]


def test_progress_lines_fit_80_columns_and_end_on_a_whole_word():
    from refloop.cli.output import describe_event

    console, out = terminal()
    for event in events():
        print_event(event, console)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # one line per event: nothing wrapped onto a second line
    for event, line in zip(events(), lines, strict=True):
        assert len(line) <= WIDTH
        whole = describe_event(event).split()
        words = line.split()
        if words[-1] == "…":  # shortened: marked, and every word shown is a whole word
            words = words[:-1]
        assert words == whole[:len(words)], line
    assert "[bold]this[/bold]" in lines[0] or lines[0].endswith("…")  # data is not markup


def test_fit_keeps_short_lines_and_marks_a_word_longer_than_the_line():
    assert fit("step 1:   write   it", WIDTH) == "step 1: write it"
    assert fit("x" * 100, WIDTH) == "x" * 79 + "…"
    assert fit("tool " + "y" * 100, 20) == "tool …"


def test_the_web_ui_link_is_printed_whole_on_its_own_line():
    console, out = terminal()
    print_link("Web UI:", URL, console)
    assert out.getvalue().splitlines() == ["Web UI:", URL]


def test_events_are_said_in_words_not_as_json():
    from refloop.cli.output import describe_event

    said = {kind: describe_event(Event(seq=1, type=kind, ts="t", data=data)) for kind, data in [
        ("workspace", {"context_chars": 512, "indexing": True}),
        ("index", {"status": "done", "files_seen": 4, "chunks_total": 9}),
        ("mcp_tools", {"servers": ["git"], "tools": ["git__status"],
                       "dropped": ["broken: refused"]}),
        ("reflection_plan", {"plan": {"steps": [{"goal": "copy it", "tool": "write_file"}]}}),
        ("waiting_for_host", {"host": "h1", "activity": "write_file", "after_s": 60.0}),
        ("quality_review", {"file_path": "a.md", "pass": True, "outcome": "passed",
                            "summary": "good"}),
        ("compacted", {"kind": "summary", "turns_folded": 60, "tokens_before": 8348,
                       "tokens_after": 2970, "window": 16000}),
    ]}
    assert said["workspace"] == "workspace read: 512 characters of context; semantic index " \
        "building"
    assert said["index"] == "semantic index ready: 4 files, 9 chunks"
    assert said["mcp_tools"].endswith("; left out: broken: refused")
    assert said["reflection_plan"] == "supplement planned: copy it"
    assert said["waiting_for_host"] == "waiting for host h1: no worker of it took write_file " \
        "within 60 s"
    assert said["quality_review"] == "quality review of a.md: PASS good"
    assert said["compacted"] == "compacted: 60 earlier messages summarised (8348 → 2970 " \
        "tokens, window 16000)"
    assert not any("{" in text for text in said.values())
