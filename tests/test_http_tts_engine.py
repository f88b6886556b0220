"""HttpTtsEngine against a scripted SSE test double and against mlx-audio's real server."""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engines.base import EngineError, SynthesisRequest, TtsEngine
from engines.http_tts import HttpTtsEngine
from tests.hang_guard import HANG_S
from tests.servers import EncodedSseServer, health_after_a_probe
from tests.tts_servers.sse_tts_double import DONE, ScriptedSseServer, delta


@pytest.fixture
def sse_server():
    server = ScriptedSseServer()
    url = server.start()
    yield server, url
    server.stop()


@contextlib.contextmanager
def loaded_engines(url: str) -> Iterator[Callable[..., HttpTtsEngine]]:
    """``load(**options)``: an HttpTtsEngine on ``url``, loaded; every one it made is
    closed on the way out."""
    engines: list[HttpTtsEngine] = []

    def load(**options: Any) -> HttpTtsEngine:
        engine = HttpTtsEngine(url, **options)
        engine.load()
        engines.append(engine)
        return engine

    try:
        yield load
    finally:
        for engine in engines:
            engine.close()


@pytest.fixture
def engine_for(sse_server):
    with loaded_engines(sse_server[1]) as load:
        yield lambda **kw: load(model="tts-1", voice="serena", **kw)


def failure_after_a_chunk(engine: HttpTtsEngine) -> EngineError:
    """The ``engine_failed`` a stream of "x" raises at its second step, its first having
    given the script's first delta (``b"\\x00\\x00"``)."""
    stream = engine.open(SynthesisRequest("x"))
    assert stream.step() == b"\x00\x00"
    with pytest.raises(EngineError) as err:
        stream.step()
    assert err.value.code == "engine_failed"
    return err.value


def run(stream):
    out = []
    while (chunk := stream.step()) is not None:
        out.append(chunk)
    return out


ONE_DELTA = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n"
                     for event in (delta(b"\x01\x00\x02\x00"), DONE))
"""An SSE answer of one audio delta (``\x01\x00\x02\x00``) and its end, not encoded."""


def read_through(server: EncodedSseServer) -> list[bytes]:
    """Every chunk an engine reads from ``server``'s one answer; both closed after."""
    engine = HttpTtsEngine(server.url)
    engine.load()
    try:
        return run(engine.open(SynthesisRequest("x")))
    finally:
        engine.close()
        server.close()


def test_sse_deltas_are_returned_one_per_step(sse_server, engine_for):
    server, _ = sse_server
    server.script = [delta(b"\x01\x00\x02\x00"), delta(b"\x03\x00"), DONE]
    engine = engine_for()
    assert isinstance(engine, TtsEngine) and engine.lane == "remote"
    stream = engine.open(SynthesisRequest("Hello.", seed=5, temperature=0.6))
    assert run(stream) == [b"\x01\x00\x02\x00", b"\x03\x00"]
    assert stream.step() is None
    body = server.requests[0]
    assert body == {
        "input": "Hello.",
        "model": "tts-1",
        "voice": "serena",
        "response_format": "pcm",
        "stream_format": "sse",
        "temperature": 0.6,
        "seed": 5,
    }


@pytest.mark.parametrize(("model", "option", "fmt", "sent"), [
    ("gpt-4o-mini-tts", None, "sse", {"instructions": "whisper"}),
    ("qwen3", None, "pcm", {"instruct": "whisper"}),  # mlx-audio's name for them
    ("tts-1", None, "sse", {}),  # OpenAI's reference: they do not work with tts-1
    ("tts-1-hd", True, "sse", {"instructions": "whisper"}),  # unless the option says so
    ("gpt-4o-mini-tts", False, "sse", {}),
])
def test_instructions_go_on_under_the_servers_name(sse_server, model, option, fmt, sent):
    """Style instructions never left the gateway (the HTTP API noted them ignored for any
    ``http`` engine): they go on as OpenAI's ``instructions``, or mlx-audio's ``instruct``
    (its server ignores a field it does not know), but to a model said not to take them."""
    server, url = sse_server
    server.script = [delta(b"\x01\x00"), DONE]
    engine = HttpTtsEngine(url, model=model, format=fmt, instructions=option)
    engine.load()
    try:
        assert engine.instructions is bool(sent)
        stream = engine.open(SynthesisRequest("Hi.", options={"instructions": "whisper"}))
        with contextlib.suppress(EngineError):  # (the double answers SSE: not raw PCM)
            run(stream)
        plain = engine.open(SynthesisRequest("Hi."))
        with contextlib.suppress(EngineError):
            run(plain)
    finally:
        engine.close()
    styled, unstyled = server.requests
    assert {k: v for k, v in styled.items() if k.startswith("instruct")} == sent
    assert not any(k.startswith("instruct") for k in unstyled)


def test_a_model_named_in_extra_body_decides_whether_instructions_go_on():
    """``extra_body`` is merged into the request last, so a model set there is the one the
    server is asked for: OpenAI's ``tts-1`` there takes no instructions either (they went
    on, decided by the ``model`` option the request no longer carried)."""
    assert not HttpTtsEngine("http://127.0.0.1:9/v1", model="qwen3",
                             extra_body={"model": "tts-1"}).instructions
    assert HttpTtsEngine("http://127.0.0.1:9/v1", model="tts-1",
                         extra_body={"model": "gpt-4o-mini-tts"}).instructions
    assert HttpTtsEngine("http://127.0.0.1:9/v1", model="qwen3", instructions=True,
                         extra_body={"model": "tts-1"}).instructions
    assert HttpTtsEngine("http://127.0.0.1:9/v1", model="qwen3",
                         extra_body={"model": ["tts-1"]}).instructions  # (no TypeError)


def test_the_notes_of_a_servers_done_event_are_kept_bounded(sse_server, engine_for):
    """Another gateway says in ``speech.audio.done`` what it did not do as asked; the stream
    keeps those notes (the lane hands them to the HTTP API), bounded: a server's text goes
    into a response header."""
    server, _ = sse_server
    notes = ["instructions ignored: engine espeak does not take them", 7, "x" * 1000,
             *[f"note {i}" for i in range(20)]]
    server.script = [delta(b"\x01\x00"), {"type": "speech.audio.done", "notes": notes}]
    stream = engine_for().open(SynthesisRequest("Hi."))
    run(stream)
    assert stream.notes[0] == notes[0] and stream.notes[1] == "x" * 300
    assert len(stream.notes) == 7  # the first 8 items, the one not a string left out
    server.script = [delta(b"\x01\x00"), {"type": "speech.audio.done", "notes": "said"}]
    stream = engine_for().open(SynthesisRequest("Hi."))
    run(stream)
    assert stream.notes == ()


def test_done_markers_empty_events_and_other_kinds_are_skipped_and_a_speed_is_asked(
    sse_server, engine_for
):
    """What an OpenAI-style server may send among its deltas: an event with no data, a
    ``[DONE]`` line (chat completions' end marker), an event of a kind the engine has no
    use for. None is audio or an error; the deltas around them are all played. A request's
    speed other than 1.0 is asked of the server (the HTTP API's ``speed``)."""
    server, _ = sse_server
    server.script = [b"event: ping\ndata:\n\n", delta(b"\x01\x00"), b"data: [DONE]\n\n",
                     {"type": "speech.audio.progress", "done": 0.5}, delta(b"\x02\x00"), DONE]
    engine = engine_for()
    assert run(engine.open(SynthesisRequest("Hello.", speed=1.5))) == [b"\x01\x00", b"\x02\x00"]
    assert server.requests[0]["speed"] == 1.5
    run(engine.open(SynthesisRequest("Hello.")))
    assert "speed" not in server.requests[1]  # (the server's own pace)


def test_an_engine_opened_before_its_load_fails_and_a_second_load_keeps_its_client(
    sse_server,
):
    engine = HttpTtsEngine(sse_server[1])
    try:
        with pytest.raises(EngineError) as err:
            engine.open(SynthesisRequest("x"))
        assert (err.value.code, err.value.message) == (
            "engine_failed", "http engine used before load()")
        engine.load()
        client = engine._client
        engine.load()
        assert engine._client is client
    finally:
        engine.close()


def test_odd_byte_counts_are_carried_to_the_next_step(sse_server, engine_for):
    server, _ = sse_server
    server.script = [delta(b"\x01"), delta(b"\x00\x02\x00\x03"), delta(b"\x00"), DONE]
    assert b"".join(run(engine_for().open(SynthesisRequest("x")))) == b"\x01\x00\x02\x00\x03\x00"


def test_error_event_is_an_engine_failure(sse_server, engine_for):
    server, _ = sse_server
    server.script = [
        delta(b"\x00\x00"),
        {"type": "speech.audio.error", "error": {"message": "boom"}},
    ]
    stream = engine_for().open(SynthesisRequest("x"))
    assert stream.step() == b"\x00\x00"
    with pytest.raises(EngineError, match="boom") as err:
        stream.step()
    assert err.value.code == "engine_failed"
    assert stream.step() is None


@pytest.mark.parametrize("event", [
    {"type": "error", "error": {"message": "model exploded", "code": "server_error"}},
    b'event: error\ndata: {"error": {"message": "model exploded"}}\n\n',
    b'event: error\ndata: {"message": "model exploded"}\n\n',
    b"event: error\ndata: model exploded\n\n",
], ids=["type-error", "event-error", "event-error-flat", "event-error-text"])
def test_an_sse_error_event_of_any_spelling_fails_with_the_servers_message(
        sse_server, engine_for, event):
    """SSE servers name an error ``error`` too (OpenAI's own streams: ``"type": "error"``;
    others: an ``event: error`` line). Such an event was skipped, so the turn's error said
    only that the stream ended without ``speech.audio.done``, and the server's reason was
    lost."""
    server, _ = sse_server
    server.script = [delta(b"\x00\x00"), event]
    error = failure_after_a_chunk(engine_for())
    assert error.message == "TTS server error: model exploded"


@pytest.mark.parametrize("script", [[delta(b"\x00\x00"), "hangup"], [delta(b"\x00\x00")]])
def test_stream_ending_without_done_is_an_engine_failure(sse_server, engine_for, script):
    server, _ = sse_server
    server.script = script
    failure_after_a_chunk(engine_for())


def test_http_error_status_is_an_engine_failure(sse_server, engine_for):
    server, _ = sse_server
    server.status = 503
    with pytest.raises(EngineError, match="503") as err:
        engine_for().open(SynthesisRequest("x")).step()
    assert err.value.code == "engine_failed"


@pytest.mark.parametrize("encoding", [b"", b"gzip,"], ids=["empty", "trailing-comma"])
def test_an_empty_content_encoding_names_no_encoding(encoding):
    """``Content-Encoding:`` with no value, or a list ending in a comma, names no encoding
    (httpx skipped the empty name); read as one, every sentence failed ("the TTS server
    sent its answer -encoded") and the fallback spoke it."""
    import gzip

    server = EncodedSseServer(encoding, gzip.compress(ONE_DELTA) if encoding else ONE_DELTA)
    assert read_through(server) == [b"\x01\x00\x02\x00"]


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS], ids=["zlib", "raw"])
def test_a_deflate_answer_with_or_without_its_zlib_header_is_read(wbits):
    """``Content-Encoding: deflate`` is the zlib format, but some servers send raw deflate
    (no header) under that name, and httpx reads both: so does the engine's own decoder
    (``engines.sse_bound``), else a proxy or server answering so failed every sentence and
    the fallback spoke them all."""
    packer = zlib.compressobj(wbits=wbits)
    server = EncodedSseServer(b"deflate", packer.compress(ONE_DELTA) + packer.flush())
    assert read_through(server) == [b"\x01\x00\x02\x00"]


def test_a_deflate_answer_that_turns_to_garbage_fails_its_sentence():
    """Raw deflate is tried only when the answer's first bytes are no zlib stream: an
    answer that started well and then is damaged fails its sentence (``engine_failed``),
    not read again as something else."""
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS)
    first = b"data: " + json.dumps(delta(b"\x01\x00\x02\x00")).encode() + b"\n\n"
    good = packer.compress(first) + packer.flush(zlib.Z_SYNC_FLUSH)
    server = EncodedSseServer(b"deflate", good + b"\x06" * 8)  # (a block of no type)
    with pytest.raises(EngineError) as err:
        read_through(server)
    assert err.value.code == "engine_failed"
    assert "DecodingError('deflate answer: " in err.value.message


def test_an_error_page_it_cannot_decode_still_tells_the_status():
    """An error answer's body in an encoding the engine does not decode (a proxy's ``br``)
    failed the sentence naming the encoding, not the status the server answered."""
    server = EncodedSseServer(b"br", b"\x8b\x02\x80overloaded\x03",
                              status=b"503 Service Unavailable", content_type=b"text/plain")
    engine = HttpTtsEngine(server.url)
    engine.load()
    try:
        with pytest.raises(EngineError) as err:
            engine.open(SynthesisRequest("x")).step()
    finally:
        engine.close()
        server.close()
    assert err.value.code == "engine_failed"
    assert err.value.message.startswith(f"TTS server {server.url}/audio/speech answered 503: ")
    assert "body not decoded" in err.value.message


def test_unreachable_server_is_an_engine_failure():
    engine = HttpTtsEngine("http://127.0.0.1:9/v1", connect_timeout_s=2)
    engine.load()
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("x")).step()
    assert err.value.code in ("engine_failed", "engine_timeout")
    engine.close()


@pytest.mark.parametrize("url", ["127.0.0.1:9/v1", "localhost:9/v1/audio/speech",
                                 "ftp://127.0.0.1:9/v1", "http:///v1", "http://[::1/v1",
                                 "http://127.0.0.1:99999/v1", "http://127.0.0.1:abc/v1"])
def test_a_url_without_scheme_or_host_is_refused_at_start_not_at_each_sentence(url):
    """The LLM's url is checked at start; the TTS server's was not: `--tts-url
    127.0.0.1:9/v1` started a gateway whose every sentence failed (engine_failed,
    "Request URL is missing an 'http://' or 'https://' protocol")."""
    from gateway.config import load_config
    from gateway.io.server import Gateway

    with pytest.raises(ValueError, match=r"^the http engine's url must be http\(s\)://"):
        Gateway(load_config(server={"port": 0}, tts={"engine": "http", "url": url}))
    with pytest.raises(ValueError, match=r"^the fallback \(\[tts\] fallback, "
                                         r"\[tts.fallback_options\]\): the http engine's url"):
        Gateway(load_config(server={"port": 0}, tts={"fallback": "http",
                                                     "fallback_options": {"url": url}}))
    HttpTtsEngine("https://tts.example/v1").close()  # (with its scheme and host: taken)


def test_close_mid_stream_disconnects_and_the_engine_goes_on(sse_server, engine_for):
    server, _ = sse_server
    server.script = [delta(b"\x00\x00"), DONE]
    server.hold = True
    engine = engine_for()
    stream = engine.open(SynthesisRequest("x"))
    assert stream.step() == b"\x00\x00"
    stream.close()
    assert stream.step() is None
    assert server.disconnected.wait(timeout=HANG_S)
    server.hold = False
    assert run(engine.open(SynthesisRequest("again"))) == [b"\x00\x00"]


@pytest.mark.parametrize("headers", [True, False], ids=["mid-answer", "before-its-answer"])
def test_no_first_audio_in_time_fails_fast_when_asked(sse_server, engine_for, headers):
    """``first_audio_timeout_s`` (a fallback's probe asks it): a server that took the request
    and says nothing fails the step then (``engine_timeout``), not at the read timeout, and
    is let go; audio in time is not cut."""
    server, url = sse_server
    if headers:
        server.script = ["stall"]
        engine = engine_for(read_timeout_s=30)
    else:
        silent = SilentServer(headers=False)
        engine = HttpTtsEngine(silent.url, read_timeout_s=30)
        engine.load()
    with pytest.raises(EngineError, match=r"no audio within 0\.2 s") as err:
        engine.open(SynthesisRequest("x", options={"first_audio_timeout_s": 0.2})).step()
    assert err.value.code == "engine_timeout"
    if headers:
        assert server.disconnected.wait(timeout=HANG_S)
        server.script = [delta(b"\x01\x00"), DONE]
        assert run(engine.open(SynthesisRequest(
            "in time", options={"first_audio_timeout_s": 30}))) == [b"\x01\x00"]
    else:
        assert silent.left.wait(timeout=HANG_S)
        engine.close()
        silent.close()


def _wav(pcm: bytes, rate: int = 24_000) -> bytes:
    """A mono 16-bit WAV file of ``pcm`` (the standard library writes it)."""
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


@pytest.fixture
def raw_server():
    """TEST DOUBLE: a raw-PCM (mlx-audio style) server answering ``body`` in the pieces
    ``pieces`` cuts it into (one network chunk each), with ``content_type``."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    answer: dict = {}

    async def speech(request):
        await request.body()

        async def chunks():
            for piece in answer["pieces"]:
                yield piece

        return StreamingResponse(chunks(), media_type=answer.get("type", "audio/pcm"))

    server = ScriptedSseServer()  # (its uvicorn runner, with this app's route instead)
    server._server.config.app = Starlette(routes=[Route("/v1/audio/speech", speech,
                                                        methods=["POST"])])
    url = server.start()
    with loaded_engines(url) as load:

        def make(pieces, content_type="audio/pcm"):
            answer.update(pieces=pieces, type=content_type)
            return load(format="pcm")

        yield make
    server.stop()


def cut(data: bytes, *sizes: int) -> list[bytes]:
    """``data`` in pieces of ``sizes`` bytes, then the rest."""
    pieces = []
    for size in sizes:
        pieces.append(data[:size])
        data = data[size:]
    return [*pieces, data]


PCM = bytes(range(1, 201)) * 24  # 4,800 bytes: 100 ms at 24 kHz


@pytest.mark.parametrize(("pieces", "content_type"), [
    (cut(_wav(PCM), 7, 40, 3), "audio/wav"),  # a header cut across network chunks
    (cut(_wav(PCM[:2000]) + _wav(PCM[2000:]), 2100), "audio/wav"),  # mlx-audio's wav stream
    ([_wav(PCM)], "audio/pcm"),  # said to be PCM, but it is a WAV file
    ([_wav(PCM, rate=22_050)], "audio/wav"),
], ids=["cut-header", "one-file-per-chunk", "mislabelled", "22050"])
def test_a_wav_answer_is_an_engine_failure_not_samples(raw_server, pieces, content_type):
    """A raw-PCM server that sends WAV instead had its header played as samples: a loud
    click at the sentence's start ("RIFF" is 18,770 as a sample), and a rate other than
    24 kHz went out at the wrong pitch and pace, without a word in the log. Failing, the
    sentence goes to the fallback, and the error says why."""
    engine = raw_server(pieces, content_type)
    with pytest.raises(EngineError, match="WAV file, not raw PCM") as err:
        run(engine.open(SynthesisRequest("x")))
    assert err.value.code == "engine_failed"


def test_an_empty_raw_answer_is_no_audio_not_an_error(raw_server):
    """A raw-PCM server's 200 with no body (nothing to say: a text of punctuation alone):
    the raw format has no end marker to miss, so the segment ends silent, as an engine's
    that made no audio."""
    engine = raw_server([b""])
    stream = engine.open(SynthesisRequest("…"))
    assert stream.step() is None and stream.step() is None


def test_raw_pcm_is_played_as_it_comes(raw_server):
    engine = raw_server(cut(PCM, 5, 6))  # tiny and odd pieces: carried, not lost
    assert b"".join(run(engine.open(SynthesisRequest("x")))) == PCM


# --- in the gateway ----------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [None, "espeak"])
async def test_a_remote_engine_gives_up_reading_before_the_lane_gives_up_on_it(
        start_gateway, fallback):
    """A TTS server that stalls must fail its sentence (``engine_timeout``, which a fallback
    then speaks) before the lane's step deadline makes the whole lane unhealthy. Both
    waited 30 s, and the lane's wait started first: a stalled server made /health 503 and
    failed every session's turn on the lane with ``engine_unavailable``, and the fallback
    never spoke."""
    from gateway.config import load_config
    from gateway.io.server import Gateway

    tts = {"engine": "http", "url": "http://127.0.0.1:9/v1", "fallback": fallback}
    gw = await start_gateway(tts=tts)
    remote = gw.engine.primary if fallback else gw.engine
    assert remote._timeout.read == remote.read_timeout_s < gw.lane.step_timeout_s
    for options, step in (({"read_timeout_s": 30}, 30), ({}, 5)):
        with pytest.raises(ValueError, match=r"read_timeout_s \(\d+ s\) must be below "
                                             r"\[tts\] step_timeout_s"):
            Gateway(load_config(server={"port": 0}, tts={**tts, "options": options,
                                                         "step_timeout_s": step}))


async def test_a_stalled_server_fails_its_sentence_and_the_fallback_speaks_it(
        sse_server, start_gateway):
    from websockets.asyncio.client import connect

    from tests.wsclient import gapless, read_turn, recv_event, send

    server, url = sse_server
    server.script = lambda body: ["stall"] if "stalls" in body["input"] else \
        [delta(b"\x01\x00" * 2400), DONE]
    gw = await start_gateway(tts={"engine": "http", "url": url, "fallback": "espeak",
                                  # (not shorter: it bounds the fine requests too)
                                  "options": {"read_timeout_s": 2},
                                  # (a slow machine's first chunks must not trip the breaker)
                                  "fallback_policy": {"first_chunk_timeout_s": 60}},
                             session={"max_lead_ms": 30_000})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws, \
            connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as other:
        for socket in (ws, other):
            await recv_event(socket, "session.created")
        await send(ws, type="say", text="This sentence stalls. The next one is fine.")
        await send(other, type="say", text="Another session speaks.")
        stalled, fine = await read_turn(ws), await read_turn(other)
        assert stalled.done["status"] == "completed" and not stalled.of("error")
        assert [s["engine"] for s in stalled.of("sentence")] == ["espeak", "http"]
        gapless(stalled)
        assert fine.done["status"] == "completed" and fine.done["metrics"]["engines"] == ["http"]
        assert server.disconnected.wait(timeout=HANG_S)  # the stalled request was let go
    assert gw.lane.unhealthy is None and gw.health()["status"] == "ok"


@pytest.mark.parametrize("fallback", [None, "espeak"])
async def test_an_answer_kept_alive_without_audio_fails_its_sentence_only(sse_server,
                                                                         start_gateway,
                                                                         fallback):
    """A TTS server that stalls but keeps its SSE answer alive with comments (sse-starlette
    pings every 15 s) is never silent for ``read_timeout_s``: the step waited until the
    lane's ``step_timeout_s``, which made the remote lane unhealthy for every session
    (``engine_unavailable``, /health 503), for good while the pings went on. It must fail
    its own sentence (``engine_timeout``, which a fallback speaks) within
    ``read_timeout_s``, as a silent server does."""
    from websockets.asyncio.client import connect

    from tests.wsclient import read_turn, recv_event, send

    server, url = sse_server
    server.script = lambda body: ["pings"] if "pings" in body["input"] else \
        [delta(b"\x01\x00" * 2400), DONE]
    # (a slow machine's first chunks must not trip the breaker)
    policy = {"fallback_policy": {"first_chunk_timeout_s": 60}} if fallback else {}
    gw = await start_gateway(tts={"engine": "http", "url": url, "fallback": fallback,
                                  # (not shorter: they bound the fine steps too)
                                  "step_timeout_s": 6, "options": {"read_timeout_s": 2},
                                  **policy})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws, \
            connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as other:
        for socket in (ws, other):
            await recv_event(socket, "session.created")
        await send(ws, type="say", text="This sentence only pings.")
        pinged = await read_turn(ws)
        await send(other, type="say", text="Another session speaks.")
        fine = await read_turn(other)
    if fallback:
        assert pinged.done["status"] == "completed"
        assert [s["engine"] for s in pinged.of("sentence")] == ["espeak"]
    else:
        assert pinged.done["status"] == "failed"
        (error,) = pinged.of("error")
        assert error["error"]["code"] == "engine_timeout", error
        assert "no audio within 2 s" in error["error"]["message"]
    assert fine.done["status"] == "completed" and fine.done["metrics"]["engines"] == ["http"]
    assert server.disconnected.wait(timeout=HANG_S)  # the pinging answer was let go
    assert gw.lane.unhealthy is None


class SilentServer:
    """TEST DOUBLE: a TTS server that takes a request and then says nothing more: no answer
    at all, or (``headers=True``) an SSE answer's headers and one delta. ``stalled`` is set
    once it went quiet; ``left`` once the client closed its connection. The first
    ``answered`` requests get a whole raw-PCM answer (``ANSWER``), on a connection kept
    alive, before it goes quiet."""

    ANSWER = b"\x01\x00\x02\x00"

    def __init__(self, headers: bool, answered: int = 0) -> None:
        import socket
        import threading

        self.headers, self.answered = headers, answered
        self.stalled, self.left = threading.Event(), threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # (closed)
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        import base64
        import re

        with conn:
            data = b""
            while True:  # (one request after another on this connection)
                while b"\r\n\r\n" not in data:
                    if not (more := conn.recv(65536)):
                        return
                    data += more
                if not self.answered:
                    break
                self.answered -= 1
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"content-length: *(\d+)", head, re.I)[1])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\n"
                             b"content-length: %d\r\n\r\n" % len(self.ANSWER) + self.ANSWER)
            if self.headers:
                event = b'data: {"type": "speech.audio.delta", "audio": "' + \
                    base64.b64encode(b"\x01\x00" * 480) + b'"}\n\n'
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" +
                             f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.stalled.set()
            while conn.recv(65536):  # (the rest of the request body, if any)
                pass
            self.left.set()

    def close(self) -> None:
        import socket

        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept)
        self._listener.close()


def test_a_raw_pcm_request_after_another_is_cut_at_once_while_it_waits_for_its_answer():
    """A raw-PCM request on a connection a whole answer had left in the pool could not be
    cut while it waited for the server's headers (the stream learnt its socket from them):
    a barge-in during a stalled answer held the step, and its lane place, until the read
    timeout (20 s), and the server worked on for nobody."""
    from concurrent.futures import ThreadPoolExecutor

    server = SilentServer(headers=False, answered=1)
    engine = HttpTtsEngine(server.url, format="pcm", read_timeout_s=3000)
    engine.load()
    try:
        assert run(engine.open(SynthesisRequest("whole"))) == [SilentServer.ANSWER]
        stream = engine.open(SynthesisRequest("stalls"))
        with ThreadPoolExecutor(1) as pool:
            step = pool.submit(stream.step)
            assert server.stalled.wait(HANG_S)  # (the step waits for the headers)
            stream.interrupt()
            try:
                assert step.result(timeout=HANG_S) is None  # (a guard against hanging, not a time)
            finally:
                engine.interrupt()  # (main: the step waited for the read timeout)
        assert server.left.wait(HANG_S)
    finally:
        engine.close()
        server.close()


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_an_sse_line_that_never_ends_fails_its_sentence(monkeypatch, gzip):
    """httpx-sse holds a line until its end: a TTS server (or proxy) sending one that never
    ends was read into memory until the read timeout, three times its size (256 MiB sent:
    +773 MiB). Past ``MAX_EVENT_BYTES`` without an event the sentence fails and the
    connection is let go. The bound counts the body as the parser gets it: a gzip answer
    (a proxy compressing text/event-stream; httpx asked for gzip) was counted as it came on
    the wire, so 1 GiB of one line took ~1 MiB there, under the bound, and grew the gateway
    by 1,060 MiB. A real server on a socket; the bound lowered to 1 MiB so that what main
    reads whole stays small."""
    import contextlib
    import socket
    import threading
    import zlib

    import engines.http_tts

    monkeypatch.setattr(engines.http_tts, "MAX_EVENT_BYTES", 1 << 20, raising=False)
    listener = socket.create_server(("127.0.0.1", 0))
    sent = []
    packer = zlib.compressobj(wbits=31)  # (the gzip format)

    def body(data: bytes) -> bytes:
        return packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH) if gzip else data

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         + (b"content-encoding: gzip\r\n" if gzip else b"")
                         + b"connection: close\r\n\r\n" + body(b"data: "))
            with contextlib.suppress(OSError):  # (the client cut it)
                for _ in range(64):
                    conn.sendall(body(b"a" * (1 << 20)))
                    sent.append(1)
                conn.sendall(body(b"\n\n"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    engine = HttpTtsEngine(f"http://127.0.0.1:{listener.getsockname()[1]}/v1")
    engine.load()
    with pytest.raises(EngineError, match="without ending an SSE event") as err:
        engine.open(SynthesisRequest("x")).step()
    assert err.value.code == "engine_failed"
    thread.join(timeout=HANG_S)
    # (socket buffers: a few MiB more; gzip'd, the 64 MiB fit in them)
    assert not thread.is_alive() and (gzip or len(sent) < 64)
    engine.close()
    listener.close()


def test_a_compressed_answer_that_decodes_huge_holds_no_more_than_its_bound(monkeypatch):
    """httpx decoded each read whole before the bound counted it: 600 bytes on the wire,
    gzip'd twice (``Content-Encoding: gzip, gzip``, both layers decoded), became one 64 MiB
    piece (256 MiB: +567 MiB) per sentence. The engine asks for no compression, and an
    answer compressed anyway is decoded a bounded piece at a time: the sentence fails at
    the bound as an uncompressed one does, holding about the bound. The bound lowered to
    1 MiB, as above."""
    import gzip
    import tracemalloc

    import engines.http_tts

    monkeypatch.setattr(engines.http_tts, "MAX_EVENT_BYTES", 1 << 20, raising=False)
    server = EncodedSseServer(b"gzip, gzip", gzip.compress(gzip.compress(
        b"data: " + b"x" * (64 << 20))))
    engine = HttpTtsEngine(server.url)
    engine.load()
    tracemalloc.start()
    try:
        with pytest.raises(EngineError, match="without ending an SSE event") as err:
            engine.open(SynthesisRequest("x")).step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        engine.close()
        server.close()
    assert err.value.code == "engine_failed"
    assert peak < 4 << 20, f"{peak:,} bytes"  # (1.8 MB; main: 149 MB)
    assert b"\r\naccept-encoding: identity\r\n" in server.request.lower()


@pytest.mark.parametrize("headers", [False, True], ids=["before-its-answer", "mid-answer"])
@pytest.mark.parametrize("role", ["primary", "fallback"])
async def test_closing_the_gateway_does_not_wait_for_a_stalled_tts_server(headers, role,
                                                                         refused_port):
    """A SIGTERMed gateway waited for the remote lane's step in flight, which waited for a
    silent server until its read timeout (30 s; past launchd's 20 s before it kills): the
    engine's close queued behind it on the lane thread. Closing now cuts the connections
    the step waits on, a fallback's too (speaking for a primary that cannot be reached:
    nothing tested that ``FallbackEngine`` and ``FallbackStream`` pass ``interrupt`` on)."""
    import asyncio

    from websockets.asyncio.client import connect

    from gateway.config import load_config
    from gateway.io.server import Gateway
    from tests.wsclient import recv_event, send

    server = SilentServer(headers)
    stalled = {"url": server.url, "options": {"read_timeout_s": 3000}}
    if role == "fallback":
        stalled = {"url": f"http://127.0.0.1:{refused_port}/v1", "fallback": "http",
                   "fallback_options": {"url": server.url, "read_timeout_s": 3000}}
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "http", "step_timeout_s": 3600, **stalled}))  # no deadline ends the wait
    await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="Hello there.")
            assert await asyncio.to_thread(server.stalled.wait, 30)
            await asyncio.wait_for(gw.aclose(), 60)  # (a guard against hanging, not a time)
        assert await asyncio.to_thread(server.left.wait, 30)
    finally:
        await asyncio.wait_for(gw.aclose(), 60)
        server.close()


@pytest.mark.parametrize("fallback", [None, "espeak"])
async def test_a_tts_server_down_at_start_is_told_by_health_metrics_and_the_log(
        fallback, caplog, sse_server, refused_port):
    """``serve --tts http --tts-url`` with nothing listening said nothing at start and
    /health said ok; the first turn failed (engine_failed, Connection refused), and only
    then came a WARNING and "degraded". The server is probed now, as the LLM's is: at start
    (a WARNING, once), /health ``lanes.remote.server`` and ``gateway_tts_reachable`` say
    it, the status is degraded; its return is an INFO, and ok again. The probe asks the
    model list beside the speech endpoint (this double has none: a 404 is an answer too),
    never a synthesis."""
    import logging

    import httpx

    from gateway.config import load_config
    from gateway.io.server import Gateway

    server, up = sse_server
    down = f"http://127.0.0.1:{refused_port}/v1"
    tts = {"engine": "http", "url": down, **({"fallback": fallback} if fallback else {})}
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts=tts))
    caplog.set_level(logging.INFO, logger="gateway.io.telemetry")
    await gw.start()
    probe = gw.telemetry.tts_probes["remote"]
    asked = probe.probe_url
    try:
        await probe._task  # the probe at start
        await probe.probe()  # still down: no second line
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            health_down = (await http.get("/health")).json()
            metrics_down = (await http.get("/metrics")).text.splitlines()
            probe.probe_url = up + "/models"  # the server is up (here: on another port)
            probe.checked_at -= probe.interval_s  # and the last check is stale
            await http.get("/metrics")  # a scrape alone probes too
            await probe._task
            health_up = (await http.get("/health")).json()
            metrics_up = (await http.get("/metrics")).text.splitlines()
    finally:
        await gw.aclose()
    assert asked == down + "/models"
    assert health_down["status"] == "degraded"
    shown = health_down["lanes"]["remote"]["server"]
    assert shown["url"] == down + "/audio/speech" and shown["reachable"] is False
    assert shown["detail"].startswith("ConnectError")
    assert 'gateway_tts_reachable{lane="remote"} 0.0' in metrics_down
    assert health_up["status"] == "ok"
    assert health_up["lanes"]["remote"]["server"]["reachable"] is True
    assert health_up["lanes"]["remote"]["server"]["detail"] == "HTTP 404"
    assert 'gateway_tts_reachable{lane="remote"} 1.0' in metrics_up
    assert server.requests == []  # no synthesis
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "gateway.io.telemetry"]
    meanwhile = "the fallback espeak speaks its sentences" if fallback else \
        "its sentences fail with engine_failed"
    assert len(said) == 2, said
    assert said[0][0] == "WARNING" and said[0][1].startswith(
        f"the TTS server of lane remote at {down}/audio/speech does not answer (ConnectError")
    assert said[0][1].endswith(f"): {meanwhile} until it does")
    # (the log names the engine's URL: the test moved only the probe)
    assert said[1] == ("INFO", f"the TTS server of lane remote at {down}/audio/speech answers "
                               "again (HTTP 404)")


@pytest.mark.parametrize("api_key", [None, "wrong"])
async def test_a_tts_server_that_refuses_the_gateways_key_is_told_at_start(
        api_key, caplog, start_gateway):
    """Gateway A speaking through gateway B's /v1/audio/speech (``engine = "http"``), B
    with tokens: A with a wrong ``api_key``, or none, started with /health ok and
    ``reachable: true`` (B's 401 to the probe counted as an answer) and no line in the log,
    then failed every sentence. A 401 or 403 is no answer now: a WARNING at start that says
    the key is refused, /health degraded. The right key: ok."""
    import logging

    import httpx

    caplog.set_level(logging.INFO, logger="gateway.io.telemetry")
    b = await start_gateway(server={"http_port": 0, "tokens": ["b-secret"]})
    url = f"http://127.0.0.1:{b.http_port}/v1"
    options = {"api_key": api_key} if api_key else {}
    a = await start_gateway(server={"http_port": 0},
                            tts={"engine": "http", "url": url, "options": options})
    good = await start_gateway(server={"http_port": 0}, tts={
        "engine": "http", "url": url, "options": {"api_key": "b-secret"}})
    healths = []
    for gw in (a, good):
        await gw.telemetry.tts_probes["remote"]._task  # the probe at start
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            healths.append((await http.get("/health")).json())
    refused, fine = healths
    why = "it refuses the api_key sent" if api_key else "it asks for an api_key, and none is set"
    assert refused["status"] == "degraded"
    assert refused["lanes"]["remote"]["server"]["reachable"] is False
    assert refused["lanes"]["remote"]["server"]["detail"] == f"HTTP 401: {why}"
    assert fine["status"] == "ok" and fine["lanes"]["remote"]["server"]["detail"] == "HTTP 200"
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "gateway.io.telemetry"]
    assert said == [("WARNING", f"the TTS server of lane remote at {url}/audio/speech refuses "
                                f"the gateway's requests (HTTP 401: {why}): its sentences "
                                "fail with engine_failed until it takes them")]


async def test_a_tts_server_that_times_out_at_start_is_said_to_fail_with_engine_timeout(
        caplog, monkeypatch):
    """A sentence that meets a timeout fails with engine_timeout, but the start-up WARNING
    of a probe that had timed out said the lane's sentences "fail with engine_failed".
    Here the server takes the connection (the kernel's backlog) and never answers."""
    import logging
    import socket

    from gateway.config import load_config
    from gateway.io import telemetry
    from gateway.io.server import Gateway

    monkeypatch.setattr(telemetry, "LLM_PROBE_TIMEOUT_S", 0.2)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0},
                                 tts={"engine": "http", "url": url}))
        caplog.set_level(logging.INFO, logger="gateway.io.telemetry")
        await gw.start()
        try:
            await gw.telemetry.tts_probes["remote"]._task  # the probe at start
        finally:
            await gw.aclose()
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.io.telemetry"]
    assert len(said) == 1 and said[0].startswith(
        f"the TTS server of lane remote at {url}/audio/speech does not answer (ReadTimeout")
    assert said[0].endswith("): its sentences fail with engine_timeout until it does")


@pytest.mark.parametrize("down", ["out of reach", "answering 500"])
async def test_an_idle_hub_is_ok_again_once_its_probe_reaches_a_tts_server_out_of_reach(
        down, caplog, sse_server, refused_port):
    """The TTS server down, one sentence fails (engine_failed, Connection refused), the
    server comes back: its probe said it answers, yet engine.failing and the status stayed
    degraded until a whole job, i.e. for good on a hub nobody talks to. A failing spell of
    a server out of reach now ends when a probe reaches it again; one of a server that
    answered the synthesis wrongly (500) still waits for a whole job."""
    import logging

    from gateway.config import load_config
    from gateway.io.server import Gateway
    from tests.wsclient import one_turn

    server, up = sse_server
    if down == "answering 500":
        server.status = 500
    url = f"http://127.0.0.1:{refused_port}/v1" if down == "out of reach" else up
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0},
                             tts={"engine": "http", "url": url}))
    caplog.set_level(logging.INFO, logger="gateway.io.lanes")
    await gw.start()
    probe = gw.telemetry.tts_probes["remote"]
    try:
        await probe._task  # the probe at start
        turn = await one_turn(gw.port, type="say", text="Is anybody there?")
        assert turn.done["status"] == "failed"
        failed = gw.health()
        probe.probe_url = up + "/models"  # the server is up (here: on another port)
        after = await health_after_a_probe(gw, probe)
    finally:
        await gw.aclose()
    assert failed["status"] == "degraded" and failed["engine"]["failing"] == "engine_failed"
    assert after["lanes"]["remote"]["server"]["reachable"] is True
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "gateway.io.lanes"]
    assert said[0][0] == "WARNING" and said[0][1].startswith(
        f"lane remote: http fails (engine_failed): TTS server {url}/audio/speech")
    if down == "out of reach":
        assert after["status"] == "ok" and after["engine"]["failing"] is None
        assert said[1:] == [("INFO", "lane remote: http's server answers again")]
    else:
        assert after["status"] == "degraded"
        assert after["engine"]["failing"] == "engine_failed" and said[1:] == []


# --- mlx-audio's real server -------------------------------------------------------------


@pytest.mark.slow
def test_raw_pcm_from_real_mlx_audio_server(mlx_audio_server):
    url, model = mlx_audio_server
    engine = HttpTtsEngine(url, model=model, voice="aria", format="pcm", read_timeout_s=120)
    engine.load()
    try:
        request = SynthesisRequest("Hello there.", options={"http_body": {"max_tokens": 8}})
        chunks = run(engine.open(request))
        assert all(len(c) % 2 == 0 for c in chunks)
        assert sum(len(c) for c in chunks) == 2 * 7680 * 2  # 8 codec frames of 24 kHz PCM16
        with pytest.raises(EngineError) as err:  # unknown voice: the server's error surfaces
            engine.open(
                SynthesisRequest("Hi.", voice="nobody", options={"http_body": {"max_tokens": 4}})
            ).step()
        assert err.value.code == "engine_failed"
    finally:
        engine.close()


def test_more_streams_at_once_than_an_http_pool_holds(sse_server, engine_for):
    """The lane interleaves its jobs on one thread, each stream holding its connection: past
    httpx's default 100, a stream's request waited for a connection only that same thread
    could free, and failed when its pool timeout ran out (engines review)."""
    server, _ = sse_server
    server.script = [delta(b"\x01\x00"), DONE]
    server.hold = True  # each answer stays open after its first delta
    engine = engine_for()
    streams = [engine.open(SynthesisRequest(f"Sentence {i}.")) for i in range(105)]
    assert [s.step() for s in streams] == [b"\x01\x00"] * 105
    for s in streams:
        s.close()


def test_a_compressed_pcm_answer_is_decoded_not_played_as_samples():
    """httpx asked for gzip; a server (or a proxy) that sends it must not have the gzip
    bytes played as PCM, as loud noise (engines review)."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pcm = bytes(range(256)) * 40

    class Gzipping(BaseHTTPRequestHandler):  # TEST DOUBLE: a raw-PCM server that gzips
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            body = gzip.compress(pcm)
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gzipping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = HttpTtsEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", format="pcm")
    engine.load()
    try:
        assert b"".join(run(engine.open(SynthesisRequest("x")))) == pcm
    finally:
        engine.close()
        server.shutdown()
        server.server_close()


def test_a_tts_urls_password_is_not_in_its_errors(refused_port):
    # (engine errors reach every voice client and HTTP caller, /health and the log)
    engine = HttpTtsEngine(f"http://hub:pa55word@127.0.0.1:{refused_port}/v1",
                           connect_timeout_s=2)
    engine.load()
    with pytest.raises(EngineError) as err:
        engine.open(SynthesisRequest("x")).step()
    engine.close()
    assert f"hub:***@127.0.0.1:{refused_port}" in err.value.message
    assert "pa55word" not in err.value.message


@pytest.mark.parametrize("fallback", [None, "espeak"])
async def test_a_barge_in_cuts_a_stalled_tts_answer_at_once(sse_server, start_gateway,
                                                            fallback):
    """A cancelled turn's step waiting for a stalled TTS server held the remote lane, for
    the barge-in's own new turn too, until the read timeout (20 s): the step could not be
    interrupted. Cancelling now cuts the stream's connection; the cut is nobody's failure
    (behind a fallback, the breaker does not count it and the fallback does not speak)."""
    import asyncio

    from websockets.asyncio.client import connect

    from tests.wsclient import read_turn, recv_event, send

    server, url = sse_server
    server.script = lambda body: ["stall"] if "stalls" in body["input"] else \
        [delta(b"\x01\x00" * 2400), DONE]
    # (a slow machine's first chunk must not count against the breaker)
    policy = {"fallback_policy": {"first_chunk_timeout_s": 60}} if fallback else {}
    gw = await start_gateway(tts={"engine": "http", "url": url, "fallback": fallback,
                                  "step_timeout_s": 3600, **policy,
                                  "options": {"read_timeout_s": 3000}})  # no timeout helps
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="This sentence stalls.")
        assert await asyncio.to_thread(server.stalled.wait, 30)  # (the lane's step waits)
        await send(ws, type="cancel")
        await send(ws, type="say", text="After the barge-in.")
        cancelled = await asyncio.wait_for(read_turn(ws), 60)  # (a guard, not a time)
        after = await asyncio.wait_for(read_turn(ws), 60)
        assert cancelled.done["status"] == "cancelled" and not cancelled.frames
        assert after.done["status"] == "completed"
        assert after.done["metrics"]["engines"] == ["http"] and after.audio_ms == 100
        assert await asyncio.to_thread(server.disconnected.wait, 10)
    if fallback:
        assert gw.engine.counters()["consecutive_failures"] == 0
        assert gw.engine.switches == 0 and gw.engine.fallback_segments == 0
    assert gw.lane.failing is None


@pytest.mark.parametrize("fallback", [None, "espeak"])
async def test_one_stalled_tts_answer_holds_its_own_turn_only(sse_server, start_gateway,
                                                              fallback):
    """The remote lane ran one step at a time: a TTS answer that stalled held every session
    on the lane until its read timeout (20 s). It runs ``parallel_steps`` at once now, so
    another session speaks meanwhile (behind espeak as the fallback too)."""
    import asyncio

    from websockets.asyncio.client import connect

    from tests.wsclient import gapless, read_turn, recv_event, send

    server, url = sse_server
    server.script = lambda body: ["stall"] if "stalls" in body["input"] else \
        [delta(b"\x01\x00" * 2400), DONE]
    gw = await start_gateway(tts={"engine": "http", "url": url, "fallback": fallback,
                                  "step_timeout_s": 3600,
                                  "options": {"read_timeout_s": 3000}})  # no timeout helps
    assert gw.lane.parallel_steps == 8
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws, \
            connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as other:
        for socket in (ws, other):
            await recv_event(socket, "session.created")
        await send(ws, type="say", text="This sentence stalls.")
        assert await asyncio.to_thread(server.stalled.wait, 30)
        await send(other, type="say", text="Another session speaks.")
        fine = await asyncio.wait_for(read_turn(other), 60)  # (a guard, not a time)
        assert fine.done["status"] == "completed" and fine.done["metrics"]["engines"] == ["http"]
        gapless(fine)
        assert not server.disconnected.is_set()  # the stalled answer still holds its turn
        await send(ws, type="cancel")
        assert (await read_turn(ws)).done["status"] == "cancelled"
    assert gw.lane.unhealthy is None and gw.lane.failing is None


async def test_sentences_an_open_breaker_gives_the_fallback_are_counted(sse_server,
                                                                        start_gateway):
    """With the breaker open the fallback speaks every sentence, each turn by one engine:
    ``gateway_fallbacks_total`` (turns spoken by two) stood at 0 and nothing else showed
    it. ``gateway_fallback_segments_total`` counts the sentences the fallback spoke."""
    from prometheus_client.parser import text_string_to_metric_families
    from websockets.asyncio.client import connect

    from tests.wsclient import read_turn, recv_event, send

    server, url = sse_server
    server.status = 503
    gw = await start_gateway(tts={"engine": "http", "url": url, "fallback": "espeak",
                                  "fallback_policy": {"breaker_failures": 1}})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        for text in ("The first one fails. The breaker is open now.", "Still open."):
            await send(ws, type="say", text=text)
            turn = await read_turn(ws)
            assert turn.done["status"] == "completed"
            assert turn.done["metrics"]["engines"] == ["espeak"]
    values = {s.name: s.value for family in text_string_to_metric_families(
        gw.telemetry.exposition().decode()) for s in family.samples}
    assert values["gateway_fallbacks_total"] == 0
    assert values["gateway_fallback_segments_total"] == 3
    assert gw.health()["engine"]["fallback"]["fallback_segments"] == 3
    assert len(server.requests) == 1  # (the breaker kept the others from the server)


@pytest.mark.parametrize("down", ["refused", "connect timeout"])
async def test_a_sentence_that_cannot_reach_the_tts_server_tells_health_at_once(
        down, monkeypatch, refused_port):
    """A turn's LLM stream that could not reach its server set ``llm.reachable`` false at
    once; a sentence that could not reach the TTS server left ``lanes.<lane>.server``
    reading reachable (a probe's result from before it went down) beside
    ``engine.failing`` until the next probe. It counts as a check now, and /health's
    ``engine.failing`` is the code the session's error event had (a connect timeout:
    engine_timeout). The connect timeout: a server whose backlog is full."""
    import socket

    from gateway.config import load_config
    from gateway.io import telemetry
    from gateway.io.server import Gateway
    from tests.wsclient import one_turn

    monkeypatch.setattr(telemetry, "LLM_PROBE_TIMEOUT_S", 0.2)
    with contextlib.ExitStack() as held:
        port = refused_port
        if down == "connect timeout":
            full = held.enter_context(socket.create_server(("127.0.0.1", 0), backlog=0))
            port = full.getsockname()[1]
            for _ in range(3):  # (the kernel takes backlog + 1; the SYNs after are dropped)
                waiting = held.enter_context(socket.socket())
                waiting.setblocking(False)
                waiting.connect_ex(("127.0.0.1", port))
        url = f"http://127.0.0.1:{port}/v1"
        gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0},
                                 tts={"engine": "http", "url": url,
                                      "options": {"connect_timeout_s": 0.3}}))
        await gw.start()
        try:
            probe = gw.telemetry.tts_probes["remote"]
            await probe._task  # the probe at start
            probe.reachable = True  # as a probe taken before the server went down said
            turn = await one_turn(gw.port, type="say", text="Is anybody there?")
            health = gw.health()
        finally:
            await gw.aclose()
    (event,) = turn.of("error")
    error = event["error"]
    assert error["code"] == ("engine_timeout" if down == "connect timeout" else "engine_failed")
    assert health["engine"]["failing"] == error["code"]
    server = health["lanes"]["remote"]["server"]
    assert server["reachable"] is False and server["detail"] == error["message"], server


async def test_a_voice_the_tts_server_lacks_does_not_move_everyone_to_the_fallback(
        start_gateway):
    """Gateway A speaking through gateway B (``engine = "http"``, no ``voice`` set, so A
    lists none and lets any voice through), espeak behind it: a client asking for a voice B
    lacks got B's 400 on each sentence, which counted against the breaker, and three such
    requests opened it: espeak then spoke every session's sentences, the good ones' too.
    The request refused for its voice still falls back; the breaker stays closed."""
    import httpx

    b = await start_gateway(server={"http_port": 0})
    a = await start_gateway(server={"http_port": 0}, tts={
        "engine": "http", "url": f"http://127.0.0.1:{b.http_port}/v1", "fallback": "espeak",
        # (a slow machine's first chunk, no failure of the voice, must not count either)
        "fallback_policy": {"first_chunk_timeout_s": 60}})
    async with httpx.AsyncClient(timeout=HANG_S,
                                 base_url=f"http://127.0.0.1:{a.http_port}") as http:
        for _ in range(4):  # (the breaker's default: 3 failures open it)
            odd = await http.post("/v1/audio/speech", json={
                "input": "Hi.", "voice": "nonesuch", "response_format": "pcm"})
            assert odd.status_code == 200 and odd.content  # the fallback spoke it
        good = await http.post("/v1/audio/speech", json={
            "input": "Hello there.", "response_format": "pcm"})
        health = (await http.get(f"http://127.0.0.1:{a.port}/health")).json()
    assert good.status_code == 200 and good.content
    assert health["engine"]["fallback"]["breaker_state"] == "closed"
    assert health["engine"]["fallback"]["switches"] == 4
    assert health["engine"]["fallback"]["consecutive_failures"] == 0


# --- chained to another gateway ------------------------------------------------------------


@pytest.mark.parametrize(("styled", "fallback"), [(True, None), (False, None),
                                                 (False, "espeak")],
                         ids=["takes-them", "espeak", "espeak-behind-a-fallback"])
async def test_instructions_reach_the_gateway_behind_and_its_notes_come_back(start_gateway,
                                                                              styled, fallback):
    """An ``http`` engine chained to another gateway (whose qwen3 takes style instructions)
    never passed them on, and the answer said "engine http does not take them". They go
    on now; what the gateway behind did not do with them (its espeak takes none) comes back
    in the notes, of a whole file and of SSE alike, so ``X-Speech-Notes`` stays true. The
    official SDK against two real gateways."""
    import openai
    import orjson

    from tests.test_fallback_engine import FakeClock, ScriptedEngine

    class Styled(ScriptedEngine):  # TEST DOUBLE: a voice that takes style instructions
        instructions = True

    voice = Styled("qwen3", FakeClock()) if styled else None
    behind = await start_gateway(engine=voice)
    gw = await start_gateway(tts={"engine": "http", "fallback": fallback,
                                  "url": f"http://127.0.0.1:{behind.http_port}/v1"})
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.http_port}/v1",
                                api_key="not-needed", max_retries=0)
    asked = {"model": "tts", "voice": behind.default_voice, "input": "Hello there.",
             "instructions": "whisper", "response_format": "pcm"}
    whole = await client.audio.speech.with_raw_response.create(
        **asked, extra_body={"stream": False})
    async with client.audio.speech.with_streaming_response.create(
            **asked, stream_format="sse") as response:
        events = [orjson.loads(line[6:]) async for line in response.iter_lines()
                  if line.startswith("data: ")]
    await client.close()
    done = events[-1]
    assert whole.http_response.status_code == 200 and whole.http_response.content
    assert done["type"] == "speech.audio.done"
    if styled:
        assert [r.options.get("instructions") for r in voice.opened] == ["whisper"] * 2
        assert "x-speech-notes" not in whole.headers and "notes" not in done
    else:
        note = "TTS server: instructions ignored: engine espeak does not take them"
        assert whole.headers["x-speech-notes"] == note and done["notes"] == [note]


async def test_an_answer_passes_on_a_bounded_number_of_a_servers_notes(sse_server,
                                                                     start_gateway):
    """A server whose every segment says something new (a buggy one, or not a gateway)
    grew the answer's X-Speech-Notes with each segment (40 segments: 320 notes, ~100 KB
    of header, past what a proxy such as nginx takes); an answer passes on at most
    ``MAX_SERVER_NOTES`` of them."""
    import httpx

    from engines.http_tts import MAX_NOTE_CHARS
    from gateway.io.http_api import MAX_SERVER_NOTES

    server, url = sse_server
    server.script = lambda body: [delta(b"\x01\x00"), {
        "type": "speech.audio.done",
        "notes": [f"request {len(server.requests)}, note {i} " + "x" * 400 for i in range(8)]}]
    gw = await start_gateway(tts={"engine": "http", "url": url})
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        whole = await client.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                  json={"input": text, "response_format": "pcm",
                                        "stream": False})
    assert whole.status_code == 200 and len(server.requests) > 1  # several segments
    notes = whole.headers["x-speech-notes"].split("; ")
    assert len(notes) == MAX_SERVER_NOTES
    assert all(len(n) == len("TTS server: ") + MAX_NOTE_CHARS for n in notes)
