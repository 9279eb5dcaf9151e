"""search_semantic: hybrid (vector + full-text) search over the workspace's index; one hit
per definition, with its whole line range. While the index is being built, files not stored
yet are scanned for the query's words, and the output says the answer is partial."""

from __future__ import annotations

from refloop.contract.activity_io import ToolResult
from refloop.contract.errors import ToolError
from refloop.contract.task import SearchAnswer
from refloop.contract.tool_catalog import SemanticSearchArgs
from refloop.search.embedders import EmbeddingsUnavailable
from refloop.search.index import CodeIndex
from refloop.search.runtime import SemanticUnavailable
from refloop.tools.base import ToolContext, tool
from refloop.tools.output import FEEDBACK_CHARS

HIT_DATA_CHARS = 300  # the model reads whole chunks in the output; history keeps a preview
# What the hits may take of the output the model reads (FEEDBACK_CHARS), leaving room for
# a partial answer's note: each hit shows its definition line whatever the limit.
HITS_CHARS = FEEDBACK_CHARS - 1_200



@tool("search_semantic")
async def search_semantic(ctx: ToolContext, args: SemanticSearchArgs) -> ToolResult:
    try:
        index = CodeIndex(ctx.settings.index_dir, ctx.workspace,
                          ctx.settings.search_model)
    except SemanticUnavailable as err:
        raise ToolError(f"E_NOT_INSTALLED: {err}") from None
    try:
        answer = index.answer(args.query, args.limit, HITS_CHARS)
    except EmbeddingsUnavailable as err:  # the user's own endpoint: say what it answered
        raise ToolError(f"E_EMBEDDINGS: {err}") from None
    if not answer.hits:
        note = answer.note or "no matches"
        return ToolResult(ok=True, output=note, data={"hits": [], "note": note})
    output = answer_output(answer)
    data = [hit.model_copy(update={"text": hit.text[:HIT_DATA_CHARS]}).model_dump()
            for hit in answer.hits]
    return ToolResult(ok=True, output=output,
                      data={"hits": data, "partial": answer.partial, "note": answer.note})


def answer_output(answer: SearchAnswer) -> str:
    """What the model reads of an answer with hits: each hit's `path:start-end` and score,
    then its numbered excerpt (its definition line first); a partial answer's note first."""
    output = "\n\n".join(
        f"{hit.path}:{hit.start_line}-{hit.end_line} "
        f"({'unindexed, word match' if hit.unindexed else 'score'} {hit.score:.2f})\n{hit.text}"
        for hit in answer.hits
    )
    if answer.note:  # first: the model must know the answer is partial before it trusts it
        output = f"{answer.note}\n\n{output}"
    return output
