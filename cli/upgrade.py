"""`refloop drain`: before the workers of this build stop for an upgrade, every running
task hands over (continues as new, parked) so that the new build goes on with it, never
replaying this build's commands (`docs/operations.md`)."""

from __future__ import annotations

import argparse
import json

from refloop.settings import Settings

COMMAND = "drain"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    drain = sub.add_parser(COMMAND, help="before an upgrade: hand every running task over "
                           "to the next build of the workers (run it with the old code)")
    drain.add_argument("--build", help="the build being retired (default: this "
                       "installation's build, as its workers report it)")
    drain.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                       help="how long to wait for every task to reach a point where it can "
                       "hand over (default 300)")
    drain.add_argument("--json", action="store_true", help="print the report as JSON")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.runtime.client import connect
    from refloop.worker.handover import drain, workflow_build_id

    if not settings.temporal_address:
        print("error: refloop drain needs the Temporal server: set TEMPORAL_ADDRESS or "
              "start `refloop up`")
        return 2
    build = args.build or settings.refloop_build_id or workflow_build_id()
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    report = await drain(client, build, settings.task_queue, args.timeout)
    if args.json:
        print(json.dumps({"build": build, "task_queue": settings.task_queue,
                          "handed_over": report.asked,
                          "refused": report.refused, "still_running": report.still_running}))
    else:
        print(f"build {build}: {len(report.asked)} task(s) asked to hand over, "
              f"{len(report.asked) - len(report.still_running)} parked for the next build")
        for workflow_id, why in report.refused.items():
            print(f"  {workflow_id}: not handed over: {why}")
        for workflow_id in report.still_running:
            print(f"  {workflow_id}: still running (it hands over at its next safe point; "
                  "run drain again, or wait)")
        if not report.still_running:
            print("stop this build's workers now; workers of the new build take the tasks "
                  "over as they start")
    return 1 if report.still_running else 0
