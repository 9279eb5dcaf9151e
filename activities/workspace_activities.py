"""Workspace activities: the system prompt's environment and repo map, and the background
semantic index (heartbeating its progress, so a dead worker is noticed and a cancelled
task stops it)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from refloop.activities.defn import implements
from refloop.activities.heartbeat import heartbeating
from refloop.contract import activity_calls
from refloop.contract.task import IndexReport, WorkspaceDescription, WorkspaceInput
from refloop.search.passes import unchanged_report
from refloop.search.repo_map import workspace_context
from refloop.search.runtime import missing_extra
from refloop.settings import Settings
from refloop.store.blobs import offload_output
from refloop.store.db import Store
from refloop.tools.sandbox import shown, workspace_root


class WorkspaceActivities:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store

    @implements(activity_calls.DESCRIBE_WORKSPACE)
    async def describe(self, inp: WorkspaceInput) -> WorkspaceDescription:
        root = workspace_root(inp.workspace)
        context = shown(await asyncio.to_thread(workspace_context, root,
                                                self.settings.refloop_repo_map_tokens))
        # A large map travels as a blob marker; the model call expands it (history-lean).
        context = await asyncio.to_thread(offload_output, context,
                                          self.settings.refloop_blob_threshold_bytes,
                                          self.store.put_blob)
        return WorkspaceDescription(
            context=context,
            index_available=self.settings.refloop_semantic_index
            and missing_extra(self.settings.search_model) is None,
        )

    @implements(activity_calls.INDEX_WORKSPACE)
    async def index(self, inp: WorkspaceInput) -> IndexReport:
        """One incremental pass in a child process: embedding is CPU-heavy and loading the
        model takes seconds, neither of which may stall the worker's workflow tasks."""
        model = self.settings.search_model
        reason = missing_extra(model)
        if reason:
            return IndexReport(available=False, note=reason)
        root = workspace_root(inp.workspace)
        async with heartbeating():  # hashing a large workspace outlasts the heartbeat timeout
            unchanged = await asyncio.to_thread(unchanged_report, self.settings.index_dir,
                                                root, model)
        if unchanged is not None:
            return unchanged
        argv, cwd, env = index_launch(root, self.settings.index_dir, model,
                                      self.settings.refloop_index_threads)
        env.update(self.settings.search_model_env)  # the endpoint, and its key if any
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None and process.stderr is not None  # both piped
        try:
            async with heartbeating():  # covers loading the model
                report, errors = await asyncio.gather(_follow(process.stdout),
                                                      process.stderr.read())
                code = await process.wait()
        except asyncio.CancelledError:  # the task ended or was cancelled: stop embedding
            process.kill()
            await process.wait()
            raise
        if code != 0 or report is None:
            last = errors.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise ApplicationError(f"indexing failed (exit {code}): {last[0]}",
                                   type="IndexingFailed")
        return report


# What the index child may see of the worker's environment: locale, temp dir, and the
# embedding libraries' caches and thread counts. Never a key, token or database URL (but
# the embeddings endpoint's own, from the settings, when one is configured).
INDEX_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "XDG_CACHE_HOME")
INDEX_ENV_PREFIXES = ("HF_", "TRANSFORMERS_", "SENTENCE_TRANSFORMERS_", "FASTEMBED_",
                      "TORCH_", "OMP_", "MKL_", "OPENBLAS_", "TOKENIZERS_")


def index_launch(root: Path, index_dir: Path, model: str, threads: int = 0,
                 environ: Mapping[str, str] | None = None
                 ) -> tuple[list[str], str, dict[str, str]]:
    """(argv, working directory, environment) of one index pass. It never runs workspace
    code: `python -I` puts neither the working directory nor PYTHON* variables on its path,
    and it starts outside the workspace (a planted `json.py` is never imported); it gets
    the minimal environment above, none of the worker's secrets."""
    environ = os.environ if environ is None else environ
    env = {key: value for key, value in environ.items()
           if key in INDEX_ENV or key.startswith(INDEX_ENV_PREFIXES)}
    index_dir.mkdir(parents=True, exist_ok=True)
    return ([sys.executable, "-I", "-m", "refloop.search.index", str(root), str(index_dir),
             model, "--threads", str(threads)], str(index_dir), env)


async def _follow(stream: asyncio.StreamReader) -> IndexReport | None:
    """Progress lines become heartbeat details; the last line is the report."""
    report = None
    async for line in stream:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a library printing to stdout
        if "progress" in message:
            activity.heartbeat(message["progress"])
        elif "report" in message:
            report = IndexReport.model_validate(message["report"])
    return report
