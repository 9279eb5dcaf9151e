"""The one LLM gateway: every model call of every activity goes through here.

`openai.AsyncOpenAI` with `max_retries=0` so Temporal owns every retry; errors are
classified retryable or not; each request carries `X-Refloop-Purpose` and a `max_tokens`
cap. What each endpoint supports (structured-output mode, `tool_choice`, native tools) is
negotiated and remembered per (base URL, model) in `refloop.llm.endpoint`; every request
goes into the calling activity's ledger, answered or not.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import openai
from pydantic import ValidationError

from refloop.contract.activity_io import LLMUsageRecord, ModelEndpoint
from refloop.contract.budget import ModelPrice
from refloop.contract.errors import (
    EndpointParked,
    EndpointWaiting,
    InvalidModelOutput,
    LLMClientError,
    LLMError,
    LLMTransportError,
    ModelRedirected,
    ParkedCall,
)
from refloop.contract.messages import (
    ChatMessage,
    Purpose,
    TokenUsage,
    ToolCall,
    ToolSpec,
    parse_max_tokens,
)
from refloop.contract.text import detect_abnormal_output
from refloop.llm.endpoint import Endpoints, rejects_mode
from refloop.llm.failures import (
    abandoned_by,
    classify,
)
from refloop.llm.fitting import Budget
from refloop.llm.ledger import current_ledger, in_flight, settled
from refloop.llm.outage import (
    EndpointGates,
    Wake,
    current_watch,
    endpoint_name,
    recoverable,
    wait_bound,
)
from refloop.llm.stream import (
    Answer,
    EmptyStream,
    NoFirstChunk,
    StreamInterrupted,
    StreamStalled,
    answer_of,
    streamed_answer,
    streamed_request,
)
from refloop.llm.tool_pick import (
    PICK_MAX_TOKENS,
    PickTheToolFirst,
    answer_picking_tool,
    stream_feature,
)
from refloop.llm.window import Fitter, WindowKeeper, length_refusal, wire_chars
from refloop.llm.wire import (
    ChatOutcome,
    StructuredOutcome,
    T,
    json_schema_of,
    parse_arguments,
    parse_json_answer,
    to_wire,
)
from refloop.runtime.metrics import model_cost, model_request
from refloop.runtime.telemetry import tracer
from refloop.settings import Settings

PURPOSE_HEADER = "X-Refloop-Purpose"


def cut_at(cut: str | None, cap: int, settings: Settings) -> str:
    if cut == "time":
        return (f"after {settings.refloop_llm_timeout_s:g} s, the time limit of one answer "
                "(it was still going)")
    return f"at the limit of {cap} tokens"


def model_client(base_url: str | None, api_key: str, timeout_s: float) -> openai.AsyncOpenAI:
    """The client of one endpoint: no retries (Temporal's), and redirects never followed
    (the openai client's own httpx client follows them, re-sending the whole prompt)."""
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s,
        http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False, timeout=timeout_s))


def redirect_refused(err: openai.OpenAIError, base_url: str) -> ModelRedirected | None:
    """A 3xx answer as the non-retryable error naming the endpoint and where it pointed."""
    if not isinstance(err, openai.APIStatusError) or not 300 <= err.status_code < 400:
        return None
    location = err.response.headers.get("location", "(no Location)")
    return ModelRedirected(
        f"the model endpoint {endpoint_name(base_url)} answered HTTP {err.status_code} "
        f"redirecting to "
        f"{location[:300]}; model requests never follow redirects: configure the final URL",
        err.status_code)


class LLMGateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default_model = settings.refloop_model
        self.base_url = settings.openai_base_url or "scripted"
        self.client = model_client(settings.openai_base_url,
                                   settings.openai_api_key or "not-needed",
                                   settings.refloop_llm_timeout_s)
        self.max_tokens = parse_max_tokens(settings.refloop_max_tokens)
        self.endpoints = Endpoints(settings.refloop_structured_mode, settings.refloop_tool_mode,
                                   settings.refloop_llm_concurrency,
                                   hold_after_timeout_s=settings.refloop_llm_timeout_s,
                                   stream=settings.refloop_llm_stream)
        self.usage_by_purpose: dict[str, TokenUsage] = {}
        self.endpoint_clients: dict[tuple[str | None, str | None, str], openai.AsyncOpenAI] = {}
        # Endpoints this worker knows are down, each with its one probe (refloop.llm.outage)
        self.gates = EndpointGates(settings.refloop_model_probe_s)
        # Told when an endpoint that was down here answers (the worker wakes parked tasks)
        self.on_endpoint_back: Wake | None = None
        # Each endpoint's context window and token ratio; every request fitted to it
        self.windows = WindowKeeper(settings.refloop_model_context_tokens,
                                    settings.refloop_model_context_default,
                                    settings.refloop_compact_mask_at,
                                    settings.refloop_compact_summary_at)

    def client_for(self, endpoint: ModelEndpoint | None) -> openai.AsyncOpenAI:
        """The default client, or one for a task's model config: its base URL, and the key
        read here, on the worker, from the variable it names (never carried in a task)."""
        if endpoint is not None and endpoint.price is not None:  # its calls at its price
            self._price_with(endpoint.price)
        if endpoint is not None:  # its window ahead of the operator's and the endpoint's
            self.windows.configured(self._base_url_of(endpoint), endpoint.model,
                                    endpoint.context_tokens)
        if endpoint is None or (endpoint.base_url is None and endpoint.api_key_env is None):
            return self.client
        # Model configs come from API clients: the worker's own key never goes to a URL one
        # chose, and a config may only name the variables the operator set aside for keys.
        key = None if endpoint.base_url else self.settings.openai_api_key
        if endpoint.api_key_env:
            # Each key goes only to the base URLs the operator bound it to.
            refusal = self.settings.key_refusal(endpoint.api_key_env, endpoint.base_url)
            if refusal:
                raise LLMClientError(f"the model config's key: {refusal} on this worker")
            key = os.environ.get(endpoint.api_key_env)
            if not key:
                raise LLMClientError(f"the model config names {endpoint.api_key_env}, which is "
                                     "unset on this worker")
        base_url = endpoint.base_url or self.settings.openai_base_url
        cache_key = (base_url, endpoint.api_key_env, key or "")
        if cache_key not in self.endpoint_clients:
            self.endpoint_clients[cache_key] = model_client(
                base_url, key or "not-needed", self.settings.refloop_llm_timeout_s)
        return self.endpoint_clients[cache_key]

    @staticmethod
    def _price_with(price: ModelPrice) -> None:
        """The calling activity's requests are priced at a model config's price."""
        ledger = current_ledger.get()
        if ledger is not None:
            ledger.price = price

    def _base_url_of(self, endpoint: ModelEndpoint | None) -> str:
        """Capability state and slots are keyed by the endpoint actually called."""
        return (endpoint.base_url if endpoint is not None and endpoint.base_url
                else self.base_url)

    async def budget_for(self, purpose: Purpose, messages: list[ChatMessage], *,
                         model: str | None = None, endpoint: ModelEndpoint | None = None,
                         tools: list[ToolSpec] | None = None) -> Budget:
        """The room the endpoint's window leaves these messages, as `chat` fits them
        (refloop.llm.fitting): a caller that fits a conversation itself asks first."""
        model = (endpoint.model if endpoint else model) or self.default_model
        return await self.windows.budget(
            self.client_for(endpoint), self._base_url_of(endpoint), model,
            sum(len(m.model_dump_json(exclude_none=True)) for m in messages),
            wire_chars([[spec.wire for spec in tools or []], None]),
            self.max_tokens[purpose.value])

    @property
    def json_schema_supported(self) -> bool:
        """Whether the default model still gets `json_schema` (kept for callers/tests)."""
        return self.endpoints.structured_mode(self.base_url, self.default_model) == "json_schema"

    async def _create(self, purpose: Purpose, model: str, client: openai.AsyncOpenAI,
                      base_url: str, **kwargs: Any) -> Answer:
        """One HTTP request: through the endpoint's slot, into the ledger either way.
        Streamed when `kwargs` say so (refloop/llm/stream.py): cut at the cap, timed by
        progress; a stream that ends without a chunk is asked again unstreamed."""
        ledger = current_ledger.get()
        cap = int(kwargs.get("max_tokens") or 0)
        if ledger is not None:
            ledger.begin(purpose, model, cap, self.settings.model_prices.get(model))
        slot = self.endpoints.slot(base_url)
        if slot is not None:
            await slot.acquire()
        release = slot.release if slot is not None else None
        headers = {PURPOSE_HEADER: purpose.value}
        started = time.monotonic()
        answered: TokenUsage | None = None
        try:
            if kwargs.get("stream"):
                answer = await streamed_request(
                    client.chat.completions.create(model=model, extra_headers=headers,
                                                   **kwargs),
                    cap, self.settings.refloop_llm_timeout_s,
                    self.settings.refloop_llm_idle_timeout_s,
                    len(json.dumps(kwargs["extra_body"]["messages"])))
            else:
                answer = answer_of(await client.chat.completions.create(
                    model=model, extra_headers=headers, **kwargs))
        except (openai.APITimeoutError, NoFirstChunk) as err:
            # The server is most likely still working on it: an unstreamed answer goes on
            # being generated, and a stream is only noticed gone after its first token
            # (llama-cpp-python evaluates the prompt and picks a tool in a thread first).
            if slot is not None:
                self.endpoints.release_later(slot)
                release = None
            self._count(purpose, in_flight(cap))
            if ledger is not None:
                ledger.failed(cap, abandoned=True)
            raise (classify(err, endpoint_name(base_url))
                   if isinstance(err, openai.APITimeoutError) else
                   LLMTransportError(f"{endpoint_name(base_url)} timed out (no token within "
                                     f"{self.settings.refloop_llm_timeout_s:g} s)")) from err
        except (StreamStalled, StreamInterrupted, EmptyStream) as err:
            # Hung up or ended by the server: nothing more is generated; what came counts.
            received = (streamed_answer(err.tally, 0).usage
                        if not isinstance(err, EmptyStream) else TokenUsage())
            self._count(purpose, in_flight(cap).add(settled(cap, failed=True)).add(
                received.model_copy(update={"calls": 0})))
            if ledger is not None:
                ledger.failed(cap, abandoned=False, received=received)
            if not isinstance(err, EmptyStream):
                raise LLMTransportError(f"{endpoint_name(base_url)}: {err}") from err
            empty = err
        except openai.OpenAIError as err:
            abandoned = abandoned_by(err)
            self._count(purpose, in_flight(cap) if abandoned
                        else in_flight(cap).add(settled(cap, failed=True)))
            if ledger is not None:
                ledger.failed(cap, abandoned)
            raise (redirect_refused(err, base_url)
                   or classify(err, endpoint_name(base_url))) from err
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            # An answer that is not UTF-8 or not JSON: the endpoint's fault, said so.
            self._count(purpose, in_flight(cap).add(settled(cap, failed=True)))
            if ledger is not None:
                ledger.failed(cap, abandoned=False)
            raise classify(err, endpoint_name(base_url)) from err
        except asyncio.CancelledError:  # the attempt was cancelled mid-request
            self._count(purpose, in_flight(cap))
            raise
        else:
            answered = answer.usage
            self._count(purpose, answer.usage)
            if ledger is not None:
                model_cost(model, purpose.value, ledger.answered(answer.usage, cap))
            return answer
        finally:
            if release is not None:
                release()
            failure = sys.exc_info()[1]
            outcome = "ok" if answered is not None else \
                type(failure).__name__ if failure is not None else "empty_stream"
            model_request(endpoint_name(base_url), purpose.value, outcome,
                          time.monotonic() - started,
                          answered.prompt_tokens if answered else 0,
                          answered.completion_tokens if answered else 0)
        # The stream ended before its first chunk: the endpoint cannot stream this request.
        if not self.endpoints.drop(base_url, model, stream_feature(kwargs["extra_body"]),
                                   str(empty)):
            raise LLMTransportError(f"{endpoint_name(base_url)}: {empty}") from empty
        if self.endpoints.state(base_url, model).picks_tool():
            raise PickTheToolFirst from empty
        unstreamed = {k: v for k, v in kwargs.items() if k not in ("stream", "stream_options")}
        return await self._create(purpose, model, client, base_url, **unstreamed)

    def _count(self, purpose: Purpose, usage: TokenUsage) -> None:
        total = self.usage_by_purpose.get(purpose.value, TokenUsage())
        self.usage_by_purpose[purpose.value] = total.add(usage)

    async def chat(
        self,
        purpose: Purpose,
        messages: list[ChatMessage],
        *,
        model: str | None = None,
        tools: list[ToolSpec] | None = None,
        parallel_tool_calls: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        response_format: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        endpoint: ModelEndpoint | None = None,
        fitter: Fitter | None = None,
    ) -> ChatOutcome:
        """One answer; an answer cut off at the token cap (by the server, or by refloop
        hanging up on a stream past it or still generating at the time bound) is re-asked
        once with the cut stated, and a second cut-off is InvalidModelOutput (never a
        transport error: the same request would run away again). The request is fitted to
        the endpoint's window first (`fitter` shrinks the messages when they do not fit),
        and a refusal for length is fitted again and asked again once."""
        client = self.client_for(endpoint)
        base_url = self._base_url_of(endpoint)
        if endpoint is not None:  # a task's model config: its model and temperature
            model = endpoint.model
            temperature = endpoint.temperature if temperature is None else temperature
        model = model or self.default_model
        fixed = [[spec.wire for spec in tools or []], response_format]
        request = await self.windows.fitted(client, base_url, model, messages, fixed,
                                            max_tokens or self.max_tokens[purpose.value],
                                            fitter)
        cap = request.max_tokens

        async def answer(conversation: list[ChatMessage]) -> ChatOutcome:
            return await self._answer(purpose, conversation, model, tools, parallel_tool_calls,
                                      temperature, top_p, response_format, cap, client,
                                      base_url, endpoint)

        try:
            first = await answer(request.messages)
        except LLMError as err:
            refusal = length_refusal(err.status, err.body or str(err))
            if refusal is None:
                raise
            # Too long for its window: never an outage, never the task's end. The window
            # (and the ratio) it states are learnt, and the request is fitted again.
            self.windows.refused(base_url, model, refusal, request)
            request = await self.windows.fitted(client, base_url, model, request.messages,
                                                fixed, cap, fitter)
            cap = request.max_tokens
            first = await answer(request.messages)
        self.windows.answered(base_url, model, request, first.usage.usage)
        messages = request.messages
        if not first.truncated:
            return first
        self._unusable(first)
        reask = [*messages,
                 ChatMessage(role="assistant", content=(first.content or "")[:2000]),
                 ChatMessage(role="user", content=(
                     f"Your answer was cut off {cut_at(first.cut, cap, self.settings)}. "
                     f"Answer again, complete and well within {cap} tokens: one tool call, "
                     "or a short answer."))]
        second = await answer(reask)
        usage = first.usage.usage.add(second.usage.usage)
        if second.truncated:
            self._unusable(second)
            raise InvalidModelOutput(
                f"{purpose.value}: the model's answer was cut off twice (last "
                f"{cut_at(second.cut, cap, self.settings)}; max_tokens {cap}); raise "
                f"REFLOOP_MAX_TOKENS for {purpose.value} or use a model that answers more "
                "briefly")
        return second.model_copy(update={"usage": LLMUsageRecord(
            purpose=purpose, model=model, usage=usage)})

    async def _answer(
        self, purpose: Purpose, messages: list[ChatMessage], model: str,
        tools: list[ToolSpec] | None, parallel_tool_calls: bool | None,
        temperature: float | None, top_p: float | None,
        response_format: dict[str, Any] | None, max_tokens: int,
        client: openai.AsyncOpenAI, base_url: str, endpoint: ModelEndpoint | None,
    ) -> ChatOutcome:
        """One answer. An endpoint that cannot stream a tool call it chose itself is
        asked which tool first, then for the call with that tool named (or `none`):
        `refloop.llm.tool_pick`."""
        state = self.endpoints.state(base_url, model)

        async def ask(offered: list[ToolSpec] | None, choice: Any, picking: bool
                      ) -> ChatOutcome:
            return await self._chat_once(
                purpose, messages, model, offered, None if picking else parallel_tool_calls,
                temperature, top_p, None if picking else response_format,
                PICK_MAX_TOKENS if picking else max_tokens, client, base_url,
                tool_choice=choice)

        return await answer_picking_tool(
            ask, tools, lambda: self._tool_choice() == "auto" and state.picks_tool())

    async def _chat_once(
        self, purpose: Purpose, messages: list[ChatMessage], model: str,
        tools: list[ToolSpec] | None, parallel_tool_calls: bool | None,
        temperature: float | None, top_p: float | None,
        response_format: dict[str, Any] | None, max_tokens: int,
        client: openai.AsyncOpenAI, base_url: str, tool_choice: Any = None,
    ) -> ChatOutcome:
        # Messages and tools are already wire-format dicts: sent as extra_body, the JSON is
        # the same and the SDK skips re-walking them on every call (a fifth of a busy
        # worker's CPU, measured with bench/bench_scale.py).
        state = self.endpoints.state(base_url, model)
        while True:
            extra: dict[str, Any] = {"messages": [to_wire(m) for m in messages]}
            kwargs: dict[str, Any] = {"messages": [], "extra_body": extra,
                                      "max_tokens": max_tokens}
            if tools and state.native_tools:
                extra["tools"] = [spec.wire for spec in tools]
                if state.tool_choice:
                    extra["tool_choice"] = tool_choice or self._tool_choice()
                if parallel_tool_calls is not None:
                    extra["parallel_tool_calls"] = parallel_tool_calls
            for name, value in (("temperature", temperature), ("top_p", top_p)):
                if value is not None:
                    kwargs[name] = value
            if response_format is not None and (state.response_format
                                                or response_format.get("type") != "json_object"):
                extra["response_format"] = response_format
            if state.streams(offers_tools="tools" in extra,
                             named=extra.get("tool_choice", "auto") != "auto"):
                kwargs["stream"] = True
                if state.stream_options:
                    kwargs["stream_options"] = {"include_usage": True}
            try:
                return await self._traced(purpose, model, kwargs, client, base_url)
            except LLMError as err:
                if not self.endpoints.drop_rejected(err, kwargs, model, base_url):
                    raise

    @staticmethod
    def _unusable(outcome: ChatOutcome) -> None:
        """An answered request whose answer cannot be used counts as failed."""
        outcome.usage.usage = outcome.usage.usage.add(TokenUsage(failed_calls=1))
        ledger = current_ledger.get()
        if ledger is not None:
            ledger.usage = ledger.usage.add(TokenUsage(failed_calls=1))

    def _tool_choice(self) -> Any:
        choice = self.settings.refloop_tool_choice
        if choice in ("auto", "required", "none"):
            return choice
        return {"type": "function", "function": {"name": choice}}

    async def _traced(self, purpose: Purpose, model: str, kwargs: dict[str, Any],
                      client: openai.AsyncOpenAI, base_url: str) -> ChatOutcome:
        """One request, through its endpoint's gate when the calling activity watches for an
        outage (`refloop.llm.outage`): while the endpoint is down, a call that is not the
        probe ends at once, sending nothing: parked (`EndpointParked`) when its task can be
        woken, else to be retried at the next probe (`EndpointWaiting`); the requests this
        activity made before are not repeated (the ledger carries their answers' usage, the
        activity its progress)."""
        watch = current_watch.get()
        if watch is None:
            return await self._traced_once(purpose, model, kwargs, client, base_url)
        name = endpoint_name(base_url)
        settings = self.settings
        turn = self.gates.try_turn(base_url)
        if turn is None:
            error = self.gates.last_error(base_url)
            if watch.waiter is not None:
                raise self._parked(base_url, name, error, watch.waiter)
            await watch.waiting(name, error, settings.refloop_model_outage_s,
                                watch.status, settings.refloop_model_auth_wait_s,
                                self.gates.episode(base_url))
            raise EndpointWaiting(f"waiting for {name}: {error}", status=watch.status,
                                  retry_after=self.gates.retry_in(base_url))
        try:
            outcome = await self._traced_once(purpose, model, kwargs, client, base_url)
        except LLMError as err:
            if not recoverable(err):
                self._answered(base_url, name)  # a refusal of this request
                raise
            self.gates.failed(base_url, turn, err)
            watch.status = err.status
            await watch.waiting(name, str(err), settings.refloop_model_outage_s,
                                err.status, settings.refloop_model_auth_wait_s,
                                self.gates.episode(base_url))
            waiting = EndpointWaiting(f"waiting for {name}: {err}", status=err.status,
                                      retry_after=self.gates.retry_in(base_url))
            waiting.body = err.body
            raise waiting from err
        except BaseException:
            self.gates.abandoned(base_url, turn)
            raise
        self._answered(base_url, name)
        await watch.back()
        return outcome

    def _parked(self, base_url: str, name: str, error: str, waiter: str) -> EndpointParked:
        """The call waits in its task for the endpoint this worker probes."""
        status = self.gates.last_status(base_url)
        bound_s, setting = wait_bound(status, self.settings.refloop_model_outage_s,
                                      self.settings.refloop_model_auth_wait_s)
        parked = ParkedCall(endpoint=name, error=error[:500], status=status, bound_s=bound_s,
                            bound_setting=setting,
                            recheck_s=self.gates.park(base_url, waiter))
        return EndpointParked(f"waiting for {name}: {error}", parked)

    def _answered(self, base_url: str, name: str) -> None:
        """The endpoint answered: if it was down here, the tasks parked on it are woken."""
        parked = self.gates.answered(base_url)
        if parked is not None and self.on_endpoint_back is not None:
            self.on_endpoint_back(name, parked)

    async def _traced_once(self, purpose: Purpose, model: str, kwargs: dict[str, Any],
                           client: openai.AsyncOpenAI, base_url: str) -> ChatOutcome:
        started = time.monotonic()
        with tracer.start_as_current_span(f"chat {model}") as span:
            span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.system": "openai",
                                 "gen_ai.request.model": model,
                                 "refloop.purpose": purpose.value})
            answer = await self._create(purpose, model, client, base_url, **kwargs)
            span.set_attributes({
                "gen_ai.response.model": answer.model,
                "gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": answer.usage.completion_tokens,
                "refloop.seconds": round(time.monotonic() - started, 3),
                "refloop.cut": answer.cut or "",
            })
        if answer.finish_reason is None and answer.content is None and not answer.calls:
            raise LLMTransportError(f"{endpoint_name(base_url)} answered with no choices")
        content = answer.content
        abnormal = detect_abnormal_output(content or "")
        if abnormal:
            content = (content or "")[:500]
        calls = [ToolCall(id=call_id or f"call_{index}", name=name,
                          arguments=parse_arguments(arguments))
                 for index, (call_id, name, arguments) in enumerate(answer.calls)]
        return ChatOutcome(
            content=content,
            tool_calls=calls,
            finish_reason=answer.finish_reason,
            abnormal=abnormal,
            cut=answer.cut,
            usage=LLMUsageRecord(purpose=purpose, model=model, usage=answer.usage),
        )

    async def structured(
        self,
        purpose: Purpose,
        messages: list[ChatMessage],
        schema: type[T],
        *,
        model: str | None = None,
        max_reasks: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        endpoint: ModelEndpoint | None = None,
    ) -> StructuredOutcome[T]:
        """Ask for JSON, validate with pydantic, re-ask with the error a bounded number of times."""
        reasks = self.settings.refloop_structured_max_reasks if max_reasks is None else max_reasks
        conversation = list(messages)
        total = TokenUsage()
        model = (endpoint.model if endpoint else model) or self.default_model
        last_error = ""
        for attempt in range(1, reasks + 2):
            outcome = await self._structured_call(purpose, conversation, schema, model,
                                                  temperature, top_p, endpoint)
            total = total.add(outcome.usage.usage)
            try:
                value = parse_json_answer(outcome.content, schema)
            except (ValueError, ValidationError) as err:
                last_error = str(err)
                self._unusable(outcome)
                total = total.add(TokenUsage(failed_calls=1))
                conversation += [
                    ChatMessage(role="assistant", content=outcome.content or ""),
                    ChatMessage(
                        role="user",
                        content=f"Your answer was not valid: {last_error}\n"
                        "Answer again with only the JSON object, matching the schema.",
                    ),
                ]
                continue
            record = LLMUsageRecord(purpose=purpose, model=model, usage=total)
            return StructuredOutcome[schema](value=value, usage=record, attempts=attempt)
        raise InvalidModelOutput(
            f"{purpose.value}: the model's answer was still invalid after {reasks} re-asks: "
            f"{last_error[:500]}"
        )

    async def _structured_call(
        self, purpose: Purpose, messages: list[ChatMessage], schema: type[T], model: str,
        temperature: float | None, top_p: float | None,
        endpoint: ModelEndpoint | None = None,
    ) -> ChatOutcome:
        """One answer in the strongest mode the endpoint takes, stepping down on refusal."""
        while True:
            base_url = self._base_url_of(endpoint)
            mode = self.endpoints.structured_mode(base_url, model)
            wire_schema = json_schema_of(schema)
            if mode == "json_schema":
                prompt, response_format = messages, {
                    "type": "json_schema",
                    "json_schema": {"name": schema.__name__, "schema": wire_schema,
                                    "strict": False},
                }
            else:
                note = ChatMessage(role="system", content=(
                    "Answer with one JSON object matching this JSON schema:\n"
                    + json.dumps(wire_schema)))
                prompt = [note, *messages]
                response_format = {"json_object_schema": {"type": "json_object",
                                                          "schema": wire_schema},
                                   "json_object": {"type": "json_object"},
                                   "prompt": None}[mode]
            try:
                return await self.chat(purpose, prompt, model=model, temperature=temperature,
                                       top_p=top_p, response_format=response_format,
                                       endpoint=endpoint)
            except LLMError as err:
                body = getattr(err, "body", "") or str(err)
                if mode == "prompt" or not rejects_mode(err.status, body):
                    raise
                if not self.endpoints.step_down(base_url, model, str(err)):
                    raise
