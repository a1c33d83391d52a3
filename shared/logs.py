"""JSON logs, one object a line, carrying the site, session and turn being worked on."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

_conversation: contextvars.ContextVar[dict | None] = contextvars.ContextVar("conversation", default=None)

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
            **(_conversation.get() or {}),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Read here, not with a service's settings: logging is set up first, at start-up only,
    # so that reading the settings can log (tests/test_settings.py lists this read).
    root.setLevel(os.environ.get("LOG_LEVEL", "INFO").upper())
    # One line per HTTP request to the LLM is noise at INFO; failures still show as warnings.
    for chatty in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    logging.Formatter.converter = time.gmtime


@contextmanager
def conversation(site: str, session_id: str, turn: int) -> Iterator[None]:
    token = _conversation.set({"site": site, "session_id": session_id, "turn": turn})
    try:
        yield
    finally:
        _conversation.reset(token)


def awaiting(coro, limit: int = 24) -> list[str]:
    """The chain of coroutines (and async generators) `coro` awaits, one line each."""
    lines = []
    while coro is not None and len(lines) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            lines.append(f"{type(coro).__name__}\n")  # a future or a C awaitable: where the chain ends
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}\n")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines
