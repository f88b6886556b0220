"""The reference phone client end to end against the real gateway (replay LLM + espeak)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import types
import wave
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from examples import phone_client
from tests.hang_guard import unless_hung
from tests.servers import record_received
from tests.wsclient import frames_written

REPLIES = (
    {"transcript": "Hello", "reply": "Hi. Nice to hear you."},
    {"transcript": "Time", "reply": "It is noon. Lunch is soon, and then a walk in the park "
                                    "with the dog, if the rain holds off until two."},
)


@pytest.fixture
async def gateway(start_gateway):
    return await start_gateway(REPLIES)


def quiet_client(port: int, out: Path,
                 player: phone_client.ClockPlayer | None = None) -> phone_client.PhoneClient:
    """A phone client of the voice socket on ``port``, its recordings in ``out``, not
    verbose, playing to ``player`` (by default a ``ClockPlayer``: no sound device)."""
    return phone_client.PhoneClient(f"ws://127.0.0.1:{port}/v1/voice", out,
                                    player or phone_client.ClockPlayer(), verbose=False)


def read_wav(path) -> tuple[int, np.ndarray]:
    with wave.open(str(path), "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


@pytest.mark.slow
async def test_two_turns_from_a_file_make_two_spoken_wavs(gateway, tmp_path):
    transcripts = tmp_path / "said.txt"
    transcripts.write_text("Hello\n\nTime\n")
    out = tmp_path / "turns"
    url = f"ws://127.0.0.1:{gateway.port}/v1/voice"
    rc = await asyncio.to_thread(phone_client.main,
                                 ["--url", url, "--file", str(transcripts), "--out", str(out)])
    assert rc == 0
    paths = sorted(out.iterdir())
    assert [p.name for p in paths] == ["turn-001.wav", "turn-002.wav"]
    lengths = []
    for path in paths:
        rate, samples = read_wav(path)
        assert rate == 24_000
        assert np.sqrt(np.mean(samples.astype(np.float64) ** 2)) > 300  # speech, not silence
        lengths.append(len(samples))
    assert lengths[1] > lengths[0]  # the second reply is the longer one
    assert gateway.metrics.turns["completed"] == 2


@pytest.mark.slow
async def test_barge_in_cancels_the_playing_turn_after_reporting_playback(gateway, tmp_path):
    client = quiet_client(gateway.port, tmp_path)
    # hear 0.6 s of the long reply, then say something else
    await client.run(phone_client._from_list(["Time", "Hello"]), sequential=True,
                     barge_in_after=0.6)
    assert [r["status"] for r in client.results] == ["cancelled", "completed"]
    cut, full = client.results
    # pacing held the server to max_lead ahead of what the marks said was played
    assert cut["metrics"]["audio_ms"] < 0.6 * 1000 + 1000 + 200
    _, first = read_wav(client.saved[0])
    assert len(first) / 24 == pytest.approx(cut["metrics"]["audio_ms"], abs=1)


class CuttingProxy:
    """A TCP proxy between the client and the gateway that aborts its first connection
    (both sides, no close handshake) once ``cut_after`` bytes went to the client: the
    phone going into a tunnel mid-reply. ``uplink``: as soon as the client sends anything
    after its handshake instead, which never reaches the gateway. Later connections pass
    through untouched, each once ``hold`` (when given) has returned: e.g. the gateway's
    ``wait_no_sessions``, so that a resume comes after the window has let the session go,
    not merely after the client's backoff."""

    def __init__(self, upstream_port: int, cut_after: int = 0, *, uplink: bool = False,
                 hold: Callable[[], Awaitable[object]] | None = None) -> None:
        self.upstream_port, self.cut_after, self.uplink = upstream_port, cut_after, uplink
        self.hold = hold
        self.connections = 0
        self.cut = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        cutting = self.connections == 1
        if not cutting and self.hold is not None:
            await self.hold()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        def abort() -> None:
            writer.transport.abort()
            up_writer.transport.abort()
            self.cut.set()

        async def pipe(src, dst, count: bool) -> None:
            sent = 0
            while data := await src.read(65536):
                dst.write(data)
                sent += len(data)
                if count and cutting and sent >= self.cut_after:
                    return abort()
            dst.close()

        async def pipe_up() -> None:
            handshake = b""
            while data := await reader.read(65536):
                if cutting and self.uplink and b"\r\n\r\n" in handshake:
                    return abort()  # (its first message, never forwarded)
                handshake += data
                up_writer.write(data)
            up_writer.close()

        await asyncio.gather(pipe_up(), pipe(up_reader, writer, not self.uplink),
                             return_exceptions=True)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.mark.slow
@pytest.mark.parametrize("max_sessions", [10_000, 1], ids=["room", "full"])
async def test_a_dropped_socket_resumes_the_turn_into_the_same_wav(start_gateway, tmp_path,
                                                                   max_sessions):
    # "full": the session waiting for its resume fills the gateway; the reconnect names it
    gateway = await start_gateway(REPLIES, server={"max_sessions": max_sessions})
    proxy = CuttingProxy(gateway.port, cut_after=60_000)  # about 1.2 s of audio in
    port = await proxy.start()
    try:
        client = quiet_client(port, tmp_path)
        await client.run(phone_client._from_list(["Time"]), sequential=True,
                         barge_in_after=None)
    finally:
        await proxy.aclose()
    assert proxy.cut.is_set() and proxy.connections == 2
    assert client.resumes == 1 and client.resumes_failed == 0
    assert client.frames_lost == 0 and client.frames_repeated == 0
    (done,) = client.results
    assert done["status"] == "completed"
    (path,) = client.saved  # one WAV: the reply went on where it was cut
    _, samples = read_wav(path)
    assert len(samples) / 24 == pytest.approx(done["metrics"]["audio_ms"], abs=1)
    assert gateway.metrics.turns["completed"] == 1  # the transcript was not sent again


@pytest.mark.slow
async def test_when_the_resume_fails_the_transcript_is_sent_again(tmp_path, start_gateway):
    gw = await start_gateway(REPLIES, server={"resume_window_s": 0.01})
    proxy = CuttingProxy(gw.port, cut_after=60_000, hold=gw.wait_no_sessions)
    port = await proxy.start()
    try:
        client = _Recording(f"ws://127.0.0.1:{port}/v1/voice", tmp_path,
                            phone_client.ClockPlayer())
        await client.run(phone_client._from_list(["Time"]), sequential=True,
                         barge_in_after=None)
    finally:
        await proxy.aclose()
    assert proxy.cut.is_set()
    assert client.resumes == 0 and client.resumes_failed == 1  # the window had passed
    # the gateway's reason, said once: it was followed by "; continuing in sess_..." when
    # the gateway's message already ends "continuing with the new session sess_..."
    (failed,) = [x for x in client.lines if x.startswith("[resume failed")]
    assert failed.startswith("[resume failed: cannot resume: unknown or expired session")
    assert failed.count("continuing") == 1
    assert [r["status"] for r in client.results] == ["completed"]
    assert len(client.saved) == 2  # the cut reply, then the whole one in the new session
    _, samples = read_wav(client.saved[1])
    assert len(samples) / 24 == pytest.approx(client.results[0]["metrics"]["audio_ms"], abs=1)


async def test_a_refused_handshake_is_not_retried_and_a_token_gets_in(tmp_path, start_gateway,
                                                                       capsys):
    gw = await start_gateway(REPLIES, server={"tokens": ("s3cret",)})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    rc = await asyncio.to_thread(phone_client.main, ["--url", url, "--out", str(tmp_path),
                                                     "Hello"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "--token" in err
    assert err.count("connection failed") == 0  # refused once, not retried
    rc = await asyncio.to_thread(phone_client.main, ["--url", url, "--out", str(tmp_path),
                                                     "--token", "s3cret", "Hello"])
    assert rc == 0 and gw.metrics.turns["completed"] == 1
    assert "s3cret" not in capsys.readouterr().err


async def test_a_turn_without_audio_is_said_to_have_none(tmp_path, start_gateway, capsys):
    """A reply with nothing to say (an LLM's emoji; a tiny model's reply cut at max_tokens
    before its first sentence ended) has ttfa_ms null: the client printed "first audio
    None ms, 0 ms of audio"."""
    gw = await start_gateway([{"transcript": "Smile", "reply": "\N{SLIGHTLY SMILING FACE}"}])
    rc = await asyncio.to_thread(phone_client.main, [
        "--url", f"ws://127.0.0.1:{gw.port}/v1/voice", "--out", str(tmp_path), "Smile"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "[turn 1 completed: no audio]" in err and "None" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--url", "http://127.0.0.1:8780/v1/voice", "Hi"], "--url must be the gateway's "
     "ws:// or wss:// URL, not 'http://127.0.0.1:8780/v1/voice'"),
    (["--file", "/nonexistent/said.txt"],
     "--file: [Errno 2] No such file or directory: '/nonexistent/said.txt'"),
    (["--out", "/dev/null", "Hi"], "--out: cannot make the directory for turn-NNN.wav: "
     "[Errno 17] File exists: '/dev/null'"),
    # 0 and below tried once and said "(1 attempts)"; a negative wait barged in at once,
    # as 0 does, without a word
    (["--connect-attempts", "0", "Hi"], "--connect-attempts must be at least 1, not 0"),
    (["--barge-in-after", "-1", "Hi"], "--barge-in-after must be 0 or more seconds, not -1"),
    # tried --connect-attempts times, then "cannot reach" a gateway it never asked
    (["--token", "s3\ncret", "--connect-attempts", "1", "Hi"],
     "--token: a token is printable ASCII, without a space at either end"),
])
def test_a_mistyped_url_or_file_is_a_usage_error_not_a_traceback(argv, message, capsys):
    """An http:// URL (the console's address, copied) ended in a TaskGroup traceback of
    InvalidURI, a missing --file in one of FileNotFoundError, an --out that is a file in
    one of FileExistsError."""
    with pytest.raises(SystemExit) as exited:
        phone_client.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


async def test_an_unreachable_gateway_is_given_up_after_the_attempts(tmp_path, capsys,
                                                                   refused_port):
    rc = await asyncio.to_thread(phone_client.main, [
        "--url", f"ws://127.0.0.1:{refused_port}/v1/voice", "--out", str(tmp_path),
        "--connect-attempts", "2", "Hello"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("connection failed") == 2 and "cannot reach" in err and "2 attempts" in err


@pytest.mark.slow
async def test_a_transcript_lost_with_the_socket_is_sent_again_after_the_resume(gateway,
                                                                                 tmp_path):
    """The uplink dies with the transcript in it: the resume succeeds, but the gateway never
    heard the transcript, so no turn.started will come. ``session.resumed.turn_id`` says so
    (it is still the last turn the client saw start), and the client sends it again instead
    of waiting for ever."""
    client = quiet_client(gateway.port, tmp_path)
    send, lost = client._send, []

    async def losing_send(**message) -> None:
        if message.get("type") == "transcript" and not lost:
            lost.append(message)
            await client._connected.wait()
            assert client._ws is not None
            client._ws.transport.abort()  # gone with the socket, never written
            return
        await send(**message)

    client._send = losing_send
    await unless_hung(client.run(phone_client._from_list(["Hello"]), sequential=True,
                                      barge_in_after=None))
    assert lost and client.resumes == 1 and client.resumes_failed == 0
    assert [r["status"] for r in client.results] == ["completed"]
    assert gateway.metrics.turns["completed"] == 1


def test_play_without_sounddevice_says_what_to_install(monkeypatch, capsys):
    """``--play`` where ``sounddevice`` is not installed (the gateway does not install it)
    said "[no audio device (No module named 'sounddevice'); ...]" on a machine with
    speakers. It is made unimportable here (``None`` in ``sys.modules``) as it is where it
    was never installed; the client still runs, on its clock."""
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    player = phone_client.make_player(True)
    assert type(player) is phone_client.ClockPlayer
    assert capsys.readouterr().err == ("[--play needs sounddevice: pip install sounddevice; "
                                       "saving WAV files only]\n")


class FakeOutputStream:
    """A FAKE ``sounddevice.RawOutputStream`` (there is no PortAudio device here), behaving
    as sounddevice documents the real one: ``latency`` (seconds), ``time`` (the stream's
    clock, in seconds; the test sets it) and a callback called as ``callback(outdata,
    frames, time, status)`` with a buffer of ``frames`` samples to fill and
    ``time.currentTime`` / ``time.outputBufferDacTime`` (when the buffer's first sample
    leaves the speaker; 0 where a host API does not say) on that clock. The test plays the
    audio thread: ``pull`` is one callback."""

    def __init__(self, *, samplerate: int, channels: int, dtype: str, callback) -> None:
        assert (samplerate, channels, dtype) == (phone_client.RATE, 1, "int16")
        self.callback = callback
        self.latency, self.time = 0.2, 100.0
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True

    def pull(self, frames: int, dac_time: float) -> bytes:
        """One callback at ``self.time`` for ``frames`` samples that leave the speaker from
        ``dac_time``; what the player put in the buffer."""
        out = bytearray(b"\xff" * 2 * frames)  # (not zeros: the padding must be written)
        when = types.SimpleNamespace(inputBufferAdcTime=0.0, currentTime=self.time,
                                     outputBufferDacTime=dac_time)
        self.callback(out, frames, when, 0)
        return bytes(out)


@pytest.fixture
def speaker(monkeypatch) -> phone_client.SpeakerPlayer:
    """A SpeakerPlayer on a FakeOutputStream, its turn started."""
    monkeypatch.setitem(sys.modules, "sounddevice",
                        types.SimpleNamespace(RawOutputStream=FakeOutputStream))
    player = phone_client.make_player(True)
    assert type(player) is phone_client.SpeakerPlayer and player._stream.started
    player.start_turn()
    return player


def pcm_ms(ms: int) -> bytes:
    return np.arange(ms * 24, dtype="<i2").tobytes()  # (distinct samples: order shows)


def test_the_speaker_counts_what_left_the_speaker_not_what_it_copied(speaker):
    """protocol.md, ``playback``: ``played_ms`` is what the listener has played, less what
    the system still holds. The SpeakerPlayer counted what its callback copied to the
    device: 200 ms ahead of the listener here (and on Bluetooth), so a barge-in's history
    kept words nobody heard. It now counts from PortAudio's ``outputBufferDacTime``."""
    stream = speaker._stream
    speaker.feed(pcm_ms(500))
    assert stream.pull(2400, dac_time=100.2) == pcm_ms(100)  # out over 100.2-100.3
    stream.time = 100.1
    assert stream.pull(2400, dac_time=100.3) == pcm_ms(200)[4800:]  # 100.3-100.4
    marks = []
    for now in (100.1, 100.2, 100.25, 100.3, 100.35, 100.4, 100.45, 101.0):
        stream.time = now
        marks.append(speaker.played_ms())
    assert marks == [0, 0, 50, 100, 150, 200, 200, 200]  # never past what was copied
    assert speaker.buffered_s() == pytest.approx(0.3)  # (what the callbacks have yet to copy)
    # an underrun: the buffer runs dry, the rest of the callback is silence
    assert stream.pull(12000, dac_time=101.2) == pcm_ms(500)[9600:] + bytes(2 * 4800)
    stream.time = 101.3
    assert speaker.played_ms() == 300
    speaker.start_turn()  # a new turn counts from its start
    assert speaker.played_ms() == 0


def test_the_speaker_falls_back_on_the_streams_latency(speaker):
    """A host API that gives no ``outputBufferDacTime`` (0): the audio leaves the speaker the
    stream's ``latency`` after the callback (``currentTime``)."""
    stream = speaker._stream
    stream.latency = 0.15
    speaker.feed(pcm_ms(100))
    stream.pull(2400, dac_time=0.0)  # at 100.0
    marks = []
    for now in (100.1, 100.15, 100.2, 100.3):
        stream.time = now
        marks.append(speaker.played_ms())
    assert marks == [0, 0, 50, 100]


def test_the_speaker_holds_the_tail_until_it_has_played(speaker):
    """The client marks while the player has audio buffered (``buffered_s``), and waits for
    it before it ends. Counting only what the callback had to copy, the speaker's tail (the
    device's latency) was never marked as played, and the resume buffer held it; the last
    mark now says all of it. A flush (barge-in) drops what is not yet copied; what the
    device holds still plays and is counted as it does."""
    stream = speaker._stream
    speaker.feed(pcm_ms(100))
    stream.pull(2400, dac_time=100.2)
    assert speaker.buffered_s() == pytest.approx(0.1)  # all copied, none out
    stream.time = 100.25
    assert (speaker.buffered_s(), speaker.played_ms()) == (pytest.approx(0.05), 50)
    speaker.feed(pcm_ms(100))
    speaker.flush()
    assert speaker.buffered_s() == pytest.approx(0.05)
    stream.time = 100.3
    assert (speaker.buffered_s(), speaker.played_ms()) == (0, 100)


def test_the_client_makes_its_output_folder_itself(tmp_path):
    # only main() made it: a program using the class with a new folder failed to open each
    # turn's WAV, an OSError the connection loop took for a network drop (resumed each turn)
    out = tmp_path / "new" / "folder"
    phone_client.PhoneClient("ws://127.0.0.1:1/v1/voice", out, phone_client.ClockPlayer())
    assert out.is_dir()


@pytest.mark.slow
async def test_a_refused_transcript_ends_as_refused_and_the_next_is_named_right(gateway,
                                                                              tmp_path):
    """A refusal (text_too_long, rate_limited) is an `error` with no turn: the client
    waited for its turn.done for ever, and the next WAV took the refused one's name
    (engines review)."""
    client = quiet_client(gateway.port, tmp_path)
    await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                      sequential=True, barge_in_after=None))
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    assert [p.name for p in client.saved] == ["turn-002.wav"]


@pytest.mark.slow
async def test_a_refused_setting_is_not_taken_for_the_refusal_of_a_transcript(gateway,
                                                                               tmp_path):
    """`--frame-ms 33` (or `--instructions` over 16,000 characters) has its session.update
    answered by an `error` with no turn, as a refused transcript is: the client took it for
    the refusal of its first transcript and left while that turn was speaking (exit 1)."""
    client = _Recording(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer(), settings={"frame_ms": 33})
    await unless_hung(client.run(phone_client._from_list(["Hello", "Time"]),
                                      sequential=True, barge_in_after=None))
    assert [r["status"] for r in client.results] == ["completed", "completed"]
    assert [p.name for p in client.saved] == ["turn-001.wav", "turn-002.wav"]
    (refused,) = [x for x in client.lines if "invalid_field" in x]
    assert "settings refused" in refused and "frame_ms" in refused
    assert gateway.metrics.turns["completed"] == 2


async def test_a_session_taken_over_by_another_device_is_left_to_it(gateway, tmp_path):
    """Close 4000 ("session resumed elsewhere") was taken for a network drop: the client
    resumed, and the two devices took the session from each other for ever (engines
    review)."""
    from websockets.asyncio.client import connect

    from tests.wsclient import recv_event, send

    client = quiet_client(gateway.port, tmp_path)

    async def talk_forever():
        async def waiting():
            await asyncio.Event().wait()
            yield ""  # (never)
        await client.run(waiting(), sequential=True, barge_in_after=None)

    running = asyncio.create_task(talk_forever())
    await client._connected.wait()
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as other:
        await recv_event(other, "session.created")
        await send(other, type="session.resume", session_id=client._session_id,
                   resume_token=client._resume_token)
        assert (await recv_event(other))["type"] == "session.resumed"
        with pytest.raises(phone_client.GaveUp, match="resumed elsewhere"):
            await unless_hung(running)
        await send(other, type="ping", id=1)  # still the other device's
        assert (await recv_event(other))["type"] == "pong"
    assert client.resumes == 0


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
async def test_a_gateway_behind_a_failing_proxy_is_given_up_after_the_attempts(tmp_path,
                                                                               capsys, version):
    """A 502 from a proxy in front of the gateway was retried for ever, whatever
    --connect-attempts said, and one in HTTP/1.0 ended the client with a traceback (engines
    review)."""
    import http.server
    import threading

    class BadGateway(http.server.BaseHTTPRequestHandler):  # TEST DOUBLE: a failing proxy
        protocol_version = version

        def do_GET(self) -> None:
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BadGateway)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        rc = await asyncio.to_thread(phone_client.main, [
            "--url", f"ws://127.0.0.1:{proxy.server_address[1]}/v1/voice",
            "--out", str(tmp_path), "--connect-attempts", "2", "Hello"])
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("connection failed") == 2 and "cannot reach" in err


class FedPlayer(phone_client.ClockPlayer):
    """A ClockPlayer that says when it has been fed ``at_s`` of audio, and counts what it is
    fed after a flush (audio the listener hears after a barge-in)."""

    def __init__(self, at_s: float) -> None:
        super().__init__()
        self.at_s, self.fed = at_s, asyncio.Event()
        self.after_flush = 0  # bytes fed since the last flush
        self.flushes: list[int] = []  # at each flush: the bytes fed since the one before

    def feed(self, pcm: bytes) -> None:
        super().feed(pcm)
        self.after_flush += len(pcm)
        if self._queued_s >= self.at_s:
            self.fed.set()

    def flush(self) -> None:
        super().flush()
        self.flushes.append(self.after_flush)
        self.after_flush = 0


def received(gateway) -> list[tuple]:
    """What the gateway's only session takes in from now on, whichever socket it comes on:
    ``("playback", turn_id, played_ms)`` and ``("transcript", text)``."""
    from gateway.core.codec import ClientPlayback, ClientTranscript

    (runner,) = gateway.runners.values()
    messages: list[tuple] = []
    receive = runner.receive

    def receiving(message, now):
        if isinstance(message, ClientPlayback):
            messages.append(("playback", message.turn_id, message.played_ms))
        elif isinstance(message, ClientTranscript):
            messages.append(("transcript", message.text))
        return receive(message, now)

    runner.receive = receiving
    return messages


LONG = " ".join(f"This is sentence number {i} of a long answer." for i in range(1, 12))
BARGE_IN = ({"transcript": "Tell me", "reply": LONG}, {"transcript": "Hello", "reply": "Hi."})


@pytest.mark.slow
@pytest.mark.parametrize("when", ["lost", "offline"])
async def test_a_barge_in_after_a_drop_goes_with_its_mark(start_gateway, tmp_path, when):
    """protocol.md, Resume: the mark sent just before a barge-in is worth sending again
    before the transcript it preceded (the gateway cuts the cut reply's history from it).
    The client sent the transcript again after the resume without it ("lost": both went
    into a socket that died), or never sent it at all ("offline": typed while the socket was
    down, the reply playing on from its buffer): the history kept the last mark before the
    drop, up to a second and more short of what the listener heard."""
    gateway = await start_gateway(BARGE_IN)
    player = FedPlayer(at_s=2.0)
    client = quiet_client(gateway.port, tmp_path, player)
    sent, send = asyncio.Event(), client._send
    dropped, clear = asyncio.Event(), client._connected.clear

    async def sending(**message) -> None:
        await send(**message)
        if message.get("text") == "Hello":
            sent.set()

    def clearing() -> None:
        clear()
        dropped.set()

    client._send, client._connected.clear = sending, clearing
    heard: list[float] = []
    taken: list[list[tuple]] = []

    async def typed():
        yield "Tell me"
        await player.fed.wait()  # about a second of it played
        (conn,) = gateway.connections
        if when == "lost":
            conn.ws.transport.pause_reading()  # what the client sends now stays unread ...
        else:
            conn.ws.transport.abort()  # the socket drops: the client is offline
            await dropped.wait()  # (once it knows)
        taken.append(received(gateway))  # from now on
        heard.append(player.played_ms())
        yield "Hello"
        if when == "lost":
            await sent.wait()
            conn.ws.transport.abort()  # ... and is lost with it

    await asyncio.wait_for(client.run(typed(), sequential=False, barge_in_after=None), 60)
    assert client.resumes == 1
    assert [r["status"] for r in client.results] == ["cancelled", "completed"]
    # what came before the barge-in's transcript, after the resume: the mark of turn 1
    (messages,) = taken
    before = messages[:messages.index(("transcript", "Hello"))]
    assert before and before[-1][:2] == ("playback", 1), messages
    assert before[-1][2] >= round(heard[0])


@pytest.mark.slow
async def test_typed_turns_send_playback_marks_while_the_reply_plays(gateway, tmp_path):
    """protocol.md, playback: marks every 200-500 ms while playing. Typed in (--play,
    stdin) the client sent none while a reply played: only the turns from a list or a file
    were listened to with marks, so the gateway paced and cut the history blind, and could
    not tell a silent network from a listener."""
    client = quiet_client(gateway.port, tmp_path)
    taken: list[list[tuple]] = []
    done = asyncio.Event()

    class Results(list):
        def append(self, result) -> None:  # a turn.done came: what the gateway had by then
            super().append(result)
            taken.append(list(taken[0]))
            done.set()

    client.results = Results()

    async def typed():
        await client._connected.wait()
        taken.append(received(gateway))
        yield "Time"
        await done.wait()  # the user types nothing more until the reply has been sent

    await asyncio.wait_for(client.run(typed(), sequential=False, barge_in_after=None), 60)
    (result,) = client.results
    assert result["status"] == "completed" and result["metrics"]["audio_ms"] > 3000
    marks = [m for m in taken[1] if m[0] == "playback"]
    # one every 250 ms while the reply played (it is sent up to 1 s ahead of playback)
    assert len(marks) >= (result["metrics"]["audio_ms"] - 1000) / 250 - 2, marks


@pytest.mark.slow
async def test_after_a_barge_in_nothing_more_of_the_cut_reply_is_heard(start_gateway,
                                                                        tmp_path):
    """The frames of the reply still on their way when the user barges in (a round trip's
    worth: the gateway has not read the transcript yet) were played after the barge-in had
    stopped the sound, until its turn.done came: the old reply spoke again over the new
    one's wait."""
    gateway = await start_gateway(BARGE_IN)
    player = FedPlayer(at_s=2.0)
    client = quiet_client(gateway.port, tmp_path, player)

    async def in_flight(conn, written: asyncio.Event) -> None:
        await written.wait()
        conn.ws.transport.resume_reading()

    async with asyncio.TaskGroup() as tasks:
        async def typed():
            yield "Tell me"
            await player.fed.wait()
            (conn,) = gateway.connections
            conn.ws.transport.pause_reading()  # the barge-in is on its way ...
            tasks.create_task(in_flight(conn, frames_written(gateway, 5)))  # ... 200 ms
            yield "Hello"

        await asyncio.wait_for(client.run(typed(), sequential=False, barge_in_after=None), 60)
    assert [r["status"] for r in client.results] == ["cancelled", "completed"]
    *_, whole, since_barge_in = player.flushes  # (the barge-in's flush, the turn.done's)
    assert whole >= 2 * 48_000 and since_barge_in == 0


async def test_a_full_gateway_is_said_to_be_full_not_unreachable(start_gateway, tmp_path,
                                                                  capsys):
    """A full gateway answers HTTP 503 server_full: the client said it could not reach it,
    which sends the user looking at the network, the address or the gateway's process."""
    from websockets.asyncio.client import connect

    from tests.wsclient import recv_event

    gw = await start_gateway(REPLIES, server={"max_sessions": 1})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    async with connect(url) as other:  # the one session the gateway takes
        await recv_event(other, "session.created")
        rc = await asyncio.to_thread(phone_client.main, [
            "--url", url, "--out", str(tmp_path), "--connect-attempts", "2", "Hello"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "cannot reach" not in err
    assert err.count("the gateway is full (HTTP 503 server_full)") == 3, err  # 2 tries, gave up


class _Recording(phone_client.PhoneClient):
    """The client, with what it would print kept as lines, and an event each time it waits
    to send a transcript again (it is then asleep: cancelling it there is clean)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, verbose=False, **kwargs)
        self.lines: list[str] = []
        self.waits = asyncio.Queue[str]()

    def say(self, *parts) -> None:
        line = " ".join(map(str, parts)).strip()
        self.lines.append(line)
        if line.startswith("[sending it again"):
            self.waits.put_nowait(line)


@pytest.mark.slow
async def test_a_rate_limited_transcript_is_sent_again_later_not_skipped(start_gateway,
                                                                         tmp_path):
    """A transcript refused as rate_limited was given up and the next line sent at once:
    with a file of lines and turns failing fast (an LLM server down), the client sent the
    whole rest of the file in a burst, each refused, and the gateway closed it with 1008
    ``too many messages``, ending the session (chaos run: both phone clients lost theirs a
    few hundred ms after the LLM server was killed)."""
    gateway = await start_gateway(REPLIES, server={"turns_per_minute": 1})
    client = _Recording(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer())
    lines = ["Hello", "Time", "Hello"]
    run = asyncio.create_task(client.run(phone_client._from_list(lines), sequential=True,
                                         barge_in_after=None))
    try:
        for _ in range(2):  # refused, then refused again when sent again
            got = asyncio.create_task(client.waits.get())
            await asyncio.wait({run, got}, return_when=asyncio.FIRST_COMPLETED)
            got.cancel()
            assert not run.done(), "the client gave its transcripts up:\n" + "\n".join(
                client.lines[-5:])
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    said = [x for x in client.lines if x.startswith("> ")]
    assert said == ["> Hello", "> Time", "> Time"]  # the same line again, nothing after it
    assert client.resumes_failed == 0 and client.results[0]["status"] == "completed"
    assert "too_many_messages" not in gateway.metrics.errors


class _Said(_Recording):
    """Puts each line it would print in ``said`` as well (the test waits on them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.said = asyncio.Queue[str]()

    def say(self, *parts) -> None:
        super().say(*parts)
        self.said.put_nowait(self.lines[-1])


async def test_a_transcript_sent_as_a_stopping_gateway_closes_waits_for_the_reconnect(
        gateway, tmp_path):
    """A gateway stopped mid-reply (^C, a restart) ends the turn ``failed`` and closes with
    1001; the client, with a next transcript, sent it at once on the socket just closed, and
    died of ConnectionClosedOK in a TaskGroup traceback instead of reconnecting as it does
    after any drop (the transcript then goes again after the resume)."""
    client = _Said(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                   phone_client.ClockPlayer())
    run = asyncio.create_task(client.run(phone_client._from_list(["Time", "Hello"]),
                                         sequential=True, barge_in_after=None))
    try:
        while await client.said.get() != "> Time":
            pass
        await frames_written(gateway, 3).wait()
        await gateway.aclose()
        while True:  # the client goes on, trying to reach the gateway again
            got = asyncio.create_task(client.said.get())
            await asyncio.wait({run, got}, return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                got.cancel()
                run.result()  # (raises what stopped it)
                pytest.fail("the client stopped:\n" + "\n".join(client.lines))
            if got.result().startswith("[connection failed"):
                break
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert [r["status"] for r in client.results] == ["failed"]
    assert "> Hello" in client.lines


class _CancelsOnRefusal(_Recording):
    """Wakes the test in the same step as the refusal that ends the client's wait."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refused = asyncio.Event()

    def say(self, *parts) -> None:
        super().say(*parts)
        if self.lines[-1].startswith("[error"):
            self.refused.set()


async def test_cancelling_the_client_as_its_wait_for_a_turn_ends_stops_it(gateway, tmp_path):
    """``_listen`` waited with ``asyncio.wait_for``, which on Python 3.11 drops a
    cancellation that comes in the step its awaitable completes: a ``run`` cancelled as the
    turn it waited for ended (a refusal here; Ctrl-C at a reply's end alike) went on with
    the next transcript and never stopped (found when a test cancelled it so)."""
    client = _CancelsOnRefusal(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                               phone_client.ClockPlayer())
    run = asyncio.create_task(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                         sequential=True, barge_in_after=None))
    await client.refused.wait()
    run.cancel()
    done, _ = await asyncio.wait({run}, timeout=30)
    assert done, "the cancelled client went on:\n" + "\n".join(client.lines)
    assert run.cancelled()
    assert not [x for x in client.lines if x == "> Hello"]


@pytest.mark.slow
async def test_a_refusal_replayed_by_a_resume_is_not_taken_for_the_next_transcript(
        gateway, tmp_path):
    """protocol.md, Resume: every event after the last frame received may come again. A
    refusal (an ``error`` with no turn) replayed after a resume was handled a second time:
    it was taken for the refusal of the transcript sent since, whose reply then went
    unheard (the client moved on, or ended, as if it had been refused)."""
    client = quiet_client(gateway.port, tmp_path)

    async def cut_at_turn_started() -> None:
        await client._connected.wait()
        (runner,) = gateway.runners.values()
        (conn,) = gateway.connections
        send = runner.send

        def sending(item) -> None:
            send(item)
            if isinstance(item, str) and '"turn.started"' in item:
                runner.send = send
                conn.ws.transport.abort()  # the drop comes before the reply's first frame

        runner.send = sending

    cutting = asyncio.create_task(cut_at_turn_started())
    await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                      sequential=True, barge_in_after=None))
    await cutting
    assert client.resumes == 1 and client.resumes_failed == 0
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    assert [p.name for p in client.saved] == ["turn-002.wav"]
    assert gateway.metrics.turns["completed"] == 1


@pytest.mark.slow
async def test_a_typed_transcript_whose_reply_a_failed_resume_cut_is_sent_again(
        start_gateway, tmp_path):
    """The module docstring: when the resume fails, the client sends again the transcript
    whose reply was cut off, in the fresh session. Typed (stdin, ``--play``), it did not:
    the client was already waiting for the next line, and the reply was lost until the user
    typed something else."""
    gateway = await start_gateway(REPLIES, server={"resume_window_s": 0.01})
    proxy = CuttingProxy(gateway.port, cut_after=60_000, hold=gateway.wait_no_sessions)
    port = await proxy.start()
    client = _Said(f"ws://127.0.0.1:{port}/v1/voice", tmp_path, phone_client.ClockPlayer())
    done = asyncio.Event()

    class Results(list):
        def append(self, result) -> None:
            super().append(result)
            done.set()

    client.results = Results()

    async def typed():
        yield "Time"
        await done.wait()  # the user types nothing more until a reply has been heard

    try:
        await unless_hung(client.run(typed(), sequential=False, barge_in_after=None))
    finally:
        await proxy.aclose()
    assert proxy.cut.is_set() and client.resumes_failed == 1
    assert [r["status"] for r in client.results] == ["completed"]
    assert [x for x in client.lines if x.startswith("> ")] == ["> Time", "> Time"]
    _, samples = read_wav(client.saved[-1])
    assert len(samples) / 24 == pytest.approx(client.results[0]["metrics"]["audio_ms"], abs=1)


@pytest.mark.slow
async def test_settings_lost_with_the_socket_are_sent_again_after_the_resume(gateway,
                                                                             tmp_path):
    """protocol.md, Resume: a session.update lost with the socket is to be sent again (it is
    idempotent). The client sent its settings only on connect: lost before the gateway read
    them, the resume went on without them, and the client, still waiting for their answer,
    took the next refusal of a transcript (an ``error`` with no turn) for theirs, and waited
    for that transcript's turn for ever."""
    proxy = CuttingProxy(gateway.port, uplink=True)  # the settings never reach the gateway
    port = await proxy.start()
    frame_ms: list[int] = []

    class Results(list):
        def append(self, result) -> None:  # what the gateway's session had for that turn
            super().append(result)
            frame_ms.extend(r.session.settings.frame_ms for r in gateway.runners.values())

    client = _Recording(f"ws://127.0.0.1:{port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer(), settings={"frame_ms": 20})
    client.results = Results()
    try:
        await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                          sequential=True, barge_in_after=None))
    finally:
        await proxy.aclose()
    assert proxy.cut.is_set() and client.resumes == 1 and client.resumes_failed == 0
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    assert frame_ms == [20, 20]
    assert not [x for x in client.lines if "settings refused" in x]

class HeldPlayer(phone_client.ClockPlayer):
    """A speaker that plays nothing until ``release()`` (then all it holds, at once): the
    reply's tail is still to be heard when the socket drops. Counts what a flush dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.held_s = self.dropped_s = 0.0
        self.released = False

    def start_turn(self) -> None:
        self.dropped_s += self.held_s
        self.held_s = 0.0

    def feed(self, pcm: bytes) -> None:
        self.held_s += len(pcm) / 2 / phone_client.RATE

    def buffered_s(self) -> float:
        return 0.0 if self.released else self.held_s

    def played_ms(self) -> float:
        return self.held_s * 1000 if self.released else 0.0

    def flush(self) -> None:
        self.start_turn()

    def release(self) -> None:
        self.released = True


@pytest.mark.slow
async def test_a_failed_resume_after_the_reply_ended_leaves_its_tail_playing(start_gateway,
                                                                             tmp_path):
    """A turn ends up to max_lead_ms before its audio has played: a socket dropped then, and
    a resume that failed (the window passed, the gateway restarted), dropped the audio the
    client held of a reply that had come whole (the failed resume flushed the player as
    for a reply cut off)."""
    gateway = await start_gateway(REPLIES, server={"resume_window_s": 0.01},
                                  session={"max_lead_ms": 30_000})  # (nothing is played)
    # (a proxy that cuts nothing: it holds the reconnect until the window has passed)
    proxy = CuttingProxy(gateway.port, cut_after=2**62, hold=gateway.wait_no_sessions)
    port = await proxy.start()
    player = HeldPlayer()
    client = _Said(f"ws://127.0.0.1:{port}/v1/voice", tmp_path, player)

    class Results(list):
        def append(self, result) -> None:  # its turn.done came: the socket drops now
            super().append(result)
            assert client._ws is not None
            client._ws.transport.abort()

    client.results = Results()
    run = asyncio.create_task(client.run(phone_client._from_list(["Hello"]), sequential=True,
                                         barge_in_after=None))
    try:
        while True:  # until the resume failed, or the client is done
            said = asyncio.create_task(client.said.get())
            done, _ = await asyncio.wait({run, said}, timeout=30,
                                         return_when=asyncio.FIRST_COMPLETED)
            if said not in done:
                said.cancel()
                break
            if said.result().startswith("[resume failed"):
                break
        assert client.resumes_failed == 1
        assert player.dropped_s == 0  # the tail is still to be heard
        player.release()
        await unless_hung(run)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await proxy.aclose()
    assert [r["status"] for r in client.results] == ["completed"]
    assert player.held_s * 1000 == pytest.approx(client.results[0]["metrics"]["audio_ms"], abs=1)
    assert gateway.metrics.turns["completed"] == 1  # (not asked again: it had come whole)


def cut_after_sending(monkeypatch, what: str) -> list[str]:
    """The gateway's socket drops right after its session puts ``what`` (part of a message)
    in its outbox, before it is written: the message comes in the replay of the resume."""
    from gateway.io.connection import SessionRunner

    send, cut = SessionRunner.send, []

    def sending(runner, item) -> None:
        send(runner, item)
        if not cut and isinstance(item, str) and what in item:
            cut.append(item)
            runner.connection.ws.transport.abort()

    monkeypatch.setattr(SessionRunner, "send", sending)
    return cut


@pytest.mark.slow
async def test_a_refusal_in_the_replay_is_not_taken_for_a_transcript_lost(gateway, tmp_path,
                                                                          monkeypatch):
    """protocol.md, Resume: a transcript is lost when session.resumed's turn_id is still the
    last turn seen start, unless its refusal is in the replay. The client sent a refused
    transcript again, and took its second refusal for the next transcript's, whose reply
    then went unheard."""
    cut = cut_after_sending(monkeypatch, '"text_too_long"')
    client = _Recording(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer())
    await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                      sequential=True, barge_in_after=None))
    assert cut and client.resumes == 1 and client.resumes_failed == 0
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    assert gateway.metrics.errors["text_too_long"] == 1  # (not sent again)


@pytest.mark.slow
async def test_settings_answered_in_the_replay_are_refused_once(gateway, tmp_path,
                                                                monkeypatch):
    """The settings' answer lost with the socket comes in the replay: their refusal
    (``frame_ms`` 33), not the refusal of the transcript sent next; answered, they are not
    sent again (sent again at once, their second refusal was taken for the transcript's)."""
    cut = cut_after_sending(monkeypatch, '"invalid_field"')
    client = _Recording(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer(), settings={"frame_ms": 33})
    await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                      sequential=True, barge_in_after=None))
    assert cut and client.resumes == 1 and client.resumes_failed == 0
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    (refused,) = [x for x in client.lines if "settings refused" in x]
    assert "frame_ms" in refused
    assert gateway.metrics.errors["invalid_field"] == 1


class _PingsAfterTheFirstResume(_Recording):
    """Sends a ``ping`` (id ``"fence"``) on the first resumed socket, right after what it
    sends on its ``session.resumed``: the gateway reading it has read all before it."""

    async def _resume(self, ws, created) -> bool:
        resumed = await super()._resume(ws, created)
        if resumed and self.resumes == 1:
            await ws.send('{"type": "ping", "id": "fence"}')
        return resumed


@pytest.mark.slow
async def test_settings_answered_twice_in_one_replay_are_refused_once(gateway, tmp_path,
                                                                     monkeypatch):
    """Two drops in a row, the settings unanswered: the first socket drops with their
    refusal unsent, the second once the gateway has read what the client sent on it, its
    replay held up on the way. The client sent the settings again on the second socket as
    soon as it was resumed, so the third socket's replay held two refusals of them, and the
    client, expecting one, took the second for the refusal of the transcript it had sent,
    whose reply it then gave up (or printed an error of nothing it had sent)."""
    from gateway.core.codec import ClientPing
    from gateway.io.connection import SessionRunner, VoiceConnection

    cut = cut_after_sending(monkeypatch, '"invalid_field"')
    write, receive, held = VoiceConnection._write_outbox, SessionRunner.receive, []

    async def writing(connection) -> None:  # the first resume's replay is held up
        if connection._writer_first is not None and not held:
            held.append(connection)
            first, connection._writer_first = connection._writer_first, None
            await connection.ws.send(first)  # (session.resumed)
            await asyncio.Event().wait()  # until the socket goes
        await write(connection)

    def receiving(runner, message, now) -> bool:
        acted = receive(runner, message, now)
        if message == ClientPing("fence"):
            runner.connection.ws.transport.abort()
        return acted

    monkeypatch.setattr(VoiceConnection, "_write_outbox", writing)
    monkeypatch.setattr(SessionRunner, "receive", receiving)
    client = _PingsAfterTheFirstResume(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                                       phone_client.ClockPlayer(), settings={"frame_ms": 33})
    await unless_hung(client.run(phone_client._from_list(["x" * 4001, "Hello"]),
                                      sequential=True, barge_in_after=None))
    assert cut and held and client.resumes == 2 and client.resumes_failed == 0
    assert [(r["status"], r.get("error", {}).get("code")) for r in client.results] == [
        ("refused", "text_too_long"), ("completed", None)]
    (refused,) = [x for x in client.lines if "invalid_field" in x]
    assert refused.startswith("[settings refused") and "frame_ms" in refused


class _MarksBadly(_Recording):
    """Sends, at once with its first transcript, a ``playback`` mark the gateway refuses
    (``played_ms`` -1, as a player whose count went wrong would send), named ``bad-mark``."""

    marked = False

    async def _send(self, **message) -> None:
        if message.get("type") == "transcript" and not self.marked:
            self.marked = True
            await super()._send(type="playback", event_id="bad-mark", turn_id=1, played_ms=-1)
        await super()._send(**message)


@pytest.mark.slow
async def test_a_refusal_that_names_another_message_is_not_the_transcripts(gateway, tmp_path):
    """The client matched an ``error`` without a turn to what it sent by order: the first
    refusal while a transcript waited for its turn was that transcript's. A mark refused
    just before it (two messages sent at once) was taken for the transcript's refusal: the
    client recorded it refused and went on, and its reply, which came, was not waited for.
    Each message now has its ``event_id``, and an error that names one is that one's."""
    client = _MarksBadly(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                         phone_client.ClockPlayer())
    await unless_hung(client.run(phone_client._from_list(["Hello"]), sequential=True,
                                      barge_in_after=None))
    assert gateway.metrics.errors["invalid_field"] == 1  # (the mark's)
    assert [r["status"] for r in client.results] == ["completed"]
    (refused,) = [x for x in client.lines if "invalid_field" in x]
    assert refused.endswith("(bad-mark)]"), refused


async def test_each_message_is_named_and_a_failed_turn_keeps_its_error(
        start_gateway, refused_port, tmp_path, monkeypatch):
    """protocol.md, Errors: a turn's error names the transcript that started it. The client
    names every message it sends (a short id, never the same twice), and a failed turn's
    result (its ``turn.done``) carries the turn's own error: the one naming its transcript."""
    from gateway.core.codec import ClientPlayback, ClientSessionUpdate, ClientTranscript

    received = record_received(monkeypatch)
    gw = await start_gateway(REPLIES, llm={"url": f"http://127.0.0.1:{refused_port}/v1"})
    client = _Recording(f"ws://127.0.0.1:{gw.port}/v1/voice", tmp_path,
                        phone_client.ClockPlayer(), settings={"frame_ms": 20})
    await unless_hung(client.run(phone_client._from_list(["Hello", "Time"]),
                                      sequential=True, barge_in_after=None))
    named = [m.event_id for m in received
             if isinstance(m, ClientTranscript | ClientSessionUpdate | ClientPlayback)]
    assert isinstance(received[0], ClientSessionUpdate)
    assert all(named) and len(set(named)) == len(named), named
    said = [m.event_id for m in received if isinstance(m, ClientTranscript)]
    assert [(r["status"], r["error"]["code"], r["error"]["event_id"])
            for r in client.results] == [("failed", "llm_unavailable", said[0]),
                                         ("failed", "llm_unavailable", said[1])]


def _notes_on_lines_of_their_own(err: str) -> bool:
    """Every ``[...]`` note of the client's stderr starts its line (the replies' text here
    has no bracket of its own)."""
    return all(line.find("[") in (-1, 0) for line in err.splitlines())


@pytest.mark.slow
async def test_a_barge_in_note_starts_its_own_line_after_the_reply_text(gateway, tmp_path,
                                                                        capsys):
    """The reply's text is printed on stderr as it comes, with no line break of its own:
    "[barge-in]" went on at the end of its words ("It is noon.[barge-in]"). stdout, which
    scripts read, is still the WAV files' paths and nothing else."""
    out = tmp_path / "turns"
    rc = await asyncio.to_thread(phone_client.main, [
        "--url", f"ws://127.0.0.1:{gateway.port}/v1/voice", "--out", str(out),
        "--barge-in-after", "0.6", "Time", "Hello"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "It is noon." in captured.err and "\n[barge-in]\n" in captured.err, captured.err
    assert _notes_on_lines_of_their_own(captured.err), captured.err
    assert captured.out == f"{out / 'turn-001.wav'}\n{out / 'turn-002.wav'}\n"


@pytest.mark.slow
async def test_a_dropped_socket_note_starts_its_own_line_after_the_reply_text(
        gateway, tmp_path, capsys):
    """A socket dropped mid-reply: its note ("[connection failed: ...]", now
    "[disconnected: ...]") went on at the end of the reply's words printed so far."""
    proxy = CuttingProxy(gateway.port, cut_after=60_000)  # about 1.2 s of audio in
    port = await proxy.start()
    try:
        rc = await asyncio.to_thread(phone_client.main, [
            "--url", f"ws://127.0.0.1:{port}/v1/voice", "--out", str(tmp_path), "Time"])
    finally:
        await proxy.aclose()
    assert rc == 0 and proxy.cut.is_set()
    captured = capsys.readouterr()
    assert "It is noon." in captured.err and "\n[disconnected: " in captured.err
    assert _notes_on_lines_of_their_own(captured.err), captured.err
    assert captured.out == f"{tmp_path / 'turn-001.wav'}\n"


async def _says_nothing():
    """A user who never speaks: the client stays connected, waiting for a transcript."""
    await asyncio.Event().wait()
    yield ""  # (never reached)


async def test_after_the_gateway_goes_each_reconnect_attempt_is_one_note(gateway, tmp_path):
    """Once connected, the client reconnects for as long as it takes (a restart's gateway
    comes back; protocol.md, Resume), each wait bounded (``RECONNECT_S``). Each attempt
    printed two notes, "[connection failed: ...]" then "[disconnected; reconnecting in
    ...]" (the second even when it had never connected), and the gateway's own close said
    no reason at all. Now one note per attempt says why, and how long until the next."""
    client = _Said(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                   phone_client.ClockPlayer())
    run = asyncio.create_task(client.run(_says_nothing(), sequential=False,
                                         barge_in_after=None))
    try:
        while not (await unless_hung(client.said.get())).startswith("[connected"):
            pass
        await gateway.aclose()
        after: list[str] = []
        while sum(line.startswith("[connection failed") for line in after) < 2:
            got = asyncio.create_task(client.said.get())
            await unless_hung(asyncio.wait({run, got}, return_when=asyncio.FIRST_COMPLETED))
            if run.done():
                got.cancel()
                run.result()  # (raises what stopped it)
                pytest.fail("the client stopped:\n" + "\n".join(client.lines))
            after.append(got.result())
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    closed, *attempts = after
    assert re.fullmatch(r"\[disconnected: closed by the gateway \(1001[^)]*\); reconnecting "
                        r"in \d+\.\d s\]", closed), after
    assert len(attempts) == 2 and all(
        re.fullmatch(r"\[connection failed: .+; reconnecting in \d+\.\d s\]", line)
        for line in attempts), after
