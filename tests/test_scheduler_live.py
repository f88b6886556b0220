"""The lane policy on the real gateway: a long background HTTP speech request and a voice
turn share one synthetic-engine lane.

Under ``scheduler`` the voice turn's first audio comes at the next step boundary of the
background request; under ``fifo`` (the old sidecar) only after the whole request. Steps are
ordered by events: the SSE deltas and the WebSocket frames, logged in arrival order.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.server import Gateway
from tests.wsclient import recv_event, send

pytestmark = pytest.mark.slow  # the FIFO run waits for ~95 engine steps of 32 ms

# ~30 s of synthetic audio (14 chars/s) in sentences; ~95 steps of 320 ms audio each.
BACKGROUND = " ".join(
    f"Chapter {n} goes on about the weather, the harbour and the boats that came in late."
    for n in range(1, 6))
HUB = "Your next meeting starts in ten minutes."
MAX_BETWEEN = 8
"""Background deltas allowed between the say and the voice turn's first frame: the step in
flight plus deltas already on their way (the client shares the loop with the gateway)."""


async def start(policy: str) -> Gateway:
    # max_lead 30 s: the background request is never held back just in time, so only the
    # priority rule can let the voice turn in before it ends.
    config = load_config(server={"port": 0, "lane_policy": policy},
                         session={"max_lead_ms": 30_000})
    gw = Gateway(config, engine=SyntheticEngine(rtf=0.1, ttfa_ms=20, step_ms=320))
    await gw.start()
    return gw


@pytest.mark.parametrize("policy", ["scheduler", "fifo"])
async def test_voice_turn_preempts_a_long_background_request(policy: str) -> None:
    gw = await start(policy)
    log: list[str] = []  # "bg" per SSE delta, "bg-done", "say", "hub" (first frame)
    first_delta = asyncio.Event()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}",
                                  timeout=60) as http:
            assert (await recv_event(ws))["type"] == "session.created"

            async def background() -> None:
                async with http.stream("POST", "/v1/audio/speech", json={
                        "input": BACKGROUND, "stream_format": "sse"}) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        kind = orjson.loads(line[6:])["type"]
                        if kind == "speech.audio.delta":
                            log.append("bg")
                            first_delta.set()
                        else:
                            assert kind == "speech.audio.done"
                            log.append("bg-done")
                            return
                        if "hub" in log and policy == "scheduler":
                            return  # seen enough: leaving closes and cancels the request

            async def hub_turn() -> None:
                # read the whole turn, as a player does (an unread socket stalls the close)
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        if "hub" not in log:
                            log.append("hub")
                    elif orjson.loads(message)["type"] == "turn.done":
                        return

            bg = asyncio.create_task(background())
            await asyncio.wait_for(first_delta.wait(), 60)
            await send(ws, type="say", text=HUB)
            log.append("say")
            await asyncio.wait_for(hub_turn(), 60)
            await asyncio.wait_for(bg, 60)
    finally:
        await gw.aclose()

    say, hub = log.index("say"), log.index("hub")
    total = gw.engine.audio_seconds(BACKGROUND) / 0.32  # background steps, roughly
    if policy == "scheduler":
        assert "bg-done" not in log[:hub]
        assert log[say:hub].count("bg") <= MAX_BETWEEN < total / 4
    else:
        assert log.index("bg-done") < hub  # the whole generation went first
        assert log[say:hub].count("bg") > total / 2


async def test_the_lane_knows_while_an_llm_decodes(tmp_path) -> None:
    """Scheduler rule 3 paces background work while this gateway's LLM decodes on the GPU:
    the connection tells the lane when a reply's stream starts and ends (also on barge-in)."""
    long_reply = " ".join(f"Sentence number {n} of a long reply." for n in range(1, 30))
    replies = tmp_path / "replies.jsonl"
    replies.write_text("".join(orjson.dumps(r).decode() + "\n" for r in (
        {"transcript": "talk", "reply": long_reply}, {"transcript": "stop", "reply": "Fine."})))
    gw = Gateway(load_config(server={"port": 0},
                             llm={"replies": str(replies), "tokens_per_s": 40.0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="gpu"))
    await gw.start()
    assert gw.lane.scheduler.llm_decoding == 0
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="talk")
            while not isinstance(await ws.recv(), bytes):  # first audio: the reply still streams
                pass
            assert gw.lane.scheduler.llm_decoding == 1
            await send(ws, type="transcript", text="stop")  # barge-in cancels the first stream
            while True:
                message = await ws.recv()
                if isinstance(message, str) and orjson.loads(message)["type"] == "turn.done" \
                        and orjson.loads(message)["status"] == "completed":
                    break
    finally:
        await gw.aclose()  # every connection task has ended (their done callbacks ran)
    assert gw.lane.scheduler.llm_decoding == 0
