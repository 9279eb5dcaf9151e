"""/healthz: liveness with Temporal and DB reachability (200 only when both answer)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from refloop.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={
    503: {"model": Health},
    421: {"description": "The Host header names no host this server answers for"}})
async def healthz(request: Request) -> JSONResponse:
    detail: dict[str, str] = {}
    client = request.app.state.client

    async def temporal() -> None:
        if client is None:
            raise RuntimeError("not connected")
        await client.workflow_service.get_system_info(GetSystemInfoRequest())

    # Both at once: each answer comes back from another thread (the Temporal bridge's, a
    # worker thread for the database), and a busy loop makes every hand-back wait its turn.
    answers = await asyncio.gather(
        asyncio.wait_for(temporal(), timeout=3),
        asyncio.wait_for(asyncio.to_thread(request.app.state.store.ping), timeout=3),
        return_exceptions=True)
    for name, answer in zip(("temporal", "database"), answers, strict=True):
        if isinstance(answer, BaseException):  # reported, never raised: the health probe
            detail[name] = type(answer).__name__
    temporal_ok, database_ok = "temporal" not in detail, "database" not in detail
    body = Health(status="ok" if temporal_ok and database_ok else "degraded",
                  temporal=temporal_ok, database=database_ok, detail=detail)
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)
