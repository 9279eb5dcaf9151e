"""SIGTERM reaches the watchdog at the signal itself, whatever the main thread does: while
synchronous work holds the event loop (the API's imports and app build, 15-20 s on a loaded
machine) the command still ends within the grace period + 5 s, with 143. The loop's own
handler armed it only once that work ended (`refloop up` signalled during its start took
25 s). And the loop still hears the signal it took the wakeup fd for: an idle command stops
gracefully at once, not by the watchdog."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

GRACE_S = 1.0
HOLDER = """
import asyncio, sys, time
from refloop.cli.main import Terminated
from refloop.cli.serve import _terminate_within, until_signalled, witness_signals
from refloop.settings import Settings

GRACE_S = {grace}

async def work():
    print("working", flush=True)
    if sys.argv[1] == "held":
        time.sleep(60)  # synchronous work on the loop's thread, as a long import is
    await asyncio.sleep(60)
    return 0

signal_ = __import__("signal")
signal_.signal(signal_.SIGTERM, _terminate_within(GRACE_S))  # as main() does
witness_signals(GRACE_S)
try:
    code = asyncio.run(until_signalled(work(), Settings(refloop_graceful_shutdown_s=GRACE_S)))
except Terminated:
    code = 143
print("exited", code, flush=True)
sys.exit(code)
"""


def signalled(mode: str, grace_s: float) -> tuple[int, float]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER.format(grace=grace_s), mode],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "working"
        time.sleep(0.2)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=grace_s + 30)
        return code, time.monotonic() - began
    finally:
        if process.poll() is None:
            process.kill()


def test_sigterm_while_the_loop_is_held_exits_within_the_bound():
    code, took = signalled("held", GRACE_S)
    assert code == 128 + signal.SIGTERM
    assert took < GRACE_S + 5, took


def test_an_idle_loop_still_hears_the_signal_and_stops_gracefully():
    """The witness passes the signal on to the loop's own wakeup fd: the command's clean-up
    runs now, long before the watchdog (grace + 3 s) would end it."""
    code, took = signalled("idle", 10.0)
    assert code == 128 + signal.SIGTERM
    assert took < 5, took
