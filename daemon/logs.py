"""Structured logs (structlog): JSON lines for machines, a pretty console for people. Below every
layer that logs (backends.py, the service), so that none imports the service for a logger."""

from __future__ import annotations

import logging
import sys
import threading

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(fmt: str = "auto", level: str = "info", stream=None) -> None:
    """Configure structlog for the process; `auto` is console on a terminal, JSON otherwise."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    # colours only for a terminal: a log file gets no ANSI codes
    renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty()) if fmt == "console" else \
        structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    # an exception nothing caught is one more log record, in the same format, not raw text
    sys.excepthook = lambda *exc: get_logger().critical("crashed", exc_info=exc)
    threading.excepthook = lambda a: get_logger().critical(
        "thread crashed", thread=a.thread.name if a.thread else None, exc_info=(a.exc_type, a.exc_value, a.exc_traceback))


def get_logger(name: str = "csmd"):
    return structlog.get_logger(name)
