"""Auth, limits, slow consumers and resume after reconnect, on the real server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.config import load_config
from gateway.core import session as session_module
from gateway.io.server import Gateway
from tests.hang_guard import hang_guard, unless_hung
from tests.servers import Hang, Text
from tests.wsclient import (
    LineSeen,
    one_turn,
    read_turn,
    read_until_closed,
    recv_event,
    round_trip,
    send,
)

LONG = "Here is a longer reply for the test. " * 5


async def started(session=None, llm=None, **server) -> Gateway:
    gw = Gateway(load_config(server={"port": 0, **server}, tts={"engine": "espeak"},
                             llm={"tokens_per_s": 0, **(llm or {})}, session=session or {}))
    await gw.start()
    return gw


@pytest.fixture
async def gateway():
    gw = await started(resume_window_s=30.0)
    yield gw
    await gw.aclose()


async def no_sessions(gw: Gateway) -> None:
    """Server-side effects of a client's close are asynchronous to the client: wait for
    the gateway to say its sessions are gone."""
    await unless_hung(gw.wait_no_sessions())


async def _drop(ws) -> None:
    ws.transport.abort()  # no close handshake: the session waits for a resume
    await ws.wait_closed()


async def a_dropped_session(gw: Gateway) -> dict[str, Any]:
    """The ``session.created`` of a session whose socket dropped at once (``_drop``): it
    waits for a resume."""
    ws = await connect(url(gw))
    created = await recv_event(ws, "session.created")
    await _drop(ws)
    return created


async def stalling_client(gw: Gateway):
    """A client on a ``small_window_socket`` that will stop reading, and its
    ``session.created``. No keepalive of its own: only the gateway can end its connection
    (the client's 20 s ping timing out ended it after 40 s, and a test waited for that)."""
    stalled = await connect(url(gw), sock=small_window_socket(gw), max_queue=1,
                            ping_interval=None)
    return stalled, await recv_event(stalled, "session.created")


def noting_pause(server_side) -> asyncio.Event:
    """An event set when the gateway's side of a socket stops writing: its transport calls
    ``pause_writing`` at its high-water mark (the kernel's send buffer full)."""
    paused = asyncio.Event()
    pause_writing = server_side.pause_writing

    def note_pause() -> None:
        pause_writing()
        paused.set()

    server_side.pause_writing = note_pause
    return paused


def small_window_socket(gw: Gateway) -> socket.socket:
    """A socket to the gateway whose receive buffer holds 4 KiB: a client that stops
    reading shows at once, not after the kernel's megabytes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    return sock


def url(gw: Gateway, suffix: str = "") -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/voice{suffix}"


@contextlib.asynccontextmanager
async def reading_late(gw: Gateway, lead_ms: int,
                       say: str) -> AsyncIterator[tuple[ClientConnection, asyncio.Event]]:
    """A client on a ``small_window_socket`` that reads nothing yet, its session's
    ``max_lead_ms`` set to ``lead_ms``, that has asked for ``say``; and an event set when
    the turn's last frame is sent (all of it is out, none of it read)."""
    async with connect(url(gw), sock=small_window_socket(gw), max_queue=1) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.update", session={"max_lead_ms": lead_ms})
        await recv_event(ws, "session.updated")
        released = asyncio.Event()
        gw.metrics.listeners.append(lambda done: released.set())
        await send(ws, type="say", text=say)
        yield ws, released


async def test_tokens_are_checked_before_the_upgrade():
    gw = await started(tokens=("s3cret", "other"))
    try:
        for bad in ({}, {"additional_headers": {"Authorization": "Bearer nope"}}):
            with pytest.raises(InvalidStatus) as info:
                async with connect(url(gw), **bad):
                    pass
            assert info.value.response.status_code == 401
            # protocol.md names the code: a client tells a token to ask for from the rest
            assert json.loads(info.value.response.body)["error"]["code"] == "unauthorized"
        async with connect(url(gw), additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            assert (await recv_event(ws))["type"] == "session.created"
        async with connect(url(gw, "?token=other")) as ws:
            assert (await recv_event(ws))["type"] == "session.created"
        async with connect(url(gw), subprotocols=["voice.v1", "bearer.s3cret"]) as ws:
            assert ws.subprotocol == "voice.v1"
            assert (await recv_event(ws))["type"] == "session.created"
        # without voice.v1 the server picks nothing: never the token entry (its answer
        # header would carry the token back), never a name it does not speak
        for offered in (["bearer.s3cret"], ["bearer.s3cret", "chat"]):
            async with connect(url(gw), subprotocols=offered) as ws:
                assert ws.subprotocol is None
                assert "s3cret" not in str(ws.response.headers)
                assert (await recv_event(ws))["type"] == "session.created"
        assert gw.metrics.errors["unauthorized"] == 2
    finally:
        await gw.aclose()


async def test_public_bind_without_token_is_refused():
    gw = Gateway(load_config(server={"host": "0.0.0.0", "port": 0}))
    with pytest.raises(ValueError, match="without a token"):
        await gw.start()
    await gw.aclose()


@pytest.mark.parametrize(("limit", "said"), [(2, "more than 2 turns in a minute"),
                                             (1, "more than 1 turn in a minute")])
async def test_turns_per_minute_limit(limit, said):
    gw = await started(turns_per_minute=limit)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            for _ in range(limit):
                await send(ws, type="say", text="Quick.")
                await read_turn(ws)
            await send(ws, type="say", text="One too many.")
            error = await recv_event(ws)
            assert error["error"] == {"code": "rate_limited",
                                      "message": f"{said}; wait and retry"}
    finally:
        await gw.aclose()


async def test_a_refused_barge_in_leaves_the_turn_in_progress_playing():
    """protocol.md: a ``transcript`` or ``say`` cancels the turn in progress, but one the
    server refuses (an ``error`` without ``turn_id``: ``rate_limited``, ``text_too_long``)
    cancels nothing: a client that stopped its player on the user's barge-in must send a
    ``cancel`` of its own, or play the reply on."""
    gw = await started(turns_per_minute=1)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=LONG)
            first = await read_turn(ws, until="sentence")
            await send(ws, type="transcript", text="Stop.")
            await send(ws, type="say", text="x" * 4001)
            turn = await read_turn(ws, first.turn_id)
        refusals = turn.of("error")  # both answered while the turn went on
        assert [e["error"]["code"] for e in refusals] == ["rate_limited", "text_too_long"]
        assert all("turn_id" not in e for e in refusals)
        assert turn.events.index(refusals[-1]) < turn.events.index(turn.done)
        assert turn.done["status"] == "completed" and not turn.of("turn.started")
    finally:
        await gw.aclose()


async def test_resume_after_a_dropped_socket_replays_gaplessly(gateway):
    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    assert created["resume_token"] and created["resume_window_s"] == 30.0
    await send(ws, type="say", text=LONG)
    first = await read_turn(ws, until="sentence")
    while len(first.frames) < 5:
        message = await ws.recv()
        if isinstance(message, bytes):
            from gateway.core.codec import decode_frame

            first.frames.append(decode_frame(message))
    await _drop(ws)  # the phone goes into a tunnel: no close handshake
    last_seq = first.frames[-1].seq
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2)
        assert fresh["type"] == "session.created" and fresh["session_id"] != created["session_id"]
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=last_seq)
        resumed = await recv_event(ws2)
        assert resumed["type"] == "session.resumed"
        assert resumed["session_id"] == created["session_id"] and resumed["replayed"] > 0
        assert resumed["turn_id"] == first.turn_id  # its latest turn
        rest = await read_turn(ws2, first.turn_id)
        assert rest.done["status"] == "completed"
        # the session keeps working after the resume
        await send(ws2, type="say", text="Back again.")
        again = await read_turn(ws2)
    seqs = [f.seq for f in first.frames + rest.frames + again.frames]
    assert seqs == list(range(len(seqs)))  # nothing lost, nothing repeated
    assert rest.frames[-1].turn_end
    await no_sessions(gateway)  # the clean close ended the session
    # /metrics: two sockets, one session (the second socket's fresh one gave way)
    m = gateway.metrics
    assert (m.connections_opened, m.sessions_resumed) == (2, 1)


async def test_playback_marks_free_the_resume_buffer_and_resume_still_works(gateway):
    # A client that reports playback proves what it received: the server keeps only what
    # came after it, not the last 1 MiB, and a resume after that still loses nothing.
    from gateway.core.codec import BYTES_PER_MS, decode_frame

    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    runner = gateway.runners[created["session_id"]]
    await send(ws, type="say", text=LONG * 2)
    frames: list = []

    async def play(ws, until_ms: float | None = None) -> None:
        """Read frames, reporting playback with 200 ms in the buffer (no real-time wait:
        the marks pace the server), until ``until_ms`` of audio or the turn's end."""
        received_ms = sum(len(f.pcm) for f in frames) / BYTES_PER_MS
        while until_ms is None or received_ms < until_ms:
            message = await ws.recv()
            if isinstance(message, str):
                if '"turn.done"' in message:
                    return
                continue
            frames.append(decode_frame(message))
            received_ms += len(frames[-1].pcm) / BYTES_PER_MS
            if len(frames) % 5 == 0:
                await send(ws, type="playback", turn_id=frames[0].turn_id,
                           played_ms=received_ms - 200)

    await play(ws, until_ms=4000)
    frames += await round_trip(ws, "after-marks")
    # at most the 1 s lead, plus a run and the events, instead of all 4 s and more
    received = sum(len(f.pcm) for f in frames)
    assert runner.outbox.nbytes < 1500 * BYTES_PER_MS < received / 2
    assert runner.outbox.start > 0
    await _drop(ws)
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=frames[-1].seq)
        resumed = await recv_event(ws2)
        assert resumed["type"] == "session.resumed"
        before = len(frames)
        await play(ws2)
    assert frames[-1].turn_end and len(frames) > before
    seqs = [f.seq for f in frames]
    assert seqs == list(range(len(seqs)))  # nothing lost, nothing repeated
    await no_sessions(gateway)


async def frames_after(ws, n: int) -> list:
    """The next ``n`` frames (events skipped)."""
    from gateway.core.codec import decode_frame

    frames = []
    while len(frames) < n:
        if isinstance(message := await ws.recv(), bytes):
            frames.append(decode_frame(message))
    return frames


async def test_a_resume_replaying_lost_frames_fits_a_small_outbox_and_adds_no_lead():
    """Frames lost in flight are replayed; the held audio goes out only as far as the
    lead allows *with* the replay counted. Releasing a fresh full lead on top overflowed
    the smallest outbox (64 KiB: 400 ms replayed + 1 s > 64 KiB) and closed the session
    1013 right after accepting the resume."""
    from gateway.core.codec import BYTES_PER_MS, decode_frame

    gw = await started(outbox_bytes=64 * 1024, resume_window_s=30.0)
    try:
        ws = await connect(url(gw))
        created = await recv_event(ws, "session.created")
        await send(ws, type="say", text=LONG * 2)
        first = await read_turn(ws, until="sentence")
        while len(first.frames) < 20:
            if isinstance(message := await ws.recv(), bytes):
                first.frames.append(decode_frame(message))
        await _drop(ws)
        kept, lost = first.frames[:-10], first.frames[-10:]  # 400 ms never arrived
        runner = gw.runners[created["session_id"]]
        sent_before = runner.session.turn.pacer.sent_ms
        # The listener's lead after the resume, on the gateway's clock at each send: it ran
        # dry, so it plays from the resume on, the replay first, then what follows it
        leads: list[float] = []
        attach, send_one, send_all = runner.attach, runner.send, runner.send_all
        resumed_at: list[float] = []

        def attaching(*args: Any, **kwargs: Any) -> None:
            resumed_at.append(runner.now())
            attach(*args, **kwargs)

        def sending(item: Any, send: Any = send_one) -> None:
            send(item)
            if resumed_at and runner.session.turn is not None:
                released = runner.session.turn.pacer.sent_ms - sent_before
                leads.append(400 + released - (runner.now() - resumed_at[0]) * 1000)

        runner.attach, runner.send = attaching, sending
        runner.send_all = functools.partial(sending, send=send_all)
        loop = asyncio.get_running_loop()
        # the client stays away until its buffer ran out
        await asyncio.sleep(runner.session.turn.pacer.play_end - loop.time() + 0.05)
        async with connect(url(gw)) as ws2:
            await recv_event(ws2, "session.created")
            await send(ws2, type="session.resume", session_id=created["session_id"],
                       resume_token=created["resume_token"], last_seq=kept[-1].seq)
            resumed = await recv_event(ws2)
            assert resumed["type"] == "session.resumed", resumed
            rest = await frames_after(ws2, 40)
        # the lead is 1 s with the 400 ms replay in it, however long the resume took (read
        # with the client's clock from its resume to the answer, that time, longer on a slow
        # machine, was margin: a fresh full lead on top of the replay could pass)
        assert leads and max(leads) <= 1000 + 1e-6
        assert [f.seq for f in rest[:10]] == [f.seq for f in lost]
        seqs = [f.seq for f in kept + rest]
        assert seqs == list(range(len(seqs)))
        assert sum(len(f.pcm) for f in lost) == 400 * BYTES_PER_MS
    finally:
        await gw.aclose()


async def test_a_dropped_session_leaves_the_lane_until_it_resumes(gateway):
    """Nobody listens to a dropped session: it asks the lane for nothing (it used to be fed
    in real time for the whole resume window, ahead of live listeners), and a resume makes
    it due again."""
    import math

    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    await send(ws, type="session.update", session={"max_lead_ms": 300})
    await recv_event(ws, "session.updated")
    await send(ws, type="say", text=LONG)
    first = await read_turn(ws, until="sentence")
    runner = gateway.runners[created["session_id"]]
    detached = asyncio.Event()
    detach = runner.detach

    def on_detach(*args, **kw) -> None:
        detach(*args, **kw)
        detached.set()

    runner.detach = on_detach
    await _drop(ws)
    await unless_hung(detached.wait())
    loop = asyncio.get_running_loop()
    assert runner.session.deadline(first.turn_id, loop.time()) == math.inf
    scheduler = gateway.lane.scheduler
    assert scheduler.next_job(loop.time()) is None and scheduler.next_eligible_at is None
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        last = max((f.seq for f in first.frames), default=-1)
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=last)
        assert (await recv_event(ws2))["type"] == "session.resumed"
        rest = await unless_hung(frames_after(ws2, 30))  # more than was made before
    seqs = [f.seq for f in first.frames + rest]
    assert seqs == list(range(len(seqs)))


class Tunnel:
    """A TCP relay to the gateway that can go silent: from ``silence()`` on, bytes in both
    directions vanish and nothing is closed (a phone in a tunnel, a half-open connection;
    the gateway's writes still succeed)."""

    def __init__(self, port: int) -> None:
        self.port, self.silent = port, False
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def silence(self) -> None:
        self.silent = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not self.silent:
                    dst.write(data)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer),
                             return_exceptions=True)
        writer.close()
        up_writer.close()

    async def aclose(self) -> None:
        """Closes both ends of every connection, and waits for their handlers (3.11's
        ``Server.wait_closed`` waits for none: their sockets were left to the GC)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)


@pytest.mark.parametrize("marks", [True, False], ids=["marking", "not marking"])
async def test_a_listener_gone_silent_is_let_go_and_resumes_without_a_gap(
        gateway, monkeypatch, marks):
    """The network goes quiet without a close: the client's marks stop (or, from a client
    that sends none, anything at all) and its pong never comes. The gateway drops the socket
    after ``LISTENER_SILENT_S`` (``UNMARKED_SILENT_S``) + ``PROBE_TIMEOUT_S`` instead of the
    keepalive's 40 s, sending audio nobody got all that while (past the
    resume buffer for a long reply), and the resume then replays what was lost."""
    from gateway.core import session as core_session
    from gateway.core.codec import BYTES_PER_MS
    from gateway.io import connection

    monkeypatch.setattr(core_session, "LISTENER_SILENT_S", 0.5)
    monkeypatch.setattr(core_session, "UNMARKED_SILENT_S", 1.0)
    monkeypatch.setattr(connection, "PROBE_TIMEOUT_S", 1.0)
    tunnel = Tunnel(gateway.port)
    port = await tunnel.start()
    try:
        ws = await connect(f"ws://127.0.0.1:{port}/v1/voice")
        created = await recv_event(ws, "session.created")
        runner = gateway.runners[created["session_id"]]
        await send(ws, type="say", text=LONG)
        first = await read_turn(ws, until="sentence")
        first.frames += await frames_after(ws, 20)
        received = sum(len(f.pcm) for f in first.frames) / BYTES_PER_MS
        if marks:
            await send(ws, type="playback", turn_id=first.turn_id, played_ms=received - 200)
            # the mark is in before the tunnel goes quiet: the pong after it says so
            await send(ws, type="ping", id="after the mark")
            while not (isinstance(message := await ws.recv(), str)
                       and json.loads(message).get("id") == "after the mark"):
                pass
            assert runner.session.turn.marking
        tunnel.silence()
        # The gateway gives the socket up: its handler ends (~2 s; unbounded here, so that a
        # gateway that does not probe fails on the count below, after the keepalive's 40 s,
        # instead of on a timeout that was the assertion)
        while gateway.connections:
            gateway._live_changed.clear()
            await gateway._live_changed.wait()
        assert runner.connection is None
        assert gateway.metrics.listeners_lost == 1  # the probe let it go, not the keepalive
        # noticed ~38 s before the keepalive would have: a suspended app that marks has as
        # long to come back as one that does not, the keepalive's 40 s + the window, from
        # the last message the gateway heard (its own clock and figures, not the time this
        # test took to get here: a stall of ~7 s failed it)
        assert runner._expiry is not None
        heard_at = runner.session._heard_at
        assert runner._expiry.when() - heard_at >= \
            2 * connection.KEEPALIVE_PING_S + runner.resume_window_s - 1e-3
        ws.transport.abort()
        async with connect(url(gateway)) as ws2:
            await recv_event(ws2, "session.created")
            await send(ws2, type="session.resume", session_id=created["session_id"],
                       resume_token=created["resume_token"], last_seq=first.frames[-1].seq)
            assert (await recv_event(ws2))["type"] == "session.resumed"
            rest = await read_turn(ws2, first.turn_id)
        assert rest.done["status"] == "completed"
        seqs = [f.seq for f in first.frames + rest.frames]
        assert seqs == list(range(len(seqs)))  # nothing lost, nothing twice
    finally:
        await tunnel.aclose()


async def test_a_listener_that_marks_then_stops_but_answers_pings_is_kept(gateway, monkeypatch):
    """Marks are advice: a client that stops sending them but is there (it answers the
    ping) keeps its socket and gets the whole reply."""
    from gateway.core import session as core_session

    monkeypatch.setattr(core_session, "LISTENER_SILENT_S", 0.3)
    answered = []
    monkeypatch.setattr(core_session.Session, "listener_answered",
                        lambda self, now: answered.append(now) or [])
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=LONG)
        first = await read_turn(ws, until="sentence")
        await send(ws, type="playback", turn_id=first.turn_id, played_ms=0)
        rest = await read_turn(ws, first.turn_id)
    assert rest.done["status"] == "completed"
    assert answered and gateway.metrics.listeners_lost == 0


async def test_a_socket_taking_a_session_over_is_probed_though_nothing_was_replayed(
        scripted_llm_server, monkeypatch):
    """Socket A marks and then goes quiet while it should be playing: it is probed, and
    before any pong a resume on B takes the session over from A's last frame (nothing to
    replay: the LLM is still thinking). B went unprobed for good: the probe still counted
    as out (only a resume with frames replayed said otherwise), so a B gone half-open was
    noticed by the keepalive alone (40 s), past what the resume buffer holds."""
    from gateway.core import session as core_session
    from gateway.io import connection

    monkeypatch.setattr(core_session, "LISTENER_SILENT_S", 0.0)  # a mark, then quiet
    probed = []  # the sockets asked; none answers (no ping goes out)
    monkeypatch.setattr(connection.VoiceConnection, "probe",
                        lambda self, silent_s: probed.append(self))
    scripted_llm_server.script([Text("Here is the first sentence of the answer. "),
                                Text("And"), Hang()])
    gw = await started(session={"max_lead_ms": 30000}, llm={"url": scripted_llm_server.url})
    try:
        async with connect(url(gw)) as a:
            created = await recv_event(a, "session.created")
            await send(a, type="transcript", text="hi")
            first = await read_turn(a, until="sentence.done")  # all its audio, nothing more
            await send(a, type="playback", turn_id=first.turn_id, played_ms=0)
            await round_trip(a, "marked")
            assert len(probed) == 1
            async with connect(url(gw)) as b:
                await recv_event(b, "session.created")
                await send(b, type="session.resume", session_id=created["session_id"],
                           resume_token=created["resume_token"],
                           last_seq=first.frames[-1].seq)
                await recv_event(b, "session.resumed")
                await send(b, type="playback", turn_id=first.turn_id, played_ms=0)
                assert not await round_trip(b, "marked on B")
                assert len(probed) == 2 and probed[1] is not probed[0]
    finally:
        await gw.aclose()


async def test_a_turn_cut_short_by_its_session_closing_is_counted(gateway):
    # no turn.done can be sent, but /health and /metrics count every turn that ended
    before = gateway.metrics.turns["cancelled"]
    async with connect(url(gateway)) as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=LONG)
        await read_turn(ws, until="sentence")
    await no_sessions(gateway)
    assert gateway.metrics.turns["cancelled"] == before + 1


async def test_every_session_opened_in_the_log_ends_there_too(gateway, caplog):
    """README (Logs): an INFO line when a session opens, and one when it ends. A socket's
    own new session, given up for the session it resumed, was opened in the log and never
    ended: an operator pairing the two saw a session that lived forever."""
    import logging
    import re

    caplog.set_level(logging.INFO, logger="gateway.io.connection")
    created = await a_dropped_session(gateway)
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        assert (await recv_event(ws2))["type"] == "session.resumed"
    await no_sessions(gateway)
    lines = [r.getMessage() for r in caplog.records]
    opened = {m[1] for line in lines if (m := re.match(r"session (\S+) opened by ", line))}
    ended = {m[1] for line in lines if (m := re.match(r"session (\S+) ended: ", line))}
    assert opened == ended == {created["session_id"], fresh["session_id"]}, lines
    assert f"session {fresh['session_id']} ended: replaced by the session it resumed, " \
        f"{created['session_id']}" in lines


async def test_a_resume_without_last_seq_does_not_replay_the_old_session_created(gateway):
    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    await send(ws, type="say", text="One sentence.")
    await recv_event(ws, "turn.started")
    await _drop(ws)
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        assert (await recv_event(ws2))["type"] == "session.resumed"
        replay = await read_turn(ws2)
    assert [e["type"] for e in replay.events][0] == "turn.started"
    assert "session.created" not in [e["type"] for e in replay.events]
    assert replay.done["status"] == "completed"


async def test_a_resume_from_a_frame_never_sent_says_so(gateway):
    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    await send(ws, type="say", text="One sentence.")
    turn = await read_turn(ws)
    await _drop(ws)
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=10**6)
        error = (await recv_event(ws2, "error"))["error"]
    assert error == {"code": "resume_failed", "message": "cannot resume: frame 1000000 was "
                     f"never sent (the last one was {turn.frames[-1].seq}); continuing with "
                     f"the new session {fresh['session_id']}"}


async def _a_turn_played_and_dropped(gateway, text: str):
    """A session says ``text``, is told all of it was played (the mark frees the turn's
    messages from the resume buffer) and its socket drops: its ``session.created`` and
    the turn."""
    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    await send(ws, type="say", text=text)
    turn = await read_turn(ws)
    await send(ws, type="playback", turn_id=turn.done["turn_id"], played_ms=10**6)
    await send(ws, type="ping", id=1)
    await recv_event(ws, "pong")  # (the mark is in: it freed the turn's messages)
    await _drop(ws)
    return created, turn


async def test_a_resume_without_last_seq_past_a_freed_start_says_to_name_a_frame(gateway):
    """A client with no frame to name (another device taking the session over) resuming
    after a mark freed the start of the buffer was told "the frames after last_seq are no
    longer buffered", of a last_seq it never sent."""
    created, _ = await _a_turn_played_and_dropped(gateway, "One sentence.")
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        error = (await recv_event(ws2, "error"))["error"]
    assert error == {"code": "resume_failed", "message": "cannot resume: the session's "
                     "first messages are no longer buffered: name the last frame received "
                     "as last_seq; continuing with the new "
                     f"session {fresh['session_id']}"}


async def test_a_resume_from_a_frame_a_mark_freed_says_it_is_no_longer_buffered(gateway):
    """A client naming as last_seq a frame it was sent but whose turn a playback mark has
    freed since (a client that lost its place, another device holding an older seq) cannot
    be replayed to: it is told so (``resume_failed``) and keeps its new session, not
    replayed from a wrong place or called a frame never sent."""
    created, turn = await _a_turn_played_and_dropped(gateway,
                                                     "One sentence. And a second one.")
    assert len(turn.frames) > 2
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=turn.frames[0].seq)
        error = (await recv_event(ws2, "error"))["error"]
        await send(ws2, type="ping", id=2)
        assert (await recv_event(ws2, "pong"))["id"] == 2  # (the new session goes on)
    assert error == {"code": "resume_failed", "message": "cannot resume: the frames after "
                     "last_seq are no longer buffered; continuing with the new session "
                     f"{fresh['session_id']}"}


async def test_resume_with_a_wrong_token_keeps_the_fresh_session(gateway):
    created = await a_dropped_session(gateway)
    async with connect(url(gateway)) as ws2:
        fresh = await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token="not-it", last_seq=-1)
        error = await recv_event(ws2)
        assert error["error"]["code"] == "resume_failed"
        assert fresh["session_id"] in error["error"]["message"]
        await send(ws2, type="say", text="Fresh session works.")
        assert (await read_turn(ws2)).done["status"] == "completed"
        await send(ws2, type="session.resume", session_id="x", resume_token="y")
        assert (await recv_event(ws2))["error"]["code"] == "invalid_message"
        ws2.transport.abort()  # and it is resumed as any session: keep its session.created
        await ws2.wait_closed()
    async with connect(url(gateway)) as ws3:
        await recv_event(ws3, "session.created")
        await send(ws3, type="session.resume", session_id=fresh["session_id"],
                   resume_token=fresh["resume_token"])
        assert (await recv_event(ws3))["type"] == "session.resumed"


async def test_a_failed_resume_can_be_retried_on_the_same_socket(gateway):
    ws = await connect(url(gateway))
    created = await recv_event(ws, "session.created")
    await send(ws, type="session.update", session={"frame_ms": 80})
    settings = (await recv_event(ws, "session.updated"))["session"]
    await _drop(ws)
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token="a stale token")
        assert (await recv_event(ws2))["error"]["code"] == "resume_failed"
        # a ping, a cancel or a mark put nothing to use: the retry window stays open
        await send(ws2, type="ping", id=1)
        await send(ws2, type="cancel")
        assert (await recv_event(ws2))["type"] == "pong"
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        resumed = await recv_event(ws2)
        # the resumed session's settings come with it: the client may have lost them
        assert resumed == {"type": "session.resumed", "session_id": created["session_id"],
                           "last_seq": None, "replayed": 1, "turn_id": None,
                           "session": settings}
        await recv_event(ws2, "session.updated")  # (the replay)
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        error = await recv_event(ws2)
        assert error["error"] == {"code": "invalid_message", "message": "session.resume must "
                                  "come before any transcript, say or session.update, and "
                                  "only until one succeeds"}


@pytest.mark.parametrize("update", [
    {"voice": "no-such-voice"},  # unknown_voice: refused by the session (it knows the voices)
    {"frame_ms": 120, "max_lead_ms": 100},  # invalid_field: the session's check too
    {"max_lead_ms": -1},  # invalid_field: refused as the message is read
])
async def test_a_refused_session_update_leaves_the_new_session_to_a_resume(gateway, update):
    """A ``session.update`` refused changed nothing, as a ping, a cancel or a mark: a
    ``session.resume`` may still replace the socket's new session. One refused by the
    session (a voice or a lead it checks) counted as putting it to use, one refused as
    the message was read did not: the same mistake, and the resume was refused
    (``invalid_message``) or taken depending on which."""
    created = await a_dropped_session(gateway)
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.update", session=update, event_id="u1")
        error = await recv_event(ws2)
        assert error["type"] == "error" and error["error"]["event_id"] == "u1"
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        resumed = await recv_event(ws2)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["session_id"] == created["session_id"]


async def test_resuming_the_sockets_own_new_session_is_refused_and_it_goes_on(gateway):
    async with connect(url(gateway)) as ws:
        created = await recv_event(ws, "session.created")
        await send(ws, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        error = await recv_event(ws)
        assert error["error"] == {"code": "resume_failed", "message": "cannot resume: that "
                                  "is this socket's own new session; continuing with the new "
                                  f"session {created['session_id']}"}
        await send(ws, type="say", text="Still here.")
        assert (await read_turn(ws)).done["status"] == "completed"


async def test_a_socket_whose_session_was_resumed_elsewhere_steers_it_no_more(gateway):
    """A half-dead phone socket (A) is displaced by a resume on B; A has not read its close
    (4000) yet and still sends. Nothing A sends may reach the session B now holds."""
    from websockets.frames import Frame, Opcode

    a = await connect(url(gateway))
    created = await recv_event(a, "session.created")
    await send(a, type="say", text=LONG)
    await recv_event(a, "sentence")
    a.transport.pause_reading()  # A reads nothing more: not even its close frame
    async with connect(url(gateway)) as b:
        await recv_event(b, "session.created")
        await send(b, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"], last_seq=-1)
        await recv_event(b, "session.resumed")
        for message in ({"type": "say", "text": "Injected from the displaced socket."},
                        {"type": "session.update", "session": {"max_lead_ms": 30000}},
                        {"type": "ping", "id": "from A"}):
            a.transport.write(Frame(Opcode.TEXT, json.dumps(message).encode()).serialize(
                mask=True, extensions=[]))
        a.transport.resume_reading()  # A now reads the rest, its close, and answers it
        await read_until_closed(a)
        assert a.close_code == 4000
        while len(gateway.connections) > 1:  # A's handler has read all A sent, and ended
            gateway._live_changed.clear()
            await gateway._live_changed.wait()
        await send(b, type="ping", id="from B")  # B's output so far comes before its pong
        seen = []
        while (event := await recv_event(b))["type"] != "pong":
            seen.append(event)
        assert event["id"] == "from B"
        # (the replay from last_seq -1 repeats turn 1's own events: only a turn 2 is A's)
        assert [e for e in seen if e["type"] in ("session.updated", "pong")
                or e.get("turn_id", 1) != 1 or "Injected" in e.get("text", "")] == []
        rest = await read_turn(b, 1)
        assert rest.done["status"] == "completed"  # the original turn, undisturbed


async def test_clean_close_ends_the_session_at_once(gateway):
    async with connect(url(gateway)) as ws:
        created = await recv_event(ws, "session.created")
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        assert (await recv_event(ws2))["error"]["code"] == "resume_failed"


async def test_a_close_frame_without_a_code_ends_the_session_at_once(gateway):
    """A browser's ``ws.close()`` without arguments sends a close frame with no code (1005
    on this side): a page that is done, not a network gone quiet (a client that means to
    resume closes with a code of its own, e.g. 4001). The session waited for a resume, its
    turn going on, for resume_window_s (websockets itself counts 1005 as a normal close)."""
    async with connect(url(gateway)) as ws:
        created = await recv_event(ws, "session.created")
        await ws.close(code=None)  # type: ignore[arg-type]  # an empty close frame
        assert ws.protocol.close_sent.code == 1005
    async with connect(url(gateway)) as ws2:
        await recv_event(ws2, "session.created")
        await send(ws2, type="session.resume", session_id=created["session_id"],
                   resume_token=created["resume_token"])
        assert (await recv_event(ws2))["error"]["code"] == "resume_failed"


async def test_detached_session_expires_after_the_window():
    gw = await started(resume_window_s=0.2)
    try:
        ws = await connect(url(gw))
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=LONG)
        await recv_event(ws, "sentence")
        await _drop(ws)
        await no_sessions(gw)  # the expiry ran
        assert gw.lane.queue_depth == 0
    finally:
        await gw.aclose()


async def test_a_client_that_pauses_reading_gets_every_frame_once_in_order():
    # No pacing (a lead of 10 minutes): ~4 minutes of audio are released at once, more than
    # the socket buffers hold, so the connection's transport pauses at its high-water mark
    # and output moves from the direct write to the writer task (flow control) and back.
    # Across those switches no message may be skipped, repeated or reordered.
    gw = await started(outbox_bytes=32 * 1024 * 1024, session={"max_lead_ms": 600_000})
    try:
        sock = small_window_socket(gw)
        async with connect(url(gw), sock=sock, max_queue=1) as ws:
            created = await recv_event(ws, "session.created")
            server_side = gw.runners[created["session_id"]].connection.ws
            # The gateway's end holds little too. Autotuned, its send buffer held 2.8 MB the
            # client had not read, ahead of anything sent after: the gateway probes a client
            # that sends nothing for 10 s (ProbeListener), and this one read the 2.8 MB
            # before its pong; under coverage (its reads traced, espeak's C not) and CPU
            # load that took over the probe's 5 s, and the gateway dropped it as gone
            # (ConnectionResetError). Behind 64 KiB its pong takes milliseconds.
            server_side.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            paused = noting_pause(server_side)
            await send(ws, type="say", text=("A long reply read late. " * 200)[:3999])
            await unless_hung(paused.wait())  # before the client reads a byte of it
            turn = await read_turn(ws)
        assert turn.done["status"] == "completed"
        seqs = [f.seq for f in turn.frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert turn.audio_ms == pytest.approx(turn.done["metrics"]["audio_ms"], abs=1)
        assert [e["index"] for e in turn.of("sentence.done")] == list(
            range(len(turn.of("sentence.done"))))
        assert gw.metrics.errors["slow_consumer"] == 0
    finally:
        await gw.aclose()


async def test_a_client_that_stops_reading_is_closed_and_others_are_untouched():
    # no pacing (a lead of 10 minutes): the whole reply is released at once
    gw = await started(outbox_bytes=64 * 1024, session={"max_lead_ms": 600_000})
    stalled = None
    try:
        stalled, _created = await stalling_client(gw)
        await send(stalled, type="say", text=("A very long reply that nobody reads. " * 100)[:3999])
        ok = await one_turn(gw.port, type="say", text="I am still served.")
        assert ok.done["status"] == "completed"
        # stop reading entirely: the gateway must give up on the stalled client
        await no_sessions(gw)
        assert gw.metrics.errors["slow_consumer"] == 1
        # and close its socket: reading again, the client finds the end of it
        async with hang_guard("the stalled socket's close"):
            await read_until_closed(stalled)
    finally:
        if stalled is not None:  # (its socket closed here, not left to the gc)
            stalled.transport.abort()
        await gw.aclose()


async def test_a_paced_client_that_stops_reading_is_a_slow_consumer(monkeypatch):
    """Paced in real time (the default lead), a client that stops reading but goes on
    sending fills the kernel's buffers before the outbox. Autotuned, the gateway's send
    buffer may take 4 MB, ~80 s of audio: nothing but the keepalive (40 s) ended
    such a client, as a network drop (1.8 MB in the kernel, its session kept for a resume),
    never as ``slow_consumer``. Sized to the lead, the buffer fills within seconds and
    the outbox's bound ends the session."""
    # the probe of a quiet listener stays out (it drops a client that sends nothing, as
    # gone): this one is taken to send on, as one with a heartbeat of its own would
    monkeypatch.setattr(session_module, "UNMARKED_SILENT_S", 3600.0)
    gw = await started(outbox_bytes=64 * 1024, resume_window_s=60.0)
    stalled = None
    try:
        stalled, created = await stalling_client(gw)
        server_side = gw.runners[created["session_id"]].connection.ws
        await send(stalled, type="say", text=("A long reply nobody reads. " * 150)[:3999])
        ok = await one_turn(gw.port, type="say", text="I am still served.")
        assert ok.done["status"] == "completed"
        await server_side.wait_closed()  # the gateway gave up on it
        assert gw.metrics.errors["slow_consumer"] == 1
        assert created["session_id"] not in gw.runners  # ended, not kept for a resume
    finally:
        if stalled is not None:  # (its socket closed here, not left to the gc)
            stalled.transport.abort()
        await gw.aclose()


async def test_the_keepalive_ends_a_socket_whose_client_stopped_reading(monkeypatch, caplog):
    """protocol.md: a peer that answers no ping within 20 s is closed (1011 ``keepalive
    ping timeout``) as a network drop, and its session waits for a resume. websockets'
    keepalive starts the pong's timeout only once its ping is written out, and to a client
    that stopped reading with output queued for it (an app frozen in the background, a
    network gone quiet as a turn's last audio went out) it never is: such a socket, and
    its session, stayed open for as long as TCP held on (for ever, to a peer that still
    acknowledges at a zero window)."""
    # the probe of a quiet listener stays out: it takes a reply still playing, not the
    # time after it (a turn whose last audio the listener would have played by now)
    monkeypatch.setattr(session_module, "UNMARKED_SILENT_S", 3600.0)
    # no pacing (a lead of 10 minutes): the socket stops draining at once
    gw = await started(outbox_bytes=16 * 1024 * 1024, session={"max_lead_ms": 600_000})
    caplog.set_level("INFO", logger="gateway.io.connection")
    dropped = LineSeen("socket dropped")
    logging.getLogger("gateway.io.connection").addHandler(dropped)
    stalled = None
    try:
        stalled, created = await stalling_client(gw)
        server_side = gw.runners[created["session_id"]].connection.ws
        paused = noting_pause(server_side)
        await send(stalled, type="say", text=("A reply nobody reads. " * 200)[:3999])
        await unless_hung(paused.wait())
        # the keepalive's next ping now, behind the unread output (20 s apart in service)
        server_side.keepalive_task.cancel()
        server_side.ping_interval = server_side.ping_timeout = 0.5
        server_side.start_keepalive()
        await unless_hung(server_side.wait_closed())
        assert (server_side.protocol.close_sent.code,
                server_side.protocol.close_sent.reason) == (1011, "keepalive ping timeout")
        # the socket's handler detaches the session after the socket has closed: its line
        # says it has (nothing else waited for it, which a run's order of steps decided)
        await unless_hung(dropped.seen.wait())
        runner = gw.runners[created["session_id"]]  # kept for a resume
        assert runner.connection is None and not runner.closed
        assert gw.metrics.errors["slow_consumer"] == 0
    finally:
        logging.getLogger("gateway.io.connection").removeHandler(dropped)
        if stalled is not None:  # (its socket closed here, not left to the gc)
            stalled.transport.abort()
        await gw.aclose()


async def test_a_client_may_read_a_whole_lead_late():
    """What the pacer lets out at once, a session's whole ``max_lead_ms`` as set by a
    ``session.update``, waits in the kernel for a client that reads it late, as it did in
    the autotuned buffer: the send buffer follows the lead, and only output beyond it
    counts against the outbox (here 64 KiB, a second of audio). On a kernel that gives
    less than asked (a stock Linux's ``net.core.wmem_max``, 208 KiB, is less than this
    lead) the outbox holds the rest beyond its bound."""
    gw = await started(outbox_bytes=64 * 1024)
    try:
        async with reading_late(gw, 20_000,
                                "A reply read only once it is all out. " * 6) as (ws, released):
            await released.wait()
            turn = await read_turn(ws)
        assert turn.done["status"] == "completed"
        assert turn.audio_ms > 10_000  # more than the outbox holds, ten times over
        assert gw.metrics.errors["slow_consumer"] == 0
    finally:
        await gw.aclose()


@pytest.mark.parametrize("when", ["mid-turn", "once all is out, before it is read"])
async def test_a_lead_lowered_late_still_lets_the_turn_be_read_late(when):
    """A turn keeps the settings it started with (protocol.md), its lead too: lowering
    ``max_lead_ms`` while it plays leaves it letting out its whole 30 s lead at once. The
    socket's send buffer and the outbox's bound followed the new lead at once, sized for
    one second, and the audio the turn let out, read late as a 30 s lead may be, ended
    the session as a slow consumer (mid-turn: the rest of the reply lost; once all was
    out: at the next message, here a pong, on a kernel that caps the buffer below the lead,
    as a stock Linux's ``net.core.wmem_max`` does; one that gives it all holds what was
    let out). They follow the turn's lead until it ends, and a smaller one only once what
    was let out under the larger one is written."""
    gw = await started(outbox_bytes=64 * 1024)
    try:
        async with reading_late(gw, 30_000,
                                "A reply read only once it is all out. " * 8) as (ws, released):
            if when == "mid-turn":
                await send(ws, type="session.update", session={"max_lead_ms": 1000})
                await released.wait()
            else:
                await released.wait()
                await send(ws, type="session.update", session={"max_lead_ms": 1000})
            await send(ws, type="ping", id="after")
            turn = await read_turn(ws)
            assert turn.done["status"] == "completed"
            seqs = [f.seq for f in turn.frames]  # every frame once, in order
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert turn.audio_ms == pytest.approx(turn.done["metrics"]["audio_ms"], abs=1)
            # more than the outbox holds, ten times over, and than the kernel holds; all
            # let out at once (within the lead)
            assert 15_000 < turn.audio_ms < 30_000
            while (event := await recv_event(ws))["type"] != "pong":
                if event["type"] == "session.updated":
                    assert event["session"]["max_lead_ms"] == 1000
            # the next turn goes by the new lead
            await send(ws, type="say", text="Now paced one second ahead.")
            assert (await read_turn(ws)).done["status"] == "completed"
        assert gw.metrics.errors["slow_consumer"] == 0
    finally:
        await gw.aclose()


def _cyclic_garbage(*modules: str) -> list[str]:
    """Types, from ``modules``, of the objects only the cyclic GC could free (with ``gc``
    disabled by the caller: ``DEBUG_SAVEALL`` keeps what ``collect`` finds)."""
    import gc

    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                        if type(o).__module__.startswith(modules)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


async def test_ended_sessions_are_freed_by_reference_counting_alone():
    """A session that ends, however it ends, must not wait for a full GC: at 2,000 live
    sessions one full collection held the event loop for 0.3 s, and closing 2,000 sessions
    at once left 243,000 objects to it (0.77 s), a stall every other listener hears.
    Left to the GC, not ours: asyncio's selector transport (uvloop's has no cycle)."""
    import gc

    # a window long enough for the resume below whatever the machine's speed (at 0.3 s, a
    # starved run could let it pass before the resume came); the session nobody resumes
    # gets a short one of its own
    gw = await started(resume_window_s=60.0)
    gc.collect()
    gc.disable()
    try:
        # a turn spoken to its end, then a clean close
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="One sentence. Then another one.")
            assert (await read_turn(ws)).done["status"] == "completed"
        # a barge-in, then a close in the middle of the second turn
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=LONG)
            await read_turn(ws, until="sentence")
            await send(ws, type="transcript", text="Stop, tell me the time.")
            await read_turn(ws, until="sentence")
        await no_sessions(gw)
        assert _cyclic_garbage("gateway", "engines", "websockets") == []
        # a dropped socket, resumed on another one, and a bad message on the way
        created = await a_dropped_session(gw)
        async with connect(url(gw)) as ws2:
            await recv_event(ws2, "session.created")
            await send(ws2, type="session.resume", session_id=created["session_id"],
                       resume_token=created["resume_token"], last_seq=-1)
            assert (await recv_event(ws2))["type"] == "session.resumed"
            await ws2.send("{not json")
            assert (await recv_event(ws2, "error"))["error"]["code"] == "invalid_json"
        # a dropped socket nobody resumes: the session expires after the window
        ws = await connect(url(gw))
        created = await recv_event(ws, "session.created")
        gw.runners[created["session_id"]].resume_window_s = 0.3
        await send(ws, type="say", text=LONG)
        await read_turn(ws, until="sentence")
        await _drop(ws)
        await no_sessions(gw)
        # (the test's aborted clients keep websockets' cycle on their side: not ours)
        assert _cyclic_garbage("gateway", "engines", "websockets.server",
                               "websockets.asyncio.server") == []
    finally:
        gc.enable()
        await gw.aclose()
