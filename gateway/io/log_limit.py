"""At most a few log lines a minute of each kind that can come in floods: a client
flooding the gateway with refused requests (a bad token, a malformed request, too many
messages...) wrote one line per refusal, 1,357 a second from one client sending malformed
HTTP requests; an LLM answering every turn with an empty reply wrote one WARNING per turn of
every session. The counters in ``/metrics`` (``gateway_errors_total``) count every one;
the log shows the first ``LOGGED`` of each kind in a window of ``WINDOW_S`` seconds, then
says how many it left out.

Such a line is logged as any line is, with ``extra=limited("kind")``; ``LogLimit``, a
``logging.Filter`` each gateway puts on the loggers that log them while it runs, drops
the ones over the limit. It goes by the records' own times (``LogRecord.created``), so it
is a function of the records it is given.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

LOGGED = 10
"""Lines of one kind logged per window."""
WINDOW_S = 60.0

LOGGERS = ("gateway", "gateway.io.connection", "gateway.io.http_api")
"""The loggers that log limited lines."""


def limited(kind: str) -> dict[str, str]:
    """The ``extra`` of a limited line's log call (a refusal, a turn the LLM's reply
    failed): records of one ``kind`` are limited together."""
    return {"log_limit": kind}


def peer_text(peer: Any) -> str:
    """A client's ``(host, port)`` as the log writes it (``?`` when unknown)."""
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def log_refused(logger: logging.Logger, path: str, peer: str, status: int, code: str,
                message: str) -> None:
    """The line of a request either port refuses before serving it (a wrong token, a
    ``Host`` or ``Origin`` not allowed, a full gateway): its path without the query (which
    may hold a token), the client and why, limited per ``code``."""
    logger.info("%s from %s refused (%d %s): %s", path.split("?", 1)[0][:200], peer, status,
                code, message, extra=limited(f"refused {code}"))


@dataclass(slots=True)
class _Window:
    start: float
    logged: int = 0
    left_out: int = 0


class LogLimit(logging.Filter):
    """Lets through the first ``logged`` records of each kind in a window of
    ``window_s`` seconds, which starts at the first of them, and drops the others. The
    first of the next window comes after a line of its own, at its level, saying how
    many were left out and since when: a flood that ends leaves that line out until the
    next line of the kind (no timer runs for it; ``/metrics`` counts them all). Records
    without a kind pass."""

    def __init__(self, logged: int = LOGGED, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.logged, self.window_s = logged, window_s
        self._windows: dict[str, _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = getattr(record, "log_limit", None)
        if not isinstance(kind, str):
            return True
        window = self._windows.get(kind)
        if window is None or record.created - window.start >= self.window_s:
            if window is not None and window.left_out:
                logging.getLogger(record.name).log(
                    record.levelno, "%d more line(s) of this kind (%s) since %s were not "
                    "logged (at most %d per %.0f s; /metrics counts them all)",
                    window.left_out, kind, _clock(window.start), self.logged, self.window_s)
            window = self._windows[kind] = _Window(record.created)
        if window.logged < self.logged:
            window.logged += 1
            return True
        window.left_out += 1
        return False

    def install(self) -> None:
        """Put the limit on the loggers that log limited lines: a logger's filter sees the
        records created on that very logger."""
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)


def _clock(created: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(created))
