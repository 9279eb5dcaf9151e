"""The edit journal: a retried or replayed edit activity never applies twice.

Each edit call has a deterministic id. Before writing, the call records the pre-image of
every file it touches; after applying, it stores its result. A repeated call returns the
stored result; a call that crashed mid-apply restores the pre-images and applies again.
Undo tools restore the same pre-images.

The journal lives under the data dir (or REFLOOP_JOURNAL_DIR), keyed by workspace and task,
outside every workspace:
nothing a repository ships or a command writes can forge an entry. Restores go through the
same no-follow writes as the tools, to paths checked like the model's own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.tools import sandbox
from refloop.tools.base import ToolContext

# Agent call ids are "<workflow id>.<run id[:8]>.<iteration>.<index>": the task is the
# workflow id. Other ids (tests, benches) share one journal per workspace.
_AGENT_CALL = re.compile(r"^(?P<task>.+)\.[0-9a-f]{8}\.\d+\.\d+$")
SHARED_TASK = "_shared"


def task_key(call_id: str) -> str:
    match = _AGENT_CALL.match(call_id)
    return match.group("task") if match else SHARED_TASK


def _safe_name(text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80]
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class Journal:
    def __init__(self, root: Path, journal_dir: Path, call_id: str,
                 max_image_bytes: int = sandbox.MAX_READ_FILE_BYTES) -> None:
        self.root = root
        workspace = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        base = Path(journal_dir).resolve()
        inside = base == root or root in base.parents
        if inside and base.relative_to(root).parts[:1] != (sandbox.DATA_DIR_NAME,):
            # (a default data dir at the workspace's top is reserved for the file tools and
            # hidden from commands, so the journal there is out of the model's reach)
            raise ToolError("E_CONFIG: the edit journal (REFLOOP_JOURNAL_DIR, or the data dir) "
                            "is inside the workspace, where the model could forge it")
        self.dir = base / workspace / _safe_name(task_key(call_id))
        self.max_image_bytes = max_image_bytes

    @classmethod
    def for_call(cls, ctx: ToolContext) -> Journal:
        return cls(ctx.workspace, ctx.settings.journal_dir, ctx.call_id,
                   ctx.settings.refloop_max_write_bytes)

    def _path(self, call_id: str) -> Path:
        return self.dir / f"{_safe_name(call_id)}.json"

    def load(self, call_id: str) -> dict[str, Any] | None:
        path = self._path(call_id)
        return json.loads(path.read_text()) if path.exists() else None

    def save(self, entry: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(entry["call_id"])
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(entry))
        temp.replace(path)

    def begin(self, call_id: str, tool: str) -> dict[str, Any]:
        entry = {"call_id": call_id, "tool": tool, "created_ns": time.time_ns(),
                 "pre_images": {}, "result": None, "undone": False}
        self.save(entry)
        return entry

    def snapshot(self, entry: dict[str, Any], path: Path) -> None:
        """Record a file's content before its first write in this call."""
        key = sandbox.relative(self.root, path)
        if key in entry["pre_images"]:
            return
        found = sandbox.kind(path)
        if found == "link":
            raise ToolError(f"E_SYMLINK: '{key}' is a symbolic link; the file tools never "
                            "write through links")
        if found not in (None, "file"):
            raise ToolError(f"E_NOT_FOUND: '{key}' is not a regular file")
        entry["pre_images"][key] = (
            base64.b64encode(sandbox.read_bytes(path, key, self.max_image_bytes)).decode()
            if found == "file" else None
        )
        self.save(entry)

    def restore(self, entry: dict[str, Any], only: str | None = None) -> list[str]:
        restored = []
        for key, image in entry["pre_images"].items():
            if only is not None and key != only:
                continue
            target = sandbox.resolve(self.root, key)
            if image is None:
                sandbox.unlink(target, key)
            else:
                sandbox.write_bytes(target, base64.b64decode(image), key)
            restored.append(key)
        return restored

    def finish(self, entry: dict[str, Any], result: ToolResult) -> None:
        entry["result"] = result.model_dump(mode="json")
        self.save(entry)

    def entries(self) -> list[dict[str, Any]]:
        """Successful edits that can be undone (undos themselves excluded), newest first."""
        if not self.dir.exists():
            return []
        found = [json.loads(p.read_text()) for p in self.dir.glob("*.json")]
        done = [
            e for e in found
            if e.get("result") and e["result"].get("ok")
            and e["result"].get("data", {}).get("edit_kind") != "undo"
        ]
        return sorted(done, key=lambda e: e["created_ns"], reverse=True)

    def discard(self, call_ids: list[str]) -> int:
        """A rewind took these calls back: their entries go, and an entry one of them
        undid is undoable again (the undo is gone with them). Returns the entries dropped."""
        gone = set(call_ids)
        dropped = 0
        for call_id in call_ids:
            entry = self.load(call_id)
            if entry is None:
                continue
            data = (entry.get("result") or {}).get("data") or {}
            undid = data.get("undone_call") or (
                data.get("patch_id") if data.get("edit_kind") == "undo" else None)
            if undid and undid not in gone and (earlier := self.load(undid)) is not None:
                earlier["undone"] = False
                self.save(earlier)
            self._path(call_id).unlink(missing_ok=True)
            dropped += 1
        return dropped
