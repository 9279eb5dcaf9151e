"""The FastAPI app: one router per resource, Temporal client from the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from temporalio.client import Client
from temporalio.service import RPCError

from refloop.api.deps import require_token
from refloop.api.guards import (
    MAX_BODY_BYTES,
    BoundaryGuard,
    HostGuard,
    allowed_hosts,
    http_error,
    short_validation_error,
)
from refloop.api.housekeeping import keep_house
from refloop.api.mcp_server import McpDeps, build_mcp_server, http_endpoint
from refloop.api.openapi import ERROR_RESPONSES, install_docs
from refloop.api.reconcile import reconcile_all
from refloop.api.routes import budget as budget_routes
from refloop.api.routes import code_reviews, health, prompts, reviews, task_review, tasks
from refloop.api.routes import hosts as host_routes
from refloop.contract.text import escape_json_controls
from refloop.settings import Settings
from refloop.store.db import store_for


class EscapedJSONResponse(JSONResponse):
    """Every control character of a text field is escaped in the JSON text: JSON escapes
    C0 (ESC included) itself; C1 and bidirectional controls, which a model or a repository
    can also write, are escaped here (`\\u009b`, `\\u202e`), never sent raw."""

    def render(self, content: object) -> bytes:
        return escape_json_controls(super().render(content).decode("utf-8")).encode("utf-8")


log = logging.getLogger("refloop.api")
__all__ = ["MAX_BODY_BYTES", "create_app"]
DB_RETRY_AFTER_S = 5


def mcp_deps(app: FastAPI) -> McpDeps:
    client = app.state.client
    if client is None:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError("Temporal is not connected")
    return McpDeps(client, app.state.store, app.state.settings)


def create_app(settings: Settings, client: Client | None = None) -> FastAPI:
    """`client` given (tests, `refloop up`): used as is; else connect to TEMPORAL_ADDRESS."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if app.state.client is None and settings.temporal_address:
            from refloop.runtime.client import connect

            try:
                app.state.client = await connect(settings.temporal_address,
                                                 settings.temporal_namespace)
            except Exception as err:  # /healthz reports it; routes answer 503
                log.error("cannot reach Temporal at %s: %s", settings.temporal_address, err)
        # Rows that claim to run are checked against Temporal once, in the background.
        startup = None
        if app.state.client is not None:
            startup = asyncio.create_task(reconcile_all(app.state.client, app.state.store))
        upkeep = asyncio.create_task(keep_house(settings, app.state.store))
        async with mcp_lifespan():
            yield
        upkeep.cancel()
        if startup is not None and not startup.done():
            startup.cancel()

    app = FastAPI(
        title="refloop",
        version="0.1.0",
        description="Durable, reflective LLM agents on Temporal.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None, openapi_url=None,  # api/openapi.py serves them
        default_response_class=EscapedJSONResponse,
    )
    app.state.settings = settings
    app.state.store = store_for(settings.effective_database_url)
    app.state.client = client
    app.add_middleware(BoundaryGuard)
    hosts = allowed_hosts(settings.refloop_allowed_hosts)
    app.add_middleware(HostGuard, hosts=lambda: hosts)  # added last: runs first
    app.add_exception_handler(RequestValidationError, short_validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    install_docs(app)

    @app.exception_handler(RPCError)
    async def temporal_unavailable(request: Request, exc: RPCError) -> JSONResponse:
        # Temporal did not answer (down, overloaded, restarting): nothing was changed, so the
        # client may simply try again.
        log.warning("Temporal error on %s %s: %s %s", request.method, request.url.path,
                    exc.status.name, exc.message)
        return JSONResponse({"detail": f"Temporal did not answer ({exc.status.name}); "
                                       "try again shortly"},
                            status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeout)
    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # The database refused or dropped the connection: a state, not a bug. Handled here
        # (not as a 500) the connection stays open for the client's next request.
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path,
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return JSONResponse({"detail": "the database is unavailable; try again shortly",
                             "database": "unavailable"},
                            status_code=503, headers={"Retry-After": str(DB_RETRY_AFTER_S)})

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # No stack trace leaves the server; the log has it.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    # The web console: static files, no build step; its data calls carry the token.
    app.mount("/ui", StaticFiles(directory=Path(__file__).parent / "static", html=True),
              name="ui")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:  # browsers ask every page's origin for it
        return FileResponse(Path(__file__).parent / "static" / "favicon.ico")

    # refloop as an MCP server (streamable HTTP), behind the same token as the routes.
    mcp_app, mcp_lifespan = http_endpoint(build_mcp_server(lambda: mcp_deps(app)), settings)
    app.router.routes.append(Route("/mcp", endpoint=mcp_app))

    secured = [Depends(require_token)]
    app.include_router(health.router)
    for router in (tasks.interactive, tasks.tasks, prompts.prompts, prompts.model_configs,
                   reviews.router, code_reviews.router, host_routes.router,
                   task_review.router, budget_routes.router):
        app.include_router(router, dependencies=secured, responses=ERROR_RESPONSES)
    return app
