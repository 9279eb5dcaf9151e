"""/prompts and /model-configs: CRUD over stored settings (sync routes: run in a threadpool)."""

# No `from __future__ import annotations`: FastAPI must see the factory's body types.

from typing import Annotated

from fastapi import APIRouter, HTTPException, Response, status
from fastapi import Path as PathParam
from pydantic import BaseModel
from sqlmodel import SQLModel

from refloop.api.deps import StoreDep
from refloop.api.schemas import (
    DB_ID_MAX,
    ModelConfigCreate,
    ModelConfigPublic,
    ModelConfigUpdate,
    PromptCreate,
    PromptPublic,
    PromptUpdate,
)
from refloop.store.db import ModelConfigRecord, PromptRecord

# Out of the column's range: 422 at the boundary, never a database error.
Key = Annotated[int, PathParam(ge=1, le=DB_ID_MAX)]


def crud_router(prefix: str, tag: str, table: type[SQLModel], create: type[BaseModel],
                update: type[BaseModel], public: type[BaseModel]) -> APIRouter:
    """The same five routes for each stored resource."""
    router = APIRouter(prefix=prefix, tags=[tag])
    label = tag.rstrip("s")

    def found(row: SQLModel | None, key: Key) -> SQLModel:
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{label} {key} not found")
        return row

    @router.post("", response_model=public, status_code=status.HTTP_201_CREATED)
    def create_one(body: create, store: StoreDep):  # type: ignore[valid-type]
        return store.add(table(**body.model_dump()))

    @router.get("", response_model=list[public])
    def list_all(store: StoreDep):
        return store.all(table)

    @router.get("/{key}", response_model=public)
    def get_one(key: Key, store: StoreDep):
        return found(store.get(table, key), key)

    @router.patch("/{key}", response_model=public)
    def update_one(key: Key, body: update, store: StoreDep):  # type: ignore[valid-type]
        return found(store.update(table, key, body.model_dump(exclude_unset=True)), key)

    @router.delete("/{key}", status_code=status.HTTP_204_NO_CONTENT)
    def delete_one(key: Key, store: StoreDep) -> Response:
        found(store.get(table, key), key)
        store.delete(table, key)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    return router


prompts = crud_router("/prompts", "prompts", PromptRecord, PromptCreate, PromptUpdate,
                      PromptPublic)
model_configs = crud_router("/model-configs", "model-configs", ModelConfigRecord,
                            ModelConfigCreate, ModelConfigUpdate, ModelConfigPublic)
