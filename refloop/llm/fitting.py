"""Fitting a conversation into a model's window: pure decisions, unit-tested without a model.

The act activity runs them on the stored conversation before every model turn (the
window, the calibrated token ratio and the prompt's own size are known only there, on
the worker that calls the model; the workflow sees their outcome in the act's result
and schedules the summary, `compact`, as its own activity). In order:

1. A single tool output larger than its share of the window is windowed (its head and
   tail, with how to read the rest), in what the model reads; the store keeps it whole.
2. Past `mask_at` of the prompt budget, old tool outputs are masked to one line each
   (and long arguments of old calls to their size), in the stored conversation: what was
   sent stays byte-stable until the next masking, so prompt caches keep serving it.
3. A prompt still over the budget has its oldest turns folded into one note, the
   assistant's own words kept verbatim, so that no request over the window is sent.
4. Past `compact_at`, a summary by the model is due: `compact_plan` says which turns it
   folds, `compacted_conversation` builds the conversation that replaces them.

The system prompt and the task (with its plan) are never touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from refloop.contract.messages import ChatMessage

PINNED = 2  # the system prompt and the task message
TOOL_RESULT_PREFIX = "Tool result for "  # a call parsed out of text is answered by a user turn
# The summary message a compaction leaves, its record's blob named
COMPACTED = re.compile(r"^\[Earlier turns were compacted \(summary ([0-9a-f]{64})\)\]")
MASKED_SUFFIX = "characters; masked to save the model's window: call the tool again if needed]"
RECENT = 0.25  # share of the budget a summary leaves to the recent turns, kept whole
LONG_ARGUMENT = 200  # characters of an old call's argument kept when it is masked
NOTE_CHARS = 2_000  # of each assistant note kept verbatim by a fold
EXCERPT = 100  # characters of a masked output kept on its line, for the summary to come


@dataclass(frozen=True)
class Budget:
    """Tokens the messages of one request may take, and the ratio that estimates them."""

    prompt_tokens: int  # the window less the completion's room, the tools and the margin
    chars_per_token: float
    window: int = 0  # the endpoint's whole window
    total: int = 0  # the messages' and the completion's together (the window less the rest)
    mask_at: float = 0.6  # share of prompt_tokens past which old outputs are masked
    compact_at: float = 0.75  # share past which a model-written summary is due
    output_share: float = 0.3  # the most one tool output may take
    # A summary is due only when the turns it would fold take this share: each one then
    # saves at least that much, so their number is bounded by the task's length
    fold_at: float = 0.25
    recent_share: float = 0.3  # recent outputs kept whole when masking

    def tokens(self, message: ChatMessage) -> int:
        return message_tokens(message, self.chars_per_token)


def message_tokens(message: ChatMessage, chars_per_token: float) -> int:
    """Estimated tokens of one message as sent (its wire JSON, plus the template's)."""
    return int(len(message.model_dump_json(exclude_none=True)) / chars_per_token) + 4


def clip_to_fit(messages: list[ChatMessage], budget: Budget) -> list[ChatMessage]:
    """Any prompt made to fit: its longest contents windowed, largest first (a review's
    file, a judge's history); the system prompt last."""
    messages = list(messages)
    for _ in range(len(messages) * 2):
        excess = sum(budget.tokens(m) for m in messages) - budget.prompt_tokens
        if excess <= 0:
            break
        index = max(range(len(messages)), key=lambda i: (
            messages[i].role != "system" and len(messages[i].content or "") > 500,
            len(messages[i].content or "")))
        text = messages[index].content or ""
        keep = max(len(text) - int((excess + 16) * budget.chars_per_token * 1.1), 0)
        if keep >= len(text) or not text:
            break
        messages[index] = messages[index].model_copy(
            update={"content": window_output(text, keep)})
    return messages


def is_tool_output(message: ChatMessage) -> bool:
    return message.role == "tool" or (
        message.role == "user" and (message.content or "").startswith(TOOL_RESULT_PREFIX))


def is_masked(message: ChatMessage) -> bool:
    return (message.content or "").endswith(MASKED_SUFFIX)


def mask_line(rendered: ChatMessage) -> str:
    """One line in place of a tool output: its first line (`[read_file] ok`), how it went
    on, its size."""
    text = rendered.content or ""
    head = 2 if rendered.role == "user" else 1  # "Tool result for NAME:\n[NAME] ok\n..."
    lines = text.split("\n", head)
    first = " ".join(lines[:head])[:200]
    rest = " ".join(lines[head].split())[:EXCERPT] if len(lines) > head else ""
    return f"{first}{' ' + rest + '...' if rest else ''} [{len(text)} {MASKED_SUFFIX}"


def window_output(text: str, max_chars: int) -> str:
    """An output too large for its share: its head and tail, and how to read the rest."""
    if len(text) <= max_chars:
        return text
    note = (f"\n[... {len(text) - max_chars} characters left out to fit the model's window; "
            "read a smaller part (read_file with start_line/end_line, or grep) ...]\n")
    head = max(max_chars * 3 // 4 - len(note), 0)
    tail = max(max_chars - head - len(note), 0)
    return text[:head] + note + (text[-tail:] if tail else "")


def short_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """Long string arguments (a file's content) as their size."""
    return {name: (f"<{len(value)} characters>"
                   if isinstance(value, str) and len(value) > LONG_ARGUMENT else value)
            for name, value in arguments.items()}


def masked_call(message: ChatMessage) -> ChatMessage:
    """An old assistant turn whose call arguments are long (a file written): their size."""
    if not message.tool_calls:
        return message
    return message.model_copy(update={"tool_calls": [
        call.model_copy(update={"arguments": short_arguments(call.arguments)})
        for call in message.tool_calls]})


@dataclass
class Fit:
    """A conversation fitted to its budget: what to store, what the model reads."""

    stored: list[ChatMessage]
    rendered: list[ChatMessage]
    tokens_before: int
    tokens_after: int
    masked: int = 0  # tool outputs masked by this fit
    windowed: int = 0  # outputs the model reads only in part
    folded: int = 0  # turns folded to make the request fit at all
    compact_due: bool = False
    notes: list[str] = field(default_factory=list)


def tail_start(messages: list[ChatMessage], budget: Budget, share: float,
               start: int = PINNED) -> int:
    """Where the recent turns kept whole begin: an assistant turn (so no tool output is left
    without its call), as far back as `share` of the budget allows, and never later than
    the last assistant turn."""
    limit = share * budget.prompt_tokens
    last_assistant = next((i for i in range(len(messages) - 1, start - 1, -1)
                           if messages[i].role == "assistant"), len(messages))
    kept, begin = 0, last_assistant
    for index in range(len(messages) - 1, start - 1, -1):
        kept += budget.tokens(messages[index])
        if kept > limit:
            break
        if messages[index].role == "assistant":
            begin = index
    return begin


def fit_conversation(stored: list[ChatMessage], rendered: list[ChatMessage],
                     budget: Budget) -> Fit:
    """Window, mask, fold (module docstring); `stored` and `rendered` are the same turns,
    as kept and as the model reads them (blob markers expanded)."""
    stored, rendered = list(stored), list(rendered)
    before = sum(budget.tokens(m) for m in rendered)
    fit = Fit(stored, rendered, before, before)
    share_chars = int(budget.output_share * budget.prompt_tokens * budget.chars_per_token)
    for index, message in enumerate(rendered):
        if is_tool_output(message) and len(message.content or "") > share_chars:
            rendered[index] = message.model_copy(
                update={"content": window_output(message.content or "", share_chars)})
            fit.windowed += 1
    total = sum(budget.tokens(m) for m in rendered)
    if total > budget.mask_at * budget.prompt_tokens:
        recent = tail_start(rendered, budget, budget.recent_share)
        for index in range(PINNED, recent):
            message = rendered[index]
            if is_tool_output(message) and not is_masked(message):
                line = mask_line(message)
                stored[index] = stored[index].model_copy(update={"content": line})
                rendered[index] = rendered[index].model_copy(update={"content": line})
                fit.masked += 1
            elif message.tool_calls:
                # from what the model read: an offloaded argument is a short marker in the
                # store, which would be expanded again at the next turn
                rendered[index] = masked_call(message)
                stored[index] = stored[index].model_copy(
                    update={"tool_calls": rendered[index].tool_calls})
        total = sum(budget.tokens(m) for m in rendered)
    if total > budget.prompt_tokens:
        fit.stored, fit.rendered, fit.folded = fold_to_fit(stored, rendered, budget)
        total = sum(budget.tokens(m) for m in fit.rendered)
    fit.tokens_after = total
    fit.compact_due = (total > budget.compact_at * budget.prompt_tokens
                       and foldable(fit.rendered, budget) > budget.fold_at * budget.prompt_tokens)
    return fit


def foldable(messages: list[ChatMessage], budget: Budget) -> int:
    """Tokens of the turns a summary would fold now (`compact_plan`'s)."""
    first = PINNED + (1 if len(messages) > PINNED and COMPACTED.match(
        messages[PINNED].content or "") else 0)
    return sum(budget.tokens(m) for m in messages[first:tail_start(messages, budget, RECENT)])


def fold_to_fit(stored: list[ChatMessage], rendered: list[ChatMessage], budget: Budget
                ) -> tuple[list[ChatMessage], list[ChatMessage], int]:
    """The oldest turns after the task folded into one note (a compaction without a model:
    the calls made, the assistant's words verbatim) until the rest fits."""
    start = PINNED + (1 if len(stored) > PINNED and COMPACTED.match(
        stored[PINNED].content or "") else 0)
    pinned = sum(budget.tokens(m) for m in rendered[:start])
    begin = tail_start(rendered, budget, 0.5, start)
    while True:
        note = ChatMessage(role="user", content=fold_note(stored[start:begin]))
        used = pinned + budget.tokens(note) + sum(budget.tokens(m) for m in rendered[begin:])
        later = next((i for i in range(begin + 1, len(rendered))
                      if rendered[i].role == "assistant"), None)
        if used <= budget.prompt_tokens or later is None:
            break
        begin = later
    if begin <= start:
        return stored, rendered, 0
    return ([*stored[:start], note, *stored[begin:]],
            [*rendered[:start], note, *rendered[begin:]], begin - start)


def assistant_notes(messages: list[ChatMessage]) -> list[str]:
    """What the assistant itself wrote in these turns, verbatim (each bounded)."""
    return [(m.content or "").strip()[:NOTE_CHARS] for m in messages
            if m.role == "assistant" and (m.content or "").strip()]


def calls_made(messages: list[ChatMessage], limit: int = 1_500) -> str:
    """The calls made in these turns, one `read_file {"path": "a.txt"}` each; over `limit`
    characters, their count by tool and the latest of them."""
    lines = [f"{call.name} {json.dumps(short_arguments(call.arguments), ensure_ascii=False)}"
             [:160] for message in messages for call in message.tool_calls or []]
    text = "; ".join(lines)
    if len(text) <= limit:
        return text or "none"
    counts: dict[str, int] = {}
    for message in messages:
        for call in message.tool_calls or []:
            counts[call.name] = counts.get(call.name, 0) + 1
    head = f"{len(lines)} calls ({', '.join(f'{n} x{c}' for n, c in counts.items())}); latest: "
    latest: list[str] = []
    for line in reversed(lines):
        if len(head) + sum(len(x) + 2 for x in latest) + len(line) > limit:
            break
        latest.insert(0, line)
    return head + "; ".join(latest)


def fold_note(messages: list[ChatMessage]) -> str:
    notes = assistant_notes(messages)
    text = (f"[{len(messages)} earlier messages were folded to fit the model's window. "
            f"Calls made: {calls_made(messages)}.]")
    if notes:
        text += "\nYour own notes from them, verbatim:\n" + "\n".join(f"- {n}" for n in notes)
    return text


# ---------------------------------------------------------------- the model's summary


@dataclass(frozen=True)
class CompactPlan:
    """Which turns a summary folds: `stored[start:end]`; the tail from `end` stays whole."""

    start: int
    end: int
    previous_ref: str | None  # the summary record an earlier compaction left


def compact_plan(stored: list[ChatMessage], budget: Budget) -> CompactPlan | None:
    """The middle to fold: everything after the task (an earlier summary included) up to
    the recent turns, which keep `RECENT` of the budget; None when nothing would fold."""
    previous = COMPACTED.match(stored[PINNED].content or "") if len(stored) > PINNED else None
    end = tail_start(stored, budget, RECENT)
    first_new = PINNED + (1 if previous else 0)
    if end <= first_new:
        return None
    return CompactPlan(PINNED, end, previous.group(1) if previous else None)


def transcript(messages: list[ChatMessage], max_chars: int) -> str:
    """The folded turns as the summarising model reads them: each bounded, oldest cut
    first when the whole is over `max_chars`."""
    lines = []
    for message in messages:
        text = (message.content or "").strip()
        if message.tool_calls:
            text = (text + "\n" if text else "") + "calls: " + "; ".join(
                f"{c.name} {json.dumps(c.arguments, ensure_ascii=False)[:300]}"
                for c in message.tool_calls)
        lines.append(f"[{message.role}] {text[:1500]}")
    whole = "\n\n".join(lines)
    return whole if len(whole) <= max_chars else "[...]\n" + whole[-max_chars:]


def summary_message(ref: str, summary: str, notes: list[str], progress: str,
                    files: list[str]) -> ChatMessage:
    """The one message a compaction leaves in place of the turns it folded."""
    parts = [f"[Earlier turns were compacted (summary {ref})]", f"Summary:\n{summary.strip()}"]
    if progress:
        parts.append(f"Plan progress: {progress}")
    if files:
        parts.append("Files written so far: " + ", ".join(files))
    if notes:
        parts.append("Your own notes from those turns, verbatim:\n"
                     + "\n".join(f"- {note}" for note in notes))
    return ChatMessage(role="user", content="\n\n".join(parts))


def refit_conversation(messages: list[ChatMessage], budget: Budget) -> list[ChatMessage]:
    """The gateway's fitter for a model turn refused for length: the same fit, on the
    conversation as the model read it."""
    return fit_conversation(messages, messages, budget).rendered


def compacted_conversation(stored: list[ChatMessage], plan: CompactPlan,
                           summary: ChatMessage) -> list[ChatMessage]:
    return [*stored[:plan.start], summary, *stored[plan.end:]]


def files_written(messages: list[ChatMessage], is_edit: Callable[[str, dict[str, Any]], bool],
                  earlier: list[str]) -> list[str]:
    """Paths edit calls named (those of an earlier compaction first), in order, once each."""
    seen = list(earlier)
    for message in messages:
        for call in message.tool_calls or []:
            path = call.arguments.get("path") or call.arguments.get("file_path")
            if is_edit(call.name, call.arguments) and isinstance(path, str) and path not in seen:
                seen.append(path)
    return seen
