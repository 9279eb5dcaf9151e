"""History-lean markers: offload, resolve and what the model reads."""

from __future__ import annotations

from refloop.contract.messages import ChatMessage, ToolCall
from refloop.llm.conversation import for_model
from refloop.store import blobs

STORE: dict[str, str] = {}


def put(text: str) -> str:
    key = blobs.digest(text)
    STORE[key] = text
    return key


def test_small_values_stay_inline():
    assert blobs.offload_output("short", 100, put) == "short"
    assert blobs.offload_args({"path": "a", "n": 3}, 100, put) == {"path": "a", "n": 3}


def test_large_arguments_round_trip_exactly():
    body = "x" * 5000 + "\n" + "y" * 5000
    args = {"path": "big.txt", "content": body, "nested": [{"text": body}]}
    lean = blobs.offload_args(args, 1000, put)
    assert len(lean["content"]) < 100 and blobs.MARKER.fullmatch(lean["content"])
    assert blobs.resolve_args(lean, STORE.__getitem__) == args


def test_large_output_keeps_a_preview_and_expands_capped():
    output = "".join(f"line {n}\n" for n in range(5000))
    lean = blobs.offload_output(output, 1000, put)
    assert lean.startswith("line 0\n") and len(lean) < blobs.PREVIEW_CHARS + 100
    shown = blobs.expand_for_model(lean, STORE.__getitem__, 2000)
    assert shown.startswith(output[:2000]) and "more characters not shown" in shown
    whole = blobs.expand_for_model(lean, STORE.__getitem__, 10**9)
    assert whole == output


def test_model_rendering_expands_messages_and_tool_arguments():
    lean_output = blobs.offload_output("z" * 3000, 100, put)
    lean_args = blobs.offload_args({"content": "w" * 3000}, 100, put)
    messages = [ChatMessage(role="tool", tool_call_id="c", content=lean_output),
                ChatMessage(role="assistant", tool_calls=[
                    ToolCall(id="c", name="write_file", arguments=lean_args)])]
    rendered = for_model(messages, STORE.__getitem__, 1000)
    assert rendered[0].content.startswith("z" * 1000) and "[[blob:" not in rendered[0].content
    content = rendered[1].tool_calls[0].arguments["content"]
    assert content.startswith("w" * 2000) and "not shown" in content


def test_marker_and_size_checks_decide_which_values_need_the_store():
    from refloop.store.blobs import holds_large_string, holds_marker

    key = "a" * 64
    assert holds_marker({"args": [{"content": f"head[[blob:{key}:10:4]]"}]})
    assert not holds_marker({"path": "a.txt", "n": 3, "items": ["x", None]})
    assert holds_large_string({"content": "x" * 101}, 100)
    assert not holds_large_string({"content": "x" * 100, "n": 10**9}, 100)
    # 30 characters of 4 UTF-8 bytes each are 120 bytes: over a 100-byte threshold.
    assert holds_large_string([{"content": "\U0001f600" * 30}], 100)
    assert not holds_large_string(["\U0001f600" * 25], 100)
