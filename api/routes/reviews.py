"""/quality-reviews: persisted reviews of document edits."""

from __future__ import annotations

from fastapi import APIRouter

from refloop.api.deps import StoreDep
from refloop.api.schemas import QualityReviewPublic

router = APIRouter(prefix="/quality-reviews", tags=["quality-reviews"])


@router.get("", response_model=list[QualityReviewPublic], response_model_by_alias=True)
def list_reviews(store: StoreDep, session_id: str | None = None, task_id: str | None = None):
    return store.list_quality_reviews(session_id=session_id, task_id=task_id)
