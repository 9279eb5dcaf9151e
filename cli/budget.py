"""`refloop budget TASK --max-cost-usd X [--max-tokens N]`: set a task's spend limit (as
POST /tasks/{id}/budget does, through the API's own route). A task waiting
`waiting_for_budget` goes on once the new limit covers its next model call; a limit below
what it has spent is refused with the figure."""

from __future__ import annotations

import argparse
from typing import Any

from refloop.settings import Settings

COMMAND = "budget"


def add_parser(sub: Any) -> None:
    budget = sub.add_parser(COMMAND, help="set a task's spend limit (totals, its children's "
                            "spend included); a task waiting for budget goes on")
    budget.add_argument("task", help="the task ID")
    budget.add_argument("--max-cost-usd", type=float, metavar="USD",
                        help="the new cost limit in USD (at REFLOOP_MODEL_PRICES)")
    budget.add_argument("--max-tokens", type=int, metavar="N", help="the new token limit")
    budget.add_argument("--json", action="store_true", help="JSON on stdout")


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from refloop.api.routes.budget import set_budget
    from refloop.api.schemas import BudgetBody
    from refloop.cli.output import fail
    from refloop.cli.people import Stack, answer

    if args.max_cost_usd is None and args.max_tokens is None:
        fail("name --max-cost-usd or --max-tokens (or both)")
    try:
        body = BudgetBody(max_cost_usd=args.max_cost_usd, max_tokens=args.max_tokens)
    except ValueError as err:
        fail(f"the limit must be above 0: {err}")
    stack = await Stack.open(settings, need_temporal=True)
    budget = await stack.call(set_budget, args.task, body, stack.client, stack.store)
    limits = ", ".join(part for part in (
        f"${budget.max_cost_usd:g}" if budget.max_cost_usd is not None else "",
        f"{budget.max_tokens} tokens" if budget.max_tokens is not None else "") if part)
    state = "still waits for budget" if budget.waiting else "goes on"
    return answer(args, budget, f"task {budget.task_id}: limit {limits}; spent "
                  f"${budget.cost_usd:.4f}, {budget.tokens} tokens; it {state}")
