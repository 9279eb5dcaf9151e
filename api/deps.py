"""Dependencies as Annotated aliases; tests override them on the app."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from temporalio.client import Client

from refloop.settings import Settings
from refloop.store.db import Store


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_client(request: Request) -> Client:
    client = request.app.state.client
    if client is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "Temporal is not connected")
    return client


def require_token(request: Request) -> None:
    """When REFLOOP_API_TOKEN is set, every route but /healthz needs it (constant time).
    The header is read by hand: the OpenAPI document declares the bearer scheme only when
    a token is configured (api/openapi.py)."""
    expected = request.app.state.settings.refloop_api_token
    if not expected:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or missing bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
ClientDep = Annotated[Client, Depends(get_client)]
