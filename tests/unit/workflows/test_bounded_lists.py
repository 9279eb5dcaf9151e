"""What a task carries of its violations, review caps and kept tool records stays bounded
however long it runs, and its counts stay exact (plain functions, no Temporal)."""

from __future__ import annotations

import json

import pytest

from refloop.activities.store_activities import kept_records, link_text, read_link
from refloop.contract.activity_io import KeepRecordsInput, QualityReview, ToolRecord
from refloop.contract.policies import REVIEW_FILES_KEPT, VIOLATIONS_CARRIED
from refloop.contract.task import TaskInput
from refloop.store.blobs import digest
from refloop.workflows import logic, review_logic
from refloop.workflows.state import AgentState

ADDITIONS = 10_000


def failed(path: str) -> QualityReview:
    return QualityReview(file_path=path, passed=False, outcome="failed", reasons=["r"])


def violation(n: int, justification: str | None = None) -> dict:
    return {"tool": "apply_patch", "step": 1, "iteration": n, "justified": bool(justification),
            "justification": justification}


def test_violations_keep_the_recent_ones_and_count_them_all():
    state = AgentState(input=TaskInput(task="t", workspace="w"), task_id="t")
    calls = state.calls
    for n in range(ADDITIONS):
        calls.violations = logic.carried_violations(calls.violations, violation(n),
                                                    VIOLATIONS_CARRIED)
        calls.violation_count += 1
        assert len(calls.violations) <= VIOLATIONS_CARRIED
    assert [v["iteration"] for v in calls.violations] == \
        list(range(ADDITIONS - VIOLATIONS_CARRIED, ADDITIONS))
    assert calls.violation_count == ADDITIONS
    # The count survives continue-as-new (the state's JSON, read back).
    again = AgentState.model_validate(json.loads(state.model_dump_json()))
    assert again.calls.violation_count == ADDITIONS


def test_a_long_justification_is_cut_in_the_carried_copy_only():
    long = "because " * 1_000
    given = violation(1, long)
    carried = logic.carried_violations([], given, VIOLATIONS_CARRIED)
    assert given["justification"] == long  # the event keeps the model's words
    kept = carried[0]["justification"]
    assert len(kept) < logic.JUSTIFICATION_CHARS + 60 and "truncated" in kept
    assert carried[0]["justified"] is True and carried[0]["tool"] == "apply_patch"


def test_state_carried_before_the_count_counts_its_violations():
    """Earlier code kept every violation: its count is theirs, so the result tells no
    violation as left out."""
    data = AgentState(input=TaskInput(task="t", workspace="w"), task_id="t") \
        .model_dump(mode="json")
    del data["calls"]["violation_count"]
    data["calls"]["violations"] = [violation(n) for n in range(35)]
    assert AgentState.model_validate(data).calls.violation_count == 35


def test_the_review_cap_remembers_a_bounded_number_of_files():
    failures: dict[str, int] = {}
    capped: list[str] = []
    reached = 0
    for n in range(ADDITIONS):  # each file fails twice, the second time reaching the cap
        for _ in range(2):
            failures, capped, hit = review_logic.remember_failure(
                failures, capped, failed(f"f{n}.md"), 2, REVIEW_FILES_KEPT)
            reached += hit
        assert len(failures) <= REVIEW_FILES_KEPT and len(capped) <= REVIEW_FILES_KEPT
    assert reached == ADDITIONS  # every file reached the cap exactly once
    assert failures == {}  # a capped file leaves the failure counts
    assert capped == [f"f{n}.md" for n in range(ADDITIONS - REVIEW_FILES_KEPT, ADDITIONS)]


@pytest.mark.parametrize(("files", "remembered", "count"), [
    (50, 50, ADDITIONS // 50),  # fewer files than kept: each counted exactly
    (250, REVIEW_FILES_KEPT, 1),  # more: a file forgotten since starts again from 1
])
def test_failures_below_the_cap_are_counted_for_the_recent_files(files, remembered, count):
    failures: dict[str, int] = {}
    capped: list[str] = []
    for n in range(ADDITIONS):
        failures, capped, hit = review_logic.remember_failure(
            failures, capped, failed(f"f{n % files}.md"), ADDITIONS, REVIEW_FILES_KEPT)
        assert not hit and len(failures) <= REVIEW_FILES_KEPT
    assert list(failures) == [f"f{n}.md" for n in range(files - remembered, files)]
    assert set(failures.values()) == {count} and capped == []


def test_a_file_failing_again_is_counted_again_and_moves_last():
    failures, capped = {"a.md": 1, "b.md": 1}, []
    failures, capped, hit = review_logic.remember_failure(failures, capped, failed("a.md"),
                                                          3, REVIEW_FILES_KEPT)
    assert failures == {"b.md": 1, "a.md": 2} and list(failures) == ["b.md", "a.md"]
    assert not hit and capped == []
    failures, capped, hit = review_logic.remember_failure(failures, capped, failed("a.md"),
                                                          3, REVIEW_FILES_KEPT)
    assert hit and capped == ["a.md"] and failures == {"b.md": 1}


@pytest.mark.parametrize("outcome", ["passed", "unavailable"])
def test_a_passed_or_unavailable_review_changes_nothing(outcome: str):
    review = QualityReview(file_path="a.md", passed=True, outcome=outcome)
    assert review_logic.remember_failure({"a.md": 1}, ["b.md"], review, 2, 5) == \
        ({"a.md": 1}, ["b.md"], False)


def test_a_capped_file_edited_again_stays_remembered():
    capped = [f"f{n}.md" for n in range(REVIEW_FILES_KEPT)]
    capped = review_logic.recent_first_out(capped, "f0.md", REVIEW_FILES_KEPT)
    assert capped[-1] == "f0.md" and len(capped) == REVIEW_FILES_KEPT
    capped = review_logic.recent_first_out(capped, "new.md", REVIEW_FILES_KEPT)
    assert "f0.md" in capped and "f1.md" not in capped  # the least recent left
    assert len(capped) == REVIEW_FILES_KEPT


def record(n: int) -> ToolRecord:
    return ToolRecord(tool="read_file", arguments=f"f{n}.txt", ok=True, outcome="ok")


def test_the_kept_records_are_a_chain_whose_head_is_all_a_state_holds():
    blobs: dict[str, str] = {}

    def keep(records: list[ToolRecord], earlier: list[str]) -> str:
        text = link_text(KeepRecordsInput(records=records, earlier=earlier))
        blobs[digest(text)] = text
        return digest(text)

    refs: list[str] = []
    chunk = 10
    for start in range(0, ADDITIONS, chunk):
        refs = [keep([record(n) for n in range(start, start + chunk)], refs)]
    assert len(refs) == 1  # the state's share, at any length
    records = kept_records(refs, blobs.__getitem__)
    assert [r.arguments for r in records] == [f"f{n}.txt" for n in range(ADDITIONS)]


def test_links_stored_by_earlier_code_are_read_in_order():
    """Earlier code stored bare lists and listed every link in the state; a new link names
    them all as earlier."""
    blobs: dict[str, str] = {}
    old = []
    for start in (0, 3):
        text = link_text(KeepRecordsInput(records=[record(n) for n in range(start, start + 3)]))
        assert json.loads(text)[0]["tool"] == "read_file"  # the bare form, as before
        blobs[digest(text)] = text
        old.append(digest(text))
    text = link_text(KeepRecordsInput(records=[record(6)], earlier=old))
    blobs[digest(text)] = text
    assert read_link(text).earlier == old
    paths = [r.arguments for r in kept_records([digest(text)], blobs.__getitem__)]
    assert paths == [f"f{n}.txt" for n in range(7)]
    assert [r.arguments for r in kept_records(old, blobs.__getitem__)] == \
        [f"f{n}.txt" for n in range(6)]
    assert kept_records([], blobs.__getitem__) == []


def test_a_missing_link_fails_loudly():
    with pytest.raises(KeyError):
        kept_records(["0" * 64], {}.__getitem__)


def test_step_summaries_kept_as_a_bounded_list_of_claimed_files():
    from refloop.contract.policies import KEPT_CLAIMS
    from refloop.workflows.completeness_logic import claimed_files, kept_claims

    kept: list[str] = []
    for n in range(ADDITIONS):
        notes = [f"Saved the section to part{n}.md and checked it.", "looked around, no file"]
        kept = kept_claims(kept, notes, KEPT_CLAIMS)
        assert len(kept) <= KEPT_CLAIMS
    assert claimed_files(kept) == [f"part{n}.md" for n in range(ADDITIONS - KEPT_CLAIMS,
                                                                    ADDITIONS)]
    # A file claimed again moves last; state from earlier code (whole summaries) is read
    # the same way at its next keep.
    again = kept_claims(kept, ["wrote part9900.md again"], KEPT_CLAIMS)
    assert claimed_files(again)[-1] == "part9900.md" and len(again) == KEPT_CLAIMS
    earlier = ["I created notes.md; then I wrote out.txt.", "nothing written"]
    assert claimed_files(kept_claims(earlier, [], KEPT_CLAIMS)) == ["notes.md", "out.txt"]
