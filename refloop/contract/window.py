"""The context window in activity inputs and results: what a model turn's fit reports and
what a compaction takes and gives back (refloop.llm.fitting decides; workflows apply)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from refloop.contract.activity_io import LLMUsageRecord, ModelEndpoint


def parse_context_tokens(value: str | None) -> dict[str, int]:
    """`REFLOOP_MODEL_CONTEXT_TOKENS`: "32768" (every model) or "smollm2=4096,gpt-4o=128000"
    (per model; `*` for the rest)."""
    if not value or not value.strip():
        return {}
    value = value.strip()
    if value.isdigit():
        return {"*": int(value)}
    windows: dict[str, int] = {}
    for item in value.split(","):
        name, _, number = item.strip().rpartition("=")
        if not name or not number.strip().isdigit() or int(number) < 256:
            raise ValueError(f"expected a number of tokens (at least 256) or model=N pairs; "
                             f"bad item {item.strip()!r}")
        windows[name.strip()] = int(number)
    return windows


class CompactInput(BaseModel):
    conversation_ref: str
    budget: int = Field(ge=1)  # the act's prompt room (ContextReport.budget)
    task: str
    progress: str = ""  # the plan's progress, in words: kept verbatim
    model: str | None = None
    endpoint: ModelEndpoint | None = None


class CompactResult(BaseModel):
    conversation_ref: str  # the compacted conversation (the same ref: nothing to fold)
    summary_ref: str | None = None  # the summary's record in the blob store
    folded: int = 0  # messages folded into the summary
    tokens_before: int = 0
    tokens_after: int = 0
    by_model: bool = True  # False: the model could not summarise; the calls were listed
    usage: LLMUsageRecord | None = None
