"""The real gateway on 127.0.0.1:0, a real websockets client, the replay LLM and espeak.

Steps are ordered by awaiting events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging

import httpx
import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.config import load_config
from gateway.core.codec import BYTES_PER_MS, MAX_MESSAGE_BYTES, MAX_TEXT_CHARS
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S, hang_guard
from tests.wsclient import LineSeen, read_turn, read_until_closed, recv_event, round_trip, send

REPLY = ("Hosting came to $184.50 last month. That's about 12% more than October, "
         "mostly from extra bandwidth.")


@pytest.fixture
def replies(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(orjson.dumps({"transcript": "How much did we spend on hosting?",
                                  "reply": REPLY}).decode() + "\n")
    return str(path)


@pytest.fixture
async def gateway(start_gateway):
    return await start_gateway([{"transcript": "How much did we spend on hosting?",
                                 "reply": REPLY}])


def url(gw: Gateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/voice"


def check_frames(result, first_seq: int | None = None) -> None:
    """Gapless seq, flags consistent with sentence events, audio not silent."""
    seqs = [f.seq for f in result.frames]
    start = seqs[0] if first_seq is None else first_seq
    assert seqs == list(range(start, start + len(seqs)))
    assert all(f.turn_id == result.turn_id for f in result.frames)
    assert result.frames[-1].turn_end and result.frames[-1].sentence_end
    assert sum(f.turn_end for f in result.frames) == 1
    ends = [f.sentence for f in result.frames if f.sentence_end]
    assert ends == [e["index"] for e in result.of("sentence.done")]
    audio = result.audio.astype(np.float64)
    assert np.sqrt(np.mean(audio**2)) > 300  # speech, not silence
    assert result.done["metrics"]["audio_ms"] == pytest.approx(result.audio_ms, abs=1)
    per_sentence = {e["index"]: e["audio_ms"] for e in result.of("sentence.done")}
    for index, ms in per_sentence.items():
        got = sum(len(f.pcm) for f in result.frames if f.sentence == index) / BYTES_PER_MS
        assert ms == pytest.approx(got, abs=1)


def leads_sent(gw: Gateway) -> list[float]:
    """From now on, after each send of the gateway's only session: the lead (ms) its pacer
    holds the listener to (audio sent and not yet played, on the gateway's clock). The
    client's clock cannot say it: a client late to read its first frame (its loop held
    0.4 s, a refill's time) reads that frame and the refill at once, and counts as lead
    what the gateway sent while it was away."""
    (runner,) = gw.runners.values()
    session, leads = runner.session, []

    def sending(item, send=runner.send) -> None:
        send(item)
        if session.turn is not None:
            leads.append(session.turn.pacer.lead_ms(runner.now()))

    runner.send, runner.send_all = sending, functools.partial(sending, send=runner.send_all)
    return leads


async def test_session_created_then_full_turn_through_replay_and_espeak(gateway):
    async with connect(url(gateway)) as ws:
        created = await recv_event(ws)
        assert created["type"] == "session.created"
        assert created["protocol"] == 1
        assert created["audio"] == {"format": "pcm16", "sample_rate": 24000, "frame_ms": 40}
        # the voice null stands for, so a client can show it (espeak's own default here)
        assert created["session"]["voice"] is None and created["default_voice"] == "en-us"
        leads = leads_sent(gateway)
        await send(ws, type="transcript", text="How much did we spend on hosting?")
        result = await read_turn(ws)
    assert result.reply == REPLY
    sentences = result.of("sentence")
    assert [s["text"] for s in sentences][-1].endswith("bandwidth.")
    assert "".join(s["text"] for s in sentences).replace(" ", "") == REPLY.replace(" ", "")
    for s in sentences:
        assert REPLY.find(s["text"]) >= 0 and s["engine"] == "espeak"
    assert result.done["status"] == "completed"
    m = result.done["metrics"]
    assert 0 <= m["ttft_ms"] <= m["first_sentence_ms"] <= m["ttfa_ms"]
    assert m["engine"] == "espeak" and m["llm_tokens_per_s"] is not None
    check_frames(result, first_seq=0)
    assert {len(f.pcm) for f in result.frames[:-1] if not f.sentence_end} == {40 * BYTES_PER_MS}
    # paced: never more than max_lead_ms (1000) sent ahead of real-time playback
    assert leads and max(leads) <= 1000 + 1e-6


async def test_a_session_lead_above_the_servers_is_honoured(gateway):
    """protocol.md: a session may ask for up to 30 s of lead. The lane used to make audio
    at most the server's 1 s ahead whatever the session asked, so a watch relay asking for
    more got 1 s. Read with the gateway's own figures, at its own decisions: the lead the
    lane holds the turn to when it lets it wait (its deadline less when it becomes eligible
    again), and what the pacer has sent ahead of the listener after each send. The client's
    clock read it before: a client late to read its first frame counted the audio sent
    meanwhile as lead (over the 3 s: a failure with the gateway right), and the lane's 1 s
    showed only as a 20 s timeout (the timeout was the assertion)."""
    holds: list[float] = []  # the lead (s) the lane held the turn to, each time it waited
    held = asyncio.Event()
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        (runner,) = gateway.runners.values()
        session, scheduler = runner.session, gateway.lane.scheduler
        sent = leads_sent(gateway)

        class Watched(type(scheduler)):  # (slotted: its methods are read-only on it)
            __slots__ = ()

            def next_job(self, now: float):
                job = super().next_job(now)
                head = None if session.turn is None else self.head((session.id,
                                                                    session.turn.id))
                if job is None and head is not None and self.next_eligible_at is not None:
                    holds.append(runner.deadline(head, now) - self.next_eligible_at)
                    held.set()
                return job

        scheduler.__class__ = Watched
        await send(ws, type="session.update", session={"max_lead_ms": 3000})
        await recv_event(ws, "session.updated")
        await send(ws, type="say", text="This is a sentence that takes a while to say. " * 8)
        done = asyncio.ensure_future(recv_event(ws, "turn.done"))  # (reading as it comes)
        waited = asyncio.ensure_future(held.wait())
        await asyncio.wait([done, waited], return_when=asyncio.FIRST_COMPLETED)
        waited.cancel()
        # (only a machine making espeak's audio slower than real time never gets ahead)
        assert held.is_set(), "the turn ended and the lane never let it wait"
        await send(ws, type="cancel")  # the lane had made enough: it let the turn wait
        assert (await done)["status"] == "cancelled"
    assert holds[0] == pytest.approx(3.0)  # the session's lead, not the server's 1 s
    assert max(sent) >= 2500  # sent ahead by then: all but what the lane was making
    assert max(sent) <= 3000 + 1e-6


async def test_say_speaks_verbatim_without_llm(gateway):
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="Dr. Patel will call at 3 p.m. today.")
        result = await read_turn(ws)
    assert result.of("turn.started")[0]["source"] == "say"
    assert result.of("text.delta") == []
    assert result.done["status"] == "completed"
    check_frames(result, first_seq=0)


async def test_session_update_changes_frames_and_voice(gateway):
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.update", session={"frame_ms": 20, "voice": "en-gb"})
        updated = await recv_event(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["frame_ms"] == 20 and updated["session"]["voice"] == "en-gb"
        await send(ws, type="say", text="A short one.")
        result = await read_turn(ws)
    assert max(len(f.pcm) for f in result.frames) == 20 * BYTES_PER_MS


async def test_barge_in_by_cancel_and_by_new_transcript(gateway):
    long = "Here is a longer reply. " * 10
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=long)
        first = await read_turn(ws, until="sentence")  # audio is about to flow
        await send(ws, type="cancel", turn_id=first.turn_id)
        first_rest = await read_turn(ws, first.turn_id)
        assert first_rest.done["status"] == "cancelled"
        # a new transcript mid-turn cancels that turn and starts the next
        await send(ws, type="say", text=long)
        second = await read_turn(ws, until="sentence")
        await send(ws, type="transcript", text="How much did we spend on hosting?")
        second_rest = await read_turn(ws, second.turn_id)
        assert second_rest.done["status"] == "cancelled"
        third = await read_turn(ws)
        assert third.turn_id == second.turn_id + 1
        assert third.done["status"] == "completed"
    # no frame of a turn after its turn.done; seq gapless across the three turns
    assert all(f.turn_id == third.turn_id for f in third.frames)
    frames = first.frames + first_rest.frames + second.frames + second_rest.frames + third.frames
    assert [f.seq for f in frames] == list(range(len(frames)))
    check_frames(third)


async def test_bad_input_gets_error_and_session_stays_usable(gateway):
    cases = [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_message"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"type": "transcript"}', "missing_field"),
        ('{"type": "transcript", "text": 5}', "invalid_field"),
        ('{"type": "playback", "turn_id": 1, "played_ms": "x"}', "invalid_field"),
        ('{"type": "session.update", "session": {"frame_ms": 33}}', "invalid_field"),
        ('{"type": "session.update", "session": {"voice": "no-such-voice"}}', "unknown_voice"),
        (orjson.dumps({"type": "say", "text": "a" * (MAX_TEXT_CHARS + 1)}).decode(),
         "text_too_long"),
        (orjson.dumps({"type": "say", "text": "a" * MAX_MESSAGE_BYTES}).decode(),
         "message_too_large"),
        (b"\x00\x01binary", "binary_not_supported"),
    ]
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        for raw, code in cases:
            await ws.send(raw)
            error = await recv_event(ws)
            assert error["type"] == "error", raw
            assert error["error"]["code"] == code, raw
            assert error["error"]["message"]
        await send(ws, type="ping", id="still-there")
        assert await recv_event(ws) == {"type": "pong", "id": "still-there"}
        await send(ws, type="say", text="Still working.")
        result = await read_turn(ws)
        assert result.done["status"] == "completed"
    assert gateway.metrics.errors["invalid_json"] == 1


async def test_errors_to_messages_sent_at_once_are_matched_by_event_id(start_gateway):
    """protocol.md (Errors): a client that sends many messages without waiting matches each
    error to its message by ``event_id``, not by order: the refusals the codec, the session
    and the connection decide, and the turn's own failure, which comes after other answers.
    What the gateway could not read as an object has no ``event_id``; successes echo none."""
    gw = await start_gateway(server={"turns_per_minute": 1},
                             llm={"url": "http://127.0.0.1:9/v1"})  # (nothing listens)
    named = {
        "u0": ({"type": "session.update", "session": {"frame_ms": 20}}, None),
        "u1": ({"type": "session.update", "session": {"voice": "klingon"}}, "unknown_voice"),
        "u2": ({"type": "session.update", "session": {"frame_ms": 33}}, "invalid_field"),
        "t1": ({"type": "transcript", "text": "hello?"}, "llm_unavailable"),  # its turn's
        "t2": ({"type": "transcript", "text": "again?"}, "rate_limited"),
        "c1": ({"type": "cancel", "turn_id": -1}, "invalid_field"),
        "m1": ({"type": "playback", "turn_id": 1}, "missing_field"),
        "x1": ({}, "invalid_message"),  # no type
        "x2": ({"type": "dance"}, "unknown_type"),
        "r1": ({"type": "session.resume", "session_id": "s", "resume_token": "t"},
               "invalid_message"),  # after a transcript: too late
        "s1": ({"type": "say", "text": "a" * (MAX_TEXT_CHARS + 1)}, "text_too_long"),
        "p1": ({"type": "ping", "id": 1}, None),
    }
    unnamed = [  # (an event_id in each, none readable)
        ('{"event_id":"n1","type":"ping"', "invalid_json"),
        ('[{"event_id":"n2","type":"ping"}]', "invalid_message"),
        (b'{"event_id":"n3","type":"ping"}', "binary_not_supported"),
        (orjson.dumps({"event_id": "n4", "type": "say", "text": "a" * MAX_MESSAGE_BYTES})
         .decode(), "message_too_large"),
        ('{"event_id":5,"type":"ping","id":2}', "invalid_field"),
        (orjson.dumps({"event_id": "n" * 65, "type": "say", "text": "hi"}).decode(),
         "invalid_field"),
    ]
    async with connect(url(gw), max_size=None) as ws:
        await recv_event(ws, "session.created")
        for event_id, (message, _code) in named.items():
            await send(ws, **message, event_id=event_id)
        for raw, _code in unnamed:
            await ws.send(raw)
        await send(ws, type="ping", id="end")
        errors, answers, turn_done = [], [], None
        while turn_done is None or {"type": "pong", "id": "end"} not in answers:
            event = await recv_event(ws)
            if event["type"] == "error":
                errors.append(event)
            else:
                answers.append(event)
            if event["type"] == "turn.done":
                turn_done = event
    by_id = {}
    for error in errors:
        if "event_id" in error["error"]:
            assert error["error"]["event_id"] not in by_id, error  # one answer each
            by_id[error["error"]["event_id"]] = error
    assert {k: e["error"]["code"] for k, e in by_id.items()} == {
        k: code for k, (_m, code) in named.items() if code is not None}
    assert by_id["t1"]["turn_id"] == turn_done["turn_id"] and turn_done["status"] == "failed"
    assert all("turn_id" not in e for k, e in by_id.items() if k != "t1")
    assert sorted(e["error"]["code"] for e in errors if "event_id" not in e["error"]) == \
        sorted(code for _raw, code in unnamed)
    assert [a for a in answers if "event_id" in orjson.dumps(a).decode()] == []
    assert sorted(a["type"] for a in answers) == [  # (the turn may end before a pong)
        "pong", "pong", "session.updated", "turn.done", "turn.started"]


async def test_llm_down_fails_the_turn_with_a_clear_error(replies):
    config = load_config(server={"port": 0}, llm={"url": "http://127.0.0.1:9/v1"})
    gw = Gateway(config)
    await gw.start()
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="hello?")
            result = await read_turn(ws)
    finally:
        await gw.aclose()
    (error,) = result.of("error")
    assert error["error"]["code"] == "llm_unavailable" and error["turn_id"] == result.turn_id
    assert result.done["status"] == "failed"
    assert result.frames == []


async def test_health_on_the_voice_port_follows_sessions(gateway):
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        health = (await client.get(f"{base}/health")).json()
        assert health["status"] == "ok" and health["sessions"] == 0
        assert health["engine"]["name"] == "espeak" and health["engine"]["loaded"]
        async with connect(url(gateway)) as ws:
            await recv_event(ws, "session.created")
            health = (await client.get(f"{base}/health")).json()
            assert health["sessions"] == 1
        assert (await client.get(f"{base}/nope")).status_code == 404


async def test_shutdown_ends_the_turn_then_closes_sessions_with_1001(replies):
    # the client is told its turn ended and why (turn.done is the authority; a close code
    # alone left it waiting for one), then the socket closes
    config = load_config(server={"port": 0}, llm={"replies": replies})
    gw = Gateway(config)
    await gw.start()
    async with connect(url(gw)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="Here is a longer reply. " * 10)
        turn_id = (await recv_event(ws, "sentence"))["turn_id"]
        closing = asyncio.create_task(gw.aclose())
        events = []
        with pytest.raises(ConnectionClosed) as info:
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    events.append(json.loads(message))
        assert (info.value.rcvd.code, info.value.rcvd.reason) == (1001, "server shutting down")
        assert events[-2:] == [
            {"type": "error", "turn_id": turn_id, "error": {
                "code": "shutting_down", "message": "the gateway is shutting down"}},
            {"type": "turn.done", "turn_id": turn_id, "status": "failed",
             "metrics": events[-1]["metrics"]}]
        await closing
    assert gw.lane.queue_depth == 0
    assert gw.connections == set()


async def test_a_mark_re_ranks_its_turn_only_when_audio_is_needed_sooner(gateway, monkeypatch):
    # A playback mark moves the listener's deadline. Earlier (the client played more than the
    # server thought): the lane must re-rank the turn now. Later: the scheduler re-checks a
    # key that is too early by itself, and waking the lane at every mark costs CPU.
    from gateway.core.codec import decode_frame

    touched = []
    real_touch = gateway.lane.touch
    monkeypatch.setattr(gateway.lane, "touch",
                        lambda owner: (touched.append(owner), real_touch(owner)))
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
        created = await recv_event(ws, "session.created")
        await send(ws, type="say", text="A sentence to speak. " * 12)
        received_ms, turn_id = 0.0, None
        while received_ms < 600:
            message = await ws.recv()
            if isinstance(message, bytes):
                frame = decode_frame(message)
                turn_id, received_ms = frame.turn_id, received_ms + len(frame.pcm) / BYTES_PER_MS

        async def mark(played_ms: float) -> None:
            await send(ws, type="playback", turn_id=turn_id, played_ms=played_ms)
            await round_trip(ws, played_ms)

        await mark(0.0)  # nothing played yet: the listener needs audio later than estimated
        assert touched == []
        await mark(received_ms)  # all of it played: it needs audio now
        assert touched == [(created["session_id"], turn_id)]
        await send(ws, type="cancel")


async def test_a_failing_llm_is_told_to_the_operator_once_and_health_says_degraded(
        scripted_llm_server, caplog):
    """A dead or broken LLM used to fail every turn without a log line while /health said
    ok. Now the first failure is a WARNING, the health is degraded with the reason, and
    three whole replies in a row are an INFO; nothing in between, even when the LLM fails
    every other turn (it flipped the health and the log on each turn)."""
    from tests.servers import Status, reply_script

    back = reply_script(["Back now."])
    scripted_llm_server.script([Status(500)], [Status(500)], back, [Status(429)], back, back,
                               back)
    gw = Gateway(load_config(server={"port": 0}, llm={"url": scripted_llm_server.url}))
    await gw.start()
    caplog.set_level("INFO", logger="gateway")
    statuses, healths = [], []
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            for _ in range(7):
                await send(ws, type="transcript", text="hello?")
                statuses.append((await read_turn(ws)).done["status"])
                healths.append(gw.health())
    finally:
        await gw.aclose()
    assert statuses == ["failed", "failed", "completed", "failed"] + ["completed"] * 3
    assert [h["status"] for h in healths] == ["degraded"] * 6 + ["ok"]
    failing = healths[5]["llm"]["failing"]
    assert (failing["turns"], failing["answered"], failing["in_a_row"]) == (3, 3, 2)
    assert failing["code"] == "llm_failed" and "429" in failing["message"]
    assert healths[6]["llm"]["failing"] is None
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "LLM" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert said[1][1].startswith("the LLM answers again: 3 turn(s) failed, 4 came whole, "
                                 "since ")


async def test_the_drop_line_says_how_the_socket_ended(gateway, caplog):
    """An operator reading "socket dropped" could not tell a network drop from a client
    that sent a frame over 1 MiB (1009) or broken UTF-8 (1007)."""
    caplog.set_level("INFO", logger="gateway.io.connection")
    line = LineSeen("socket dropped")
    logging.getLogger("gateway.io.connection").addHandler(line)
    try:
        async with connect(url(gateway)) as ws:
            created = await recv_event(ws, "session.created")
            await send(ws, type="say", text="Hello.")
            await ws.send("x" * (1024 * 1024 + 1))
            await read_until_closed(ws)
        async with hang_guard("the socket-dropped line"):
            await line.seen.wait()
    finally:
        logging.getLogger("gateway.io.connection").removeHandler(line)
    (message,) = [r.getMessage() for r in caplog.records if "socket dropped" in r.getMessage()]
    assert message.startswith(f"session {created['session_id']}: socket dropped "
                              "(sent 1009 (message too big)")


async def test_a_client_closing_while_it_no_longer_reads_ends_its_session_at_once(
        gateway, caplog, monkeypatch):
    """A client that stopped reading (python websockets stops past its queue) and closes
    cannot take the close reply queued behind its audio; websockets reported the close only
    when the TCP connection ended, after the client's close timeout, and until then the
    session went on. Now the client's close frame ends it. Here nothing else could: no
    close timeout, keepalive or abort grace on either side ends the TCP connection, so
    the session must end while that is open, and not as a slow consumer. (A 30 s bound
    on the wait was the assertion: a starved machine could fail it.)"""
    from gateway.io import connection

    monkeypatch.setattr(connection, "CLOSED_TCP_GRACE_S", 3600.0)
    caplog.set_level("INFO", logger="gateway.io.connection")
    ws = await connect(url(gateway), max_queue=1, close_timeout=None, ping_interval=None)
    created = await recv_event(ws, "session.created")
    (server_side,) = [c.ws for c in gateway.connections]
    server_side.close_timeout = None  # (its close waits for the client's end for ever)
    ended = LineSeen(f"session {created['session_id']} ended")
    logging.getLogger("gateway.io.connection").addHandler(ended)
    await send(ws, type="session.update", session={"max_lead_ms": 30_000})
    await recv_event(ws, "session.updated")
    await send(ws, type="say", text="A long reply goes on. " * 60)
    while not isinstance(await ws.recv(), bytes):
        pass  # audio flows; from now on the client reads nothing
    closing = asyncio.create_task(ws.close())
    try:
        async with hang_guard("the session's end after the client's close frame"):
            await ended.seen.wait()
        assert not server_side.transport.is_closing() and not closing.done()
    finally:
        logging.getLogger("gateway.io.connection").removeHandler(ended)
        ws.transport.abort()
        await closing
    assert gateway.metrics.errors["slow_consumer"] == 0
    (line,) = [r.getMessage() for r in caplog.records if ended.text in r.getMessage()]
    assert line == f"session {created['session_id']} ended: the client closed its socket"
    async with hang_guard("the socket's handler ending after the TCP connection"):
        await gateway.wait_no_sessions()


async def test_a_client_flooding_messages_is_closed(gateway, monkeypatch):
    # One client sending pings as fast as it could (145,000 a second from one process)
    # had them all answered: the event loop that paces every session spent its time on
    # them (loop lag 0.2-0.7 s). Past a burst, messages are allowed at a steady rate; a
    # client beyond it is closed with 1008. (Small figures here, so no clock matters.)
    from gateway.io import connection

    monkeypatch.setattr(connection, "MESSAGE_BURST", 50, raising=False)
    monkeypatch.setattr(connection, "MESSAGES_PER_S", 0.0, raising=False)  # (no refill)
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        pongs = 0
        with pytest.raises(ConnectionClosed):  # (a send may already meet the close)
            for i in range(2000):
                await send(ws, type="ping", id=i)
            await send(ws, type="ping", id="last")
            while (await recv_event(ws))["id"] != "last":
                pongs += 1
    assert ws.close_code == 1008 and ws.close_reason == "too many messages"
    assert pongs <= 50
    assert gateway.metrics.errors["too_many_messages"] == 1
    await gateway.wait_no_sessions()  # the session ended with its socket


async def test_a_burst_within_the_allowance_is_answered(gateway):
    # (a client's playback marks every 200 ms, its pings and a resume's burst are far below)
    from gateway.io.connection import MESSAGE_BURST

    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        for i in range(MESSAGE_BURST - 1):
            await send(ws, type="ping", id=i)
        for i in range(MESSAGE_BURST - 1):
            assert (await recv_event(ws)) == {"type": "pong", "id": i}


async def test_an_idle_socket_keeps_no_writer_task(gateway):
    """Between outputs the gateway holds no task of its own per socket: only websockets'
    two (the connection's handler and its keepalive pings). A writer task parked for
    output held ~14 of an idle session's ~100 objects, which every full garbage collection
    walks (bench/gc_pause.py). Output still flows: each socket then speaks a turn."""
    before = gateway.health()["loop"]["tasks"]
    sockets = 3
    async with contextlib.AsyncExitStack() as stack:
        # (the client's own keepalive off: only the gateway's tasks are counted)
        clients = [await stack.enter_async_context(connect(url(gateway), ping_interval=None))
                   for _ in range(sockets)]
        for i, ws in enumerate(clients):
            assert (await recv_event(ws))["type"] == "session.created"
            await round_trip(ws, i)
        assert gateway.health()["loop"]["tasks"] - before == 2 * sockets
        for ws in clients:
            await send(ws, type="say", text="Still speaking after an idle spell.")
        for ws in clients:
            check_frames(await read_turn(ws))
