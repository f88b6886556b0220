"""Pacing over a slow mobile link: underruns and time to first audio behind a proxy that
adds one-way latency and caps the downlink.

    python bench/slow_link.py [--turns 2] [--links 0/0 100/0 300/80 500/70 ...]

The gateway (replay LLM, espeak, default pacing: ``max_lead_ms`` 1000, marks as
protocol.md asks) runs in this process. A child process runs, per link setting, an asyncio
TCP proxy on 127.0.0.1 and one client behind it; all settings run at once, one session each.

* The proxy delays every byte by the one-way latency each way and, downstream, serializes
  bytes at the cap (1,460-byte packets, an unbounded queue before the bottleneck, as a
  mobile network's buffer is): a link given as ``LAT/KBPS`` (ms / KB per second, 0: none).
* The client plays in real time by its wall clock (a frame that arrives after it ran dry
  restarts playback on arrival: one underrun, as the gateway counts them), sends a
  ``playback`` mark every 250 ms while it plays (also after ``turn.done``, until played
  out), and counts its own underruns and its time to first audio (transcript sent → first
  frame received).

Baselines, same run: the ``0/0`` link (no latency, no cap), and every link once more with
the pacer's earlier mark model (``--models``: ``fresh``, each mark taken as if the client
had just played it, as before this bench; ``aged``: the pacer as it is). The audio is 48 KB/s of PCM
plus framing (12-byte header + WebSocket header per 40 ms frame): a cap below ~49 KB/s is a
link slower than the audio, where underruns are the link's, not the pacer's.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import load_config  # noqa: E402
from gateway.core.pacer import Pacer  # noqa: E402
from gateway.io.server import Gateway  # noqa: E402

TRANSCRIPT = "Read me the trip notes."
REPLY = ("The train leaves Lyon at 7:42 in the morning and reaches Turin just after noon. "
         "From the station, the hotel is a ten minute walk along Via Roma, past the market. "
         "Check-in opens at two, but they will hold your bags if you arrive early. "
         "On Thursday the museum is closed, so plan the river walk for that afternoon. "
         "Dinner is booked for eight at the small place behind the cathedral.")
PACKET = 1460
MARK_EVERY_S = 0.25
BYTES_PER_MS = 48


class Link:
    """One direction of the emulated link: latency, and a rate cap (bytes/s, 0: none)."""

    def __init__(self, writer: asyncio.StreamWriter, latency_s: float, rate: float) -> None:
        self.writer, self.latency_s, self.rate = writer, latency_s, rate
        self.free_at = 0.0  # when the bottleneck has sent everything queued
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    def push(self, data: bytes) -> None:
        now = time.monotonic()
        for i in range(0, len(data), PACKET):
            piece = data[i:i + PACKET]
            if self.rate:
                self.free_at = max(self.free_at, now) + len(piece) / self.rate
                out = self.free_at
            else:
                out = now
            self.queue.put_nowait((out + self.latency_s, piece))

    async def run(self) -> None:
        while (item := await self.queue.get()) is not None:
            due, piece = item
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.writer.write(piece)
        self.writer.close()


async def _pipe(reader: asyncio.StreamReader, link: Link) -> None:
    while data := await reader.read(65536):
        link.push(data)
    link.queue.put_nowait(None)


async def start_proxy(upstream_port: int, latency_ms: float, kbps: float) -> asyncio.Server:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        g_reader, g_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        up = Link(g_writer, latency_ms / 1000, 0)
        down = Link(c_writer, latency_ms / 1000, kbps * 1000)
        async with asyncio.TaskGroup() as tg:
            for task in (_pipe(c_reader, up), _pipe(g_reader, down), up.run(), down.run()):
                tg.create_task(task)

    return await asyncio.start_server(handle, "127.0.0.1", 0)


class Player:
    """Plays frames back to back by the wall clock; counts underruns like the gateway."""

    def __init__(self) -> None:
        self.end: float | None = None
        self.fed_ms = 0.0
        self.underruns = 0

    def feed(self, ms: float, now: float) -> None:
        if self.end is not None and self.end < now:
            self.underruns += 1
        self.end = (now if self.end is None else max(self.end, now)) + ms / 1000
        self.fed_ms += ms

    def played_ms(self, now: float) -> float:
        if self.end is None:
            return 0.0
        return self.fed_ms - max(0.0, self.end - now) * 1000


class TurnState:
    def __init__(self) -> None:
        self.player = Player()
        self.turn_id: int | None = None
        self.done: dict | None = None


async def _marks(ws, turn: TurnState) -> None:
    """A ``playback`` mark every 250 ms once audio plays, until it has all been played."""
    while True:
        await asyncio.sleep(MARK_EVERY_S)
        now, player = time.monotonic(), turn.player
        if turn.turn_id is not None and player.end is not None:
            await ws.send(orjson.dumps({"type": "playback", "turn_id": turn.turn_id,
                                        "played_ms": round(player.played_ms(now))}).decode())
            if turn.done is not None and player.end <= now:
                return


async def client(port: int, turns: int) -> list[dict]:
    from websockets.asyncio.client import connect

    rows = []
    async with connect(f"ws://127.0.0.1:{port}/v1/voice", compression=None,
                       max_size=None) as ws:
        await ws.recv()  # session.created
        for _ in range(turns):
            turn = TurnState()
            sent_at = time.monotonic()
            first_audio = None
            await ws.send(orjson.dumps({"type": "transcript", "text": TRANSCRIPT}).decode())
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_marks(ws, turn))
                while turn.done is None:
                    msg = await ws.recv()
                    now = time.monotonic()
                    if isinstance(msg, bytes):
                        if first_audio is None:
                            first_audio = now - sent_at
                        turn.player.feed((len(msg) - 12) / BYTES_PER_MS, now)
                        continue
                    event = orjson.loads(msg)
                    if event["type"] == "turn.started":
                        turn.turn_id = event["turn_id"]
                    elif event["type"] == "turn.done":
                        turn.done = event
            m = turn.done["metrics"]
            rows.append({"client_underruns": turn.player.underruns,
                         "server_underruns": m["underruns"],
                         "client_ttfa_ms": None if first_audio is None else first_audio * 1000,
                         "server_ttfa_ms": m["ttfa_ms"], "audio_ms": m["audio_ms"]})
    return rows


async def _one_link(port: int, link: str, turns: int) -> tuple[str, list[dict]]:
    latency, kbps = (float(x) for x in link.split("/"))
    proxy = await start_proxy(port, latency, kbps)
    try:
        return link, await client(proxy.sockets[0].getsockname()[1], turns)
    finally:
        proxy.close()


def _clients_main(port: int, links: list[str], turns: int, queue) -> None:
    async def go() -> dict:
        results = await asyncio.gather(*(_one_link(port, link, turns) for link in links))
        return dict(results)

    queue.put(asyncio.run(go()))


def _fresh_mark(self: Pacer, played_ms: float, now: float) -> None:
    """The earlier model: a mark replaced the estimate as if the client had just played it."""
    played_ms = min(played_ms, self.sent_ms)
    self.played_ms = played_ms if self.played_ms is None else max(self.played_ms, played_ms)
    self.play_end = now + (self.sent_ms - self.played_ms) / 1000.0


async def run(links: list[str], turns: int, tmp: Path) -> dict:
    replies = tmp / "slow-link-replies.jsonl"
    replies.write_text(orjson.dumps({"transcript": TRANSCRIPT, "reply": REPLY}).decode() + "\n")
    config = load_config(server={"port": 0}, tts={"engine": "espeak"},
                         llm={"tokens_per_s": 400, "replies": str(replies)})
    gateway = Gateway(config)
    await gateway.start()
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()
    proc = ctx.Process(target=_clients_main, args=(gateway.port, links, turns, queue))
    proc.start()
    loop = asyncio.get_running_loop()
    results = await loop.run_in_executor(None, queue.get)
    await loop.run_in_executor(None, proc.join)
    await gateway.aclose()
    return results


def _table(results: dict, model: str) -> str:
    lines = ["| marks | link (one-way ms / KB/s) | turns | underruns client | underruns server "
             "| TTFA client ms | TTFA server ms |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for link, rows in results.items():
        lat, kbps = link.split("/")
        name = f"{lat} ms / {'no cap' if float(kbps) == 0 else kbps}"
        cu = "/".join(str(r["client_underruns"]) for r in rows)
        su = "/".join(str(r["server_underruns"]) for r in rows)
        ct = "/".join(f"{r['client_ttfa_ms']:.0f}" for r in rows if r["client_ttfa_ms"])
        st = "/".join(f"{r['server_ttfa_ms']:.0f}" for r in rows if r["server_ttfa_ms"])
        lines.append(f"| {model} | {name} | {len(rows)} | {cu} | {su} | {ct} | {st} |")
    audio = {r["audio_ms"] for rows in results.values() for r in rows}
    lines.append(f"\naudio per turn: {sorted(audio)} ms; per cell: each turn in order")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--links", nargs="+", default=[
        "0/0", "0/45", "0/60", "0/70", "100/0", "100/80", "300/0", "300/80", "300/120",
        "500/0", "500/70", "500/120", "800/70"])
    parser.add_argument("--models", nargs="+", choices=["fresh", "aged"],
                        default=["fresh", "aged"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    links = args.links if args.links[0] == "0/0" else ["0/0", *args.links]
    out = {}
    aged = Pacer.mark
    for model in args.models:
        Pacer.mark = _fresh_mark if model == "fresh" else aged  # type: ignore[method-assign]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                out[model] = asyncio.run(run(links, args.turns, Path(tmp)))
        finally:
            Pacer.mark = aged  # type: ignore[method-assign]
        print(_table(out[model], model), flush=True)
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
