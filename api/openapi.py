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
from refloop.settings import DEFAULT_ENDPOINT, Settings, normalise_url


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
    413: problem("Body larger than 1 MB (chunked bodies included), or of more than 10,000 "
                 "JSON members or 64 levels of nesting"),
    421: problem("The Host header names no host this server answers for "
                 "(REFLOOP_ALLOWED_HOSTS)"),
    422: problem("Invalid input: field issues (inputs quoted short), NUL bytes, workspace "
                 "outside the roots"),
    503: problem("Temporal is not connected or did not answer, or the database is "
                 "unavailable; try again after Retry-After seconds"),
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


KEY_ENV_TEXT = ("The environment variable holding the model key: a name the operator bound in "
                "REFLOOP_MODEL_KEY_ENVS (with none bound, null only), with a base_url it is "
                "bound to (a bare NAME: the worker's own endpoint, base_url null).")


def express_key_binding(schema: dict[str, Any], settings: Settings) -> None:
    """The operator's REFLOOP_MODEL_KEY_ENVS in the document: `api_key_env` is one of its
    names and, in a create, comes with a base URL its name is bound to, as the route checks
    (settings.key_refusal). A PATCH's check also reads the stored row, which no schema can
    say; its `api_key_env` is at least limited to the bound names."""
    bindings = settings.model_key_urls
    default = normalise_url(settings.openai_base_url) if settings.openai_base_url else None
    names: dict[str, Any] = {"type": "string", "enum": sorted(bindings)}
    choice = {"anyOf": [names, {"type": "null"}] if bindings else [{"type": "null"}],
              "title": "Api Key Env", "description": KEY_ENV_TEXT}
    components = schema.get("components", {}).get("schemas", {})
    for name in ("ModelConfigCreate", "ModelConfigUpdate"):
        if "api_key_env" in components.get(name, {}).get("properties", {}):
            components[name]["properties"]["api_key_env"] = choice
    create = components.get("ModelConfigCreate")
    if not bindings or create is None:
        return
    unset = [{"not": {"required": ["api_key_env"]}},
             {"properties": {"api_key_env": {"type": "null"}}, "required": ["api_key_env"]}]
    variants = []
    for key, urls in sorted(bindings.items()):
        allowed: list[str | None] = sorted(url for url in urls if url != DEFAULT_ENDPOINT)
        if DEFAULT_ENDPOINT in urls:
            allowed += [None] + ([default] if default else [])
        elif default in urls:
            allowed.append(None)
        variant: dict[str, Any] = {
            "properties": {"api_key_env": {"const": key}, "base_url": {"enum": allowed}},
            "required": ["api_key_env"] + ([] if None in allowed else ["base_url"])}
        variants.append(variant)
    create["anyOf"] = unset + variants


MCP_SERVERS_TEXT = ("MCP servers whose tools the task may use: names in the operator's "
                    "REFLOOP_MCP_CONFIG file (with none configured, none)")
# The request bodies that name MCP servers.
MCP_SERVER_FIELDS = (("SessionStart", "mcp_servers"), ("TaskCreate", "mcp_servers"))


def configured_mcp_servers(settings: Settings) -> tuple[str, ...]:
    """The names the routes accept (api/routes/tasks.py known_mcp_servers): the MCP
    configuration's, read now; a file that does not load accepts none."""
    from refloop.contract.errors import McpConfigError
    from refloop.mcp.config import load_config

    try:
        return tuple(sorted(load_config(settings.refloop_mcp_config).servers))
    except McpConfigError:
        return ()


def express_mcp_servers(schema: dict[str, Any], names: tuple[str, ...]) -> None:
    """The configured MCP server names in the document, as the model keys are: each
    `mcp_servers` list of a request holds only them (none configured: an empty list)."""
    components = schema.get("components", {}).get("schemas", {})
    for component, field in MCP_SERVER_FIELDS:
        prop = components.get(component, {}).get("properties", {}).get(field)
        if prop is None:
            continue
        prop["description"] = MCP_SERVERS_TEXT
        for array in (prop, *prop.get("anyOf", [])):
            if array.get("type") != "array":
                continue
            if names:
                array["items"] = {"type": "string", "enum": list(names)}
            else:
                array["maxItems"] = 0


def build_openapi(app: FastAPI) -> dict[str, Any]:
    secured = bool(app.state.settings.refloop_api_token)
    # The MCP file is read by every request that names a server, so by the document too:
    # an operator's edit shows without a restart.
    mcp_servers = configured_mcp_servers(app.state.settings)
    cache: dict[tuple[bool, tuple[str, ...]], dict[str, Any]] = app.state.openapi_cache
    if (secured, mcp_servers) in cache:
        return cache[secured, mcp_servers]
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    add_links(schema)
    express_key_binding(schema, app.state.settings)
    express_mcp_servers(schema, mcp_servers)
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
    cache[secured, mcp_servers] = schema
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
