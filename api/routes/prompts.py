"""/prompts and /model-configs: CRUD over stored settings (sync routes: run in a threadpool)."""

# No `from __future__ import annotations`: FastAPI must see the factory's body types.

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Response, status
from fastapi import Path as PathParam
from pydantic import BaseModel
from sqlmodel import SQLModel

from refloop.api.deps import SettingsDep, StoreDep
from refloop.api.schemas import (
    DB_ID_MAX,
    ModelConfigCreate,
    ModelConfigPublic,
    ModelConfigUpdate,
    PromptCreate,
    PromptPublic,
    PromptUpdate,
)
from refloop.settings import Settings
from refloop.store.db import ModelConfigRecord, PromptRecord

# A stored row's fields after a change -> why they may not be stored (422), or None.
Check = Callable[[dict[str, Any], Settings], "str | None"]


def key_binding(fields: dict[str, Any], settings: Settings) -> str | None:
    """A model config may pair a key variable only with a base URL the operator bound it
    to (REFLOOP_MODEL_KEY_ENVS): the key never goes where a client points it."""
    return settings.key_refusal(fields.get("api_key_env"), fields.get("base_url"))


def no_check(fields: dict[str, Any], settings: Settings) -> str | None:
    return None

# Out of the column's range: 422 at the boundary, never a database error.
Key = Annotated[int, PathParam(ge=1, le=DB_ID_MAX)]


def crud_router(prefix: str, tag: str, table: type[SQLModel], create: type[BaseModel],
                update: type[BaseModel], public: type[BaseModel], check: Check = no_check
                ) -> APIRouter:
    """The same five routes for each stored resource."""
    router = APIRouter(prefix=prefix, tags=[tag])
    label = tag.rstrip("s")

    def found(row: SQLModel | None, key: Key) -> SQLModel:
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{label} {key} not found")
        return row

    def checked(fields: dict[str, Any], settings: Settings) -> dict[str, Any]:
        if (refusal := check(fields, settings)) is not None:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, refusal)
        return fields

    @router.post("", response_model=public, status_code=status.HTTP_201_CREATED)
    def create_one(body: create, store: StoreDep,  # type: ignore[valid-type]
                   settings: SettingsDep):
        return store.add(table(**checked(body.model_dump(), settings)))

    @router.get("", response_model=list[public])
    def list_all(store: StoreDep):
        return store.all(table)

    @router.get("/{key}", response_model=public)
    def get_one(key: Key, store: StoreDep):
        return found(store.get(table, key), key)

    @router.patch("/{key}", response_model=public)
    def update_one(key: Key, body: update, store: StoreDep,  # type: ignore[valid-type]
                   settings: SettingsDep):
        changes = body.model_dump(exclude_unset=True)
        current = found(store.get(table, key), key)
        checked({**current.model_dump(), **changes}, settings)
        return found(store.update(table, key, changes), key)

    @router.delete("/{key}", status_code=status.HTTP_204_NO_CONTENT)
    def delete_one(key: Key, store: StoreDep) -> Response:
        found(store.get(table, key), key)
        store.delete(table, key)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    return router


prompts = crud_router("/prompts", "prompts", PromptRecord, PromptCreate, PromptUpdate,
                      PromptPublic)
model_configs = crud_router("/model-configs", "model-configs", ModelConfigRecord,
                            ModelConfigCreate, ModelConfigUpdate, ModelConfigPublic,
                            check=key_binding)
