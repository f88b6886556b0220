"""An OpenAI-compatible streaming LLM server that sometimes cuts a reply: for bench/soak.py
``--faults``, which kills it (SIGKILL) and starts it again on the same port.

    python bench/fault_llm.py [--port 0] [--replies FILE] [--cut-rate 0.03] [--seed 1]

Prints ``PORT <n>`` once it serves ``/v1/chat/completions`` and ``/v1/models``. It is
``tests.servers.ScriptedLlmServer`` (the tests' double, real uvicorn on 127.0.0.1) with a
script chosen per request: the reply the replay LLM (``engines.llm_replay``) gives the
request's last user message, in chunks of 1-8 word pieces at ``--tokens-per-s`` (oMLX's
51.5 by default), then ``finish_reason`` ``stop``, usage and ``[DONE]``. With the chance
``--cut-rate`` a reply breaks off after a random number of its chunks: the connection is
aborted mid-body, before any ``finish_reason`` (the gateway's ``llm_failed``). SIGUSR1 sets
the cut rate to 0 (the soak's recovery check); SIGTERM stops it. It prints a line per reply
as it begins, ``reply`` or ``cut`` and the turn it is for (a count a SIGKILL does not lose):
the soak ends each transcript with `` #s<session>t<turn>``, which this server takes off
every message before it chooses the reply, and prints (``-`` for a message without one).
The port is bound with ``SO_REUSEADDR``, so that a server started again after a SIGKILL gets
it back while its old connections are in TIME_WAIT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.llm_replay import ReplayLlm, split_tokens  # noqa: E402
from tests.servers import Drop, Pause, ScriptedLlmServer, Text, reply_script  # noqa: E402

TAG = re.compile(r" #(s\d+t\d+)$")
"""bench/soak.py's name for a turn (session, turn), at the end of its transcript."""


def untagged(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """``messages`` without the soak's tags, and the tag of the last user message (the
    turn this request is for), if it has one."""
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    found = TAG.search(users[-1]) if users and isinstance(users[-1], str) else None
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and (tagged := TAG.search(content)):
            m = {**m, "content": content[: tagged.start()]}
        out.append(m)
    return out, found and found.group(1)


class FaultLlm:
    """Chooses each request's script (``ScriptedLlmServer.choose``)."""

    def __init__(self, replies: str | None, tokens_per_s: float, cut_rate: float,
                 seed: int) -> None:
        self.replay = ReplayLlm(replies)
        self.tokens_per_s = tokens_per_s
        self.cut_rate = cut_rate
        self.rng = random.Random(seed)

    def script(self, body: dict[str, Any] | None) -> list[Any]:
        messages, tag = untagged((body or {}).get("messages") or [])
        tokens = split_tokens(self.replay.reply_for(messages))
        chunks: list[str] = []
        while tokens:
            n = self.rng.randint(1, 8)
            chunks.append("".join(tokens[:n]))
            del tokens[:n]
        steps: list[Any] = []
        for chunk in chunks:
            if self.tokens_per_s:
                steps.append(Pause(len(split_tokens(chunk)) / self.tokens_per_s))
            steps.append(Text(chunk))
        steps += reply_script([], usage={"completion_tokens": len(chunks)})
        cut = self.rng.random() < self.cut_rate
        print(f"{'cut' if cut else 'reply'} {tag or '-'}", flush=True)
        if cut:  # after 0 .. all of its text chunks, before the finish_reason
            steps = [*steps[: 2 * self.rng.randint(0, len(chunks))], Drop()]
        return steps


async def main(args: argparse.Namespace) -> None:
    faults = FaultLlm(args.replies, args.tokens_per_s, args.cut_rate, args.seed)
    server = ScriptedLlmServer()
    server.choose = faults.script
    await server.start(port=args.port)  # (SO_REUSEADDR)
    # (a cut is an exception in the ASGI app, on purpose: not a traceback per cut; set
    # after the start, where uvicorn sets its loggers' levels)
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(faults, "cut_rate", 0.0))
    print(f"PORT {server.port}", flush=True)
    await stop.wait()
    await server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--replies", help="JSONL of {transcript, reply} (default: the shipped set)")
    p.add_argument("--tokens-per-s", type=float, default=51.5)
    p.add_argument("--cut-rate", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    import uvloop

    uvloop.run(main(a))
