"""Every path a tool touches resolves inside the task's workspace."""

from __future__ import annotations

from pathlib import Path

from refloop.tools.base import ToolError

INTERNAL_DIR = ".refloop"  # the edit journal lives here; tools may not touch it
SKIPPED_DIRS = frozenset({INTERNAL_DIR, ".git", "__pycache__", "node_modules", ".venv"})


def workspace_root(workspace: str | Path) -> Path:
    root = Path(workspace).resolve()
    if not root.is_dir():
        raise ToolError(f"E_NO_WORKSPACE: workspace '{workspace}' does not exist")
    return root


def resolve(root: Path, raw: str) -> Path:
    """The real path of `raw` (symlinks followed), refused when it leaves the workspace."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("E_INVALID_ARGS: path must be a non-empty string")
    candidate = Path(raw)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"E_PATH_ESCAPE: '{raw}' resolves outside the workspace")
    relative = resolved.relative_to(root)
    if relative.parts and relative.parts[0] == INTERNAL_DIR:
        raise ToolError(f"E_PATH_RESERVED: '{raw}' is refloop's internal state")
    return resolved


def relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


def read_text(path: Path, raw: str) -> str:
    if not path.is_file():
        raise ToolError(f"E_NOT_FOUND: '{raw}' is not a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"E_BINARY: '{raw}' is not a UTF-8 text file") from None


def write_text(path: Path, text: str) -> None:
    """Atomic: a crash mid-write never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.refloop-tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(path)


def line_count(text: str) -> int:
    return len(text.splitlines())


def numbered(text: str, start: int = 1) -> str:
    return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(text.splitlines(), start=start))


def truncate_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", errors="ignore")
    return f"{kept}\n[... truncated {len(data) - limit} bytes ...]"
