"""The edit journal: a retried or replayed edit activity never applies twice.

Each edit call has a deterministic id. Before writing, the call records the pre-image of
every file it touches; after applying, it stores its result. A repeated call returns the
stored result; a call that crashed mid-apply restores the pre-images and applies again.
Undo tools restore the same pre-images.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from refloop.models import ToolResult
from refloop.tools.sandbox import INTERNAL_DIR


class Journal:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / INTERNAL_DIR / "journal"

    def _path(self, call_id: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", call_id)[:80]
        digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
        return self.dir / f"{safe}-{digest}.json"

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
        key = path.relative_to(self.root).as_posix()
        if key in entry["pre_images"]:
            return
        entry["pre_images"][key] = (
            base64.b64encode(path.read_bytes()).decode() if path.is_file() else None
        )
        self.save(entry)

    def restore(self, entry: dict[str, Any], only: str | None = None) -> list[str]:
        restored = []
        for key, image in entry["pre_images"].items():
            if only is not None and key != only:
                continue
            target = self.root / key
            if image is None:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(image))
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
