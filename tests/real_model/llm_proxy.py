"""A logging proxy in front of a real model server: what was asked, what came back, and
the usage the server reported, per request (abandoned ones included).

A streamed answer is relayed chunk by chunk and counted as the server sent it: its usage
chunk when it sends one, else one completion token per chunk carrying text
(llama-cpp-python 0.3.36 streams one generated token a chunk and no usage). When refloop
hangs up, the proxy closes the upstream connection at once (`hung_up`), so what the
server generated after that is what it finished before noticing."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from refloop.runtime.http_thread import ThreadedServer


class Steer(Protocol):
    """Narrows a request before the server sees it (its choices, never its prompt), and
    hears how the server answered it."""

    def request(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def answered(self, body: dict[str, Any], status: int) -> None: ...


class LoggingProxy(ThreadedServer):
    name = "llm-proxy"

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.steer: Steer | None = None
        self.log: list[dict[str, Any]] = []
        self.in_flight = 0
        self.lock = threading.Lock()

    def app(self) -> FastAPI:
        app = FastAPI()
        client = httpx.AsyncClient(timeout=900)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            raw = await request.body()
            entry: dict[str, Any] = {"purpose": request.headers.get("x-refloop-purpose"),
                                     "start": time.time(), "status": None}
            try:
                body = json.loads(raw)
                fmt = body.get("response_format")
                entry.update(response_format=fmt.get("type") if isinstance(fmt, dict) else None,
                             schema_in_format=isinstance(fmt, dict) and "schema" in fmt,
                             tool_choice=body.get("tool_choice"), tools=bool(body.get("tools")),
                             max_tokens=body.get("max_tokens"), stream=bool(body.get("stream")))
                if self.steer is not None:
                    body = self.steer.request(body)
                    raw = json.dumps(body).encode()
                    entry["body"] = body
            except ValueError:
                pass
            # Logged in the order requests arrive, so one still generating when its run is
            # read (status None) is never counted in the next run's slice of the log.
            with self.lock:
                self.in_flight += 1
                self.log.append(entry)
            if entry.get("stream"):
                return await relay_stream(client, raw, entry, request)
            try:
                upstream = await client.post(
                    f"{self.upstream}/v1/chat/completions", content=raw,
                    headers=forwarded(request))
            except httpx.HTTPError as err:
                entry.update(status=599, error=str(err), end=time.time())
                with self.lock:
                    self.in_flight -= 1
                return Response(status_code=502, content=b'{"error": "upstream"}')
            # The client gave up on this request (its timeout, a cancelled attempt): what
            # the server generated for it never reached refloop's ledger.
            entry.update(status=upstream.status_code, end=time.time(),
                         abandoned=await request.is_disconnected())
            self.heard(entry, upstream.status_code)
            if upstream.status_code == 200:
                data = upstream.json()
                usage = data.get("usage") or {}
                choice = (data.get("choices") or [{}])[0]
                entry.update(prompt_tokens=usage.get("prompt_tokens", 0),
                             completion_tokens=usage.get("completion_tokens", 0),
                             finish_reason=choice.get("finish_reason"),
                             tool_calls=bool((choice.get("message") or {}).get("tool_calls")))
            else:
                entry["error"] = upstream.text[:300]
            with self.lock:
                self.in_flight -= 1
            return Response(content=upstream.content, status_code=upstream.status_code,
                            media_type="application/json")

        async def relay_stream(client: httpx.AsyncClient, raw: bytes,
                               entry: dict[str, Any], request: Request) -> Response:
            request = client.build_request("POST", f"{self.upstream}/v1/chat/completions",
                                           content=raw,
                                           headers=forwarded(request))
            try:
                upstream = await client.send(request, stream=True)
            except httpx.HTTPError as err:
                entry.update(status=599, error=str(err), end=time.time())
                self.done()
                return Response(status_code=502, content=b'{"error": "upstream"}')
            entry.update(status=upstream.status_code, completion_tokens=0, hung_up=False)
            self.heard(entry, upstream.status_code)
            if upstream.status_code != 200:
                body = await upstream.aread()
                await upstream.aclose()
                entry.update(error=body.decode(errors="replace")[:300], end=time.time())
                self.done()
                return Response(content=body, status_code=upstream.status_code,
                                media_type="application/json")

            async def chunks():
                try:
                    async for line in upstream.aiter_lines():
                        count_line(entry, line)
                        yield (line + "\n").encode()
                except BaseException:  # refloop hung up (cancelled) or the server dropped
                    entry["hung_up"] = True
                    raise
                finally:
                    await upstream.aclose()
                    entry["end"] = time.time()
                    entry["abandoned"] = entry["hung_up"]
                    self.done()

            return StreamingResponse(chunks(), media_type="text/event-stream")

        return app

    def heard(self, entry: dict[str, Any], status: int) -> None:
        if self.steer is not None and "body" in entry:
            self.steer.answered(entry.pop("body"), status)

    def done(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def mark(self) -> int:
        with self.lock:
            return len(self.log)

    def since(self, mark: int) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.log[mark:])

    def wait_idle(self, timeout_s: float) -> None:
        """Abandoned generations still finishing: wait so the next run starts clean."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.5)


def forwarded(request: Request) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if purpose := request.headers.get("x-refloop-purpose"):
        headers["x-refloop-purpose"] = purpose
    return headers


def count_line(entry: dict[str, Any], line: str) -> None:
    """One SSE line of a streamed answer, into the request's log entry."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    try:
        data = json.loads(line[len("data: "):])
    except ValueError:
        return
    if data.get("usage"):
        entry["server_usage"] = data["usage"]
        entry["prompt_tokens"] = data["usage"].get("prompt_tokens", 0)
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("function_call"):
            entry["completion_tokens"] += 1
        if choice.get("finish_reason"):
            entry["finish_reason"] = choice["finish_reason"]
        if delta.get("tool_calls"):
            entry["tool_calls"] = True
    if entry.get("server_usage"):  # the server's own count wins over the chunks
        entry["completion_tokens"] = entry["server_usage"].get("completion_tokens", 0)
