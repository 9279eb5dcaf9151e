"""Semantic search: index throughput and query latency on this repo, recall@5 on the
labelled fixture queries, and what an incremental pass costs beside a full one.

    python -m bench.bench_semantic [--repeats 3]

The model load (once per process) is reported apart from indexing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from refloop.search.index import CodeIndex
from refloop.search.runtime import embed, missing_extra

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def recall_at_5(index: CodeIndex, queries: list[dict]) -> tuple[float, float]:
    top1 = top5 = 0
    for query in queries:
        hits = index.search(query["query"], 5)
        matches = [h.path == query["path"] and query["symbol"] in h.text for h in hits]
        top1 += bool(matches and matches[0])
        top5 += any(matches)
    return top1 / len(queries), top5 / len(queries)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3, help="query passes for the p50")
    args = parser.parse_args()
    if missing_extra():
        raise SystemExit(missing_extra())
    queries = yaml.safe_load((FIXTURES / "semantic_queries.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        embed(["warm up"])
        load_s = time.perf_counter() - started

        # This repo, copied so the incremental pass can touch one file.
        repo = Path(shutil.copytree(ROOT, work / "repo", ignore=shutil.ignore_patterns(
            ".git", ".venv", ".refloop-data", "__pycache__", "node_modules")))
        index = CodeIndex(work / "index", repo)
        full = index.update()
        target = repo / "refloop" / "feedback.py"
        target.write_text(target.read_text() + "\n\ndef bench_marker():\n    return 1\n")
        started = time.perf_counter()
        incremental = index.update()
        incremental_s = time.perf_counter() - started

        latencies = []
        for _ in range(args.repeats):
            for query in queries:
                started = time.perf_counter()
                index.search(query["query"], 5)
                latencies.append(time.perf_counter() - started)

        fixture = CodeIndex(work / "fixture-index",
                            Path(shutil.copytree(FIXTURES / "semantic_repo", work / "fx")))
        fixture.update()
        top1, top5 = recall_at_5(fixture, queries)

    print(f"model load (once per process): {load_s:.2f} s")
    print(f"full index of this repo: {full.files_indexed} files, {full.chunks_embedded} chunks "
          f"in {full.seconds:.2f} s = {full.chunks_embedded / full.seconds:.0f} chunks/s")
    print(f"incremental pass after one edit: {incremental.files_indexed} file(s), "
          f"{incremental.chunks_embedded} chunks in {incremental_s:.2f} s = "
          f"{incremental_s / full.seconds:.3f} of the full pass")
    print(f"query latency over {len(latencies)} queries: p50 "
          f"{statistics.median(latencies) * 1000:.1f} ms, p95 "
          f"{sorted(latencies)[int(len(latencies) * 0.95) - 1] * 1000:.1f} ms")
    print(f"fixture recall@1 {top1:.2f}, recall@5 {top5:.2f} over {len(queries)} labelled "
          "queries")


if __name__ == "__main__":
    main()
