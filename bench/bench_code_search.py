"""Code search on third-party code.

    python -m bench.bench_code_search
        [--corpora starlette,httpx,fastapi,click,jinja2,networkx,sympy] [--small]

By default, the scale table: each corpus (a package as installed in the venv, with its
labelled queries in tests/fixtures/code_search_queries*.yaml, written from behaviour before
any search ran over it) indexed from nothing in a child process, as the index activity
runs it: lines, chunks, CPU-seconds, wall, peak RSS, time to the first search result,
recall@1 / recall@5 through search_semantic's own output (what the model reads, parsed
back: a hit is a returned range holding the labelled definition whose excerpt shows its
`def`/`class` line), the hybrid's exact-definition recall@1 / @5 / MRR beside the score
fusion it replaced and BM25 over whole definitions, paired per query (wins / losses / ties
at 5); then query p50 / p95 on the FastAPI index while the last corpus is being indexed,
and the load average the run saw. `--small`: the quick starlette slice `make test` runs.

    python -m bench.bench_code_search --detail [--small] [--models minilm-int8,minilm]
        [--repeats 3] [--queries tests/fixtures/code_search_queries_httpx.yaml] [--misses]
        [--starts 3]

`--detail`: one corpus (starlette by default; `--queries` names another query file) with
every search mode beside BM25 and grep, index throughput, the cost of a one-file
re-index, query p50/p95 and the first query of a fresh worker, per embedding model.
Recall is also reported per half of the queries: of the starlette queries, the
even-numbered half was used to choose the fusion weights, the odd one was not. Modes:
hybrid (score fusion, the default), rrf (rank fusion per definition), lance-rrf (LanceDB's
own hybrid query and RRF reranker, per chunk), vector and text alone. Start-up: a fresh
interpreter doing what `refloop worker` does (the warm-up starts as the command line is
imported, then the worker's modules) times process launch -> search ready (warm-up
finished), -> worker ready (it could poll), -> first query answered."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.code_search_eval import (
    QUERIES,
    bm25_ranker,
    copy_corpus,
    corpus_units,
    grep_ranker,
    index_ranker,
    latencies,
    load_queries,
    resolve,
    score,
)
from refloop.search.index import CodeIndex
from refloop.search.runtime import import_lancedb, missing_extra

# LanceDB's hybrid query warns on every call about its score columns (its Rust log
# reads LANCEDB_LOG; LANCE_LOG is the lance format's own and does not reach it).
os.environ.setdefault("LANCEDB_LOG", "error")
MODES = ("hybrid", "score", "rrf", "lance-rrf", "vector", "text")
LOAD_PROBE = """
import sys, time
from pathlib import Path
began = time.perf_counter()
from refloop.search.index import CodeIndex
from refloop.search.runtime import start_warm_up
start_warm_up(sys.argv[3]).join()
loaded = time.perf_counter()
CodeIndex(Path(sys.argv[2]), Path(sys.argv[1]), sys.argv[3]).search("read a setting", 5)
print(loaded - began, time.perf_counter() - loaded)
"""


WORKER_PROBE = """
import sys, time
began = time.time()
index_dir, corpus, model = sys.argv[1:4]
sys.argv = ["refloop", "worker"]  # what `refloop worker` runs before it connects:
import refloop.cli.main  # noqa: F401
from refloop.settings import load_settings
load_settings()
import refloop.worker.main  # noqa: F401  (the Temporal SDK, workflows, activities)
ready = time.time()
from pathlib import Path
from refloop.search.index import CodeIndex
from refloop.search.runtime import start_warm_up, warm_up_finished
start_warm_up(model)  # as the worker does once it polls; the query waits on it
CodeIndex(Path(index_dir), Path(corpus), model).search("read a setting", 5)
answered = time.time()
print(began, ready, answered, warm_up_finished(model) or answered)
"""


def worker_start(model: str, corpus: Path, index_dir: Path) -> dict[str, float]:
    """Seconds from launching a fresh interpreter that starts as `refloop worker` does
    (REFLOOP_EMBEDDING_MODEL=model) to: search ready (the warm-up finished), the worker's
    modules imported (it could poll), the first query answered."""
    env = {**os.environ, "REFLOOP_EMBEDDING_MODEL": model, "REFLOOP_SEMANTIC_INDEX": "1"}
    launched = time.time()
    done = subprocess.run([sys.executable, "-c", WORKER_PROBE, str(index_dir), str(corpus),
                           model], capture_output=True, text=True, check=True, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    _, ready, answered, warmed = map(float, done.stdout.strip().splitlines()[-1].split())
    return {"search_ready": warmed - launched, "worker_ready": ready - launched,
            "answered": answered - launched, "after_ready": answered - ready}


def cold_start(model: str, corpus: Path, index_dir: Path) -> tuple[float, float]:
    """In a fresh interpreter, as a worker starts: seconds to import LanceDB and load the
    model (the warm-up), then seconds for the first query."""
    done = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(corpus), str(index_dir),
                           model], capture_output=True, text=True, check=True)
    load_s, query_s = done.stdout.strip().splitlines()[-1].split()
    return float(load_s), float(query_s)


def one_file(corpus: Path) -> Path:
    """The file a one-file edit touches: the median-sized Python file (the cost of a
    re-index is that file's chunks, so the biggest or smallest would say little)."""
    files = sorted(corpus.rglob("*.py"), key=lambda path: (path.stat().st_size, str(path)))
    return files[len(files) // 2]


def row(name: str, scores, p50: float | None = None, p95: float | None = None) -> str:
    timing = f"{p50:.1f} / {p95:.1f}" if p50 is not None else "-"
    return (f"| {name} | {scores.recall_at_1:.2f} | {scores.recall_at_5:.2f} | "
            f"{scores.mrr:.2f} | {timing} |")


def half_row(name: str, ranker, queries) -> str:
    cells = []
    for half in (queries[0::2], queries[1::2]):
        s = score(ranker, half)
        cells.append(f"{s.recall_at_1:.2f} / {s.recall_at_5:.2f} / {s.mrr:.2f}")
    return f"| {name} | {cells[0]} | {cells[1]} |"


FIXTURES = QUERIES.parent
CORPORA = {"starlette": QUERIES, "httpx": FIXTURES / "code_search_queries_httpx.yaml",
           "fastapi": FIXTURES / "code_search_queries_fastapi.yaml",
           "click": FIXTURES / "code_search_queries_click.yaml",
           "jinja2": FIXTURES / "code_search_queries_jinja2.yaml",
           "networkx": FIXTURES / "code_search_queries_networkx.yaml",
           "sympy": FIXTURES / "code_search_queries_sympy.yaml"}


def scale(names: list[str], small: bool) -> None:
    """The scale table (see the module's docstring)."""
    from bench.code_search_scale import HEADER, measure, query_latencies
    from refloop.search.embedders import embedder

    count_tokens = embedder().count_tokens
    import_lancedb()  # as a worker's warm-up has: the first search is not the import
    latency = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(HEADER, flush=True)
        runs = {}
        for number, name in enumerate(names):
            package, small_files, queries = load_queries(small, path=CORPORA[name])
            corpus = copy_corpus(package, small_files if small else None, work / name / package)
            resolve(queries, corpus)
            during = None
            if "fastapi" in runs and number == len(names) - 1:  # FastAPI's queries meanwhile
                fastapi, fastapi_queries = runs["fastapi"]

                def during(process, index=fastapi, queries=fastapi_queries):
                    latency["timed"] = query_latencies(index, queries, process)
            run = measure(name, corpus, work / name / "index", queries, count_tokens, during)
            runs[name] = (CodeIndex(work / name / "index", corpus), queries)
            print(run.row(), flush=True)
    print(f"\nload average at the end (1 / 5 / 15 min): "
          f"{' / '.join(f'{load:.2f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs")
    if latency:
        p50, p95, timed = latency["timed"]
        print(f"\nFastAPI hybrid queries while {names[-1]} was being indexed: p50 {p50:.0f} ms,"
              f" p95 {p95:.0f} ms ({timed} queries)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpora", default=",".join(CORPORA),
                        help="the scale table's corpora, in order")
    parser.add_argument("--detail", action="store_true",
                        help="every mode, start-up and re-index costs on one corpus")
    parser.add_argument("--small", action="store_true", help="the quick corpus of make test")
    parser.add_argument("--models", default="minilm-int8,minilm")
    parser.add_argument("--repeats", type=int, default=3, help="query passes for p50/p95")
    parser.add_argument("--starts", type=int, default=3, help="worker starts timed")
    parser.add_argument("--misses", action="store_true", help="list the hybrid's misses")
    parser.add_argument("--queries", type=Path, default=QUERIES,
                        help="a labelled query file (default: the starlette one)")
    args = parser.parse_args()
    if not args.detail:
        names = args.corpora.split(",")
        scale(names if not args.small else names[:1], args.small)
        return
    package, small_files, queries = load_queries(args.small, path=args.queries)
    _, _, name_queries = load_queries(False, names=True, path=args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = copy_corpus(package, small_files if args.small else None, work / "corpus")
        resolve(queries, corpus)
        if not args.small and name_queries:
            resolve(name_queries, corpus)
        files = sum(1 for _ in corpus.rglob("*.py"))
        print(f"corpus: {package} ({'small' if args.small else 'full'}), {files} files, "
              f"{len(queries)} labelled queries\n")
        baselines_done = False
        for model in args.models.split(","):
            if missing_extra(model):
                print(f"{model}: {missing_extra(model)}")
                continue
            index = CodeIndex(work / f"index-{model}", corpus, model)
            full = index.update()
            load_s, first_query_s = cold_start(model, corpus, index.index_dir)
            starts = [worker_start(model, corpus, index.index_dir) for _ in range(args.starts)]
            start = {key: statistics.median(s[key] for s in starts) for key in starts[0]}
            target = one_file(corpus)
            target.write_text(target.read_text() + "\n\ndef bench_marker():\n    return 1\n")
            began = time.perf_counter()
            incremental = index.update()
            incremental_s = time.perf_counter() - began
            print(f"## {model}\n")
            print("| cost, same run | figure |\n|---|---|")
            print(f"| full index | {full.files_indexed} files, {full.chunks_embedded} chunks in "
                  f"{full.seconds:.2f} s = {full.chunks_embedded / full.seconds:.0f} chunks/s, "
                  f"{full.files_indexed / full.seconds:.1f} files/s |")
            print(f"| one-file edit ({target.relative_to(corpus)}) | "
                  f"{incremental.files_indexed} file, "
                  f"{incremental.chunks_embedded} chunks in {incremental_s:.2f} s = "
                  f"{incremental_s / full.seconds:.3f} of the full pass |")
            print(f"| fresh process: warm-up (import LanceDB, load the model) | {load_s:.2f} s, "
                  f"then the first query {first_query_s * 1000:.0f} ms |")
            print(f"| `refloop worker` start (median of {len(starts)}): launch -> search ready "
                  f"| {start['search_ready']:.2f} s |")
            print(f"| launch -> worker modules imported (it could poll) | "
                  f"{start['worker_ready']:.2f} s |")
            print(f"| launch -> first query answered | {start['answered']:.2f} s "
                  f"({start['after_ready'] * 1000:.0f} ms after the worker is ready) |\n")
            print("| method, same run | recall@1 | recall@5 | MRR | query p50 / p95 ms |")
            print("|---|---|---|---|---|")
            named = []
            halves = []
            for mode in MODES:
                ranker = index_ranker(index, mode)
                scores = score(ranker, queries)
                p50, p95 = latencies(ranker, queries, args.repeats)
                print(row(f"search_semantic {mode} ({model})", scores, p50, p95), flush=True)
                halves.append(half_row(f"search_semantic {mode} ({model})", ranker, queries))
                if mode == "hybrid" and args.misses:
                    hybrid_misses = scores.misses
                if not args.small and name_queries:
                    named.append(row(f"search_semantic {mode} ({model})",
                                     score(ranker, name_queries)))
            if not baselines_done:
                from refloop.search.embedders import embedder

                chunks, units = corpus_units(corpus, embedder(model).count_tokens)
                for name, ranker in (("BM25 (rank-bm25), same chunks", bm25_ranker(chunks)),
                                     ("grep word counts per definition", grep_ranker(units))):
                    scores = score(ranker, queries)
                    p50, p95 = latencies(ranker, queries, 1)
                    print(row(name, scores, p50, p95))
                    halves.append(half_row(name, ranker, queries))
                    if not args.small and name_queries:
                        named.append(row(name, score(ranker, name_queries)))
                baselines_done = True
            print("\nby half (recall@1 / recall@5 / MRR): even-numbered queries (of the "
                  "starlette file: the half the fusion weight was chosen on) | odd-numbered\n")
            print("| method | even half | odd half |\n|---|---|---|")
            print("\n".join(halves))
            if named:
                print(f"\nname queries ({len(name_queries)}), same indexes:\n")
                print("| method | recall@1 | recall@5 | MRR | |\n|---|---|---|---|---|")
                print("\n".join(named))
            if args.misses:
                print("\nhybrid misses (not in the top 5):")
                for miss in hybrid_misses:
                    print(f"- {miss}")
            print()


if __name__ == "__main__":
    main()
