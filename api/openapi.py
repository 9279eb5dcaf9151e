"""The OpenAPI document and /docs: statuses with their real bodies, security only when a
token is configured, Swagger UI 5 served from the files of the `fastapi-swagger` package
(no CDN; `swagger-ui-bundle` ships Swagger UI 4, which cannot render OpenAPI 3.1).

Documented choice: `/openapi.json` needs the token when one is set. `/docs` is a static
page holding no data; it fetches the document with the console's token (kept in the tab's
sessionStorage by the sign-in at /ui/), or links to that sign-in when it has none.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from refloop.api.deps import require_token


class ValidationIssue(BaseModel):
    type: str
    loc: list[str | int]
    msg: str
    input: Any = None


class Problem(BaseModel):
    """Every error answer: a sentence, or (422 from validation) the list of field issues."""

    detail: str | list[ValidationIssue]


def problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


# Declared on every data route (include_router(responses=...)).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: problem("The body could not be parsed (not JSON, or not UTF-8)"),
    404: problem("No such resource (or not of this route's kind)"),
    409: problem("The resource's state forbids this (duplicate ID, task already ended, ...)"),
    413: problem("Body larger than 1 MB (chunked bodies included)"),
    421: problem("The Host header names no host this server answers for "
                 "(REFLOOP_ALLOWED_HOSTS)"),
    422: problem("Invalid input: field issues (inputs quoted short), NUL bytes, workspace "
                 "outside the roots"),
    503: problem("Temporal is not connected or did not answer; try again"),
}
UNAUTHORIZED = {"description": "Missing or wrong bearer token", "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
PUBLIC_PATHS = frozenset({"/healthz"})

DOCS_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>refloop API</title><link rel="stylesheet" href="/docs/assets/swagger-ui.css"></head>
<body><p id="signin" hidden>This API needs its token: <a href="/ui/?next=/docs">sign in</a>
first, then come back.</p><div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script>
const token = sessionStorage.getItem("refloop-token");
SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui",
  requestInterceptor: (req) => { if (token) req.headers.Authorization = `Bearer ${token}`;
                                 return req; },
  responseInterceptor: (res) => { if (res.status === 401)
    document.getElementById("signin").hidden = false; return res; } });
</script></body></html>"""


# What a created resource leads to (OpenAPI links): clients and schemathesis' stateful
# phase follow them. (method, path, status) -> [(method, path, parameters, request body)].
# Event streams and approvals are left out: on a task no worker runs they wait for ever.
TASK_ID = {"task_id": "$response.body#/task_id"}
KEY = {"key": "$response.body#/id"}
LINKS: dict[tuple[str, str, str], list[tuple[str, str, dict[str, str], dict | None]]] = {
    **{("post", base, "201"): [(method, f"{base}/{{key}}", KEY, None)
                               for method in ("get", "patch", "delete")]
       for base in ("/prompts", "/model-configs")},
    ("post", "/agent/interactive/start", "201"): [
        ("post", "/agent/interactive/task", {},
         {"session_id": "$response.body#/session_id", "task": "say hello"})],
    ("post", "/agent/interactive/task", "202"): [
        ("get", "/tasks/{task_id}", TASK_ID, None),
        ("post", "/tasks/{task_id}/cancel", TASK_ID, None)],
    ("post", "/code-reviews", "202"): [
        ("get", "/code-reviews/{task_id}", TASK_ID, None),
        ("get", "/tasks/{task_id}", TASK_ID, None)],
}


def add_links(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    for (method, path, code), targets in LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(code)
        if response is None:
            continue
        links = response.setdefault("links", {})
        for target_method, target_path, parameters, body in targets:
            target = paths.get(target_path, {}).get(target_method)
            if target is None:
                continue
            link: dict[str, Any] = {"operationId": target["operationId"]}
            if parameters:
                link["parameters"] = parameters
            if body is not None:
                link["requestBody"] = body
            links[target["operationId"]] = link


def build_openapi(app: FastAPI) -> dict[str, Any]:
    secured = bool(app.state.settings.refloop_api_token)
    cache: dict[bool, dict[str, Any]] = app.state.openapi_cache
    if secured in cache:
        return cache[secured]
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    add_links(schema)
    if secured:
        components = schema.setdefault("components", {})
        components.setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer",
            "description": "REFLOOP_API_TOKEN (printed by `refloop up` when it made one)"}
        for path, operations in schema["paths"].items():
            if path in PUBLIC_PATHS:
                continue
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]
                operation["responses"]["401"] = UNAUTHORIZED
    cache[secured] = schema
    return schema


def install_docs(app: FastAPI) -> None:
    """/openapi.json behind the token; /docs with local Swagger UI assets."""
    app.state.openapi_cache = {}
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    async def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(DOCS_PAGE)

    try:
        assets = resources.files("fastapi_swagger") / "resources"
    except ModuleNotFoundError:  # the page then stays empty; the API itself works
        return
    app.mount("/docs/assets", StaticFiles(directory=str(assets)), name="swagger-ui")
