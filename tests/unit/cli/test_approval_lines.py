"""How `refloop watch` tells an approval decided with edited arguments, and one that
nobody answered."""

from __future__ import annotations

from refloop.cli.output import describe_event
from refloop.contract.task import Event


def line(kind: str, **data) -> str:
    return describe_event(Event(seq=1, type=kind, ts="2026-12-07T10:00:00Z", data=data))


def test_an_edited_approval_names_what_changed():
    assert line("approval_decided", call_id="2.0", approved=True, comment=None) \
        .endswith("call 2.0 approved")
    edited = line("approval_decided", call_id="2.0", approved=True, comment=None,
                  edited=True, original_arguments={"path": "a.md", "content": "a"},
                  arguments={"path": "b.md", "content": "a"})
    assert edited.endswith("call 2.0 approved with edited arguments (path)")


def test_an_unanswered_approval_ends_the_task():
    assert line("approval_expired", call_id="2.0", tool="write_file", waited="3 days") \
        .endswith("no decision on call 2.0 (write_file) within 3 days: the task ends incomplete")


def test_files_changed_are_the_ones_the_approved_arguments_wrote():
    from refloop.cli.people import changes_of

    def event(seq: int, kind: str, **data) -> Event:
        return Event(seq=seq, type=kind, ts="2026-12-07T10:00:00Z", data=data)

    events = [
        event(1, "tool_call", iteration=1, id="c1", tool="read_file", args={"path": "x"}),
        event(2, "tool_result", iteration=1, id="c1", tool="read_file", ok=True),
        event(3, "tool_call", iteration=1, id="c2", tool="write_file",
              args={"path": "a.md", "content": "a"}),
        event(4, "approval_decided", call_id="1.1", approved=True, edited=True,
              original_arguments={"path": "a.md", "content": "a"},
              arguments={"path": "b.md", "content": "a"}),
        event(5, "tool_result", iteration=1, id="c2", tool="write_file", ok=True),
        event(6, "tool_call", iteration=2, id="c3", tool="write_file",
              args={"path": "c.md", "content": "c"}),
        event(7, "approval_decided", call_id="2.0", approved=True, comment=None),
        event(8, "tool_result", iteration=2, id="c3", tool="write_file", ok=True),
    ]
    assert changes_of(events) == (["b.md", "c.md"], [])
