"""No request stalls the others: a body's JSON shape is bounded before anything parses it
(members, depth), by a scan that runs in C chunk by chunk, so a 1 MB body of 90,000
unknown keys (3.6 s on the loop before, as a 422) is a prompt 413, and /healthz answers
while several are in flight. Bodies of long strings, commas and brackets inside them
included, pass as before."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from refloop.api.guards import MAX_JSON_DEPTH, MAX_JSON_MEMBERS, JsonShape, json_shape_refusal

MANY_KEYS = json.dumps({f"k{i}": 0 for i in range(90_000)}, separators=(",", ":")).encode()
assert len(MANY_KEYS) < 1_000_000  # under the size limit: the shape must refuse it


def test_the_shape_scan_counts_structure_outside_strings_only():
    assert json_shape_refusal(MANY_KEYS) == \
        f"the body has more than {MAX_JSON_MEMBERS} JSON members"
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert "deeper than 64" in json_shape_refusal(deep)
    assert json_shape_refusal(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is None
    code = json.dumps({"content": 'f(a, b), [c], {d: "e\\" ,,,", \\\\' * 20_000}).encode()
    assert json_shape_refusal(code) is None  # punctuation inside a string is text
    items = json.dumps(list(range(MAX_JSON_MEMBERS - 1))).encode()
    assert json_shape_refusal(items) is None
    assert json_shape_refusal(json.dumps(list(range(MAX_JSON_MEMBERS + 1))).encode())


def token_by_token(body: bytes) -> tuple[int, int]:
    """The reference: members and deepest nesting, one byte at a time."""
    members = depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"{[":
            members, depth = members + 1, depth + 1
            deepest = max(deepest, depth)
        elif byte in b"}]":
            depth -= 1
        elif byte == 0x2C:
            members += 1
    return members, deepest


TEXT = st.text(alphabet=st.sampled_from('ab"\\,:{}[] \n\u00e9'), max_size=12)
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                      lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(TEXT, inner, max_size=4), max_leaves=40)


@settings(max_examples=150, deadline=None)
@given(value=VALUES, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_the_scan_agrees_with_a_byte_by_byte_count_whatever_the_chunks(value, cuts):
    """Strings full of quotes, backslashes and brackets, cut anywhere (inside an escape
    included), counted the same as one byte at a time."""
    body = json.dumps(value, ensure_ascii=False).encode()
    members, deepest = token_by_token(body)
    edges = sorted({0, len(body), *(cut for cut in cuts if cut < len(body))})
    chunks = [body[a:b] for a, b in itertools.pairwise(edges)]
    shape = JsonShape(max_members=members, max_depth=deepest)
    assert [shape.feed(chunk) for chunk in chunks] == [None] * len(chunks)
    assert shape.members == members and shape.depth == 0
    tighter = JsonShape(max_members=members, max_depth=max(deepest - 1, 0))
    refusals = [tighter.feed(chunk) for chunk in chunks]
    assert (deepest == 0) or any(r and "deeper" in r for r in refusals)


def test_a_refused_body_costs_the_event_loop_little():
    """The 90,000-key body, fed as the server reads it (64 KB chunks), is refused within a
    few milliseconds of CPU: ten such clients no longer keep the loop busy (the token loop
    took ~15 ms and more per body)."""
    best = float("inf")
    for _ in range(5):
        began = time.process_time()
        shape = JsonShape()
        refusal = None
        for start in range(0, len(MANY_KEYS), 65_536):
            if (refusal := shape.feed(MANY_KEYS[start:start + 65_536])) is not None:
                break
        best = min(best, time.process_time() - began)
        assert refusal is not None and "JSON members" in refusal
    assert best < 0.005, best


async def test_ninety_thousand_keys_are_a_prompt_413_and_healthz_answers_meanwhile(api):
    began = time.perf_counter()
    refused = await api.post("/prompts", content=MANY_KEYS,
                             headers={"Content-Type": "application/json"})
    assert refused.status_code == 413 and "JSON members" in refused.json()["detail"]
    assert time.perf_counter() - began < 2.0  # was 3.6 s of validation on the event loop

    async def abuse() -> int:
        response = await api.post("/prompts", content=MANY_KEYS,
                                  headers={"Content-Type": "application/json"})
        return response.status_code

    attack = [asyncio.create_task(abuse()) for _ in range(3)]
    await asyncio.sleep(0)
    probe_began = time.perf_counter()
    health = await api.get("/healthz")
    probe_s = time.perf_counter() - probe_began
    assert [await task for task in attack] == [413] * 3
    assert health.status_code == 200 and probe_s < 1.0, probe_s

    # A legitimate body of the same size: one long string full of commas and brackets.
    text = "if (a, b) { [c, d]; }\n" * 40_000
    created = await api.post("/prompts", json={"name": "big", "system_prompt": text[:100_000]})
    assert created.status_code == 201
