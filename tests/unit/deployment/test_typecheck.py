"""The static type check catches an activity whose signature is not its `ActivityCall`'s,
and a workflow call that sends or expects other types, before anything runs.

Modules written here are checked by `tests.typecheck` with the repository's configuration
(strict): refloop's own modules come from mypy's cache, which `make test` warms first.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

from tests.typecheck import check

MATCHING = '''
from refloop.activities.defn import implements
from refloop.contract import activity_calls
from refloop.contract.activity_io import ReadToolsInput, SummarizeInput, SummarizeResult
from refloop.contract.activity_io import ToolCatalogSnapshot
from refloop.workflows.calls import Calls


class Activities:
    @implements(activity_calls.SUMMARIZE)
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        raise NotImplementedError


@implements(activity_calls.READ_TOOL_CATALOG)
async def read_catalog(inp: ReadToolsInput) -> ToolCatalogSnapshot:
    raise NotImplementedError


async def workflow_code(calls: Calls, inp: SummarizeInput) -> str:
    result = await calls.call(activity_calls.SUMMARIZE, inp, summary="summarize")
    return result.summary
'''

MISMATCHED = '''
from refloop.activities.defn import implements
from refloop.contract import activity_calls
from refloop.contract.activity_io import (
    ClassifyIntentInput,
    ClassifyIntentResult,
    SummarizeInput,
    SummarizeResult,
)
from refloop.workflows.calls import Calls


class Activities:
    @implements(activity_calls.SUMMARIZE)  # line 14: takes another input
    async def summarize(self, inp: ClassifyIntentInput) -> SummarizeResult:
        raise NotImplementedError

    @implements(activity_calls.SUMMARIZE)  # line 18: returns another result
    async def summarize_to_nothing(self, inp: SummarizeInput) -> None:
        return None


@implements(activity_calls.RECORD_TASK)  # line 23: returns something, its call nothing
async def record_task(inp: SummarizeInput) -> SummarizeResult:
    raise NotImplementedError


async def workflow_code(calls: Calls, inp: ClassifyIntentInput) -> None:
    await calls.call(activity_calls.SUMMARIZE, inp)  # line 29: another argument
    result: ClassifyIntentResult = await calls.call(  # another result
        activity_calls.SUMMARIZE,  # line 31
        SummarizeInput(task="t", transcript=""))
'''


def errors_by_line(report: str, name: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for line in report.splitlines():
        path, _, rest = line.partition(":")
        number, _, message = rest.partition(":")
        if path.endswith(name) and number.isdigit() and message.strip().startswith("error"):
            found[int(number)] = found.get(int(number), "") + message
    return found


def module(folder: Path, name: str, source: str) -> Path:
    """A module of a name of its own: mypy's cache (shared with `make test`'s check) keys
    modules by name."""
    path = folder / f"{name}_{uuid.uuid4().hex[:12]}.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_an_activity_that_does_not_match_its_call_is_a_type_error(tmp_path):
    matching = module(tmp_path, "matching", MATCHING)
    mismatched = module(tmp_path, "mismatched", MISMATCHED)
    report, stderr, status = check([str(matching), str(mismatched)])
    assert status == 1, report + stderr
    assert errors_by_line(report, matching.name) == {}, report
    errors = errors_by_line(report, mismatched.name)
    assert set(errors) == {14, 18, 23, 29, 31}, report
    for line in (14, 18, 23):
        assert '"__call__" of "implements" has incompatible type' in errors[line], errors[line]
    assert ("[Activities, ClassifyIntentInput]" in errors[14]
            and "[Activities, SummarizeInput]" in errors[14])
    assert "Coroutine[Any, Any, None]" in errors[18] and "[SummarizeResult]" in errors[18]
    assert "Awaitable[None]" in errors[23]
    assert 'type parameter "ArgT" of "call"' in errors[29], errors[29]
    assert "ActivityCall[SummarizeInput, ClassifyIntentResult]" in errors[31], errors[31]


def test_the_matching_module_alone_passes(tmp_path):
    report, stderr, status = check([str(module(tmp_path, "matching", MATCHING))])
    assert status == 0, report + stderr
    assert report.startswith("Success"), report
