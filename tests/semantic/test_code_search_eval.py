"""The code-search eval on third-party code (a small slice of starlette as installed):
definition-level recall of search_semantic beside BM25 and grep, in one run; chunks
within the model's window; a fresh process answers its first query fast after warm-up."""

from __future__ import annotations

import json
import subprocess
import sys
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
from refloop.code_chunks import MODEL_WINDOW
from refloop.embedders import WINDOW, embedder
from refloop.semantic import CodeIndex, start_warm_up


@pytest.fixture(scope="module")
def small_eval(tmp_path_factory):
    work = tmp_path_factory.mktemp("code-search")
    package, files, queries = load_queries(small=True)
    corpus = copy_corpus(package, files, work / "corpus")
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


def test_hits_are_whole_definitions_one_each(small_eval):
    corpus, _, index = small_eval
    hits = index.search("keep per-user data in a signed browser cookie between requests", 10)
    ranges = [(h.path, h.start_line, h.end_line) for h in hits]
    assert len(ranges) == len(set(ranges)) == 10  # merged per definition
    lines = (corpus / hits[0].path).read_text().splitlines()
    assert lines[hits[0].start_line - 1].lstrip().startswith(("def ", "async def ", "class ",
                                                               "@"))
    assert hits[0].text.splitlines()[0] == lines[hits[0].start_line - 1]
    # an identifier finds its definition through the lexical side
    top = index.search("is_allowed_origin", 1)[0]
    assert top.path == "middleware/cors.py"
    assert top.text.lstrip().startswith("def is_allowed_origin")
    # query syntax of the full-text engine and bare punctuation are only words or nothing
    for hostile in ['path:"x" OR (*) AND -', "!!! ???", "' OR 1=1; --", "x" * 5000]:
        assert len(index.search(hostile, 3)) == 3


def test_every_indexed_chunk_fits_the_models_window(small_eval):
    corpus, _, index = small_eval
    assert MODEL_WINDOW == WINDOW
    chunks, _ = corpus_units(corpus, embedder().count_tokens)
    counted = embedder().count_tokens([c["document"] for c in chunks])
    assert max(counted) + 2 <= WINDOW  # [CLS] and [SEP] included
    assert index.chunk_count() >= len(chunks) - 5  # (the index's copy may have been edited)


PROBE = r"""
import json, sys, time
from pathlib import Path
began = time.monotonic()
from refloop.semantic import CodeIndex, start_warm_up
start_warm_up().join()
ready = time.monotonic()
t = time.monotonic()
index = CodeIndex(Path(sys.argv[2]), Path(sys.argv[1]))
hits = index.search("answer a cross-origin preflight request", 3)
print(json.dumps({"warm_up_s": ready - began, "first_query_s": time.monotonic() - t,
                  "top": hits[0].path, "torch": "torch" in sys.modules}))
"""


def test_after_warm_up_the_first_query_of_a_process_is_fast(small_eval):
    corpus, _, index = small_eval
    done = subprocess.run([sys.executable, "-c", PROBE, str(corpus), str(index.index_dir)],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["top"] == "middleware/cors.py"
    assert out["first_query_s"] < 1.0, out
    assert out["torch"] is False  # the default model needs no PyTorch


def test_warm_up_runs_once_per_process_and_model():
    first = start_warm_up()
    assert first is not None and start_warm_up() is first
    first.join(timeout=120)
    assert not first.is_alive()
