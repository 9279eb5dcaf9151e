"""A large workspace's first pass, in a child process as the index activity runs it: a
search answers during it (its hits so far, the files not stored yet scanned for words) and
says it is partial; a pass cut off keeps every file it stored, and the next one embeds
only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from refloop.search.chunks import chunk_source
from refloop.search.embedders import embedder
from refloop.search.index import CodeIndex

BATCH_CHUNKS = 4  # many batches: the pass is between two of them for most of its time
FILES = 40


def _workspace(root: Path) -> Path:
    """FILES modules of a few functions each, every one with words of its own."""
    for number in range(FILES):
        package = root / f"pkg{number % 4}"
        package.mkdir(parents=True, exist_ok=True)
        (package / f"module{number:02d}.py").write_text(
            f'def parse_record_{number}(line):\n'
            f'    """Split a comma separated line of ledger {number} into fields."""\n'
            f'    return line.split(",")\n\n\n'
            f'def checksum_{number}(data):\n'
            f'    """The additive checksum of a payload, modulo 256."""\n'
            f'    return sum(data) % 256\n')
    (root / "pkg3" / "zebra_inventory.py").write_text(
        'def count_striped_animals(herd):\n'
        '    """How many zebras the inventory lists."""\n'
        '    return sum(1 for animal in herd if animal == "zebra")\n')
    return root


def _start(workspace: Path, index_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "refloop.search.index", str(workspace), str(index_dir),
         "minilm-int8", str(BATCH_CHUNKS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_progress(process: subprocess.Popen, files_done: int) -> dict:
    """Reads the pass's progress lines until it has stored at least `files_done` files."""
    for line in process.stdout:
        message = json.loads(line)
        if message.get("progress", {}).get("files_done", 0) >= files_done:
            return message["progress"]
    raise AssertionError(f"the pass ended first: {process.stderr.read()[-500:]}")


def test_a_search_answers_during_the_first_pass_and_says_it_is_partial(tmp_path: Path):
    workspace = _workspace(tmp_path / "ws")
    index = CodeIndex(tmp_path / "index", workspace)
    before = index.answer("how many zebras are in the inventory", 3)
    assert before.partial and before.hits[0].unindexed  # no pass yet: all words, at once
    assert before.hits[0].path == "pkg3/zebra_inventory.py"

    process = _start(workspace, tmp_path / "index")
    try:
        progress = _wait_for_progress(process, 2)
        os.kill(process.pid, signal.SIGSTOP)  # hold the pass between two batches
        answer = index.answer("how many zebras are in the inventory", 5)
        stored = FILES + 1 - len(json.loads(index.pending_path.read_text())["files"])
        assert progress["files_done"] <= stored < FILES + 1
        assert answer.partial
        assert f"the index holds {stored} of {FILES + 1} files" in answer.note
        assert "indexing runs in the background" in answer.note  # it does: stopped, alive
        assert "pkg3/zebra_inventory.py" in answer.note or "more" in answer.note
        zebra = [hit for hit in answer.hits if hit.path == "pkg3/zebra_inventory.py"]
        assert zebra and zebra[0].unindexed and "count_striped_animals" in zebra[0].text
        assert any(not hit.unindexed for hit in answer.hits)  # the stored part answers too
    finally:
        os.kill(process.pid, signal.SIGCONT)
    process.communicate(timeout=600)
    assert process.returncode == 0
    done = index.answer("how many zebras are in the inventory", 3)
    assert not done.partial and done.note is None and not index.pending_path.exists()
    assert done.hits[0].path == "pkg3/zebra_inventory.py" and not done.hits[0].unindexed


def test_a_cut_off_pass_resumes_without_re_embedding_the_files_it_stored(tmp_path: Path):
    workspace = _workspace(tmp_path / "ws")
    process = _start(workspace, tmp_path / "index")
    progress = _wait_for_progress(process, 6)
    process.kill()  # as the activity does when the task ends mid-pass
    process.communicate()
    index = CodeIndex(tmp_path / "index", workspace)
    left = json.loads(index.pending_path.read_text())["files"]
    stored = FILES + 1 - len(left)
    assert progress["files_done"] <= stored < FILES + 1
    partial = index.answer("split a comma separated ledger line", 5)
    assert partial.partial and f"holds {stored} of {FILES + 1}" in partial.note
    # the pass is dead: the note must not say one is running (it said so forever)
    assert "runs in the background" not in partial.note
    assert "the last indexing pass stopped before it finished" in partial.note

    report = index.update()
    assert report.files_unchanged == stored  # kept, by their content hashes
    assert report.files_indexed == FILES + 1 - stored == len(left)
    expected = sum(len(chunk_source(path.relative_to(workspace).as_posix(), path.read_text(),
                                    embedder().count_tokens))
                   for path in workspace.rglob("*.py"))
    assert report.chunks_total == expected  # each file's chunks once: none twice
    assert not index.answer("how many zebras are in the inventory", 3).partial


def test_a_pass_runs_below_the_searches_beside_it():
    """The pass lowers its own CPU priority, so searches on the same cores stay fast."""
    import subprocess
    import sys

    from refloop.search.passes import PASS_NICENESS

    done = subprocess.run(
        [sys.executable, "-c", "import os\nfrom refloop.search.index import lower_priority\n"
         "before = os.nice(0)\nlower_priority()\nprint(before, os.nice(0))"],
        capture_output=True, text=True, check=True)
    before, after = map(int, done.stdout.split())
    assert after == min(19, before + PASS_NICENESS)


def test_a_pass_embeds_with_one_thread_per_cpu_unless_told(monkeypatch):
    from refloop.search.passes import pass_threads

    assert pass_threads(3) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5})
    assert pass_threads(0) == 3


def test_a_pass_refuses_a_negative_thread_count_before_it_starts(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "refloop.search.index", str(tmp_path), str(tmp_path / "index"),
         "--threads", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--threads must be 0 or more" in done.stderr
    assert not (tmp_path / "index").exists()  # nothing was opened or written


def test_the_index_activity_passes_the_thread_setting(tmp_path: Path):
    from activities.workspace_activities import index_launch

    argv, _, _ = index_launch(tmp_path, tmp_path / "index", "minilm-int8", 2, environ={})
    assert argv[-2:] == ["--threads", "2"]
