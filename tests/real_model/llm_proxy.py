"""A logging proxy in front of a real model server: what was asked, what came back, and
the usage the server reported, per request (abandoned ones included)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from refloop.runtime.http_thread import ThreadedServer


class LoggingProxy(ThreadedServer):
    name = "llm-proxy"

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
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
                             max_tokens=body.get("max_tokens"))
            except ValueError:
                pass
            # Logged in the order requests arrive, so one still generating when its run is
            # read (status None) is never counted in the next run's slice of the log.
            with self.lock:
                self.in_flight += 1
                self.log.append(entry)
            try:
                upstream = await client.post(
                    f"{self.upstream}/v1/chat/completions", content=raw,
                    headers={"content-type": "application/json"})
            except httpx.HTTPError as err:
                entry.update(status=599, error=str(err), end=time.time())
                with self.lock:
                    self.in_flight -= 1
                return Response(status_code=502, content=b'{"error": "upstream"}')
            # The client gave up on this request (its timeout, a cancelled attempt): what
            # the server generated for it never reached refloop's ledger.
            entry.update(status=upstream.status_code, end=time.time(),
                         abandoned=await request.is_disconnected())
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

        return app

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
