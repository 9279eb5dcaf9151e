"""Code search at repository scale: one corpus indexed from nothing in a child process (as
the index activity runs it), measured from outside: lines, chunks, CPU-seconds, wall time,
peak RSS, time to the first search result (polled from the start of the pass), then
recall@1 / recall@5 through search_semantic's own output (a hit: a returned range holding
the labelled definition whose excerpt shows its `def`/`class` line), then the hybrid's
exact-definition recall and MRR beside the score fusion it replaced and BM25 over whole
definitions, paired per query. Used by bench/bench_code_search.py (every labelled set)
and by tests/semantic/test_code_search_eval.py (a small slice).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.code_search_eval import (
    Query,
    Scores,
    bm25_definitions_ranker,
    corpus_units,
    index_ranker,
    paired,
    score,
    tool_ranker,
)
from refloop.search.index import CodeIndex

# The pass as the index activity runs it (`python -m refloop.search.index`), then its own
# resource usage: CPU of all its threads, and its peak resident memory. The peak is VmHWM,
# not ru_maxrss: Linux carries ru_maxrss across exec, so a child started from a large
# parent would report the parent's peak.
PASS = """
import json, resource, sys
from refloop.search.index import main
main(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as status:
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"usage": {"cpu_s": usage.ru_utime + usage.ru_stime,
                            "peak_rss_mb": peak_kb / 1024}}), flush=True)
"""
POLL_S = 0.1


@dataclass
class CorpusRun:
    name: str
    files: int
    lines: int
    chunks: int
    cpu_s: float
    wall_s: float
    peak_rss_mb: float
    first_result_s: float | None  # pass start -> a search answered with a hit
    tool: Scores  # search_semantic's own output, parsed back (`tool_ranker`)
    hybrid: Scores
    before: Scores  # the score fusion the hybrid replaced (mode "score")
    bm25: Scores

    def row(self) -> str:
        wins, losses, ties = paired(self.tool, self.bm25)
        first = f"{self.first_result_s:.2f}" if self.first_result_s is not None else "-"
        return (f"| {self.name} | {len(self.tool.ranks)} | {self.lines:,} | {self.chunks:,} | "
                f"{self.cpu_s:.0f} | {self.wall_s:.0f} | {self.peak_rss_mb:.0f} | {first} | "
                f"**{self.tool.recall_at_1:.2f} / {self.tool.recall_at_5:.2f}** | "
                f"{_cells(self.hybrid)} | {_cells(self.before)} | {_cells(self.bm25)} | "
                f"{wins} / {losses} / {ties} |")


HEADER = ("| corpus | queries | lines | chunks | CPU-s | wall s | peak RSS MB | first result s | "
          "tool output R@1 / R@5 | hybrid, exact definition R@1 / R@5 / MRR | score fusion "
          "(before) | BM25 over definitions | tool vs BM25 @5: wins / losses / ties |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _cells(scores: Scores) -> str:
    return f"{scores.recall_at_1:.2f} / {scores.recall_at_5:.2f} / {scores.mrr:.2f}"


def count_lines(corpus: Path) -> tuple[int, int]:
    files = sorted(corpus.rglob("*.py"))
    return len(files), sum(path.read_bytes().count(b"\n") for path in files)


def start_pass(corpus: Path, index_dir: Path) -> subprocess.Popen:
    """The indexing pass in a child process, as the index activity starts it."""
    return subprocess.Popen([sys.executable, "-c", PASS, str(corpus), str(index_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=corpus.parent)


def first_result(index: CodeIndex, query: str, process: subprocess.Popen, began: float
                 ) -> float | None:
    """Seconds from `began` (the pass's launch) to the first answer with a hit, polling
    while the pass runs; None if none came before it ended."""
    while True:
        if index.answer(query, 5).hits:
            return time.monotonic() - began
        if process.poll() is not None:
            return None
        time.sleep(POLL_S)


def finish(process: subprocess.Popen) -> dict:
    """The pass's report and resource usage (its last two JSON lines)."""
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"indexing failed: {err.strip().splitlines()[-1:]}")
    found: dict = {}
    for line in out.splitlines():
        try:
            found.update(json.loads(line))
        except ValueError:
            continue
    return found


def measure(name: str, corpus: Path, index_dir: Path, queries: list[Query],
            count_tokens, during=None) -> CorpusRun:
    """Index `corpus` from nothing and evaluate it. `during(process)` runs while the pass
    does, after the first result (to time queries on another index meanwhile)."""
    files, lines = count_lines(corpus)
    index = CodeIndex(index_dir, corpus)
    began = time.monotonic()
    process = start_pass(corpus, index_dir)
    first = first_result(index, queries[0].text, process, began)
    if during is not None:
        during(process)
    outcome = finish(process)
    wall = time.monotonic() - began
    _, units = corpus_units(corpus, count_tokens)
    return CorpusRun(name, files, lines, outcome["report"]["chunks_total"],
                     outcome["usage"]["cpu_s"], wall, outcome["usage"]["peak_rss_mb"], first,
                     score(tool_ranker(index, corpus), queries),
                     score(index_ranker(index, "hybrid"), queries),
                     score(index_ranker(index, "score"), queries),
                     score(bm25_definitions_ranker(units), queries))


def query_latencies(index: CodeIndex, queries: list[Query], process: subprocess.Popen,
                    at_least: int = 40) -> tuple[float, float, int]:
    """p50 and p95 ms of hybrid queries on `index` while `process` (another pass) runs;
    and how many were timed."""
    times = []
    while process.poll() is None or len(times) < at_least:
        for query in queries:
            began = time.perf_counter()
            index.search(query.text, 5)
            times.append((time.perf_counter() - began) * 1000)
        if len(times) >= 400:
            break
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)], len(times)
