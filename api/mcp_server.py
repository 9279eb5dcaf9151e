"""refloop as an MCP server: hand refloop a long task, come back for the result.

The tools call the HTTP API's own route functions (same Temporal client, same store), so
MCP and HTTP clients see one behaviour. Served over stdio by `refloop mcp` and over
streamable HTTP at `/mcp` by the API, behind the API token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client

from refloop.api.guards import short_echo
from refloop.api.routes import code_reviews, tasks
from refloop.api.schemas import ApprovalBody, SessionStart, TaskCreate
from refloop.api.sse import TemporalSilent, fetch_events
from refloop.runtime.workspaces import is_safe_id
from refloop.settings import Settings
from refloop.store.db import Store

MAX_WAIT_S = 30.0
POLL_S = 0.2


@dataclass
class McpDeps:
    client: Client
    store: Store
    settings: Settings


def refusal(**inputs: Any) -> str | None:
    """What HTTP's boundary refuses before any route (NUL bytes, lone surrogates, unsafe
    IDs), and what only a stdio server must: a relative directory would be resolved
    against the MCP client's working directory, not the server's."""
    for name, value in inputs.items():
        if value is None:
            continue
        text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
        if "\x00" in text:
            return f"NUL bytes are not accepted ({name})"
        if any("\ud800" <= ch <= "\udfff" for ch in text):
            return f"{name}: a string holds a lone UTF-16 surrogate"
        if name == "task_id" and not is_safe_id(value):
            return (f"task_id must be 1-128 letters, digits, '.', '_' or '-' "
                    f"(got {short_echo(value)!r})")
        if name in ("workspace", "working_directory") and not value.startswith(("/", "~")):
            return f"{name} must be an absolute path (got {short_echo(value)!r})"
    return None


@contextlib.contextmanager
def api_errors(**inputs: Any) -> Any:
    """The API's refusals (404, 409, 422) as MCP tool errors with HTTP's words: the same
    checks, the same messages, inputs quoted at most 80 characters."""
    if (why := refusal(**inputs)) is not None:
        raise ToolError(f"422: {why}")
    try:
        yield
    except HTTPException as err:
        raise ToolError(f"{err.status_code}: {err.detail}") from None
    except ValidationError as err:
        issues = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got "
                           f"{short_echo(e.get('input'))!r})" for e in err.errors()[:5])
        raise ToolError(f"422: {issues}") from None


def _task_view(state: Any) -> dict[str, Any]:
    """A task's row without its event list (task_events pages through that)."""
    view = state.model_dump(mode="json")
    result = view.get("result")
    if isinstance(result, dict):
        view["result"] = {k: v for k, v in result.items() if k != "events"}
    return view


def build_mcp_server(deps: Callable[[], McpDeps]) -> MCPServer:
    server = MCPServer(
        name="refloop",
        instructions="Durable, reflective agent tasks on Temporal. start_task returns a "
                     "task_id at once; poll task_events (after the last seq you saw) or "
                     "get_task until the status is completed, incomplete, failed or "
                     "cancelled. approval_required events wait for approve.",
    )

    @server.tool()
    async def start_task(task: str, workspace: str,
                         approval_mode: Literal["auto", "confirm_writes", "confirm_all"]
                         = "auto",
                         mcp_servers: list[str] | None = None, max_iterations: int = 20,
                         model: str | None = None, max_cost_usd: float | None = None,
                         max_tokens: int | None = None) -> dict[str, Any]:
        """Start an agent task in a workspace directory; returns its task_id at once.
        `max_cost_usd`/`max_tokens`: its spend limit; at it the task waits
        waiting_for_budget until POST /tasks/{id}/budget (or `refloop budget`) raises it."""
        d = deps()
        with api_errors(task=task, workspace=workspace, approval_mode=approval_mode,
                        mcp_servers=mcp_servers, max_iterations=max_iterations, model=model,
                        max_cost_usd=max_cost_usd, max_tokens=max_tokens):
            session = await tasks.start_session(
                SessionStart(workspace=workspace, approval_mode=approval_mode, model=model),
                d.store, d.settings)
            accepted = await tasks.start_task(
                TaskCreate(session_id=session.session_id, task=task,
                           max_iterations=max_iterations, mcp_servers=mcp_servers,
                           max_cost_usd=max_cost_usd, max_tokens=max_tokens),
                d.client, d.store, d.settings)
        return accepted.model_dump(mode="json")

    @server.tool()
    async def get_task(task_id: str) -> dict[str, Any]:
        """A task's status, progress and (once ended) result with its answer."""
        d = deps()
        with api_errors(task_id=task_id):
            return _task_view(await tasks.get_task(task_id, d.client, d.store, d.settings))

    @server.tool()
    async def task_events(task_id: str, after_seq: int = 0,
                          wait_s: float = 0.0) -> dict[str, Any]:
        """A task's events after `after_seq`; waits up to `wait_s` (max 30) for new ones.
        `ended` is true once the task has finished."""
        d = deps()
        with api_errors(task_id=task_id, after_seq=after_seq, wait_s=wait_s):
            row = await tasks.task_row(d.store, task_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(wait_s, MAX_WAIT_S))
        while True:
            try:
                events, ended = await fetch_events(d.client, d.store, task_id,
                                                   row.workflow_id, after_seq)
            except TemporalSilent as err:  # said, as the HTTP stream says it
                return {"events": [], "ended": False, "status": str(err),
                        "temporal": "unreachable"}
            if events or ended or loop.time() >= deadline:
                return {"events": [event.model_dump(mode="json") for event in events],
                        "ended": ended}
            await asyncio.sleep(POLL_S)

    @server.tool()
    async def approve(task_id: str, call_id: str, approved: bool = True,
                      comment: str | None = None,
                      arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Decide a waiting call (the call_id of an approval_required event); `arguments`:
        approve it with these instead of the model's (its whole arguments, checked as the
        tool checks the model's own)."""
        d = deps()
        with api_errors(task_id=task_id, call_id=call_id, approved=approved, comment=comment,
                        arguments=arguments):
            outcome = await tasks.decide(
                task_id, ApprovalBody(call_id=call_id, approved=approved, comment=comment,
                                      arguments=arguments),
                d.client, d.store)
        return outcome.model_dump(mode="json")

    @server.tool()
    async def cancel_task(task_id: str) -> dict[str, Any]:
        """Cancel a running task."""
        d = deps()
        with api_errors(task_id=task_id):
            return await tasks.cancel_task(task_id, d.client, d.store)

    @server.tool()
    async def start_code_review(review_type: Literal["diff", "file", "snippet"],
                                working_directory: str, content: str | None = None,
                                file_paths: list[str] | None = None, task_desc: str = "",
                                output_format: str = "detailed",
                                model: str | None = None, max_cost_usd: float | None = None,
                                max_tokens: int | None = None) -> dict[str, Any]:
        """Start a code review of a diff, files or a snippet; returns its task_id.
        `max_cost_usd`/`max_tokens`: its own spend limit; at it the review waits
        waiting_for_budget until POST /tasks/{id}/budget (or `refloop budget`) raises it."""
        d = deps()
        with api_errors(review_type=review_type, working_directory=working_directory,
                        content=content, file_paths=file_paths, task_desc=task_desc,
                        output_format=output_format, model=model, max_cost_usd=max_cost_usd,
                        max_tokens=max_tokens):
            body = code_reviews.CodeReviewRequest(
                review_type=review_type, working_directory=working_directory,
                content=content, file_paths=file_paths or [], task_desc=task_desc,
                output_format=output_format, model=model, max_cost_usd=max_cost_usd,
                max_tokens=max_tokens)
            accepted = await code_reviews.start_review(body, d.client, d.store, d.settings)
        return accepted.model_dump(mode="json")

    @server.tool()
    async def get_code_review(task_id: str) -> dict[str, Any]:
        """A code review's status and, once done, its result."""
        d = deps()
        with api_errors(task_id=task_id):
            state = await code_reviews.get_review(task_id, d.client, d.store)
        return json.loads(state.model_dump_json())

    return server


class TokenGuard:
    """The API token in front of the MCP endpoint (constant-time, like the routes)."""

    def __init__(self, app: ASGIApp, token: Callable[[], str | None]) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        expected = self.token()
        if expected and scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, credentials = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    credentials.encode(), expected.encode()):
                body = b'{"detail":"invalid or missing bearer token"}'
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_endpoint(server: MCPServer, settings: Settings,
                  ) -> tuple[ASGIApp, Callable[[], contextlib.AbstractAsyncContextManager[None]]]:
    """(the ASGI app for `/mcp`, the lifespan the API enters for it)."""
    from mcp.server.transport_security import TransportSecuritySettings

    # With a token the endpoint is guarded; without one, only localhost Host headers pass
    # (the SDK's DNS-rebinding protection).
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False) \
        if settings.refloop_api_token else None
    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security)

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        async with app.router.lifespan_context(app):
            yield

    return TokenGuard(app, lambda: settings.refloop_api_token), lifespan
