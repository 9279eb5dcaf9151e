"""Workspace checkpoints: what one costs, against the workspace's size on disk.

Trees are copies of local sources (nothing is downloaded): source distributions given with
`--sdist` (FastAPI's or sympy's whole tree, e.g. from `pip download --no-deps
--no-binary :all: fastapi`), the installed fastapi and sympy packages, and a 10,000-file
tree of torch's sources and headers (the `semantic` extra). The store is the dev default,
SQLite in the data dir, opened as `refloop up` opens it (WAL). Each figure sits beside a
baseline measured in the same run: a checkpoint beside a bare walk that stats every file,
a restore beside `shutil.copytree` of the same tree. Run: `python -m
bench.bench_checkpoints [--sdist FILE]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from refloop.checkpoints.objects import DatabaseObjectStore
from refloop.checkpoints.restore import restore_checkpoint
from refloop.checkpoints.snapshot import RACY_WINDOW_NS, load_manifest, take_checkpoint
from refloop.store.db import sqlite_engine

SOURCE_SUFFIXES = (".py", ".pyi", ".h")
STEPS = 30


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # found, not imported (torch takes seconds)
    return Path(spec.origin).parent if spec and spec.origin else None


def copy_tree(source: Path, target: Path, limit: int | None = None) -> int:
    """Copy source files (at most `limit`) to `target`; the number copied."""
    copied = 0
    for path in sorted(source.rglob("*")):
        if not path.is_file() or path.suffix not in SOURCE_SUFFIXES or "__pycache__" in path.parts:
            continue
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        copied += 1
        if limit is not None and copied >= limit:
            break
    return copied


def unpack_sdist(sdist: Path, target: Path) -> None:
    """Every file of a source distribution (its whole tree: docs, tests, sources)."""
    with tarfile.open(sdist) as archive:
        archive.extractall(target, filter="data")
    (top,) = target.iterdir()
    for child in top.iterdir():
        child.rename(target / child.name)
    top.rmdir()


def size_on_disk(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def bare_walk(root: Path) -> int:
    count = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            os.lstat(os.path.join(directory, name))
            count += 1
    return count


def on(directory: Path, action: Callable, *args):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return action(fd, *args)
    finally:
        os.close(fd)


def timed(action: Callable, *args) -> tuple[float, object]:
    started = time.perf_counter()
    result = action(*args)
    return time.perf_counter() - started, result


def restore_into(target: Path, store: DatabaseObjectStore, checkpoint_id: str):
    """What the restore activity does: read the stored manifest, then restore it."""
    return on(target, restore_checkpoint, store, load_manifest(store, checkpoint_id))


def bench_tree(name: str, tree: Path, store: DatabaseObjectStore, scratch: Path,
               runs: int) -> dict:
    files = sum(1 for path in tree.rglob("*") if path.is_file())
    walk_s, _ = timed(bare_walk, tree)
    first_s, first = timed(on, tree, take_checkpoint, store)
    # One-file edits, each checkpointed against the previous one (the tree was copied
    # more than the racy window before `first`, so its stat hints hold, as in a real
    # task's later steps; the file edited one step earlier is inside it and read again).
    previous = first
    victims = sorted(tree.rglob("*.py"))[:runs]
    edit_times, bare_times, reads, exact, tree_bytes = [], [], [], [], []
    for victim in victims:
        victim.write_bytes(victim.read_bytes() + b"\n# edited\n")
        seconds, snap = timed(on, tree, take_checkpoint, store, previous.state)
        bare_times.append(timed(bare_walk, tree)[0])
        edit_times.append(seconds)
        reads.append(snap.stats.files_read)
        exact.append(snap.stats.new_bytes == victim.stat().st_size)
        tree_bytes.append(snap.stats.new_tree_bytes)
        previous = snap
    target = scratch / f"{name}-restored"
    target.mkdir()
    restore_s, _ = timed(restore_into, target, store, first.checkpoint_id)
    copy_s, _ = timed(shutil.copytree, tree, scratch / f"{name}-copied")
    return {
        "tree": name, "files": files, "disk_mb": size_on_disk(tree) / 1e6,
        "first_s": first_s, "first_vs_walk": first_s / walk_s,
        "stored_mb": first.stats.new_bytes / 1e6,
        "edit_ms": statistics.median(edit_times) * 1000,
        "edit_max_ms": max(edit_times) * 1000,
        "edit_vs_walk": statistics.median(edit_times) / statistics.median(bare_times),
        "edit_reads": statistics.median(reads), "edit_exact": all(exact),
        "edit_tree_bytes": statistics.median(tree_bytes),
        "restore_s": restore_s, "restore_vs_copy": restore_s / copy_s,
    }


def thirty_steps(tree: Path, store: DatabaseObjectStore) -> dict:
    """A task of 30 steps in `tree`, each writing one file (some files rewritten): content
    stored against the unique content it produced, and the tree objects beside it."""
    previous = on(tree, take_checkpoint, store)  # the workspace as the task found it
    produced: dict[bytes, None] = {}
    stored = manifests = 0
    for step in range(STEPS):
        content = f"step {step} of a task {os.getpid()} {time.time_ns()}\n".encode() * (
            step + 1)
        (tree / f"task-{step % 7}.txt").write_bytes(content)
        produced[content] = None
        snap = on(tree, take_checkpoint, store, previous.state)
        stored += snap.stats.new_bytes
        manifests += snap.stats.new_tree_bytes
        previous = snap
    return {"stored": stored, "unique": sum(map(len, produced)), "manifests": manifests,
            "files": previous.stats.files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="one-file edits per tree")
    parser.add_argument("--sdist", type=Path, action="append", default=[],
                        help="a source distribution (.tar.gz) to use as a tree, e.g. "
                        "FastAPI's; repeatable")
    parser.add_argument("--only", help="comma-separated tree names to run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as scratch_name:
        scratch = Path(scratch_name)
        store = DatabaseObjectStore(sqlite_engine(f"sqlite:///{scratch / 'refloop.db'}"))
        sources: list[tuple[str, Callable[[Path], object]]] = []
        for sdist in args.sdist:
            name = sdist.name.removesuffix(".tar.gz")
            sources.append((name, lambda t, s=sdist: unpack_sdist(s, t)))
        for name, package, limit in (("fastapi", "fastapi", None), ("sympy", "sympy", None),
                                     ("torch-10k", "torch", 10_000)):
            found = package_dir(package)
            if found is not None:
                sources.append((name, lambda t, f=found, n=limit: copy_tree(f, t, n)))
        if args.only:
            sources = [s for s in sources if s[0] in args.only.split(",")]
        for name, make in sources:
            make(scratch / name)
        time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)  # the copies' stats become trusted
        load_before = os.getloadavg()[0]
        rows = [bench_tree(name, scratch / name, store, scratch, args.runs)
                for name, _make in sources]
        task = thirty_steps(scratch / sources[0][0], store)
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| tree | files | on disk MB | first checkpoint s (/ bare walk) | stored MB "
          "| one-file edit ms, median (max) (/ bare walk) | files read | stores only the "
          "file (+ tree bytes) | restore to empty s (/ copytree) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['tree']} | {row['files']:,} | {row['disk_mb']:.1f} "
              f"| {row['first_s']:.2f} ({row['first_vs_walk']:.1f}x) | {row['stored_mb']:.1f} "
              f"| {row['edit_ms']:.1f} ({row['edit_max_ms']:.1f}) "
              f"({row['edit_vs_walk']:.2f}x) | {row['edit_reads']:.0f} "
              f"| {row['edit_exact']} (+{row['edit_tree_bytes']:,.0f}) "
              f"| {row['restore_s']:.2f} ({row['restore_vs_copy']:.2f}x) |")
    print(f"30-step task in {sources[0][0]} ({task['files']:,} files): {task['stored']:,} "
          f"bytes of content stored for {task['unique']:,} bytes of unique content "
          f"({task['stored'] / task['unique']:.2f}), plus {task['manifests']:,} bytes of "
          f"tree objects ({task['manifests'] / STEPS:,.0f} per step)")


if __name__ == "__main__":
    main()
