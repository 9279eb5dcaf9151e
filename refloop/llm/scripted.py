"""The scripted model: an OpenAI-compatible HTTP server answering from a scenario file.

A test double that ships with the product: the offline demo and every test drive the
real `openai` client against it. Responses are consumed in order per purpose (the
`X-Refloop-Purpose` header); an exhausted purpose is a clear 400, never a hang. Every
answer says it is scripted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from refloop.contract.messages import Purpose
from refloop.llm.prompts import NO_TOOL, TOOL_PICK_NAME, is_tool_pick
from refloop.llm.scenario import (
    SCRIPTED_MARKER,
    Scenario,
    ScriptedResponse,
    load_scenario,
)
from refloop.llm.scripted_stream import RUNAWAY_TEXT, stream_answer
from refloop.llm.scripted_window import UNENFORCED_WINDOW, length_refused, window_tokens
from refloop.runtime.http_thread import KEEP_ALIVE_S, ThreadedServer
from refloop.runtime.net import free_port, wait_for_port

# An unstreamed runaway answers this many times its max_tokens (a context's end).
RUNAWAY_FACTOR = 4


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": code, "code": code}},
        status_code=status,
        headers={"X-Refloop-Scripted": "true"},
    )


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


class ScriptState:
    """Loaded scenarios, their cursors and the request log (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scenarios: dict[str, Scenario] = {}
        self.cursors: dict[tuple[str, str], int] = {}
        self.log: list[dict[str, Any]] = []
        # Requests received, answered or not yet (the log has only answered ones): a crash
        # test kills a worker while the call it waits on is here.
        self.arrived: Counter[tuple[str, str | None]] = Counter()
        self.default = "default"
        # An endpoint-wide fault (an outage on demand, `POST /_admin/fault`): every chat
        # request gets it, no scenario entry is used; `faulted` keeps when each came.
        self.fault: dict[str, Any] | None = None
        self.faulted: list[float] = []

    def load(self, scenario: Scenario, default: bool = False) -> None:
        with self.lock:
            self.scenarios[scenario.name] = scenario
            for key in [k for k in self.cursors if k[0] == scenario.name]:
                del self.cursors[key]
            if default:
                self.default = scenario.name

    def requests(self, model: str | None, purpose: str | None) -> list[dict[str, Any]]:
        """Logged requests, oldest first, each with its parsed `body`."""
        with self.lock:
            rows = [r for r in self.log if (model is None or r["model"] == model)
                    and (purpose is None or r["purpose"] == purpose)]
        return [{**{k: v for k, v in r.items() if k != "raw"}, "body": json.loads(r["raw"])}
                for r in rows]

    def scenario_for(self, model: str) -> Scenario | None:
        with self.lock:
            return self.scenarios.get(model) or self.scenarios.get(self.default)

    def next_response(
        self, model: str, purpose: Purpose, text: str, turn: int = 0, peek: bool = False
    ) -> tuple[Scenario | None, ScriptedResponse | None, int]:
        """The entry answering this request; `peek`: left for the next request too."""
        with self.lock:
            scenario = self.scenarios.get(model) or self.scenarios.get(self.default)
            if scenario is None:
                return None, None, 0
            entries = scenario.responses.get(purpose, [])
            key = (scenario.name, purpose.value)
            index = self.cursors.get(key, 0)
            if scenario.repeat and entries:
                return scenario, entries[turn % len(entries)], len(entries)
            while index < len(entries):
                entry = entries[index]
                index += 1
                if entry.when_contains is None or entry.when_contains in text:
                    if not peek:
                        self.cursors[key] = index
                    return scenario, entry, len(entries)
            if not peek:
                self.cursors[key] = index
            return scenario, None, len(entries)

    def put_back(self, scenario: Scenario, purpose: Purpose, entry: ScriptedResponse) -> None:
        """The entry answers the next request again (a stream the server broke)."""
        with self.lock:
            entries = scenario.responses.get(purpose, [])
            index = next((i for i, e in enumerate(entries) if e is entry), None)
            if index is not None and not scenario.repeat:
                self.cursors[(scenario.name, purpose.value)] = index


def build_app(state: ScriptState) -> FastAPI:
    app = FastAPI(title="refloop scripted model (test double)")

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        purpose_name = request.headers.get("x-refloop-purpose")
        model = str(body.get("model", ""))
        with state.lock:
            state.arrived[(model, purpose_name)] += 1
        # The raw bytes are kept, parsed again only when read: a long run's log of parsed
        # prompts would be millions of live objects for the garbage collector to walk.
        entry_log: dict[str, Any] = {
            "purpose": purpose_name, "model": model, "time": time.time(), "raw": raw,
            "authorization": request.headers.get("authorization"),
        }
        with state.lock:
            fault = state.fault
            if fault is not None:
                state.faulted.append(time.time())
        if fault is not None:
            return fault_response(fault, bool(body.get("stream")))
        response, delay_s = _answer(state, body, purpose_name, model, entry_log)
        if delay_s:
            await asyncio.sleep(delay_s)
        entry_log["status"] = response.status_code
        entry_log["answered"] = time.time()
        with state.lock:
            state.log.append(entry_log)
        return response

    @app.get("/props")
    async def props() -> Response:
        """llama.cpp's server properties: the default scenario's window, when it is one
        that words its refusals as llama.cpp does."""
        scenario = state.scenario_for("")
        quirks = scenario.endpoint if scenario is not None else None
        if quirks is None or quirks.context_tokens is None or \
                quirks.context_refusal != "llama_cpp":
            return _error(404, "File Not Found", "not_found")
        return JSONResponse({"default_generation_settings": {"n_ctx": quirks.context_tokens},
                             "total_slots": 1})

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> JSONResponse:
        """Every scenario as a model; its window stated unless it hides it (openai)."""
        with state.lock:
            scenarios = list(state.scenarios.values())
        data = []
        for scenario in scenarios:
            entry: dict[str, Any] = {"id": scenario.name, "object": "model",
                                     "owned_by": SCRIPTED_MARKER}
            if scenario.endpoint.context_refusal != "openai":
                entry["context_length"] = scenario.endpoint.context_tokens or UNENFORCED_WINDOW
            data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    @app.post("/_admin/scenarios/{name}")
    async def load(name: str, request: Request) -> JSONResponse:
        try:
            state.load(load_scenario(await request.json(), name))
        except ValueError as err:
            return _error(422, str(err), "invalid_scenario")
        return JSONResponse({"loaded": name})

    @app.post("/_admin/fault")
    async def set_fault(request: Request) -> JSONResponse:
        """`{"status": 500}`, `{"status": 429, "retry_after": 2}`, `{"garbage": true}`: every
        chat request answers so from now on; `{}`: normal answers again."""
        fault = await request.json()
        if not isinstance(fault, dict) or not set(fault) <= FAULT_KEYS:
            return _error(422, f"a fault takes {sorted(FAULT_KEYS)}", "invalid_fault")
        with state.lock:
            state.fault = fault or None
        return JSONResponse({"fault": fault})

    @app.get("/_admin/requests")
    async def requests(model: str | None = None, purpose: str | None = None) -> JSONResponse:
        return JSONResponse(state.requests(model, purpose))

    @app.post("/_admin/reset")
    async def reset() -> JSONResponse:
        with state.lock:
            state.cursors.clear()
            state.log.clear()
        return JSONResponse({"reset": True})

    return app


FAULT_KEYS = frozenset({"status", "retry_after", "garbage"})
# A body cut short in a multi-byte sequence: not UTF-8, not JSON (a proxy's truncation).
GARBAGE = b'{"id": "chatcmpl-scripted", "choices": [{"message": {"content": "\xff\xfe'


def fault_response(fault: dict[str, Any], stream: bool) -> Response:
    """The answer of an endpoint-wide fault: an error status (with `Retry-After`), or a
    200 whose body is garbage (for a stream, one event of it)."""
    headers = {"X-Refloop-Scripted": "true"}
    if fault.get("garbage"):
        if stream:
            return Response(b"data: " + GARBAGE + b"\n\n", media_type="text/event-stream",
                            headers=headers)
        return Response(GARBAGE, media_type="application/json", headers=headers)
    if fault.get("retry_after") is not None:
        headers["Retry-After"] = str(fault["retry_after"])
    status = int(fault.get("status", 500))
    return JSONResponse({"error": {"message": f"scripted fault: HTTP {status}",
                                   "type": "scripted_fault", "code": "scripted_fault"}},
                        status_code=status, headers=headers)


def _answer(state: ScriptState, body: dict[str, Any], purpose_name: str | None,
            model: str, record: dict[str, Any]) -> tuple[Response, float]:
    """The response and how long to wait before sending it (a stream's first token)."""
    if not purpose_name:
        return _error(400, "missing X-Refloop-Purpose header", "missing_purpose"), 0
    try:
        purpose = Purpose(purpose_name)
    except ValueError:
        return _error(400, f"unknown purpose {purpose_name!r}", "unknown_purpose"), 0
    rejected = _quirk_rejection(state.scenario_for(model), body)
    if rejected is not None:
        return rejected, 0
    quirks = (state.scenario_for(model) or Scenario()).endpoint
    if quirks.context_tokens is not None:
        record["prompt_tokens"] = window_tokens(body)
        refused = length_refused(quirks, body)
        if refused is not None:
            return refused, 0
    text = json.dumps(body.get("messages", []), ensure_ascii=False)
    messages = body.get("messages") or []
    turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    # Asked which tool comes next: the next scripted answer's tool, which stays to answer
    # the call that follows (a scenario lists the answers, not the picks).
    picking = is_tool_pick(body)
    scenario, entry, total = state.next_response(model, purpose, text, turn, peek=picking)
    if scenario is None:
        return _error(400, "no scripted scenario is loaded", "scenario_missing"), 0
    if entry is None:
        message = (f"scripted scenario '{scenario.name}' exhausted for purpose "
                   f"'{purpose.value}' after {total} responses")
        return _error(400, message, "scenario_exhausted"), 0
    if picking:
        entry = pick_answer(entry)
    elif breaks_stream(scenario, entry, body):
        state.put_back(scenario, purpose, entry)  # the client asks again unstreamed
    return (_render(scenario, entry, body, record),
            (scenario.latency_ms + entry.delay_ms) / 1000)


def pick_answer(entry: ScriptedResponse) -> ScriptedResponse:
    """The answer to "which tool next" (a call of the pick tool): the scripted answer's
    first tool, else none."""
    name = entry.tool_calls[0].name if entry.status == 200 and entry.tool_calls else NO_TOOL
    return ScriptedResponse(tool_calls=[{"name": TOOL_PICK_NAME, "arguments": {"tool": name}}],
                            delay_ms=entry.delay_ms, token_ms=entry.token_ms)


def chooses_itself(body: dict[str, Any]) -> bool:
    """Tools offered, the model left to choose (`tool_choice` auto or absent)."""
    return bool(body.get("tools")) and body.get("tool_choice", "auto") == "auto"


def breaks_stream(scenario: Scenario, entry: ScriptedResponse, body: dict[str, Any]) -> bool:
    """llama-cpp-python 0.3.36: a tool call chosen under `tool_choice: auto` cannot stream
    (`stream_named_tools_break`: nor one with its tool named)."""
    if not (body.get("stream") and body.get("tools") and entry.tool_calls):
        return False
    quirks = scenario.endpoint
    return quirks.stream_tools_break if chooses_itself(body) else quirks.stream_named_tools_break


def _quirk_rejection(scenario: Scenario | None, body: dict[str, Any]) -> JSONResponse | None:
    """The error a quirky endpoint answers this request with, worded like the real ones."""
    if scenario is None:
        return None
    quirks = scenario.endpoint
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is not None and quirks.reject_response_format:
        return _error(quirks.reject_response_format,
                      "response_format is not supported by this server", "unsupported")
    if kind == "json_schema" and quirks.reject_json_schema:
        return _error(quirks.reject_json_schema,
                      "1 validation error: response_format.type: Input should be 'text' "
                      "or 'json_object'", "validation_error")
    if kind == "json_object" and "schema" in fmt and quirks.reject_json_object_schema:
        return _error(quirks.reject_json_object_schema,
                      "response_format.schema: extra inputs are not permitted",
                      "validation_error")
    if quirks.reject_null_content and any(
            isinstance(m, dict) and m.get("content") is None for m in body.get("messages", [])):
        return _error(500, "1 validation error: messages.content: Input should be a valid "
                      "string", "validation_error")
    if "tool_choice" in body and quirks.reject_tool_choice:
        return _error(quirks.reject_tool_choice, "tool_choice is not supported",
                      "unsupported")
    if "stream_options" in body and quirks.reject_stream_options:
        return _error(quirks.reject_stream_options, "1 validation error: stream_options: "
                      "extra inputs are not permitted", "validation_error")
    if body.get("stream") and quirks.reject_stream:
        return _error(quirks.reject_stream, "stream is not supported by this server",
                      "unsupported")
    return None


def _render(scenario: Scenario, entry: ScriptedResponse, body: dict[str, Any],
            record: dict[str, Any]) -> Response:
    if entry.status != 200:
        headers = {"X-Refloop-Scripted": "true"}
        if entry.retry_after is not None:
            headers["Retry-After"] = str(entry.retry_after)
        headers.update(entry.headers or {})
        payload = entry.body or {"error": {"message": f"scripted error {entry.status}",
                                           "type": "scripted_error"}}
        return JSONResponse(payload, status_code=entry.status, headers=headers)
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if entry.json_ is not None:
        message["content"] = json.dumps(entry.json_, ensure_ascii=False)
    if entry.content is not None:
        message["content"] = entry.content
    if entry.tool_calls and scenario.endpoint.tools_need_choice and "tool_choice" not in body:
        names = ", ".join(call.name for call in entry.tool_calls)
        message["content"] = f"To do this I would use {names} on the files you mentioned."
    elif entry.tool_calls:
        message["tool_calls"] = [
            {"id": call.id or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call in entry.tool_calls
        ]
    finish = entry.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    runaway_tokens = RUNAWAY_FACTOR * int(body.get("max_tokens") or 16)
    if entry.runaway and not body.get("stream"):  # generated to its context's end
        message["content"], finish = RUNAWAY_TEXT * runaway_tokens, "length"
    # llama-cpp-python 0.3.36 passes no max_tokens on for a tool call it chose itself
    overran = entry.runaway or (scenario.endpoint.unstreamed_tools_run_away
                                and not body.get("stream") and chooses_itself(body)
                                and bool(message.get("tool_calls")))
    prompt = (window_tokens(body) if scenario.endpoint.context_tokens is not None
              else _tokens(body.get("messages", [])))
    completion = runaway_tokens if overran else _tokens(message)
    if scenario.usage is not None:  # a fixed usage: every call costs the same
        prompt = scenario.usage.get("prompt_tokens", 0)
        completion = scenario.usage.get("completion_tokens", 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}
    base = {"id": f"chatcmpl-scripted-{uuid.uuid4().hex[:12]}", "created": int(time.time()),
            "model": f"scripted:{scenario.name}", "system_fingerprint": SCRIPTED_MARKER}
    if body.get("stream"):
        return _stream(scenario, entry, body, record, base, message, finish, usage)
    return JSONResponse(
        {**base, "object": "chat.completion",
         "choices": [{"index": 0, "message": message, "finish_reason": finish}],
         "usage": usage},
        headers={"X-Refloop-Scripted": "true"},
    )


def _stream(scenario: Scenario, entry: ScriptedResponse, body: dict[str, Any],
            record: dict[str, Any], base: dict[str, Any], message: dict[str, Any],
            finish: str, usage: dict[str, Any]) -> StreamingResponse:
    headers = {"X-Refloop-Scripted": "true"}
    if breaks_stream(scenario, entry, body):
        record.update(chunks=0, hung_up=False)
        return StreamingResponse(iter(()), media_type="text/event-stream", headers=headers)
    options = body.get("stream_options") or {}
    chunks = stream_answer(base, message, finish,
                           usage if options.get("include_usage") else None, record,
                           runaway=entry.runaway, stall_after=entry.stall_after,
                           token_s=entry.token_ms / 1000,
                           repeat_fields=scenario.endpoint.stream_repeats_call_fields)
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


# Longer than uvicorn's 5 s: a client reusing a connection the server is just closing
# sees a connection error, which a pause between test phases would make common.
class ScriptedLLMServer(ThreadedServer):
    """The scripted model in a background thread (tests, the demo)."""

    name = "scripted-llm"

    def __init__(self, scenario: dict[str, Any] | str | Path | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.state = ScriptState()
        if scenario is not None:
            self.state.load(load_scenario(scenario), default=True)

    def app(self) -> FastAPI:
        return build_app(self.state)

    def __enter__(self) -> ScriptedLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def load(self, name: str, scenario: dict[str, Any]) -> None:
        self.state.load(load_scenario(scenario, name))

    def requests(self, model: str | None = None, purpose: str | None = None) -> list[dict]:
        return self.state.requests(model, purpose)

    def set_fault(self, **fault: Any) -> None:
        """An endpoint-wide fault from now on (`status`, `retry_after`, `garbage`); none
        given: answer normally again."""
        with self.state.lock:
            self.state.fault = fault or None

    def faulted_since(self, since: float) -> int:
        """Chat requests answered with the fault since `since` (epoch seconds)."""
        with self.state.lock:
            return sum(1 for at in self.state.faulted if at >= since)

    def arrived(self, model: str, purpose: str) -> int:
        """Requests for `model` and `purpose` received so far, answered or still waiting."""
        with self.state.lock:
            return self.state.arrived[(model, purpose)]

    def remaining(self, name: str) -> dict[str, int]:
        with self.state.lock:
            scenario = self.state.scenarios[name]
            return {p.value: len(entries) - self.state.cursors.get((name, p.value), 0)
                    for p, entries in scenario.responses.items()}


class ScriptedLLMProcess:
    """`refloop scripted-llm` in a child process, with ScriptedLLMServer's interface. Its
    work (parsing every prompt) then stays off the caller's interpreter, as a remote
    model's would: benchmarks use it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root}/v1"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ScriptedLLMProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "refloop", "scripted-llm", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.port, 30, alive=lambda: self.process.poll() is None)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def load(self, name: str, scenario: dict[str, Any]) -> None:
        response = httpx.post(f"{self.root}/_admin/scenarios/{name}", json=scenario)
        if response.status_code != 200:
            raise ValueError(response.text)

    def requests(self, model: str | None = None, purpose: str | None = None) -> list[dict]:
        params = {k: v for k, v in (("model", model), ("purpose", purpose)) if v is not None}
        return httpx.get(f"{self.root}/_admin/requests", params=params).json()


def serve(scenario_path: str | None, host: str, port: int) -> None:
    """`refloop scripted-llm`: foreground server. Without a scenario file, scenarios
    arrive over POST /_admin/scenarios/{name} (a request naming none fails loudly)."""
    state = ScriptState()
    name = "none (load one over /_admin/scenarios)"
    if scenario_path is not None:
        try:
            scenario = load_scenario(scenario_path)
        except ValueError as err:
            raise SystemExit(str(err)) from None
        state.load(scenario, default=True)
        name = scenario.name
    print(f"SCRIPTED MODEL (a test double, not a real LLM): scenario '{name}' "
          f"at http://{host}:{port}/v1", file=sys.stderr)
    uvicorn.run(build_app(state), host=host, port=port, log_level="warning",
                timeout_keep_alive=KEEP_ALIVE_S)
