"""Code search: hybrid retrieval (vectors and full text, fused) over chunks in LanceDB.

Chunks come from `refloop.search.chunks`, each mapped back to its definition, so results
are merged per definition. The lexical side is LanceDB's full-text index over
identifier-split text (whole definitions); the vector side is all-MiniLM-L6-v2 (its int8
ONNX build by default), fused per definition by score (`refloop.search.fusion`). One table
per workspace and model under the index dir; a pass stores whole files batch by batch
(`refloop.search.passes`), skips every file whose content hash it holds (a cut-off pass
resumes where it stopped), keeps the full-text side current per batch, and lists the
files it has yet to store, so a search meanwhile answers from both and says what it
misses (`refloop.search.coverage`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from refloop.search.chunks import identifier_terms
from refloop.search.coverage import (
    Pending,
    pending_note,
    read_pending,
    scan_files,
    scan_slots,
    write_pending,
)
from refloop.search.excerpt import excerpt
from refloop.search.fusion import (
    CANDIDATES,
    RRF_TEXT_WEIGHTS,
    SHAPE_TEXT_WEIGHTS,
    fuse_by_definition,
    fuse_scores,
    fuse_shapes,
    merge_by_definition,
    text_weight,
)
from refloop.search.passes import (
    EMBED_BATCH_CHUNKS,
    SCHEMA_VERSION,
    batches,
    grow_text_index,
    lower_priority,
    manifest_path,
    pass_threads,
    path_filter,
    read_manifest,
    refresh_text_index,
    scan,
    sources,
    table_name,
)

# Importable from here as before (the worker, the tests).
from refloop.search.runtime import (
    API_PREFIX,
    DEFAULT_MODEL,
    SemanticUnavailable,
    embed,
    import_lancedb,
    missing_extra,
)
from refloop.search.symbols import read_source

if TYPE_CHECKING:  # imported where used: a warm-up started first thing need not wait for them
    from refloop.contract.task import IndexReport, SearchAnswer, SemanticHit

DIMENSIONS = 384
COLUMNS = ["path", "start_line", "end_line", "symbol", "part", "text"]
# What the hits of one answer may show the model, all together (the tool passes its own
# budget): each hit gets its share, its definition line first (`refloop.search.excerpt`).
HITS_CHARS = 7_000
HIT_HEADER_CHARS = 80  # a hit's "path:start-end (score ...)" line in the tool's output

Progress = Callable[[dict], None]


class CodeIndex:
    """The index of one workspace; safe to share between threads and worker processes
    on one host (a lock file serialises writers)."""

    def __init__(self, index_dir: Path, workspace: Path, model: str = DEFAULT_MODEL) -> None:
        reason = missing_extra(model)
        if reason:
            raise SemanticUnavailable(reason)
        self.workspace = workspace.resolve()
        self.index_dir = index_dir
        self.model = model
        self.table_name = table_name(self.workspace, model)

    # ------------------------------------------------------------ storage

    def _db(self):
        return _connection(self.index_dir)

    def _table(self, create: bool):
        """The table, opened once per process (a handle checks for newer versions on every
        read, so it sees other processes' writes; reopening per query cost more than the
        query)."""
        import pyarrow as pa

        key = (str(self.index_dir.resolve()), self.table_name)
        with _OPEN_LOCK:
            table = _OPEN_TABLES.get(key)
            if table is not None and not (self.index_dir / f"{self.table_name}.lance").is_dir():
                del _OPEN_TABLES[key]  # the index dir was wiped: open afresh
                table = None
        if table is not None:
            return table
        db = self._db()
        try:
            table = db.open_table(self.table_name)
        except ValueError:  # not created yet
            if not create:
                return None
        else:
            with _OPEN_LOCK:
                return _OPEN_TABLES.setdefault(key, table)
        self._drop_older_schemas(db)
        schema = pa.schema([
            pa.field("path", pa.string()),
            pa.field("start_line", pa.int32()),
            pa.field("end_line", pa.int32()),
            pa.field("symbol", pa.string()),
            pa.field("part", pa.string()),
            pa.field("text", pa.string()),
            pa.field("lexical", pa.string()),
            pa.field("file_hash", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), self._dimensions())),
        ])
        table = db.create_table(self.table_name, schema=schema, exist_ok=True)
        with _OPEN_LOCK:
            return _OPEN_TABLES.setdefault(key, table)

    def _dimensions(self) -> int:
        """The vectors' width: the packaged models' is known; an endpoint's model says its
        own (its first answer)."""
        if not self.model.startswith(API_PREFIX):
            return DIMENSIONS
        from refloop.search.embedders import embedder

        return embedder(self.model).dimensions

    def _drop_older_schemas(self, db) -> None:
        """An index of this workspace built by an older chunker is never read again: it goes
        (table and manifest) when the current one is made, so upgrades leave no dead
        copies behind."""
        for schema in range(1, SCHEMA_VERSION):
            old = table_name(self.workspace, self.model, schema)
            db.drop_table(old, ignore_missing=True)
            (self.index_dir / f"{old}.manifest.json").unlink(missing_ok=True)

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
        manifest = read_manifest(self.index_dir, self.workspace, self.model)
        return {**manifest.get("files", {}), **in_table}

    def update(self, progress: Progress | None = None,
               batch_chunks: int = EMBED_BATCH_CHUNKS, threads: int = 1) -> IndexReport:
        """Embed new and changed files, drop deleted ones; heartbeat-friendly progress.
        Whole files are stored batch by batch, and after each batch the files still to
        store are written down (`pending_path`), so a search during the pass answers from
        what is stored and says what it does not cover yet."""
        from refloop.contract.task import IndexReport

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
                table.delete(path_filter(stale))
            pending = [f.path for f in changed]
            write_pending(self.pending_path, pending, len(files))
            covered = table.count_rows() if self._has_text_index(table) else 0
            embedded = done = 0
            for batch, rows in batches(changed, self.model, batch_chunks):
                if rows:
                    vectors = embed([row.pop("document") for row in rows], self.model, threads)
                    for row, vector in zip(rows, vectors, strict=True):
                        row["vector"] = vector
                    table.add(rows)
                    covered = grow_text_index(table, covered)
                embedded += len(rows)
                done += len(batch)
                write_pending(self.pending_path, pending[done:], len(files))
                if progress:
                    progress({"files_done": done, "files_to_index": len(changed),
                              "chunks_embedded": embedded})
            total = table.count_rows()
            if stale or (changed and covered != total):
                refresh_text_index(table)
            manifest = {"files": {f.path: f.digest for f in files}, "chunks": total}
            manifest_path(self.index_dir, self.workspace, self.model).write_text(
                json.dumps(manifest))
            self.pending_path.unlink(missing_ok=True)
            return IndexReport(
                files_seen=len(files),
                files_indexed=len(changed),
                files_unchanged=len(files) - len(changed),
                files_removed=len(removed),
                chunks_embedded=embedded,
                chunks_total=total,
                seconds=round(time.monotonic() - began, 3),
            )

    @property
    def pending_path(self) -> Path:
        return self.index_dir / f"{self.table_name}.pending.json"

    # ------------------------------------------------------------ search

    def chunk_count(self) -> int:
        table = self._table(create=False)
        return table.count_rows() if table is not None else 0

    def answer(self, query: str, limit: int = 5, chars: int = HITS_CHARS) -> SearchAnswer:
        """`search`, and while a pass has files left to store (or none has stored any),
        those files scanned for the query's words: their hits (`unindexed`) take a share
        of the `limit` in proportion to the files not indexed, and a note says what the
        answer does not cover yet."""
        from refloop.contract.task import SearchAnswer, SemanticHit

        pending = read_pending(self.pending_path)
        stored = (self.index_dir / f"{self.table_name}.lance").is_dir()
        if pending is None and not stored and not self._indexed_before():
            files = [relative for relative, _ in sources(self.workspace)]
            pending = Pending(tuple(files), len(files))
        if pending is None or not pending.files:
            return SearchAnswer(hits=self.search(query, limit, chars=chars))
        # no table yet: the words alone, without waiting for LanceDB to import
        indexed = self.search(query, limit, chars=chars) if stored else []
        scanned, read = scan_files(self.workspace, pending.files, query, limit)
        slots = scan_slots(limit, pending, len(indexed), len(scanned))
        hits = indexed[: limit - slots] + [
            SemanticHit(path=hit.path, start_line=hit.start_line, end_line=hit.end_line,
                        text=hit.text, score=hit.score, unindexed=True)
            for hit in scanned[:slots]]
        # a list on disk: a pass wrote it, and it is still running or was killed
        running = self._pass_running() if self.pending_path.exists() else True
        return SearchAnswer(hits=hits, partial=True, note=pending_note(pending, read, running))

    def _pass_running(self) -> bool:
        """Whether a pass holds the writer lock now (a killed one left its pending list
        behind but no lock: the kernel drops a dead process's flock)."""
        try:
            handle = open(self.index_dir / f"{self.table_name}.lock", "rb")  # noqa: SIM115
        except OSError:
            return False
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False

    def _indexed_before(self) -> bool:
        """A finished pass left a manifest (the workspace may simply hold no code)."""
        return manifest_path(self.index_dir, self.workspace, self.model).exists()

    def search(self, query: str, limit: int = 5, mode: str = "hybrid",
               chars: int = HITS_CHARS) -> list[SemanticHit]:
        """The best definitions (or text windows) for `query`, one hit each with its whole
        line range, among what is indexed so far and still in the workspace, each showing
        its share of `chars`. `mode` "vector" or "text" uses one side only (for
        evaluation)."""
        from refloop.contract.task import SemanticHit

        table = self._table(create=False)
        if table is None:
            return []
        rows = self._ranked_chunks(table, query, mode)
        inside: dict[str, bool] = {}  # a file is checked once, and only if it ranks
        present = (row for row in merge_by_definition(rows, len(rows))
                   if inside.setdefault(row["path"], self._inside(row["path"])))
        budget = max(chars // limit - HIT_HEADER_CHARS, 200)
        hits = []
        for row in itertools.islice(present, limit):
            hits.append(SemanticHit(
                path=row["path"], start_line=row["start_line"], end_line=row["end_line"],
                text=self._hit_text(row, budget), score=round(float(row["_score"]), 4)))
        return hits

    def _ranked_chunks(self, table, query: str, mode: str = "hybrid") -> list[dict]:
        """Chunks ranked for `query`: "hybrid" fuses the vector list and LanceDB's full-text
        list per definition by the shape of their scores (`fuse_shapes`); "score" by
        score (`fuse_scores`, the fusion before it); "rrf" fuses them per definition by
        weighted reciprocal rank; "lance-rrf" lets LanceDB's hybrid query and RRF reranker
        fuse per chunk; "vector" and "text" use one side. Without a text index (or words
        in the query) every mode falls back to vectors."""
        lexical = bool(identifier_terms(query)) and self._has_text_index(table)
        if mode == "text" and lexical:
            return self._text_side(table, query)
        if mode in ("vector", "text") or not lexical:
            return self._vector_side(table, query)
        if mode == "lance-rrf":
            from lancedb.rerankers import RRFReranker

            rows = (table.search(query_type="hybrid", fts_columns="lexical")
                    .vector(embed([query], self.model, role="query")[0])
                    .text(identifier_terms(query))
                    .distance_type("cosine").rerank(RRFReranker()).select(COLUMNS)
                    .limit(CANDIDATES).to_list())
            return [{**row, "_score": row["_relevance_score"]} for row in rows]
        weights = {"rrf": RRF_TEXT_WEIGHTS, "score": None}.get(mode, SHAPE_TEXT_WEIGHTS)
        weight = text_weight(query, weights)
        if not weight:  # prose in the "score" mode: the words would not move the ranking
            return self._vector_side(table, query)
        # The full-text query runs while the query is embedded and the vectors searched
        # (both release the GIL): the hybrid costs little more than the vectors alone.
        text_future = _side_pool().submit(self._text_side, table, query)
        vector_rows = self._vector_side(table, query)
        text_rows = text_future.result()
        if mode == "rrf":
            return fuse_by_definition([vector_rows, text_rows], [1.0, weight])
        if mode == "score":
            return fuse_scores(vector_rows, text_rows, weight)
        return fuse_shapes(vector_rows, text_rows, weight)

    def _vector_side(self, table, query: str) -> list[dict]:
        rows = (table.search(embed([query], self.model, role="query")[0])
                .distance_type("cosine")
                .select([*COLUMNS, "_distance"]).limit(CANDIDATES).to_list())
        return [{**row, "_score": 1.0 - float(row["_distance"])} for row in rows]

    @staticmethod
    def _text_side(table, query: str) -> list[dict]:
        return (table.search(identifier_terms(query), query_type="fts", fts_columns="lexical")
                .select([*COLUMNS, "_score"]).limit(CANDIDATES).to_list())

    @staticmethod
    def _has_text_index(table) -> bool:
        """Whether the full-text index exists (once seen, remembered for the handle: it is
        only ever replaced, never dropped)."""
        if id(table) in _TEXT_INDEXED:
            return True
        try:
            found = any("lexical" in index.columns for index in table.list_indices())
        except Exception:  # an index listing problem only costs the lexical side
            return False
        if found:
            _TEXT_INDEXED.add(id(table))
        return found

    def _hit_text(self, row: dict, budget: int) -> str:
        """What the model reads: the definition from the file as it is now, numbered, its
        definition line (and its classes' for a method) first, within `budget`
        characters; the stored chunk if the file no longer has those lines."""
        text = read_source(self.workspace / row["path"])
        lines = text.splitlines() if text is not None else []
        if 0 < row["start_line"] <= row["end_line"] <= len(lines):
            return excerpt(lines, row["start_line"], row["end_line"], row["symbol"],
                           row["text"], budget)
        symbol = f"{row['symbol']}  " if row["symbol"] else ""
        return f"{symbol}({row['part']} of lines {row['start_line']}-{row['end_line']})\n" \
               f"{row['text'][:budget]}"

    def _inside(self, relative: str) -> bool:
        path = (self.workspace / relative).resolve()
        return path.is_relative_to(self.workspace) and path.is_file()


_OPEN_LOCK = threading.Lock()
_CONNECTIONS: dict[str, object] = {}
_OPEN_TABLES: dict[tuple[str, str], object] = {}  # (index dir, table name) -> handle
_TEXT_INDEXED: set[int] = set()  # ids of handles whose table has its full-text index


def _connection(index_dir: Path):
    """One LanceDB connection per index dir and process; its tables re-read the latest
    version on every query (`read_consistency_interval` 0), so a long-lived handle sees
    what another process stored."""
    from datetime import timedelta

    lancedb = import_lancedb()
    index_dir.mkdir(parents=True, exist_ok=True)
    key = str(index_dir.resolve())
    with _OPEN_LOCK:
        if key not in _CONNECTIONS:
            _CONNECTIONS[key] = lancedb.connect(key, read_consistency_interval=timedelta(0))
        return _CONNECTIONS[key]


_SIDE_POOL: list[ThreadPoolExecutor] = []
_SIDE_POOL_LOCK = threading.Lock()


def _side_pool() -> ThreadPoolExecutor:
    """The process's threads for the full-text side of hybrid queries."""
    with _SIDE_POOL_LOCK:
        if not _SIDE_POOL:
            _SIDE_POOL.append(ThreadPoolExecutor(2, thread_name_prefix="refloop-search"))
        return _SIDE_POOL[0]


def main(argv: list[str] | None = None) -> int:
    """`python -m refloop.search.index WORKSPACE INDEX_DIR [MODEL [BATCH_CHUNKS]]
    [--threads N]`: one indexing pass in its own process (the worker stays responsive),
    at lower priority; progress and the report as JSON lines. MODEL defaults to the one the
    worker searches with: REFLOOP_EMBEDDINGS_MODEL at REFLOOP_EMBEDDINGS_URL when that is
    set, else the packaged model."""
    parser = argparse.ArgumentParser(prog="python -m refloop.search.index",
                                     description="One indexing pass of a workspace.")
    parser.add_argument("workspace", type=Path)
    parser.add_argument("index_dir", type=Path)
    parser.add_argument("model", nargs="?", default=None,
                        help="minilm-int8, minilm or api:NAME (default: the settings')")
    parser.add_argument("batch_chunks", nargs="?", type=int, default=EMBED_BATCH_CHUNKS)
    parser.add_argument("--threads", type=int, default=0,
                        help="embedding threads (0: one per CPU this process may use)")
    args = parser.parse_args(argv)
    if args.threads < 0 or args.batch_chunks < 1:
        parser.error("--threads must be 0 or more, BATCH_CHUNKS 1 or more")
    lower_priority()
    index = CodeIndex(args.index_dir, args.workspace, args.model or settings_model())
    report = index.update(lambda details: print(json.dumps({"progress": details}), flush=True),
                          args.batch_chunks, pass_threads(args.threads))
    print(json.dumps({"report": report.model_dump(mode="json")}), flush=True)
    return 0


def settings_model() -> str:
    """The model the settings choose, said on stderr; an endpoint model named without its
    endpoint is an error, never quietly the packaged model's index."""
    from refloop.search.embedders import endpoint_settings

    settings = endpoint_settings()
    named = "refloop_embeddings_model" in settings.model_fields_set
    if named and not settings.refloop_embeddings_url:
        raise SystemExit("REFLOOP_EMBEDDINGS_MODEL names a model but REFLOOP_EMBEDDINGS_URL "
                         "is unset: set the endpoint, or unset the model to index with the "
                         f"packaged {settings.refloop_embedding_model}")
    print(f"indexing with {settings.search_model}", file=sys.stderr, flush=True)
    return settings.search_model


if __name__ == "__main__":
    sys.exit(main())
