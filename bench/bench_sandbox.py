"""What the command sandbox costs: a command in bubblewrap beside the bare command, in the
same run, with the steps between them (where the time goes: bubblewrap's namespaces and
mounts alone, the reaper process it adds by default, a `prlimit` exec for the limits), and
a 10-step agent task of run_cmd calls with the sandbox on and off.

    .venv/bin/python -m bench.bench_sandbox [--runs 200] [--steps 10]

Measured (--runs 60, as root) on a quiet 2-core host (load average 0.6): bare 1.8 ms median;
`bwrap --bind / /` alone 5.0; the old profile (reaper + prlimit exec) 14.0; the profile
12.2, a cost of 10.4 ms over bare (CPU: 7.8 ms). At load average 12.5 the profile cost
25 ms, mostly waiting for a CPU. The goal is 12 ms (GOAL_MS).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.common import bench_env
from refloop.contract.activity_io import RunToolInput
from refloop.settings import Settings
from refloop.tools.command import run_bounded
from refloop.tools.os_sandbox import BASE_ENV, SandboxedCommand, sandboxed_command
from refloop.tools.registry import execute_tool

COMMAND = ["/bin/sh", "-c", "true"]
GOAL_MS = 12.0


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def variants(workspace: Path) -> dict[str, Callable[[], SandboxedCommand]]:
    """How to start `sh -c true`, from bare to the full profile, one piece added at a time:
    where the sandbox's time goes. Each call builds a fresh command (bubblewrap consumes
    the descriptors it is given)."""
    settings = Settings(refloop_data_dir=workspace / "data")
    unconfined = settings.model_copy(update={"refloop_sandbox": "none"})
    bwrap = shutil.which("bwrap") or "bwrap"

    def full() -> SandboxedCommand:
        return sandboxed_command(COMMAND, workspace=workspace, allow_network=False, env={},
                                 settings=settings)

    def without(*flags: str) -> Callable[[], SandboxedCommand]:
        def build() -> SandboxedCommand:
            command = full()
            command.argv = [a for a in command.argv if a not in flags]
            return command
        return build

    def old_profile() -> SandboxedCommand:  # before: a reaper, and limits by a prlimit exec
        command = without("--as-pid-1")()
        limits = command.limits
        command.argv = ["prlimit", f"--cpu={limits['cpu_s']}", f"--as={limits['address_space']}",
                        f"--fsize={limits['file_size']}", "--core=0", "--",
                        *command.argv[:-3], *COMMAND]
        return command

    return {
        "bare": lambda: SandboxedCommand(argv=COMMAND, env=dict(BASE_ENV)),
        "bare+limits": lambda: sandboxed_command(COMMAND, workspace=workspace,
                                                 allow_network=False, env={},
                                                 settings=unconfined),
        "bwrap bind /": lambda: SandboxedCommand(
            argv=[bwrap, "--bind", "/", "/", "--", *COMMAND], env=dict(BASE_ENV)),
        "profile+reaper": without("--as-pid-1"),
        "old: +reaper+prlimit": old_profile,
        "bwrap+limits": full,  # the profile commands run in
    }


async def spawn_costs(runs: int, workspace: Path) -> dict[str, list[float]]:
    """Milliseconds per `sh -c true` for each variant; interleaved so that machine noise
    hits all alike."""
    builders = variants(workspace)
    samples: dict[str, list[float]] = {name: [] for name in builders}
    for _ in range(runs):
        for name, build in builders.items():
            command = build()
            started = time.perf_counter()
            try:
                code, _, _, _ = await run_bounded(command.argv, cwd=str(workspace),
                                                  env=command.env, preexec_fn=None, limit_s=10,
                                                  cap=1000, pass_fds=command.pass_fds)
            finally:
                command.close()
            samples[name].append((time.perf_counter() - started) * 1000)
            assert code == 0, name
    return samples


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


async def spawn_cpu(runs: int, workspace: Path) -> dict[str, float]:
    """CPU milliseconds (user + system, of the command's processes) per `sh -c true`: a
    figure the machine's load does not inflate as it does wall time."""
    builders = variants(workspace)
    costs = {}
    for name in ("bare", "bwrap+limits"):
        before = children_cpu_ms()
        for _ in range(runs):
            command = builders[name]()
            try:
                await run_bounded(command.argv, cwd=str(workspace), env=command.env,
                                  preexec_fn=None, limit_s=10, cap=1000,
                                  pass_fds=command.pass_fds)
            finally:
                command.close()
        costs[name] = (children_cpu_ms() - before) / runs
    return costs


async def tool_costs(runs: int, workspace: Path) -> dict[str, list[float]]:
    """Milliseconds per run_cmd call (policy, sandbox, capture) with REFLOOP_SANDBOX on/off."""
    modes = {mode: Settings(refloop_sandbox=mode, refloop_data_dir=workspace / "data")
             for mode in ("none", "bwrap")}
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(runs):
        for mode, settings in modes.items():
            call = RunToolInput(call_id=uuid.uuid4().hex, name="run_cmd",
                                arguments={"command": "true"}, workspace=str(workspace))
            started = time.perf_counter()
            result = await execute_tool(call, settings)
            samples[mode].append((time.perf_counter() - started) * 1000)
            assert result.ok, result.error
    return samples


def command_scenario(steps: int) -> dict:
    acts = [{"tool_calls": [{"name": "run_cmd",
                             "arguments": {"command": f"echo step {n} > out{n}.txt"}}]}
            for n in range(1, steps + 1)]
    return {"responses": {
        "intent": [{"json": {"intent": "CODING_TASK", "confidence": 1, "reason": "x"}}],
        "plan": [{"json": {"task_type": "coding", "steps": [
            {"goal": f"run step {n}", "tool": "run_cmd"} for n in range(1, steps + 1)]}}],
        "act": [*acts, {"content": "all steps run"}],
        "summary": [{"content": "ran the commands"}],
    }}


async def task_time(mode: str, steps: int, repeats: int) -> list[float]:
    """Wall seconds of a `steps`-step task whose every step is a run_cmd."""
    times = []
    async with bench_env(refloop_sandbox=mode) as env:
        await env.run("warmup", command_scenario(steps))
        for n in range(repeats):
            result, seconds, _ = await env.run(f"task{n}", command_scenario(steps))
            assert result.status == "completed", result.answer
            assert (env.root / f"task{n}" / f"out{steps}.txt").exists()
            times.append(seconds)
    return times


async def main(runs: int, steps: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        await spawn_costs(10, workspace)  # warm-up
        spawn = await spawn_costs(runs, workspace)
        tools = await tool_costs(runs, workspace)
        cpu = await spawn_cpu(runs, workspace)
    load = os.getloadavg()[0]
    print(f"`sh -c true`, {runs} runs each, interleaved (ms; load average {load:.1f}):")
    for name, values in spawn.items():
        median, p90 = quantiles(values)
        print(f"  {name:<16} median {median:6.2f}  p90 {p90:6.2f}")
    bare_median, bare_p90 = quantiles(spawn["bare"])
    box_median, box_p90 = quantiles(spawn["bwrap+limits"])
    cost = box_median - bare_median
    print(f"  sandbox cost  median {cost:6.2f}  p90 {box_p90 - bare_p90:6.2f}  "
          f"(goal <= {GOAL_MS:g} ms median: {'met' if cost <= GOAL_MS else 'MISSED'})")
    print(f"  CPU per command: bare {cpu['bare']:.2f} ms, in bwrap {cpu['bwrap+limits']:.2f} "
          f"ms (sandbox {cpu['bwrap+limits'] - cpu['bare']:.2f} ms of CPU)")
    print("run_cmd `true` through execute_tool (ms):")
    for mode, values in tools.items():
        median, p90 = quantiles(values)
        print(f"  REFLOOP_SANDBOX={mode:<6} median {median:6.2f}  p90 {p90:6.2f}")
    print(f"{steps}-step task, every step a run_cmd, scripted model without latency "
          f"({repeats} runs each, median wall s):")
    walls = {mode: await task_time(mode, steps, repeats) for mode in ("none", "bwrap")}
    for mode, values in walls.items():
        print(f"  REFLOOP_SANDBOX={mode:<6} {statistics.median(values):6.3f}s  "
              f"(runs: {', '.join(f'{v:.3f}' for v in values)})")
    delta = statistics.median(walls["bwrap"]) - statistics.median(walls["none"])
    print(f"  sandbox adds {delta * 1000:.0f} ms to the task ({delta * 1000 / steps:.1f} ms/step)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.steps, args.repeats))
