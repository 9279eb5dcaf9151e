"""An indexing pass's bookkeeping: which files it covers, what it stores of each, batch by
batch, when it rebuilds the full-text index, and the manifest it leaves for the next one.

Apart from `refloop.search.index` (the table and its queries) so that what a pass stores,
and what it vouches for afterwards, reads in one place; and so that `unchanged_report`
stays cheap to import where a worker decides whether a pass is needed at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from refloop.search.chunks import MODEL_WINDOW, chunk_source, identifier_terms
from refloop.search.runtime import API_PREFIX, DEFAULT_MODEL
from refloop.search.symbols import (
    CODE_SUFFIXES,
    TEXT_SUFFIXES,
    iter_sources,
    read_source,
    read_source_bytes,
)

MAX_INDEXED_FILE_BYTES = 300_000
# Chunks per batch: embedded, stored and reported together. A pass cut off loses at most
# the batch in progress (every stored file is kept: the next pass skips it by its hash),
# and the pass's memory is bounded by it, not by the workspace.
EMBED_BATCH_CHUNKS = 256
# The full-text index is rebuilt once the rows stored since its last build exceed this
# share of the rows it covers (never more often than TEXT_INDEX_MIN_NEW rows): between
# builds LanceDB searches the new rows without the index, so every batch is searchable
# by its words as soon as it is stored, and the rebuilds of a long pass cost O(rows).
TEXT_INDEX_GROWTH = 0.25
TEXT_INDEX_MIN_NEW = 2_000
SCHEMA_VERSION = 7  # fused attention, shorter headers (6: split down-projections; 5: float
# ones; 4: float products; 3: overlapping windows; 2: token-sized)

if TYPE_CHECKING:  # imported where used: a warm-up started first thing need not wait for it
    from refloop.contract.task import IndexReport


@dataclass(frozen=True)
class SourceFile:
    path: str
    absolute: Path
    digest: str


def table_name(workspace: Path, model: str = DEFAULT_MODEL, schema: int = SCHEMA_VERSION
               ) -> str:
    key = f"{workspace.resolve()}\0{model}\0{schema}"
    if model.startswith(API_PREFIX):  # an endpoint's documents as its settings form them
        from refloop.search.embedders import document_form, endpoint_settings

        if form := document_form(endpoint_settings()):
            key += f"\0{form}"
    return "ws_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def sources(workspace: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of each file the index covers."""
    return iter_sources(workspace, CODE_SUFFIXES | TEXT_SUFFIXES, MAX_INDEXED_FILE_BYTES)


def scan(workspace: Path) -> list[SourceFile]:
    """The files the index covers, with content hashes."""
    found = []
    for relative, path in sources(workspace):
        data = read_source_bytes(path, MAX_INDEXED_FILE_BYTES)
        if data is not None:
            found.append(SourceFile(relative, path, hashlib.sha256(data).hexdigest()))
    return found


def manifest_path(index_dir: Path, workspace: Path, model: str = DEFAULT_MODEL) -> Path:
    return index_dir / f"{table_name(workspace, model)}.manifest.json"


def read_manifest(index_dir: Path, workspace: Path, model: str = DEFAULT_MODEL) -> dict:
    """What the last complete pass saw: {"files": {path: hash}, "chunks": n}, or {}."""
    try:
        return json.loads(manifest_path(index_dir, workspace, model).read_text())
    except (OSError, ValueError):
        return {}


def unchanged_report(index_dir: Path, workspace: Path,
                     model: str = DEFAULT_MODEL) -> IndexReport | None:
    """A report without loading anything heavy when the last pass saw exactly these files
    (the manifest is a cache; the table stays the truth)."""
    from refloop.contract.task import IndexReport

    indexed = read_manifest(index_dir, workspace, model)
    if not indexed:
        return None
    files = scan(workspace)
    if {f.path: f.digest for f in files} != indexed.get("files"):
        return None
    return IndexReport(files_seen=len(files), files_unchanged=len(files),
                       chunks_total=indexed.get("chunks", 0), note="up to date")


def batches(files: list[SourceFile], model: str, batch_chunks: int
            ) -> Iterator[tuple[list[SourceFile], list[dict]]]:
    """Whole files with their rows, about `batch_chunks` chunks at a time (a file's
    chunks are never split between batches, so a stored file is a whole one)."""
    from refloop.search.embedders import embedder

    loaded = embedder(model)
    batch: list[SourceFile] = []
    rows: list[dict] = []
    for source in files:
        batch.append(source)
        rows += file_rows(source, loaded.count_tokens, loaded.window)
        if len(rows) >= batch_chunks:
            yield batch, rows
            batch, rows = [], []
    if batch:
        yield batch, rows


def file_rows(source: SourceFile, count_tokens, window: int = MODEL_WINDOW) -> list[dict]:
    text = read_source(source.absolute)
    if text is None:
        return []
    return [{
        "path": source.path, "start_line": chunk.start_line,
        "end_line": chunk.end_line, "symbol": chunk.symbol, "part": chunk.part,
        "text": chunk.text, "file_hash": source.digest,
        # a summary row also carries the words of the lines no chunk embeds: the
        # full-text side covers whole definitions
        "lexical": identifier_terms(f"{chunk.header}\n{chunk.rest}" if chunk.rest
                                    else chunk.document),
        "document": chunk.document,
    } for chunk in chunk_source(source.path, text, count_tokens, window)]


def grow_text_index(table, covered: int) -> int:
    """Rebuild the full-text index when the rows added since its last build have grown
    past TEXT_INDEX_GROWTH of it (the first batch builds it); the rows it covers."""
    rows = table.count_rows()
    if covered and rows - covered < max(TEXT_INDEX_MIN_NEW, TEXT_INDEX_GROWTH * covered):
        return covered
    refresh_text_index(table)
    return rows


def refresh_text_index(table) -> None:
    """LanceDB's native full-text index over the identifier-split column (stemmed,
    stop words out); rebuilt after a change, which costs milliseconds per thousand
    chunks."""
    if table.count_rows() == 0:
        return
    with warnings.catch_warnings():  # its successor's sync form only indexes vectors
        warnings.simplefilter("ignore", DeprecationWarning)
        table.create_fts_index("lexical", replace=True, use_tantivy=False, stem=True,
                               remove_stop_words=True, with_position=False)


def path_filter(paths: list[str]) -> str:
    quoted = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
    return f"path IN ({quoted})"


# A pass runs beside the worker's searches on the same cores: below them, it takes only
# what they leave (FastAPI query p95 with an httpx pass beside it, load 3 on 2 cores: 81 ms
# at equal priority, 43 ms with the pass at 10).
PASS_NICENESS = 10


def pass_threads(requested: int) -> int:
    """A pass's embedding threads: `requested`, or with 0 one per CPU it may run on."""
    if requested > 0:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call here
        return max(1, os.cpu_count() or 1)


def lower_priority(niceness: int = PASS_NICENESS) -> None:
    """Lower this process's CPU priority by `niceness` (no-op where not allowed)."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(niceness)
