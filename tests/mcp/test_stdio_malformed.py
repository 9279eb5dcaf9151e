"""`refloop mcp` over stdio answers every malformed line with JSON-RPC 2.0's error object
(it used to answer nothing, and the client waited), and goes on serving."""

from __future__ import annotations

import asyncio
import json
import os
import sys

LINES = {  # what a confused or hostile client sends -> the code JSON-RPC 2.0 asks for
    "this is not json": -32700,
    "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\"": -32700,
    "[]": -32600,
    "42": -32600,
    json.dumps({"jsonrpc": "2.0", "id": {"an": "object"}, "method": "ping"}): -32600,
    json.dumps({"jsonrpc": "1.0", "id": 7, "method": "ping"}): -32600,
}


async def test_malformed_json_rpc_gets_error_objects_and_the_server_keeps_serving(
        temporal_server, settings, tmp_path):
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server,
           "DATABASE_URL": settings.database_url or "",
           "REFLOOP_DATA_DIR": str(tmp_path / "data")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "refloop", "mcp", env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for line, code in LINES.items():
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            answer = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            assert answer["jsonrpc"] == "2.0" and answer["id"] is None, (line, answer)
            assert answer["error"]["code"] == code, (line, answer)
        # Still serving: a real request after them all is answered.
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                     "params": {"protocolVersion": "2025-06-18",
                                                "capabilities": {},
                                                "clientInfo": {"name": "t", "version": "1"}}
                                     }).encode() + b"\n")
        await proc.stdin.drain()
        answer = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
        assert answer["id"] == 1 and answer["result"]["serverInfo"]
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()
