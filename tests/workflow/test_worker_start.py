"""A fresh worker: nothing its first poll does not need is on the way to it. The search
warm-up (LanceDB, onnxruntime, the model), FastAPI (the scripted model's server), the
regex engine, the model SDK's unused types and the unused database dialect load later or
never; the warm-up starts once the worker polls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refloop.search.runtime import missing_extra

PROBE = r"""
import asyncio, json, sys, time
address, data_dir = sys.argv[1:3]
sys.argv = ["refloop", "worker"]  # what `refloop worker` imports before it connects
import refloop.cli.main  # noqa: F401
import refloop.worker.main as worker_main
from refloop.search import runtime

HEAVY = ("lancedb", "onnxruntime", "tokenizers", "torch", "fastapi", "uvicorn", "regex",
         # the API's type models refloop never uses (refloop.llm.lazy_types), httpx beside
         # the SDK's own httpx2, and the database dialect not in use
         "openai.types.responses.response", "openai.types.beta", "httpx",
         "sqlalchemy.dialects.postgresql")
out = {"imported": [name for name in HEAVY if name in sys.modules],
       "warming_after_imports": sorted(runtime._WARMING)}


async def main():
    from refloop.runtime.client import connect
    from refloop.settings import Settings

    settings = Settings(temporal_address=address, refloop_data_dir=data_dir,
                        openai_base_url="http://127.0.0.1:9/v1", refloop_task_queue="probe",
                        refloop_semantic_index=True)
    client = await connect(address, "default")
    async with worker_main.serving(client, settings, warm_search=True):
        out["warming_as_it_polls"] = sorted(runtime._WARMING)
        began = time.monotonic()
        while not runtime._WARMING and time.monotonic() - began < 30:
            await asyncio.sleep(0.05)
        out["warm_up_began_after_s"] = time.monotonic() - began
        out["warming_later"] = sorted(runtime._WARMING)

asyncio.run(main())
print(json.dumps(out), flush=True)
# Measured: leave without waiting for the warm-up's load to finish (seconds of onnxruntime
# the test does not look at; the interpreter would join its thread at exit).
import os
os._exit(0)
"""


@pytest.mark.skipif(missing_extra("minilm-int8"), reason="needs the semantic extra")
def test_a_fresh_worker_polls_before_the_search_warms_up(temporal_server: str, tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", PROBE, temporal_server, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["imported"] == [], out
    assert out["warming_after_imports"] == [] and out["warming_as_it_polls"] == [], out
    assert out["warming_later"] == ["minilm-int8"], out
    assert out["warm_up_began_after_s"] >= 0.5, out  # WARM_UP_AFTER_S after polling began
