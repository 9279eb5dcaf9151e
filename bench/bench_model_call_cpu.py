"""A worker's CPU per model call: the gateway's `act` call with one tool call streamed back
(the arguments in about 70 chunks, as a token-a-chunk server sends them), against the
scripted model in a child process so that only the caller's work is timed.

    python -m bench.bench_model_call_cpu [--calls 200] [--content-chars 400]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.common import load_average
from refloop.contract.messages import ChatMessage, Purpose, ToolSpec
from refloop.llm.gateway import LLMGateway
from refloop.llm.scripted import ScriptedLLMProcess
from refloop.settings import Settings

WRITE = ToolSpec(name="write_file", description="Create a file.", parameters={
    "type": "object", "properties": {"path": {"type": "string"},
                                     "content": {"type": "string"}},
    "required": ["path", "content"]})


async def main(calls: int, content_chars: int) -> None:
    call = {"tool_calls": [{"name": "write_file", "arguments": {
        "path": "notes.md", "content": "x" * content_chars}}]}
    with ScriptedLLMProcess() as model:
        model.load("bench", {"name": "bench", "repeat": True, "responses": {"act": [call]}})
        gateway = LLMGateway(Settings(openai_base_url=model.base_url, openai_api_key="k"))
        messages = [ChatMessage(role="user", content="write the notes")]
        for _ in range(5):  # connections, endpoint negotiation, first imports
            await gateway.chat(Purpose.act, messages, model="bench", tools=[WRITE])
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            answer = await gateway.chat(Purpose.act, messages, model="bench", tools=[WRITE])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert answer.tool_calls and answer.tool_calls[0].name == "write_file"
    print(f"{calls} act calls, a {content_chars}-character tool call streamed back; "
          f"load {load_average()}")
    print(f"  caller CPU {cpu * 1000 / calls:.2f} ms a call, wall {wall * 1000 / calls:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--content-chars", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.content_chars))
