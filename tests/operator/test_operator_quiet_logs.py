"""One log line per failure class with a count (`runtime.quiet_logs`), on a real logging handler:
the first failure of a class is logged whole, its repeats within the window are held back and
counted in one line once the window is over, and anything that is not a repeated failure passes."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from rtj_operator.runtime import quiet_logs

RETRY = "Request attempt #%d/9 failed; will retry: GET https://10.0.0.1:6443/api/v1/pods?watch=true -> %s"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, Clock]]:
    """A logger whose handler writes one line per record through the filter, and the filter's clock."""
    out, clock = io.StringIO(), Clock()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(quiet_logs.RepeatedFailures(handler, window_seconds=60.0, clock=clock))
    logger = logging.getLogger("test.quiet")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, out, clock
    logger.removeHandler(handler)


def _traceback(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as raised:
        return raised


def test_a_45_s_outage_of_retries_and_tracebacks_is_one_line_per_class_then_a_count(
    logged: tuple[logging.Logger, io.StringIO, Clock],
) -> None:
    logger, out, clock = logged
    for second in range(45):  # two failure classes every second, one with a traceback
        clock.now += 1
        logger.error(RETRY, second % 9 + 1, "ConnectionTimeoutError('Connection timeout to host')")
        logger.error("a pass failed", exc_info=_traceback(ConnectionRefusedError(111, "refused")))
    assert out.getvalue().count("\n") > 2  # the first of each, the traceback's lines
    first = out.getvalue()
    assert first.count("Request attempt") == 1 and first.count("a pass failed") == 1
    assert first.count("Traceback (most recent call last)") == 1
    clock.now += 20  # past the window: the next record of any kind brings the counts out
    logger.info("the API server answers again")
    lines = out.getvalue()[len(first) :].splitlines()
    assert lines == [
        "WARNING test.quiet: 44 more ConnectionTimeoutError in the last 64 s",
        "WARNING test.quiet: 44 more ConnectionRefusedError in the last 64 s",
        "INFO test.quiet: the API server answers again",
    ]


def test_a_class_logs_again_after_its_window_and_other_records_always_pass(
    logged: tuple[logging.Logger, io.StringIO, Clock],
) -> None:
    logger, out, clock = logged
    logger.warning('health check failed: ReadTimeoutError("read timed out")')
    logger.warning('health check failed: ReadTimeoutError("read timed out")')  # held back
    logger.warning("no failure named here")
    logger.warning("no failure named here")
    logger.info("ServerTimeout(below WARNING passes)")
    clock.now += 61
    logger.warning('health check failed: ReadTimeoutError("read timed out")')
    assert out.getvalue().splitlines() == [
        'WARNING test.quiet: health check failed: ReadTimeoutError("read timed out")',
        "WARNING test.quiet: no failure named here",
        "WARNING test.quiet: no failure named here",
        "INFO test.quiet: ServerTimeout(below WARNING passes)",
        "WARNING test.quiet: 1 more ReadTimeoutError in the last 61 s",
        'WARNING test.quiet: health check failed: ReadTimeoutError("read timed out")',
    ]


def test_failure_classes_come_from_the_exception_or_the_last_one_named() -> None:
    def record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("x", logging.ERROR, __file__, 1, msg, None, info)

    assert quiet_logs.failure_class(record("boom", KeyError("k"))) == "KeyError"
    assert quiet_logs.failure_class(record(RETRY % (1, "ClientConnectorError(ConnectionKey(...))"))) == (
        "ClientConnectorError"
    )
    assert quiet_logs.failure_class(record("APITooManyRequestsError('storage is (re)initializing')")) == (
        "APITooManyRequestsError"
    )
    assert quiet_logs.failure_class(record("the job is Stalled")) is None


def test_install_filters_every_handler_of_the_logger() -> None:
    logger = logging.getLogger("test.quiet.install")
    handlers = [logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())]
    for handler in handlers:
        logger.addHandler(handler)
    try:
        filters = quiet_logs.install(logger)
        assert [f.handler for f in filters] == handlers
        assert all(isinstance(h.filters[0], quiet_logs.RepeatedFailures) for h in handlers)
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
