"""Scripted LLM backend: replies from a JSONL file, paced and bursty like oMLX.

For the demo, for load scripts and for tests of everything downstream of the LLM (the
splitter, the scheduler, the pacer), without a model. It is a real backend, shipped like
httpx's ``MockTransport``, and it behaves like the production server as seen by the gateway:

* the reply is cut into approximate tokens (word pieces, ``split_tokens``) and delivered at
  ``tokens_per_s`` (51.5 tok/s: Gemma 4 26B-A4B through oMLX, idle hub), several tokens per
  chunk (oMLX sent 300 tokens in 45 chunks), chunk sizes drawn from ``chunk_tokens``;
* the final ``LlmDone`` carries oMLX-shaped usage (``completion_tokens``,
  ``generation_tokens_per_second``), and ``finish_reason`` ``"length"`` when
  ``max_tokens`` cut the reply.

Which reply: the **last user message** is normalised (case-folded, punctuation dropped,
whitespace collapsed) and looked up among the file's transcripts. An unknown transcript gets
one of the file's replies chosen by a stable hash (BLAKE2b) of its normalised text: the same
transcript always gets the same reply, across processes and runs, and unknown transcripts
still exercise the hard cases the set was written for.

The default file is ``engines/data/replies.jsonl`` (package data); one JSON object per line,
``{"transcript": "...", "reply": "..."}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
import unicodedata
from collections.abc import AsyncGenerator, Awaitable, Callable
from importlib import resources
from pathlib import Path

from engines.base import LlmDelta, LlmDone, LlmEvent, LlmRequest

_TOKEN = re.compile(r"\s*(?:[^\W\d_]{1,6}|\d{1,3}|[^\w\s]|_)|\s+")
"""A word piece: optional leading space, then up to 6 letters, up to 3 digits, or one other
character. Every character of any string falls in exactly one match."""


def split_tokens(text: str) -> list[str]:
    """Cut ``text`` into approximate LLM tokens; ``"".join(split_tokens(t)) == t``."""
    return _TOKEN.findall(text)


_APOSTROPHES = frozenset("'\u2019\u02bc")


def normalise(text: str) -> str:
    """Case-folded, without punctuation, whitespace collapsed: the lookup key."""
    kept = "".join(
        "" if c in _APOSTROPHES else " " if unicodedata.category(c).startswith("P") else c
        for c in text.casefold()
    )
    return " ".join(kept.split())


class RepliesError(ValueError):
    """A replies file that cannot be read or used (``load_replies``). Its message names the
    file (and the line), not where the file was given: the caller adds that (the gateway's
    ``llm.replies (--replies)``, the soak's ``--replies``)."""


def load_replies(path: str | Path | None = None) -> dict[str, str]:
    """Read a replies file into ``{normalised transcript: reply}``.

    Raises ``RepliesError`` for a file that cannot be read, or naming the line for a
    malformed line or a transcript that normalises to one already in the file.
    """
    if path is None:
        text = resources.files("engines").joinpath("data/replies.jsonl").read_text("utf-8")
        where = "engines/data/replies.jsonl"
    else:
        try:
            text = Path(path).read_text("utf-8-sig")  # (a Windows editor's BOM too)
        except OSError as exc:
            raise RepliesError(f"{str(path)!r} cannot be read: "
                               f"{exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:  # (said only "'utf-8' codec can't decode ...")
            raise RepliesError(f"{str(path)!r} is not UTF-8 text: {exc}") from None
        where = str(path)
    replies: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            transcript, reply = item["transcript"], item["reply"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RepliesError(f"{where}:{number}: not a {{transcript, reply}} object") from exc
        if not isinstance(transcript, str) or not isinstance(reply, str) or not reply:
            raise RepliesError(f"{where}:{number}: transcript and reply must be strings")
        key = normalise(transcript)
        if key in replies:
            raise RepliesError(f"{where}:{number}: duplicate transcript {transcript!r}")
        replies[key] = reply
    if not replies:
        raise RepliesError(f"{where}: no replies")
    return replies


class ReplayLlm:
    """Streams scripted replies at a decode rate, in bursts.

    ``tokens_per_s`` times ``speed`` is the pace; ``0`` for either means unpaced (load
    tests): chunks follow each other with only a yield to the event loop, and ``LlmDone``
    reports no rate. ``chunk_tokens`` is the (min, max) number of tokens per chunk; chunk
    sizes come from a generator seeded by ``seed`` and the transcript, so a given transcript
    is always chunked the same way.

    Pacing keeps an absolute schedule (chunk *k* is due when its last token would have been
    decoded), so slow consumers do not accumulate drift. ``clock`` and ``sleep`` are
    injectable for tests; the defaults are ``time.monotonic`` and ``asyncio.sleep``.
    """

    name = "replay"

    def __init__(
        self,
        path: str | Path | None = None,
        tokens_per_s: float = 51.5,
        chunk_tokens: tuple[int, int] = (1, 8),
        seed: int = 0,
        speed: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        low, high = chunk_tokens
        if not 1 <= low <= high:
            raise ValueError(f"chunk_tokens must be 1 <= min <= max, got {chunk_tokens}")
        if tokens_per_s < 0 or speed < 0:
            raise ValueError("tokens_per_s and speed must be >= 0")
        self.replies = load_replies(path)
        self._choices = list(self.replies.values())
        self.rate = tokens_per_s * speed
        self.chunk_tokens = (low, high)
        self.seed = seed
        self._clock = clock
        self._sleep = sleep

    def reply_for(self, messages: list[dict[str, str]]) -> str:
        """The reply to the last user message: scripted if known, else a stable pick."""
        last = next(
            (m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), ""
        )
        key = normalise(last if isinstance(last, str) else "")
        reply = self.replies.get(key)
        if reply is not None:
            return reply
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return self._choices[int.from_bytes(digest, "big") % len(self._choices)]

    async def stream(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        """Yield the reply in paced chunks, then ``LlmDone``. Safe to cancel at any point."""
        reply = self.reply_for(request.messages)
        tokens = split_tokens(reply)
        finish_reason = "stop"
        if request.max_tokens is not None and len(tokens) > request.max_tokens:
            tokens = tokens[: request.max_tokens]
            finish_reason = "length"
        rng = random.Random(f"{self.seed}\0{reply}")
        low, high = self.chunk_tokens
        start = self._clock()
        sent = 0
        while sent < len(tokens):
            size = rng.randint(low, high)
            piece = tokens[sent : sent + size]
            sent += len(piece)
            if self.rate > 0:
                delay = start + sent / self.rate - self._clock()
                await self._sleep(max(0.0, delay))
            else:
                await asyncio.sleep(0)
            yield LlmDelta("".join(piece))
        usage: dict[str, float | int] = {
            "prompt_tokens": sum(
                len(split_tokens(str(m.get("content", "")))) for m in request.messages
            ),
            "completion_tokens": len(tokens),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if self.rate > 0:
            usage["generation_tokens_per_second"] = self.rate
        yield LlmDone(
            finish_reason=finish_reason,
            tokens_per_s=self.rate if self.rate > 0 else None,
            usage=usage,
        )

    async def aclose(self) -> None:
        """Nothing to release; present for the ``LlmBackend`` interface."""
