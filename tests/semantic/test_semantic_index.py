"""The index on a real embedding model and LanceDB: known answers, incremental updates."""

from __future__ import annotations

from pathlib import Path

from refloop.contract.activity_io import RunToolInput
from refloop.search.index import CodeIndex
from refloop.search.passes import unchanged_report
from refloop.settings import Settings
from refloop.tools.registry import execute_tool
from tests.semantic.conftest import QUERIES


def _hit_matches(hit, expected: dict) -> bool:
    return hit.path == expected["path"] and f"def {expected['symbol']}" in hit.text or (
        hit.path == expected["path"] and f"class {expected['symbol']}" in hit.text)


def test_the_retry_policy_question_finds_the_function(repo: Path, tmp_path: Path):
    index = CodeIndex(tmp_path / "index", repo)
    progress = []
    report = index.update(progress.append)
    assert report.files_seen == report.files_indexed == 14 and report.chunks_total > 14
    assert progress[-1]["files_done"] == 14
    top = index.search("where is the retry policy configured", 5)[0]
    assert top.path == "net/retries.py"
    assert "def default_retry_policy" in top.text
    assert top.start_line <= 14 <= top.end_line and 0 < top.score <= 1


def test_recall_at_5_on_the_labelled_queries(repo: Path, tmp_path: Path):
    index = CodeIndex(tmp_path / "index", repo)
    index.update()
    found = sum(any(_hit_matches(h, q) for h in index.search(q["query"], 5)) for q in QUERIES)
    assert found / len(QUERIES) >= 0.9, f"recall@5 {found}/{len(QUERIES)}"


def test_reindex_touches_only_changed_files(repo: Path, tmp_path: Path):
    (repo / "utils" / "__init__.py").write_text("")  # no chunks, yet never re-embedded
    index = CodeIndex(tmp_path / "index", repo)
    first = index.update()
    assert unchanged_report(tmp_path / "index", repo).files_unchanged == 15
    (repo / "utils" / "text.py").write_text(
        (repo / "utils" / "text.py").read_text() + "\n\ndef shout(s):\n    return s.upper()\n")
    (repo / "utils" / "colors.py").write_text("def hex_to_rgb(value):\n    return value\n")
    (repo / "mail" / "sender.py").unlink()
    assert unchanged_report(tmp_path / "index", repo) is None  # the cache sees the change
    second = index.update()
    assert (second.files_indexed, second.files_removed, second.files_unchanged) == (2, 1, 13)
    assert second.chunks_embedded < first.chunks_embedded / 3
    paths = {h.path for h in index.search("send an email to a new user", 10)}
    assert "mail/sender.py" not in paths
    assert index.search("convert a hex colour to rgb", 1)[0].path == "utils/colors.py"
    assert index.update().files_indexed == 0


def test_hits_only_name_files_still_in_the_workspace(repo: Path, tmp_path: Path):
    index = CodeIndex(tmp_path / "index", repo)
    index.update()
    (repo / "net" / "retries.py").unlink()  # not re-indexed yet
    hits = index.search("where is the retry policy configured", 5)
    assert hits and all((repo / h.path).is_file() for h in hits)


async def test_the_tool_returns_hits_and_word_matches_before_anything_is_indexed(repo: Path,
                                                                      tmp_path: Path):
    settings = Settings(refloop_data_dir=tmp_path / "data")
    call = RunToolInput(call_id="c1", name="search_semantic", workspace=str(repo),
                        arguments={"query": "how are user passwords hashed", "limit": 3})
    empty = await execute_tool(call, settings)  # nothing indexed yet: words at once
    assert empty.ok and empty.data["partial"] and empty.output.startswith(
        "partial: the index holds 0 of 14 files so far")
    assert empty.data["hits"] and all(hit["unindexed"] for hit in empty.data["hits"])
    assert "auth/passwords.py" in {hit["path"] for hit in empty.data["hits"]}
    assert "(unindexed, word match" in empty.output
    CodeIndex(settings.index_dir, repo).update()
    result = await execute_tool(call, settings)
    assert result.ok and len(result.data["hits"]) == 3 and not result.data["partial"]
    first = result.data["hits"][0]
    assert first["path"] == "auth/passwords.py" and set(first) == {
        "path", "start_line", "end_line", "text", "score", "unindexed"}
    assert result.output.startswith(f"auth/passwords.py:{first['start_line']}-")
    assert "def hash_password" in result.output
    bad = await execute_tool(call.model_copy(update={"arguments": {"query": ""}}), settings)
    assert not bad.ok and bad.error.startswith("E_INVALID_ARGS")


def test_an_index_of_an_older_chunker_is_dropped_when_the_current_one_is_made(tmp_path: Path):
    from refloop.search.index import SCHEMA_VERSION, manifest_path, table_name
    from refloop.search.runtime import import_lancedb

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "colors.py").write_text("def hex_to_rgb(value):\n    return value\n")
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    db = import_lancedb().connect(str(index_dir))
    old = table_name(workspace, schema=SCHEMA_VERSION - 1)
    db.create_table(old, data=[{"path": "colors.py", "start_line": 1}])
    (index_dir / f"{old}.manifest.json").write_text('{"files": {}, "chunks": 1}')
    other_workspace = table_name(tmp_path / "elsewhere", schema=SCHEMA_VERSION - 1)
    db.create_table(other_workspace, data=[{"path": "x.py", "start_line": 1}])

    CodeIndex(index_dir, workspace).update()

    names = set(db.list_tables().tables)
    assert old not in names and not (index_dir / f"{old}.manifest.json").exists()
    assert table_name(workspace) in names and manifest_path(index_dir, workspace).exists()
    assert other_workspace in names  # only this workspace's old index goes


def test_a_long_lived_handle_sees_other_writers_and_a_wiped_index(repo: Path, tmp_path: Path):
    """Tables are opened once per process: a search still sees rows another process (here a
    pass of its own) stored after it opened the table, and an index dir wiped and rebuilt."""
    import shutil
    import subprocess
    import sys

    reader = CodeIndex(tmp_path / "index", repo)
    reader.update()
    assert reader.search("convert a hex colour to rgb", 1)[0].path != "utils/colors.py"
    (repo / "utils" / "colors.py").write_text("def hex_to_rgb(value):\n    return value\n")
    subprocess.run([sys.executable, "-m", "refloop.search.index", str(repo),
                    str(tmp_path / "index")], check=True, capture_output=True)
    assert reader.search("convert a hex colour to rgb", 1)[0].path == "utils/colors.py"
    shutil.rmtree(tmp_path / "index")
    (repo / "utils" / "colors.py").unlink()
    assert reader.search("convert a hex colour to rgb", 1) == []
    CodeIndex(tmp_path / "index", repo).update()
    assert reader.search("where is the retry policy configured", 1)[0].path == \
        "net/retries.py"


def test_a_hit_in_a_long_method_shows_its_class_and_definition_line(tmp_path: Path):
    """A body window deep in a long method used to come back without its `def` line (the
    model had to guess what it was reading): the excerpt starts with the class and the
    signature, then the matched lines, within the tool's budget."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    body = "".join(f"        total_{n} = self.weigh({n})\n" for n in range(150))
    (workspace / "ledger.py").write_text(
        "class Ledger:\n    \"\"\"Books of the shop.\"\"\"\n\n"
        "    def reconcile(self, entries):\n" + body +
        "        overdue_invoices = [e for e in entries if e.overdue]\n"
        "        send_reminder_letters(overdue_invoices)\n"
        "        return total_1\n")
    index = CodeIndex(tmp_path / "index", workspace)
    index.update()
    hit = next(h for h in index.search("send reminder letters for overdue invoices", 3,
                                       chars=3_000)
               if h.start_line == 4)
    lines = hit.text.splitlines()
    assert lines[0] == "1\tclass Ledger:" and lines[1] == "...", lines[:3]
    assert "4\t    def reconcile(self, entries):" in lines
    assert any("send_reminder_letters(overdue_invoices)" in line for line in lines)
    assert len(hit.text) < 3_000 // 3
