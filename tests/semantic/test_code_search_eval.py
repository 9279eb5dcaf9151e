"""The code-search eval on third-party code (a small slice of starlette as installed):
definition-level recall of search_semantic beside BM25 and grep, in one run; chunks
within the model's window; a fresh worker answers its first query fast."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

from bench.code_search_eval import (
    bm25_ranker,
    copy_corpus,
    corpus_units,
    grep_ranker,
    index_ranker,
    load_queries,
    resolve,
    score,
)
from refloop.search import chunks as code_chunks
from refloop.search import embedders, passes
from refloop.search import index as semantic
from refloop.search.chunks import MODEL_WINDOW
from refloop.search.embedders import WINDOW, embedder
from refloop.search.fusion import SHAPE_TEXT_WEIGHTS, text_weight
from refloop.search.index import CodeIndex
from refloop.search.runtime import start_warm_up


def _index_key(package: str, files: list[str]) -> str:
    """Changes whenever the indexed text or vectors could: the chunker, the embedder, the
    index code, the package's and LanceDB's versions, the slice."""
    digest = hashlib.sha256(json.dumps([package, files, version(package), version("lancedb")])
                            .encode())
    for module in (code_chunks, embedders, semantic, passes):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def small_eval(request, tmp_path_factory):
    """The small corpus and its index, kept in pytest's cache between runs while nothing
    that shapes the index has changed (the index is incremental by content hash, so a
    reused one is still checked against the files)."""
    package, files, queries = load_queries(small=True)
    key = _index_key(package, files)
    cache = getattr(request.config, "cache", None)
    root = cache.mkdir("code-search-eval") if cache else tmp_path_factory.mktemp("cse")
    for stale in root.iterdir():
        if stale.name != key:
            shutil.rmtree(stale, ignore_errors=True)
    work = root / key
    corpus = work / "corpus"
    if not corpus.is_dir():
        staging = Path(tempfile.mkdtemp(dir=root))
        copy_corpus(package, files, staging / "corpus")
        work.mkdir(exist_ok=True)
        (staging / "corpus").rename(corpus)
        shutil.rmtree(staging)
    resolve(queries, corpus)
    index = CodeIndex(work / "index", corpus)
    index.update()
    return corpus, queries, index


def test_hybrid_search_beats_bm25_and_grep_at_definition_level(small_eval):
    corpus, queries, index = small_eval
    assert len(queries) >= 15
    chunks, units = corpus_units(corpus, embedder().count_tokens)
    hybrid = score(index_ranker(index, "hybrid"), queries)
    bm25 = score(bm25_ranker(chunks), queries)
    grep = score(grep_ranker(units), queries)
    report = {name: (s.recall_at_1, s.recall_at_5, round(s.mrr, 2))
              for name, s in (("hybrid", hybrid), ("bm25", bm25), ("grep", grep))}
    assert hybrid.recall_at_5 >= 0.9, (report, hybrid.misses)
    assert hybrid.recall_at_5 > bm25.recall_at_5 and hybrid.recall_at_5 > grep.recall_at_5, report
    assert hybrid.mrr > bm25.mrr and hybrid.mrr > grep.mrr, report


@pytest.mark.slow  # indexes the slice from nothing in a child process
def test_the_scale_table_on_the_small_corpus(tmp_path: Path):
    """`make test`'s version of the bench's scale table: the small slice indexed from
    nothing in a child process, as the index activity runs it, and measured from outside;
    a search answers before the pass ends; recall beside BM25 over whole definitions."""
    from bench.code_search_scale import HEADER, measure

    package, files, queries = load_queries(small=True)
    corpus = copy_corpus(package, files, tmp_path / "corpus")
    resolve(queries, corpus)
    run = measure("starlette (small)", corpus, tmp_path / "index", queries,
                  embedder().count_tokens)
    assert (run.files, run.chunks) == (len(files), CodeIndex(tmp_path / "index",
                                                             corpus).chunk_count())
    assert run.lines > 1000 and run.cpu_s > 0 and 0 < run.peak_rss_mb < 1000
    assert run.first_result_s is not None and run.first_result_s < run.wall_s
    assert run.hybrid.recall_at_5 >= 0.9 and run.hybrid.recall_at_5 > run.bm25.recall_at_5
    assert run.tool.recall_at_5 >= run.hybrid.recall_at_5  # every excerpt shows its def line
    assert len(run.row().split("|")) == len(HEADER.splitlines()[0].split("|"))


def test_hits_are_whole_definitions_one_each(small_eval):
    corpus, _, index = small_eval
    hits = index.search("keep per-user data in a signed browser cookie between requests", 10)
    ranges = [(h.path, h.start_line, h.end_line) for h in hits]
    assert len(ranges) == len(set(ranges)) == 10  # merged per definition
    lines = (corpus / hits[0].path).read_text().splitlines()
    assert lines[hits[0].start_line - 1].lstrip().startswith(("def ", "async def ", "class ",
                                                               "@"))
    assert f"{hits[0].start_line}\t{lines[hits[0].start_line - 1]}" in hits[0].text
    # an identifier finds its definition through the lexical side; the excerpt shows the
    # method's class, then its def line
    top = index.search("is_allowed_origin", 1)[0]
    assert top.path == "middleware/cors.py"
    shown = top.text.splitlines()
    assert shown[0].endswith("\tclass CORSMiddleware:")
    assert any(line.split("\t", 1)[1].lstrip().startswith("def is_allowed_origin")
               for line in shown if "\t" in line)
    # query syntax of the full-text engine and bare punctuation are only words or nothing
    for hostile in ['path:"x" OR (*) AND -', "!!! ???", "' OR 1=1; --", "x" * 5000]:
        assert len(index.search(hostile, 3)) == 3


def test_the_words_count_for_prose_too_and_more_for_identifiers(small_eval):
    """Prose used to be ranked by the vectors alone, which threw away the full-text side
    where it had the answer (issue 47); now both lists count for every query, by the shape
    of their scores, and a query naming an identifier gives the words more say."""
    _, queries, index = small_eval
    prose, identifier = queries[0].text, "is_allowed_origin"
    assert 0 < text_weight(prose, SHAPE_TEXT_WEIGHTS) < text_weight(identifier,
                                                                     SHAPE_TEXT_WEIGHTS)
    assert index.search(identifier, 1)[0].path == "middleware/cors.py"
    changed = 0
    for query in [q.text for q in queries]:
        hybrid = [(h.path, h.start_line) for h in index.search(query, 5)]
        changed += hybrid != [(h.path, h.start_line) for h in index.search(query, 5, "vector")]
    assert changed  # the full-text side moved some prose query's ranking


def test_every_indexed_chunk_fits_the_models_window(small_eval):
    corpus, _, index = small_eval
    assert MODEL_WINDOW == WINDOW
    chunks, _ = corpus_units(corpus, embedder().count_tokens)
    counted = embedder().count_tokens([c["document"] for c in chunks])
    assert max(counted) + 2 <= WINDOW  # [CLS] and [SEP] included
    assert index.chunk_count() >= len(chunks) - 5  # (the index's copy may have been edited)


PROBE = r"""
import json, sys, time
began = time.monotonic()
corpus, index_dir = sys.argv[1:3]
sys.argv = ["refloop", "worker"]  # as `refloop worker` starts, before it connects:
import refloop.cli.main  # noqa: F401
import refloop.worker.main  # noqa: F401  (the Temporal SDK, the workflows and activities)
from refloop.search.runtime import _WARMING, start_warm_up, warm_up_finished
started = "minilm-int8" in _WARMING
ready = time.monotonic()
start_warm_up().join()  # as the worker starts it once it polls
warmed = time.monotonic()
from pathlib import Path
from refloop.search.index import CodeIndex
hits = CodeIndex(Path(index_dir), Path(corpus)).search(
    "answer a cross-origin preflight request", 3)
print(json.dumps({"worker_ready_s": ready - began, "warm_up_s": warmed - ready,
                  "after_warm_up_s": time.monotonic() - warmed, "top": hits[0].path,
                  "started_before_polling": started,
                  "warmed": warm_up_finished() is not None,
                  "torch": "torch" in sys.modules}))
"""


def test_a_fresh_worker_answers_its_first_query_within_a_second_of_the_warm_up(small_eval):
    """Worker start -> first query answered: `refloop worker` imports no search runtime
    before it polls (tests/workflow/test_worker_start.py); the warm-up it starts then
    (LanceDB, the model) leaves a query answered within a second."""
    corpus, _, index = small_eval
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("refloop_semantic_index", "refloop_embedding_model")}
    done = subprocess.run([sys.executable, "-c", PROBE, str(corpus), str(index.index_dir)],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["top"] == "middleware/cors.py"
    assert not out["started_before_polling"] and out["warmed"], out
    assert out["after_warm_up_s"] < 1.0, out
    assert out["torch"] is False  # the default model needs no PyTorch


def test_lancedb_imports_without_the_namespace_rest_client():
    """Its generated REST client's __init__ (most of LanceDB's import time) runs only
    when something reads it; a local index never does, and reading it still works."""
    done = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "from refloop.search.runtime import import_lancedb\n"
        "import_lancedb()\n"
        "print('lance_namespace_urllib3_client.api' in sys.modules)\n"
        "import lance_namespace_urllib3_client as c\n"
        "print(c.ApiClient.__name__)\n")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "ApiClient"]


def test_warm_up_runs_once_per_process_and_model():
    first = start_warm_up()
    assert first is not None and start_warm_up() is first
    first.join(timeout=120)
    assert not first.is_alive()
