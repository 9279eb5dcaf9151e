"""Spend limits without Temporal: prices, the cost of a call, sums that do not drift, when
the limit covers the next call, which raises are refused, a child's share, the ledger's
pricing and the earlier `token_budget` name."""

from __future__ import annotations

import pytest

from refloop.contract.budget import (
    BudgetRaise,
    ModelPrice,
    call_cost,
    parse_prices,
    priced,
)
from refloop.contract.messages import Purpose, TokenUsage
from refloop.contract.task import TaskInput, TaskStats
from refloop.llm.ledger import RequestLedger
from refloop.settings import Settings
from refloop.workflows import accounting
from refloop.workflows.completeness_logic import merge_stats

CENT = ModelPrice(input_usd_per_mtok=5, output_usd_per_mtok=5)


def spent(calls: int, cost: float = 0.01, tokens: int = 2000) -> TokenUsage:
    return TokenUsage(calls=calls, cost_usd=round(calls * cost, 9),
                      total_tokens=calls * tokens)


def test_prices_parse_from_json_text_or_an_object_and_refuse_other_shapes():
    text = '{"gpt-4o": {"input_usd_per_mtok": 2.5, "output_usd_per_mtok": 10}}'
    assert parse_prices(text)["gpt-4o"].output_usd_per_mtok == 10
    assert parse_prices({"m": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2,
                               "cached_input_usd_per_mtok": 0.5}})["m"].input_usd_per_mtok == 1
    assert parse_prices(None) == {} and parse_prices("") == {}
    for bad in ('[1]', '{"m": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 1}}',
                '{"m": {"input": 1}}', "{not json"):
        with pytest.raises(ValueError):
            parse_prices(bad)


def test_a_bad_price_list_is_refused_at_start_naming_its_variable():
    with pytest.raises(ValueError, match="refloop_model_prices"):
        Settings(refloop_model_prices='{"m": 3}')
    prices = Settings(refloop_model_prices='{"m": {"input_usd_per_mtok": 5, '
                      '"output_usd_per_mtok": 5}}').model_prices
    assert prices == {"m": CENT}


def test_a_call_costs_its_tokens_at_the_price_and_an_unpriced_one_is_counted():
    usage = TokenUsage(prompt_tokens=1000, completion_tokens=1000, total_tokens=2000, calls=1)
    assert call_cost(usage, CENT) == 0.01
    assert priced(usage, CENT).cost_usd == 0.01 and priced(usage, CENT).unpriced_calls == 0
    unpriced = priced(usage, None)
    assert unpriced.cost_usd == 0 and unpriced.unpriced_calls == 1


def test_sums_of_cents_do_not_drift():
    total = TokenUsage()
    for _ in range(100):
        total = total.add(TokenUsage(cost_usd=0.01, calls=1))
    assert total.cost_usd == 1.0
    assert sum([0.01] * 100) != 1.0  # what a plain float sum would have said


def test_the_limit_covers_the_next_call_until_spend_plus_a_call_passes_it():
    assert accounting.over_budget(spent(4), 0.05, None) is None  # 0.04 + 0.01 fits
    why = accounting.over_budget(spent(5), 0.05, None)
    assert why == ("spend limit: $0.05 spent of $0.05; the next model call (about $0.01) "
                   "is not covered")
    assert accounting.over_budget(spent(3), 0.035, None) is not None  # 0.04 would pass it
    assert accounting.over_budget(TokenUsage(), 0.05, None) is None  # nothing spent yet
    assert accounting.over_budget(spent(5), None, None) is None  # no limit
    # unpriced calls cost 0: the cost limit passes them, a token limit does not
    assert accounting.over_budget(spent(9, cost=0), 0.05, None) is None
    tokens = accounting.over_budget(spent(3), None, 6000)
    assert tokens is not None and tokens.startswith("token limit: 6000 tokens used of 6000")
    assert accounting.over_budget(spent(2), None, 6000) is None


def test_a_limit_below_the_spend_is_refused_with_the_figure():
    usage = spent(5)
    assert accounting.refuse_raise(usage, 0.05, None) is None
    assert accounting.refuse_raise(usage, 1.0, 20_000) is None
    assert "has spent $0.05" in (accounting.refuse_raise(usage, 0.03, None) or "")
    assert "has used 10000 tokens" in (accounting.refuse_raise(usage, None, 9000) or "")
    with pytest.raises(ValueError, match="max_cost_usd or max_tokens"):
        BudgetRaise()
    with pytest.raises(ValueError):
        BudgetRaise(max_cost_usd=0)


def test_a_child_gets_what_is_left_never_nothing():
    assert accounting.remaining(0.09, 0.07) == 0.02
    assert accounting.remaining(None, 0.07) is None
    assert accounting.remaining(0.05, 0.06) == 1e-9  # it starts by waiting for a raise


def test_a_childs_usage_is_the_parents_and_counted_apart():
    parent = TaskStats(usage=spent(7))
    child = TaskStats(usage=spent(3))
    merged = merge_stats(parent, child)
    assert merged.usage.cost_usd == 0.1 and merged.children_usage.cost_usd == 0.03
    again = merge_stats(merged, TaskStats(usage=spent(1)))
    assert again.children_usage.cost_usd == 0.04


def test_the_ledger_prices_each_answer_and_what_a_broken_stream_delivered():
    ledger = RequestLedger()
    ledger.begin(Purpose.act, "m", 256, CENT)
    cost = ledger.answered(TokenUsage(prompt_tokens=1000, completion_tokens=1000,
                                      total_tokens=2000, calls=1), 256)
    assert cost == 0.01 and ledger.usage.cost_usd == 0.01 and ledger.usage.calls == 1
    ledger.begin(Purpose.act, "m", 256)
    ledger.failed(256, abandoned=False,
                  received=TokenUsage(completion_tokens=200, total_tokens=200))
    assert ledger.usage.cost_usd == 0.011 and ledger.usage.unpriced_calls == 0
    record = ledger.record()
    assert record is not None and record.usage.cost_usd == 0.011


def test_a_ledger_without_a_price_counts_answers_unpriced():
    ledger = RequestLedger()
    ledger.begin(Purpose.plan, "free-model", 128)
    assert ledger.answered(TokenUsage(prompt_tokens=10, completion_tokens=5,
                                      total_tokens=15, calls=1), 128) == 0
    assert ledger.usage.unpriced_calls == 1 and ledger.usage.cost_usd == 0


def test_token_budget_is_the_earlier_name_of_max_tokens():
    assert TaskInput(task="t", workspace="/w", token_budget=300).max_tokens == 300
    both = TaskInput(task="t", workspace="/w", token_budget=300, max_tokens=500)
    assert both.max_tokens == 500
    assert "token_budget" not in TaskInput(task="t", workspace="/w").model_dump()
    settings = Settings(refloop_budget_wait_s=60)
    assert settings.task_input(task="t", workspace="/w", max_cost_usd=1.0).budget_wait_s == 60
    assert settings.task_input(task="t", workspace="/w").budget_wait_s is None
