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
    temporal = database = False
    client = request.app.state.client
    try:
        if client is None:
            raise RuntimeError("not connected")
        await asyncio.wait_for(
            client.workflow_service.get_system_info(GetSystemInfoRequest()), timeout=3)
        temporal = True
    except Exception as err:  # reported, never raised: this is the health probe
        detail["temporal"] = type(err).__name__
    try:
        await asyncio.wait_for(asyncio.to_thread(request.app.state.store.ping), timeout=3)
        database = True
    except Exception as err:
        detail["database"] = type(err).__name__
    body = Health(status="ok" if temporal and database else "degraded", temporal=temporal,
                  database=database, detail=detail)
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)
