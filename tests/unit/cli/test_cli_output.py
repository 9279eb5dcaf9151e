"""The CLI's stderr without --verbose: one line per failed activity attempt."""

from __future__ import annotations

import logging
import sys

from refloop.cli.main import build_parser
from refloop.cli.serve import OneLineFailures
from refloop.contract.errors import LLMTransportError


def record_for(err: BaseException) -> logging.LogRecord:
    try:
        raise err
    except BaseException:
        exc_info = sys.exc_info()
    record = logging.LogRecord("temporalio.activity", logging.WARNING, __file__, 1,
                               "Completing activity as failed ({...})", None, exc_info)
    record.__dict__["__temporal_error_identifier"] = "ActivityFailure"
    record.temporal_activity = {"activity_type": "refloop.tool.run_cmd", "attempt": 2}
    return record


def test_other_activity_failures_become_one_line_without_traceback():
    record = record_for(RuntimeError("disk\nfull"))
    assert OneLineFailures().filter(record)
    assert record.getMessage() == "run_cmd attempt 2 failed: disk full"
    assert record.exc_info is None


def test_model_failures_are_dropped_as_they_log_their_own_line():
    try:
        try:
            raise LLMTransportError("HTTP 500")
        except LLMTransportError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as err:
        record = record_for(err)
    assert OneLineFailures().filter(record) is False


def test_unrelated_records_pass_untouched_and_verbose_exists():
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "hello", None, None)
    assert OneLineFailures().filter(record) and record.getMessage() == "hello"
    assert build_parser().parse_args(["--verbose", "worker"]).verbose


def test_stats_say_how_many_requests_failed_and_were_abandoned():
    from refloop.cli.output import failed_calls_note
    from refloop.contract.messages import TokenUsage

    assert failed_calls_note(TokenUsage(calls=4)) == ""
    assert failed_calls_note(TokenUsage(calls=4, failed_calls=2)) == " (2 failed)"
    note = failed_calls_note(TokenUsage(calls=4, failed_calls=2, abandoned_calls=1,
                                        abandoned_max_tokens=384))
    assert note == " (2 failed; 1 abandoned, usage unknown: at most 384 more completion tokens)"
