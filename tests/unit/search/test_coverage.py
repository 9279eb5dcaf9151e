"""What a pass has not stored yet and the word scan over it (no model, no LanceDB)."""

from __future__ import annotations

from pathlib import Path

from refloop.search.coverage import (
    Pending,
    pending_note,
    read_pending,
    scan_files,
    scan_slots,
    scan_terms,
    write_pending,
)


def test_the_pending_list_round_trips_and_a_missing_or_broken_one_is_none(tmp_path: Path):
    path = tmp_path / "t.pending.json"
    assert read_pending(path) is None
    write_pending(path, ["a.py", "b/c.py"], 7)
    assert read_pending(path) == Pending(("a.py", "b/c.py"), 7)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    path.write_text("{not json")
    assert read_pending(path) is None


def test_query_words_are_split_like_the_full_text_side_without_question_words():
    assert scan_terms("How does parse_URLPath handle the port?") == [
        "parseurlpath", "parse", "url", "path", "handle", "port"]
    assert scan_terms("is it ?") == []
    assert scan_terms("hashed passwords, loading the class") == [
        "hash", "password", "load", "class"]


def test_the_scan_ranks_blocks_by_the_share_of_query_words_they_hold(tmp_path: Path):
    (tmp_path / "a.py").write_text(
        "import os\n\n\ndef load_config(path):\n    return open(path).read()\n\n\n"
        "class Cache:\n    def evict(self, key):\n        del self.store[key]\n")
    (tmp_path / "b.md").write_text("# Config\nThe cache is loaded from the config path.\n")
    (tmp_path / "c.py").write_text("def unrelated():\n    return 1\n")
    hits, read = scan_files(tmp_path, ["a.py", "b.md", "c.py", "gone.py"],
                            "load the config from a path", 5)
    assert read == 4
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [
        ("a.py", 4, 7), ("b.md", 1, 2)]
    assert hits[0].score == 1.0 and hits[0].text.startswith("def load_config(path):")
    assert scan_files(tmp_path, ["a.py"], "the", 5) == ([], 1)  # no words: nothing read


def test_the_scan_stops_at_its_time_budget(tmp_path: Path):
    (tmp_path / "a.py").write_text("def load():\n    pass\n")
    hits, read = scan_files(tmp_path, ["a.py"] * 50, "load", 5, budget_s=0.0)
    assert read <= 1


def test_scan_hits_take_the_share_of_places_of_the_files_not_indexed():
    mostly_pending = Pending(tuple(f"f{i}" for i in range(90)), 100)
    assert scan_slots(5, mostly_pending, indexed=5, scanned=9) == 4
    assert scan_slots(5, Pending(("x",), 100), indexed=5, scanned=9) == 1  # at least one
    assert scan_slots(5, Pending(("x",), 100), indexed=2, scanned=9) == 3  # fills the rest
    assert scan_slots(5, mostly_pending, indexed=5, scanned=0) == 0


def test_the_note_names_what_is_not_indexed_and_how_far_the_scan_got():
    pending = Pending(tuple(f"m{i}.py" for i in range(8)), 20)
    note = pending_note(pending, read=8)
    assert note.startswith("partial: the index holds 12 of 20 files")
    assert "m0.py, m1.py, m2.py, m3.py, m4.py and 3 more" in note
    assert "all of them were scanned" in note
    assert "3 of them were scanned" in pending_note(pending, read=3)
