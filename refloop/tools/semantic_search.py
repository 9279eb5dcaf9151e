"""search_semantic: hybrid (vector + full-text) search over the workspace's index; one hit
per definition, with its whole line range."""

from __future__ import annotations

from pydantic import BaseModel, Field

from refloop.contract.models import ToolResult
from refloop.search.index import CodeIndex, SemanticUnavailable
from refloop.tools.base import ToolContext, ToolError, tool

HIT_DATA_CHARS = 300  # the model reads whole chunks in the output; history keeps a preview


class SemanticSearchArgs(BaseModel):
    query: str = Field(min_length=1, description="what the code does, in plain words")
    limit: int = Field(default=5, ge=1, le=20)


@tool("search_semantic", SemanticSearchArgs,
      "Find code by meaning or by name (e.g. 'where is the retry policy configured'); "
      "returns the best-matching definitions (function, method or class) with path and "
      "line range.", kind="read")
async def search_semantic(ctx: ToolContext, args: SemanticSearchArgs) -> ToolResult:
    try:
        index = CodeIndex(ctx.settings.index_dir, ctx.workspace,
                          ctx.settings.refloop_embedding_model)
    except SemanticUnavailable as err:
        raise ToolError(f"E_NOT_INSTALLED: {err}") from None
    hits = index.search(args.query, args.limit)
    if not hits:
        note = ("no indexed code yet: the workspace is being indexed in the background; "
                "use grep meanwhile") if index.chunk_count() == 0 else "no matches"
        return ToolResult(ok=True, output=note, data={"hits": [], "note": note})
    output = "\n\n".join(
        f"{hit.path}:{hit.start_line}-{hit.end_line} (score {hit.score:.2f})\n{hit.text}"
        for hit in hits
    )
    data = [hit.model_copy(update={"text": hit.text[:HIT_DATA_CHARS]}).model_dump()
            for hit in hits]
    return ToolResult(ok=True, output=output, data={"hits": data})
