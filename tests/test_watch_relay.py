"""The watch relay (examples/watch_relay.py): its sans-I/O parts with synthetic audio, then
the real gateway (replay LLM + espeak) on 127.0.0.1:0 behind the relay, compared with a
direct client. Steps are ordered by awaiting messages, never by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys

import numpy as np
import orjson
import pytest
import soxr
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from engines.base import SynthesisRequest
from engines.espeak import EspeakEngine
from examples import watch_relay
from examples.watch_relay import (
    FLAG_SENTENCE_END,
    FLAG_TURN_END,
    HEADER,
    OpusAudio,
    Pcm16kAudio,
    RelayCore,
    WatchDecoder,
    WatchRelay,
)
from gateway.config import load_config
from gateway.core.codec import ClientPing, ClientPlayback, ClientTranscript, decode_client
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S, hang_guard, unless_hung
from tests.servers import ServeProcess
from tests.wsclient import read_turn, recv_event, send

END = FLAG_SENTENCE_END | FLAG_TURN_END


@contextlib.asynccontextmanager
async def relay_to(handler, *, resume_window_s: float):
    """A relay started against a stand-in gateway (a websockets server running
    ``handler``, a TEST DOUBLE scripted by each test), closed after."""
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", resume_window_s=resume_window_s)
        await relay.start()
        try:
            yield relay
        finally:
            await relay.aclose()


@contextlib.asynccontextmanager
async def lost_with_the_uplink(gateway: Gateway, session, kind: str):
    """What the watch sends in the block goes up but is never read by ``gateway``: once the
    relay has sent a message of type ``kind``, the gateway's socket drops (the phone's
    uplink), and all of it is lost with it."""
    (conn,) = gateway.connections
    conn.ws.transport.pause_reading()
    upstream, sent = session.gateway, asyncio.Event()
    send_up = upstream.send

    async def sending(message, *args, **kwargs):
        await send_up(message, *args, **kwargs)
        if orjson.loads(message)["type"] == kind:
            sent.set()

    upstream.send = sending
    yield
    await unless_hung(sent.wait())
    conn.ws.transport.abort()


@functools.cache
def _espeak(text: str) -> np.ndarray:
    engine = EspeakEngine()
    engine.load()
    stream = engine.open(SynthesisRequest(text=text))
    chunks = []
    while (chunk := stream.step()) is not None:
        chunks.append(chunk)
    stream.close()
    return np.frombuffer(b"".join(chunks), dtype="<i2")


def speechlike(n: int, seed: int = 0) -> np.ndarray:
    """``n`` samples of real espeak speech at 24 kHz (two different texts by ``seed``)."""
    text = ("Speech for the codec test, long enough to cut where we like, with pauses. "
            if seed == 0 else "Another voice line, so that the sentences differ a little. ")
    x = _espeak(text * 3)
    assert len(x) >= n
    return x[:n].copy()


def feed_chunks(audio, turn_id, sentence, x, *, end_flags, chunk=960):
    packets = []
    for start in range(0, len(x), chunk):
        last = start + chunk >= len(x)
        packets += audio.feed(turn_id, sentence, end_flags if last else 0,
                              x[start:start + chunk].tobytes())
    return packets


def frame(packet, turn_id, seq=0):
    return HEADER.pack(1, packet.flags, packet.sentence, turn_id, seq) + packet.payload


def best_correlation(a: np.ndarray, b: np.ndarray, max_lag: int) -> float:
    """Peak normalized cross-correlation of ``a`` and ``b`` within ±``max_lag`` samples."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    n = len(a) + len(b)
    xc = np.fft.irfft(np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n)), n)
    lags = np.r_[xc[:max_lag + 1], xc[-max_lag:]]
    return float(np.max(lags) / (np.linalg.norm(a) * np.linalg.norm(b)))


def local_similarity(a: np.ndarray, b: np.ndarray, window: int = 960, search: int = 480
                     ) -> float:
    """How alike two takes of the same speech are, robust to the small time warps between
    two espeak runs: each 40 ms window of ``a`` is matched (normalized correlation) at its
    best offset within ±``search`` samples around the same relative place in ``b``; the
    result is the energy-weighted mean. Same text: ~0.9; another sentence: ~0.2."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    scale, num, den = len(b) / len(a), 0.0, 0.0
    for start in range(0, len(a) - window, window):
        w = a[start:start + window]
        energy = float(np.dot(w, w))
        if energy < window * 300.0**2:
            continue  # pauses say nothing about likeness
        centre = int(start * scale)
        seg = b[max(0, centre - search):min(len(b), centre + window + search)]
        if len(seg) < window:
            continue
        norms = np.sqrt(np.convolve(seg**2, np.ones(window), "valid")) * np.sqrt(energy)
        num += energy * float(np.max(np.correlate(seg, w, "valid") / (norms + 1e-9)))
        den += energy
    return num / den


def decode(audio_desc, frames: list[bytes]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Whole decoded turn at 24 kHz (Opus) or 16 kHz (pcm16), and the same per sentence."""
    decoder = WatchDecoder(audio_desc)
    per: dict[int, list[bytes]] = {}
    for data in frames:
        _turn, sentence, _flags, pcm = decoder.feed(data)
        per.setdefault(sentence, []).append(pcm)

    def at_rate(chunks: list[bytes]) -> np.ndarray:
        x = np.frombuffer(b"".join(chunks), dtype="<i2")
        return soxr.resample(x, 48_000, 24_000) if decoder.rate == 48_000 else x

    return (at_rate([c for s in sorted(per) for c in per[s]]),
            {s: at_rate(c) for s, c in per.items()})


# ---- sans-I/O ---------------------------------------------------------------------------------


def test_opus_round_trip_keeps_the_signal_and_pads_the_sentence_tail():
    audio = OpusAudio()
    ps = audio.pre_skip_24k
    assert audio.audio["pre_skip"] == 2 * ps and 0 < ps < 480
    x = speechlike(24_000 + 130)  # not a whole number of 20 ms frames
    packets = feed_chunks(audio, 1, 0, x, end_flags=END)
    pad = ps + (-(len(x) + ps)) % 480
    assert len(packets) == (len(x) + pad) // 480
    assert [p.flags for p in packets] == [0] * (len(packets) - 1) + [END]
    bits_per_s = sum(len(p.payload) for p in packets) * 8 / (len(packets) * 0.020)
    assert 12_000 < bits_per_s < 32_000 and max(len(p.payload) for p in packets) < 200
    y, _ = decode(audio.audio, [frame(p, 1) for p in packets])
    assert len(y) == len(x) + pad - ps  # the watch drops pre_skip: its time = encoder input
    # aligned within 2 samples once pre_skip is dropped (the codec's own delay is sub-ms)
    assert best_correlation(x, y[:len(x)], 2) > 0.9
    assert np.sqrt(np.mean(y[len(x) + 60:].astype(float) ** 2)) < 300  # the pad is silence
    # playback marks: the watch's time → the gateway's; the padding adds no gateway audio
    ms = len(x) / 24
    assert audio.timeline.to_upstream(500) == pytest.approx(500)
    assert audio.timeline.to_upstream(ms + pad / 24) == pytest.approx(ms)
    assert audio.timeline.to_upstream(ms + 5) == pytest.approx(ms)


def test_opus_sentences_flags_end_marker_and_new_encoder_per_turn():
    audio = OpusAudio()
    a = feed_chunks(audio, 3, 0, speechlike(9_000), end_flags=FLAG_SENTENCE_END)
    b = feed_chunks(audio, 3, 1, speechlike(7_000, 1), end_flags=FLAG_SENTENCE_END)
    marker = audio.feed(3, 1, END, b"")  # the turn's end became known after its audio
    assert [p.sentence for p in a] == [0] * len(a) and [p.sentence for p in b] == [1] * len(b)
    assert a[-1].flags == b[-1].flags == FLAG_SENTENCE_END
    assert sum(p.flags != 0 for p in a + b) == 2
    assert len(marker) == 1 and marker[0].payload == b"" and marker[0].flags == END
    # two sentences: the watch time runs ahead by both paddings, the mapping removes them
    assert audio.timeline.to_upstream(10_000) == pytest.approx(16_000 / 24)
    # a cancelled turn leaves samples behind; the next turn starts clean
    audio.feed(4, 0, 0, speechlike(700).tobytes())
    first = feed_chunks(audio, 5, 0, speechlike(4_800), end_flags=END)
    assert audio.timeline.to_upstream(10_000) == pytest.approx(200)
    y, _ = decode(audio.audio, [frame(p, 5) for p in first])
    assert best_correlation(speechlike(4_800), y[:4_800], 8) > 0.9


def test_pcm16k_resamples_each_sentence_to_two_thirds():
    audio = Pcm16kAudio()
    x0, x1 = speechlike(24_000 + 7), speechlike(12_345, 1)
    p0 = feed_chunks(audio, 1, 0, x0, end_flags=FLAG_SENTENCE_END)
    p1 = feed_chunks(audio, 1, 1, x1, end_flags=END)
    assert p0[-1].flags == FLAG_SENTENCE_END and p1[-1].flags == END
    for x, packets in ((x0, p0), (x1, p1)):
        y = np.frombuffer(b"".join(p.payload for p in packets), dtype="<i2")
        assert abs(len(y) - len(x) * 2 / 3) <= 1
        assert np.corrcoef(soxr.resample(x, 24_000, 16_000)[:len(y)], y)[0, 1] > 0.99
    assert audio.timeline.to_upstream(1000) == pytest.approx(1000, abs=1)


def test_pcm16k_frames_are_even_for_the_watchs_jitter_buffer():
    """soxr hands out ~490-sample blocks, so 40 ms frames came out 489 or 979 samples
    (30 or 61 ms); each is now the gateway frame's own length, the sentence's end taking
    what is left."""
    audio = Pcm16kAudio()
    x = speechlike(960 * 25)
    packets = feed_chunks(audio, 1, 0, x, end_flags=END)
    sizes = [len(p.payload) // 2 for p in packets]
    assert set(sizes[:-1]) == {640} and len(packets) == 24  # the first frame is held
    assert sum(sizes) == pytest.approx(len(x) * 2 / 3, abs=1)
    for ms in (40, 480, 960):  # the watch's ms are the gateway's
        assert audio.timeline.to_upstream(ms) == pytest.approx(ms, abs=0.1)
    assert audio.timeline.to_upstream(1000) == pytest.approx(1000, abs=0.1)


def test_core_skips_replayed_messages_and_translates_marks():
    core = RelayCore(OpusAudio())
    created = {"type": "session.created", "session_id": "s1", "resume_token": "t",
               "resume_window_s": 30, "protocol": 1,
               "audio": {"format": "pcm16", "sample_rate": 24000, "frame_ms": 40}}
    down = orjson.loads(core.created(created))
    assert "resume_token" not in down and down["audio"]["format"] == "opus"
    started = orjson.dumps({"type": "turn.started", "turn_id": 1, "source": "say"}).decode()
    assert core.from_gateway(started) == [started]
    pcm = speechlike(960).tobytes()
    out = core.from_gateway(HEADER.pack(1, 0, 0, 1, 7) + pcm)
    assert [HEADER.unpack_from(f)[4] for f in out] == [0, 1]  # the watch's own seq
    sentence = orjson.dumps({"type": "sentence", "turn_id": 1, "index": 0}).decode()
    assert core.from_gateway(sentence) == [sentence]
    assert orjson.loads(core.resume_request())["last_seq"] == 7
    core.resumed(replayed=2)  # the gateway re-sends `sentence`, then a new frame
    assert core.from_gateway(sentence) == []
    again = core.from_gateway(HEADER.pack(1, 0, 0, 1, 8) + pcm)
    assert [HEADER.unpack_from(f)[4] for f in again] == [2, 3]
    mark = orjson.dumps({"type": "playback", "turn_id": 1, "played_ms": 30,
                         "event_id": "k1"}).decode()
    up, reply = core.from_watch(mark)
    assert reply is None and orjson.loads(up)["played_ms"] == pytest.approx(30)
    assert orjson.loads(up)["event_id"] == "k1"  # translated, still the watch's message
    up, reply = core.from_watch(b"\x00")
    assert up is None and orjson.loads(reply)["error"]["code"] == "binary_not_supported"


def test_core_skips_only_what_it_relayed_when_no_frame_came_before_the_drop():
    # A resume without last_seq replays everything after the gateway's session.created,
    # never that message itself: counting it made the relay drop one replayed message
    # too many (the watch lost "It's on Tuesday" from its reply text).
    core = RelayCore(Pcm16kAudio())
    core.created({"type": "session.created", "session_id": "s1", "resume_token": "t",
                  "audio": {"format": "pcm16", "sample_rate": 24000, "frame_ms": 40}})
    started = orjson.dumps({"type": "turn.started", "turn_id": 1, "source": "say"}).decode()
    delta = orjson.dumps({"type": "text.delta", "turn_id": 1, "delta": "It's"}).decode()
    assert core.from_gateway(started) == [started] and core.from_gateway(delta) == [delta]
    assert "last_seq" not in orjson.loads(core.resume_request())
    core.resumed(replayed=3)  # turn.started, text.delta, then one the watch has not had
    more = orjson.dumps({"type": "text.delta", "turn_id": 1, "delta": " on"}).decode()
    assert [core.from_gateway(m) for m in (started, delta, more)] == [[], [], [more]]


def test_core_sends_a_mark_at_a_sentences_end_as_that_end_exactly():
    """The gateway counts a mark a hair past a sentence's end as the next sentence begun
    (its history: 'Two meetings. …'); the relay rounded marks to 0.1 ms, which put the end
    of a sentence of 9,001 samples (375.0417 ms) before it, or past it."""
    core = RelayCore(OpusAudio())
    x0 = speechlike(9_001)
    for start in range(0, len(x0), 960):
        last = start + 960 >= len(x0)
        core.from_gateway(HEADER.pack(1, FLAG_SENTENCE_END if last else 0, 0, 1, start // 960)
                          + x0[start:start + 960].tobytes())
    ps = core.audio.pre_skip_24k
    for watch_samples in (len(x0), len(x0) + ps + (-(len(x0) + ps)) % 480):  # (+ padding)
        mark = {"type": "playback", "turn_id": 1, "played_ms": watch_samples / 24}
        up, _ = core.from_watch(orjson.dumps(mark).decode())
        assert orjson.loads(up)["played_ms"] == pytest.approx(len(x0) / 24, abs=1e-9)


def test_core_sends_up_a_mark_holding_a_field_nested_too_deeply_to_write_back():
    """The gateway reads a mark with any other fields (a JSON nested up to 1,024 levels);
    the relay, writing it again in the gateway's time, failed on one past orjson's 254 and
    the watch's session ended with a traceback (found writing a fuzz harness for ``from_watch``)."""
    core = RelayCore(Pcm16kAudio())
    core.from_gateway(HEADER.pack(1, FLAG_SENTENCE_END, 0, 1, 0) + speechlike(960).tobytes())
    mark = ('{"type":"playback","turn_id":1,"played_ms":20,"note":' + "[" * 300 + "]" * 300
            + "}")
    assert isinstance(decode_client(mark), ClientPlayback)  # the gateway takes it
    up, reply = core.from_watch(mark)
    assert reply is None
    assert orjson.loads(up) == {"type": "playback", "turn_id": 1,
                                "played_ms": pytest.approx(20)}
    deep_id = ('{"type":"playback","turn_id":1,"played_ms":20,"event_id":' + "[" * 300
               + "]" * 300 + "}")
    up, reply = core.from_watch(deep_id)  # (refused by the gateway: not a string)
    assert reply is None and "event_id" not in orjson.loads(up)


def test_opus_sentence_done_says_the_watchs_time_so_marks_added_up_from_it_are_whole():
    """protocol.md lets a client build ``played_ms`` by adding up ``sentence.done``'s
    ``audio_ms``. Through the relay's Opus, each sentence's last packet carries up to
    26.5 ms of padding the watch plays, and marks are in the watch's time; the figure was
    the gateway's, so a watch that had played two sentences whole said so short by the
    first one's padding, and the mark the gateway got put the end of the second sentence
    past the 20 ms it may be short by (its history: cut by words). ``audio_ms`` now
    counts the padding."""
    core = RelayCore(OpusAudio())
    ps = core.audio.pre_skip_24k
    sentences = [speechlike(9_001), speechlike(7_013, 1)]
    played = 0  # the watch's sum of audio_ms
    end = 0  # the watch's samples to the end of the sentence, its padding included
    for index, x in enumerate(sentences):
        flags = END if index == len(sentences) - 1 else FLAG_SENTENCE_END
        for start in range(0, len(x), 960):
            last = start + 960 >= len(x)
            core.from_gateway(HEADER.pack(1, flags if last else 0, index, 1, start // 960)
                              + x[start:start + 960].tobytes())
        done = {"type": "sentence.done", "turn_id": 1, "index": index,
                "audio_ms": round(len(x) / 24)}
        (down,) = core.from_gateway(orjson.dumps(done).decode())
        audio_ms = orjson.loads(down)["audio_ms"]
        before, end = end, end + len(x) + ps + (-(len(x) + ps)) % 480
        assert audio_ms == round(end / 24) - round(before / 24)  # (adds up to the ms)
        played += audio_ms
        mark = {"type": "playback", "turn_id": 1, "played_ms": played}
        up, _ = core.from_watch(orjson.dumps(mark).decode())
        heard = sum(len(y) for y in sentences[:index + 1]) / 24
        assert orjson.loads(up)["played_ms"] == pytest.approx(heard, abs=1e-9), index


def test_core_translates_the_marks_of_a_turn_that_ended_while_it_plays():
    """A turn ends up to max_lead_ms before the watch has played it, and its marks still
    count (protocol.md, History). They went up in the watch's time, Opus padding and all:
    the gateway took the end of a sentence for a way into the next one."""
    core = RelayCore(OpusAudio())
    core.created({"type": "session.created", "session_id": "s1", "resume_token": "t",
                  "audio": {"format": "pcm16", "sample_rate": 24000, "frame_ms": 40}})
    x0, x1 = speechlike(9_000), speechlike(7_000, 1)
    for index, x, flags in ((0, x0, FLAG_SENTENCE_END), (1, x1, END)):
        for start in range(0, len(x), 960):
            last = start + 960 >= len(x)
            core.from_gateway(HEADER.pack(1, flags if last else 0, index, 1, start // 960)
                              + x[start:start + 960].tobytes())
    ps = core.audio.pre_skip_24k
    watch_ms = (len(x0) + ps + (-(len(x0) + ps)) % 480) / 24  # sentence 0 and its padding
    mark = orjson.dumps({"type": "playback", "turn_id": 1, "played_ms": watch_ms}).decode()
    before = orjson.loads(core.from_watch(mark)[0])["played_ms"]
    core.from_gateway(orjson.dumps({"type": "turn.done", "turn_id": 1,
                                    "status": "completed"}).decode())
    after = orjson.loads(core.from_watch(mark)[0])["played_ms"]
    assert before == after == pytest.approx(len(x0) / 24, abs=1e-9)  # sentence 0, no more
    other = orjson.dumps({"type": "playback", "turn_id": 7, "played_ms": watch_ms}).decode()
    assert core.from_watch(other) == (other, None)  # another turn's: as it is


def _dumps(**message) -> str:
    return orjson.dumps(message).decode()


@pytest.mark.parametrize(("sent", "heard", "replayed", "again"), [
    # (what went up, what came down after it before the drop, what came in the replay
    # after that, sent again)
    (["transcript"], [], [], ["transcript"]),  # no answer: lost
    (["transcript"], [], ["turn.started"], []),  # its turn started: it came
    (["transcript", "cancel"], [], ["turn.started"], ["cancel"]),  # (the cancel may not have)
    (["cancel", "say"], [], [], ["cancel", "say"]),  # in the order sent
    (["transcript"], ["turn.started"], [], []),
    (["transcript"], ["error"], [], []),  # refused (rate_limited): not again
    (["transcript"], [], ["error"], []),  # (refused in the replay, as well)
    (["cancel"], ["turn.cancelled"], [], []),  # it came: nothing left to cancel
    # a cancel after the next transcript is for that one's turn, not the one cancelled
    (["transcript", "cancel", "second", "cancel"], ["turn.started", "turn.cancelled"], [],
     ["second", "cancel"]),
    (["transcript", "cancel", "second", "cancel"], [],
     ["turn.started", "turn.cancelled", "turn.started 2"], ["cancel"]),
    # it may have crossed the turn's turn.done, and still cuts the tail (protocol.md, History)
    (["cancel"], ["turn.done"], [], ["cancel"]),
    (["cancel", "transcript"], ["turn.done"], ["turn.started 2"], []),
    (["ping", "playback"], [], [], ["ping"]),  # a ping gets its pong: lost without it
    (["ping"], ["pong"], [], []),
    (["ping"], [], ["pong"], []),
    (["cancel", "ping", "ping"], [], ["pong"], ["ping"]),  # the gateway read the cancel
    # turn N answers the N-th transcript or say: a second one sent before the first one's
    # turn.started came is still unanswered
    (["transcript", "second"], ["turn.started"], [], ["second"]),
    (["transcript", "second"], [], ["turn.started"], ["second"]),
    (["transcript", "cancel", "second"], [], ["turn.started"], ["cancel", "second"]),
    (["transcript", "second"], [], ["turn.started", "turn.started 2"], []),
    (["transcript", "second"], ["error"], [], ["second"]),  # the first one refused
    (["transcript", "second"], [], ["error", "turn.started"], []),  # (each its own answer)
    (["transcript", "second"], [], ["turn.started", "error"], []),
    (["transcript", "second"], ["other error"], [], ["transcript", "second"]),
    (["blank", "second"], [], ["turn.started"], []),  # refused (invalid_field): no turn
    (["blank"], [], [], ["blank"]),  # refused when it comes: the watch gets its error
    # a session.update is answered, applied or refused: until then it goes again
    (["update"], [], [], ["update"]),
    (["update"], ["session.updated"], [], []),
    (["update"], [], ["session.updated"], []),
    (["update"], ["other error"], [], []),  # refused (unknown_voice, invalid_field)
    (["update"], [], ["other error"], []),
    (["update"], ["error"], [], ["update"]),  # (a transcript's refusal)
    (["update", "transcript"], [], ["turn.started"], []),  # the transcript after it came
    (["transcript", "update"], [], ["turn.started"], ["update"]),
    (["cancel", "update", "say"], ["session.updated"], [], ["say"]),
    # a message the gateway refuses (a malformed frame) is answered by its own error, which
    # comes first: not the answer of an update sent after it (sent again itself, without it
    # the watch never got its error, and the update's refusal was taken for it)
    (["invalid", "update"], ["other error"], [], ["update"]),
    (["invalid", "update"], [], ["other error"], ["update"]),
    (["invalid", "update"], ["other error", "other error"], [], []),
    (["invalid"], [], [], ["invalid"]),
    (["invalid"], ["other error"], [], []),
])
def test_core_sends_again_what_a_dropped_gateway_socket_may_have_lost(sent, heard, replayed,
                                                                      again):
    """protocol.md, Resume: what has no answer once the replay is in was lost."""
    core = RelayCore(Pcm16kAudio())
    messages = {"transcript": _dumps(type="transcript", text="Hi"),
                "say": _dumps(type="say", text="Hello"), "cancel": _dumps(type="cancel"),
                "ping": _dumps(type="ping"),
                "playback": _dumps(type="playback", turn_id=1, played_ms=5),
                "second": _dumps(type="transcript", text="And tomorrow?"),
                "blank": _dumps(type="transcript", text=" \n"),
                "update": _dumps(type="session.update", session={"voice": "en"}),
                "invalid": "{"}
    for kind in sent:
        up, _reply = core.from_watch(messages[kind])
        core.sent(up)
    for kind in heard:
        core.from_gateway(EVENTS[kind])
    # no frame came: the replay is all that followed session.created, what was heard first
    core.resumed(len(heard) + len(replayed), None)
    assert core.replaying == bool(replayed)  # (what was lost is not known yet)
    for kind in heard:
        assert core.from_gateway(EVENTS[kind]) == []  # relayed already
    for kind in replayed:
        assert core.from_gateway(EVENTS[kind]) == [EVENTS[kind]]
    assert not core.replaying
    assert core.lost() == [messages[kind] for kind in again]


EVENTS = {"turn.started": _dumps(type="turn.started", turn_id=1, source="transcript"),
          "turn.done": _dumps(type="turn.done", turn_id=1, status="completed"),
          "turn.cancelled": _dumps(type="turn.done", turn_id=1, status="cancelled"),
          "turn.started 2": _dumps(type="turn.started", turn_id=2, source="transcript"),
          "session.updated": _dumps(type="session.updated", session={"voice": "en"}),
          "pong": _dumps(type="pong"),
          "error": _dumps(type="error", error={"code": "rate_limited", "message": ""}),
          "other error": _dumps(type="error", error={"code": "invalid_field",
                                                      "message": "a playback mark"})}


def test_core_counts_a_turn_started_during_a_resume_once():
    """Turn 1 started in the replay: the second transcript stays unanswered, also after
    another drop, until its own turn starts."""
    core = RelayCore(Pcm16kAudio())
    first, second = _dumps(type="transcript", text="Hi"), _dumps(type="transcript", text="Bye")
    for message in (first, second):
        core.sent(core.from_watch(message)[0])
    core.resumed(1, 1)
    core.from_gateway(EVENTS["turn.started"])
    assert core.lost() == [second]
    core.resumed(0, 1)  # after another drop
    assert core.lost() == [second]
    core.from_gateway(EVENTS["turn.started 2"])
    core.resumed(0, 2)
    assert core.lost() == []


def test_core_decides_after_a_replay_cut_short_by_another_drop():
    """The socket drops again in the replay: the next resume replays it all again, what was
    relayed of it skipped, and only then is what was lost known."""
    core = RelayCore(Pcm16kAudio())
    first, second = _dumps(type="transcript", text="Hi"), _dumps(type="transcript", text="Bye")
    for message in (first, second):
        core.sent(core.from_watch(message)[0])
    core.resumed(2, 1)  # turn 1, then the second one refused
    assert core.from_gateway(EVENTS["turn.started"]) == [EVENTS["turn.started"]]
    core.resumed(2, 1)  # dropped again
    assert core.from_gateway(EVENTS["turn.started"]) == []  # (relayed already)
    assert core.replaying
    assert core.from_gateway(EVENTS["error"]) == [EVENTS["error"]]
    assert not core.replaying and core.lost() == []


@pytest.mark.parametrize(("sent", "heard", "resumed_turn", "again"), [
    # (what went up, "drop" for an earlier resume; what came down after it; session.resumed's
    # turn_id; sent again). The watch is playing turn 1, past its first sentence's padding.
    (["mark", "cancel"], [], 1, ["mark", "cancel"]),  # the barge-in's mark goes first
    (["mark", "transcript"], [], 1, ["mark", "transcript"]),
    (["mark", "say"], [], 1, ["mark", "say"]),
    (["mark", "cancel", "say"], [], 1, ["mark", "cancel", "say"]),  # once, before the first
    (["cancel"], [], 1, ["cancel"]),  # no mark sent
    (["mark", "later", "cancel"], [], 1, ["later", "cancel"]),  # the newest
    # the later mark may have arrived (so the cancel did): never the older one after it
    (["mark", "cancel", "later"], [], 1, ["later", "cancel"]),
    (["mark"], [], 1, []),  # no barge-in lost: a lost mark is replaced by the next
    (["mark", "ping"], [], 1, ["ping"]),  # (it goes again, but is no barge-in)
    (["mark", "cancel"], ["turn.done"], 1, []),  # the cancel is not sent again: nor its mark
    (["mark", "transcript"], ["error"], 1, []),
    (["mark", "transcript"], ["turn.started"], 2, []),  # it came, the mark before it too
    (["mark", "transcript", "cancel"], ["turn.started"], 2, ["cancel"]),  # (for turn 1: done)
    (["mark", "cancel"], [], None, ["cancel"]),  # the gateway has no turn 1 (any more)
    (["other", "cancel"], [], 1, ["cancel"]),  # a mark for another turn
    # the gateway refuses it: it counts nothing (it goes again only for its error)
    (["refused", "cancel"], [], 1, ["refused", "cancel"]),
    (["mark", "cancel", "drop"], [], 1, ["mark", "cancel"]),  # again after another drop
    (["mark", "cancel", "drop", "later"], [], 1, ["later", "cancel"]),  # (sent since)
])
def test_core_sends_the_barge_ins_mark_again_before_it(sent, heard, resumed_turn, again):
    """The gateway cuts a turn's history from the mark it has when the barge-in comes; a mark
    lost with the socket just before a cancel, transcript or say was not sent again (only
    they were), so the history was cut from an older one (protocol.md, Resume)."""
    core = RelayCore(OpusAudio())
    core.from_gateway(_dumps(type="turn.started", turn_id=1, source="transcript"))
    x0, x1 = speechlike(9_000), speechlike(7_000, 1)
    for index, x, flags in ((0, x0, FLAG_SENTENCE_END), (1, x1, 0)):
        for start in range(0, len(x), 960):
            last = start + 960 >= len(x)
            core.from_gateway(HEADER.pack(1, flags if last else 0, index, 1, start // 960)
                              + x[start:start + 960].tobytes())
    ps = core.audio.pre_skip_24k
    pad_ms = (ps + (-(len(x0) + ps)) % 480) / 24
    watch_ms = len(x0) / 24 + pad_ms + 100  # 100 ms into the second sentence
    messages = {"mark": _dumps(type="playback", turn_id=1, played_ms=watch_ms),
                "later": _dumps(type="playback", turn_id=1, played_ms=watch_ms + 200),
                "other": _dumps(type="playback", turn_id=7, played_ms=watch_ms),
                "refused": _dumps(type="playback", turn_id=1, played_ms="all"),
                "transcript": _dumps(type="transcript", text="Hi"),
                "say": _dumps(type="say", text="Hello"), "cancel": _dumps(type="cancel"),
                "ping": _dumps(type="ping")}
    events = {"turn.started": _dumps(type="turn.started", turn_id=2, source="transcript"),
              "turn.done": _dumps(type="turn.done", turn_id=1, status="cancelled"),
              "error": _dumps(type="error", error={"code": "rate_limited", "message": ""})}
    up: dict[str, str] = {}
    for kind in sent:
        if kind == "drop":
            core.resumed(0, resumed_turn)
            core.lost()
            continue
        up[kind], _reply = core.from_watch(messages[kind])
        core.sent(up[kind])
    for kind in heard:
        core.from_gateway(events[kind])
    core.resumed(0, resumed_turn)
    assert core.lost() == [up[kind] for kind in again]
    if "mark" in up:  # in the gateway's time, translated once (not twice when sent again)
        assert orjson.loads(up["mark"])["played_ms"] == pytest.approx(watch_ms - pad_ms)


# ---- against the real gateway -----------------------------------------------------------------

TEXT = "The watch hears the same words. It speaks a second sentence, a little longer."


@pytest.fixture
def replies(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text(orjson.dumps({"transcript": "What is on today?",
                                  "reply": "Two meetings. The first is at ten."}).decode() + "\n")
    return str(path)


@pytest.fixture
async def gateway(replies):
    config = load_config(server={"port": 0}, tts={"engine": "espeak"},
                         llm={"replies": replies, "tokens_per_s": 400.0})
    gw = Gateway(config)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.aclose()


@pytest.fixture
async def relay(gateway):
    r = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await r.start()
    try:
        yield r
    finally:
        await r.aclose()


ESPEAK_SPREAD = 1200
"""Samples (50 ms): how much one sentence's length may vary between espeak runs where the
engine cannot reset libespeak-ng's carried-over pitch state (``deterministic`` False: a
non-ELF build such as macOS). Measured on Linux without the reset: up to 812 samples, in
steps of a pitch period (engines/espeak.py)."""


def length_tolerance(gateway, exact: int, rate_ratio: float = 1.0) -> float:
    """Samples two runs of one sentence may differ by: ``exact`` where the espeak engine is
    deterministic, ``ESPEAK_SPREAD`` (at the compared rate) where it is not."""
    return exact if gateway.engine.deterministic else ESPEAK_SPREAD * rate_ratio


async def direct_turn(gateway, text):
    async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=text)
        result = await read_turn(ws)
    per = {}
    for f in result.frames:
        per.setdefault(f.sentence, []).append(f.pcm)
    return result, {s: np.frombuffer(b"".join(c), dtype="<i2") for s, c in per.items()}


def tap(relay: WatchRelay) -> dict[int, np.ndarray]:
    """Record, per sentence, the PCM the gateway sends the relay's only session from now on
    (the samples are filled in as frames pass; read them after the turn)."""
    (session,) = relay.sessions
    chunks: dict[int, list[bytes]] = {}
    original = session.core.from_gateway

    def from_gateway(message):
        if isinstance(message, bytes):
            chunks.setdefault(HEADER.unpack_from(message)[2], []).append(message[HEADER.size:])
        return original(message)

    session.core.from_gateway = from_gateway
    return _Joined(chunks)


class _Joined(dict):
    def __init__(self, chunks: dict[int, list[bytes]]) -> None:
        super().__init__()
        self._chunks = chunks

    def __getitem__(self, index: int) -> np.ndarray:
        return np.frombuffer(b"".join(self._chunks[index]), dtype="<i2")


@pytest.mark.slow
async def test_opus_watch_hears_what_a_direct_client_hears(gateway, relay):
    direct, direct_sentences = await direct_turn(gateway, TEXT)
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=opus") as ws:
        created = await recv_event(ws)
        assert created["type"] == "session.created" and "resume_token" not in created
        assert "resume_window_s" not in created  # (docs/watch-relay.md: the relay resumes)
        audio = created["audio"]
        assert audio["format"] == "opus" and audio["frame_ms"] == 20
        assert created["relay"] == {"upstream_audio": {"format": "pcm16", "sample_rate": 24000,
                                                       "frame_ms": 40}}
        upstream = tap(relay)
        await send(ws, type="say", text=TEXT)
        watch = await read_turn(ws)
    assert watch.done["status"] == "completed"
    assert [e["text"] for e in watch.of("sentence")] == [e["text"] for e in direct.of("sentence")]
    frames = [HEADER.pack(1, f.flags, f.sentence, f.turn_id, f.seq) + f.pcm
              for f in watch.frames]  # read_turn parsed them with the gateway's codec
    assert [f.seq for f in watch.frames] == list(range(len(frames)))
    assert sum(f.turn_end for f in watch.frames) == 1 and watch.frames[-1].turn_end
    assert all(len(f.pcm) < 200 for f in watch.frames)  # Opus packets, not PCM
    total, sentences = decode(audio, frames)
    assert set(sentences) == set(direct_sentences) and len(sentences) >= 2
    ps = audio["pre_skip"] // 2
    gateway_samples = 0
    for index, done in enumerate(watch.of("sentence.done")):
        n = len(upstream[index])
        gateway_samples += n
        pad = ps + (-(n + ps)) % 480
        assert n + pad == pytest.approx(done["audio_ms"] * 24, abs=24)  # the watch's time
        if gateway.engine.deterministic:
            # espeak gives the same bytes for the same text on every call (engines/espeak.py),
            # so the gateway sent this session exactly what it sent the direct client
            assert np.array_equal(upstream[index], direct_sentences[index])
        else:
            assert abs(n - len(direct_sentences[index])) <= ESPEAK_SPREAD
        # the watch hears the sentence plus its padding (the turn's pre_skip dropped once)
        assert len(sentences[index]) == n + pad - (ps if index == 0 else 0)
        # the very PCM the gateway sent this session: Opus keeps the waveform
        assert best_correlation(upstream[index], sentences[index], 2 * 480) > 0.9
        # and, sample by sample, what the direct client heard
        assert local_similarity(direct_sentences[index], sentences[index]) > 0.75
    assert abs(len(total) - gateway_samples) <= len(sentences) * (480 + ps) + 4


@pytest.mark.slow
async def test_pcm16k_chosen_by_first_message(gateway, relay):
    direct, direct_sentences = await direct_turn(gateway, TEXT)
    async with connect(f"ws://127.0.0.1:{relay.port}/") as ws:
        await send(ws, type="relay.hello", format="pcm16-16k")
        created = await recv_event(ws)
        assert created["audio"] == {"format": "pcm16", "sample_rate": 16000, "channels": 1,
                                    "frame_ms": 40}
        await send(ws, type="say", text=TEXT)
        watch = await read_turn(ws)
    assert watch.done["status"] == "completed"
    _total, sentences = decode(created["audio"], [
        HEADER.pack(1, f.flags, f.sentence, f.turn_id, f.seq) + f.pcm for f in watch.frames])
    for index, pcm in direct_sentences.items():
        # soxr, flushed per sentence: one sample of rounding
        assert abs(len(sentences[index]) - len(pcm) * 2 / 3) <= length_tolerance(gateway, 1, 2 / 3)
        reference = soxr.resample(pcm, 24_000, 16_000)
        assert local_similarity(reference, sentences[index], 640, 320) > 0.75


@pytest.mark.slow
async def test_transcript_and_cancel_go_through(gateway, relay):
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=opus") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="transcript", text="What is on today?")
        turn = await read_turn(ws)
        assert turn.done["status"] == "completed"
        assert turn.reply == "Two meetings. The first is at ten."
        await send(ws, type="say", text=" ".join(["This reply is long enough to cancel."] * 12))
        started = await recv_event(ws, "turn.started")
        while not isinstance(message := await ws.recv(), bytes):
            pass  # the first audio packet has arrived: the turn is speaking
        await send(ws, type="playback", turn_id=started["turn_id"], played_ms=20)
        await send(ws, type="cancel")
        cancelled = await read_turn(ws, started["turn_id"])
        assert cancelled.done["status"] == "cancelled"
        await send(ws, type="ping", id=7)
        pong = await recv_event(ws, "pong")  # no frame of the cancelled turn after turn.done
    assert pong["id"] == 7
    del message


@pytest.mark.slow
async def test_a_mark_after_turn_done_reaches_the_gateway_in_its_time(gateway, relay):
    """The watch has played its first sentence, padding included, when it cancels after
    the turn's end (a barge-in that still counts: protocol.md, History). The gateway got
    that mark in the watch's time, Opus padding and all (1053.5 for 1045.875 ms), so its
    history took the end of the sentence for a way into the next one."""
    from gateway.core.codec import ClientPlayback

    async with connect(f"ws://127.0.0.1:{relay.port}/?format=opus") as ws:
        created = await recv_event(ws, "session.created")
        upstream = tap(relay)
        await send(ws, type="transcript", text="What is on today?")
        turn = await read_turn(ws)
        assert turn.done["status"] == "completed"
        _total, sentences = decode(created["audio"], [
            HEADER.pack(1, f.flags, f.sentence, f.turn_id, f.seq) + f.pcm for f in turn.frames])
        (runner,) = gateway.runners.values()
        marks: list[float] = []
        receive = runner.receive

        def receiving(message, now):
            if isinstance(message, ClientPlayback):
                marks.append(message.played_ms)
            return receive(message, now)

        runner.receive = receiving
        watch_ms = len(sentences[0]) / 24  # (decode gives 24 kHz)
        await send(ws, type="playback", turn_id=turn.turn_id, played_ms=watch_ms)
        await send(ws, type="cancel")
        await send(ws, type="ping", id=1)
        await recv_event(ws, "pong")  # the gateway has had the mark and the cancel
    assert watch_ms > len(upstream[0]) / 24  # (the watch's time runs ahead by the padding)
    assert marks == [pytest.approx(len(upstream[0]) / 24, abs=1e-9)]


@pytest.mark.slow
async def test_dropped_gateway_socket_is_resumed_without_the_watch_noticing(gateway, relay):
    direct, direct_sentences = await direct_turn(gateway, TEXT)
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        created = await recv_event(ws, "session.created")
        await send(ws, type="say", text=TEXT)
        started = await recv_event(ws, "turn.started")
        before = await read_turn(ws, started["turn_id"], until="sentence")
        (session,) = relay.sessions
        dropped = session.gateway
        dropped.transport.abort()  # the phone's uplink drops mid-turn (no close frame)
        watch = await read_turn(ws, started["turn_id"])
        watch.events[:0], watch.frames[:0] = before.events, before.frames
        assert session.gateway is not dropped
        await send(ws, type="say", text="Still here.")
        after = await read_turn(ws)
    assert after.done["status"] == "completed"
    assert watch.done["status"] == "completed"
    assert [e["index"] for e in watch.of("sentence")] == sorted(direct_sentences)
    assert len(watch.of("turn.done")) == 1
    seqs = [f.seq for f in watch.frames + after.frames]
    assert seqs == list(range(len(seqs)))
    _t, sentences = decode(created["audio"], [
        HEADER.pack(1, f.flags, f.sentence, f.turn_id, f.seq) + f.pcm for f in watch.frames])
    for index, pcm in direct_sentences.items():
        assert abs(len(sentences[index]) - len(pcm) * 2 / 3) <= length_tolerance(gateway, 1, 2 / 3)


async def test_a_watch_flooding_messages_gets_the_gateways_1008(gateway, relay, monkeypatch):
    """The gateway closes a client past its message rate with 1008 ``too many messages``,
    which ends the session (protocol.md, Close codes); the relay passed it on as 1011, the
    code of a gateway bug, so a watch app reading protocol.md took its own flood for the
    gateway's fault. (Small figures here, as in test_gateway_ws.py, so no clock matters.)"""
    from websockets.exceptions import ConnectionClosed

    from gateway.io import connection

    monkeypatch.setattr(connection, "MESSAGE_BURST", 50, raising=False)
    monkeypatch.setattr(connection, "MESSAGES_PER_S", 0.0, raising=False)  # (no refill)
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        with pytest.raises(ConnectionClosed):  # (a send may already meet the close)
            for i in range(2000):
                await send(ws, type="ping", id=i)
            while True:
                await recv_event(ws)
    assert (ws.close_code, ws.close_reason) == (1008, "too many messages")

def test_the_relay_holds_a_watch_to_the_gateways_allowance_of_messages():
    from gateway.io import connection

    assert (watch_relay.MESSAGE_BURST, watch_relay.MESSAGES_PER_S) == \
        (connection.MESSAGE_BURST, connection.MESSAGES_PER_S)


@pytest.mark.parametrize("opcode", [0x9, 0xA, 0x2], ids=["pings", "pongs", "binary frames"])
async def test_a_watch_flooding_what_the_relay_answers_itself_is_closed_1008(gateway, relay,
                                                                             monkeypatch,
                                                                             opcode):
    """The relay answers a watch's ping frames (websockets' pongs), takes its pongs and
    refuses its binary frames (``binary_not_supported``) itself: none went up, so none
    counted toward the gateway's allowance of messages. A watch flooding pings and reading
    none of the pongs had them all queued in the relay's memory (4 million in 15 s: 42 MB
    to 530 MB RSS), and a flood of refusals took the event loop from the other watches (a
    ping of another watch answered 1.3 s late). Each counts now as at the gateway: past the
    allowance the watch is closed with 1008 ``too many messages``, the relay reads no more
    of it (the last ping goes unanswered), its gateway session ends, another watch goes on."""
    from tests.test_ws_limits import client_frame, server_frame, upgraded

    monkeypatch.setattr(watch_relay, "MESSAGE_BURST", 50)
    monkeypatch.setattr(watch_relay, "MESSAGES_PER_S", 0.0)  # (no refill: no clock matters)
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as other:
        await recv_event(other, "session.created")
        reader, writer = await upgraded(relay)
        writer.write(client_frame(0x1, b'{"type": "relay.hello", "format": "pcm16-16k"}',
                                  fin=True))
        assert orjson.loads((await unless_hung(server_frame(reader)))[1])["type"] == \
            "session.created"
        writer.write(client_frame(opcode, b"p" * 125, fin=True) * 2000)
        writer.write(client_frame(0x1, b'{"type": "ping", "id": "last"}', fin=True))
        await writer.drain()
        answers = 0
        async with hang_guard("the flooding watch's close"):
            while (frame := await server_frame(reader))[0] != 0x8:
                assert frame != (0x1, b'{"type":"pong","id":"last"}'), \
                    f"the flood was answered: {answers} answers, then the last ping"
                answers += 1
        assert frame[1] == (1008).to_bytes(2, "big") + b"too many messages"
        assert answers < 2000  # (those read with the 50th may all be answered)
        writer.close()
        async with hang_guard("the flooding watch's gateway session's end"):
            while len(gateway.runners) > 1:  # (the gateway reads the relay's close 1000)
                gateway._live_changed.clear()
                await gateway._live_changed.wait()
        await send(other, type="ping", id=1)
        assert (await unless_hung(recv_event(other, "pong"))) == {"type": "pong", "id": 1}


@pytest.mark.parametrize("bad", ["over 1 MiB", "not UTF-8"])
async def test_a_watch_message_the_link_cannot_carry_ends_the_session(gateway, relay, bad):
    """protocol.md has the gateway close 1009 (a message over 1 MiB) or 1007 (a text frame
    not UTF-8) and keep the session for a resume; the watch cannot resume through the
    relay, so from the relay the same close ends the gateway session (docs/watch-relay.md
    said nothing of either)."""
    from websockets.exceptions import ConnectionClosed

    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k",
                       max_size=None) as ws:
        await recv_event(ws, "session.created")
        if bad == "over 1 MiB":
            await send(ws, type="say", text="x" * 2**20)
        else:
            await ws.send(b'{"type":"say","text":"\xff"}', text=True)
        with pytest.raises(ConnectionClosed):
            await recv_event(ws)
    assert ws.close_code == (1009 if bad == "over 1 MiB" else 1007)
    await unless_hung(gateway.wait_no_sessions())

async def test_a_watch_message_over_64_kib_is_refused_by_the_relay(gateway, relay):
    """The relay sent a watch message of up to 1 MiB up for the gateway to refuse
    (``message_too_large``, protocol.md, Limits); but a gateway that holds its 16 MiB of
    unfinished messages (other clients') closes a socket sending one over 80 KiB with 1009,
    which the relay passed on as 1011: the watch lost its session for a message it would
    have been told was too large. The relay refuses it itself, as the gateway would."""
    gateway.unfinished.limit = 0  # others hold it all
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="x" * 900_000)
        error = await unless_hung(recv_event(ws))
        assert error["error"]["code"] == "message_too_large"
        await send(ws, type="ping", id=1)
        assert (await unless_hung(recv_event(ws))) == {"type": "pong", "id": 1}
    assert gateway.metrics.errors["unfinished_messages"] == 0

async def test_a_playback_mark_goes_up_no_larger_than_the_watch_sent_it(gateway, relay):
    """The relay sends a translated playback mark up re-encoded. All of it was: a mark of
    64 KiB at most, with numbers written short (``1e15``, 18 bytes once re-encoded), went
    up four times as large, where a gateway holding its budget of unfinished messages
    closes a socket sending one over 80 KiB with 1009 (protocol.md, Limits). The relay
    does not resume after a 1009 (the mark it would send again would meet it again): the
    watch lost its session. The mark goes up with the fields the gateway reads only."""
    gateway.unfinished.limit = 0  # others hold it all
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="Hi.")
        turn = await read_turn(ws)
        pad = ",".join(["1e15"] * 12_000)
        mark = (f'{{"type":"playback","turn_id":{turn.done["turn_id"]},"played_ms":10,'
                f'"pad":[{pad}]}}')
        assert len(mark) < 65_536 < 80 * 1024 < len(orjson.dumps(orjson.loads(mark)))
        await ws.send(mark)
        await send(ws, type="ping", id=1)
        assert (await unless_hung(recv_event(ws))) == {"type": "pong", "id": 1}
    assert gateway.metrics.errors["unfinished_messages"] == 0


async def test_unknown_format_is_refused(relay):
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=mp3") as ws:
        error = await recv_event(ws)
        assert error["error"]["code"] == "invalid_field"
        await unless_hung(ws.wait_closed())
    assert ws.close_code == 1008


@pytest.mark.parametrize(("first", "code"), [
    ("hello", "invalid_json"),  # closed 1008 with no error at all
    (b'{"type":"relay.hello","format":"opus"}', "binary_not_supported"),
    ("[1, 2]", "invalid_message"),
    ('{"type":"say","text":"Hi."}', "invalid_message"),  # (was invalid_field: no format)
    ('{"type":"relay.hello","format":"mp3"}', "invalid_field"),
], ids=["not-json", "binary", "not-an-object", "not-a-hello", "unknown-format"])
async def test_a_first_message_that_is_no_usable_hello_gets_its_error_then_1008(
        relay, first, code):
    """Without ``?format=`` the first message must be a ``relay.hello``. One that was not
    JSON closed 1008 with no ``error``, while a JSON one that was no hello got
    ``invalid_field`` first: each now gets the error that says what was wrong with it,
    in the gateway's codes (protocol.md, Errors), then the close."""
    async with connect(f"ws://127.0.0.1:{relay.port}/") as ws:
        await ws.send(first)
        error = await unless_hung(recv_event(ws))
        await unless_hung(ws.wait_closed())
    assert error["type"] == "error" and error["error"]["code"] == code
    assert ws.close_code == 1008
    assert ws.close_reason == ("unknown audio format" if code == "invalid_field"
                               else "expected ?format= or a relay.hello first message")


@pytest.mark.parametrize("first", ['{"type":"say","text":"Hi.","event_id":"h1"}',
                                   '{"type":"relay.hello","format":"mp3","event_id":"h1"}'],
                         ids=["not-a-hello", "unknown-format"])
async def test_a_refused_first_message_names_its_event_id(relay, first):
    """The relay's refusal of a first message it could read names its ``event_id``, as the
    gateway's refusals do (protocol.md, Errors)."""
    async with connect(f"ws://127.0.0.1:{relay.port}/") as ws:
        await ws.send(first)
        error = await unless_hung(recv_event(ws))
    assert error["error"].get("event_id") == "h1"


async def test_opus_without_pyav_is_refused_with_the_install_step(relay, monkeypatch):
    import examples.watch_relay as module

    monkeypatch.setattr(module, "HAS_PYAV", False)  # a plain install: no [watch] extra
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=opus") as ws:
        error = (await recv_event(ws))["error"]
        await unless_hung(ws.wait_closed())
    assert error["code"] == "invalid_field" and ".[watch]" in error["message"]
    assert ws.close_code == 1008
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        assert (await recv_event(ws))["type"] == "session.created"  # PCM needs no PyAV


async def test_a_watch_that_drops_mid_turn_ends_quietly(gateway, relay, caplog):
    """A watch losing its link is the normal case: the gateway session ends, and nothing
    is logged as a failure (it used to log an ExceptionGroup traceback)."""
    ws = await connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k")
    await recv_event(ws, "session.created")
    await send(ws, type="say", text=" ".join(["This reply keeps the watch busy."] * 6))
    await read_turn(ws, until="sentence")
    ws.transport.abort()  # no close frame
    await unless_hung(gateway.wait_no_sessions())
    assert not relay.sessions
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def test_a_watch_gone_before_its_session_created_leaves_no_gateway_session(gateway,
                                                                                  relay):
    for _ in range(3):
        ws = await connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k")
        ws.transport.abort()  # gone while the relay still opens its gateway session
    await unless_hung(gateway.wait_no_sessions())
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        assert (await recv_event(ws))["type"] == "session.created"


async def test_a_transcript_lost_with_the_gateway_socket_is_sent_again(gateway, relay):
    """The watch sees one unbroken session: a transcript the relay sent just before the
    phone's uplink dropped was lost with the socket (protocol.md, Resume: send it again),
    and the watch waited for an answer for ever."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        upstream = session.gateway
        async with lost_with_the_uplink(gateway, session, "transcript"):
            await send(ws, type="transcript", text="What is on today?")
        turn = await unless_hung(read_turn(ws))
        assert session.gateway is not upstream  # resumed on a new socket
    assert turn.done["status"] == "completed"
    assert turn.reply == "Two meetings. The first is at ten."


@pytest.mark.slow
async def test_a_gateway_keepalive_close_is_resumed_like_a_drop(gateway, relay):
    """protocol.md: after close 1011 (keepalive ping timeout) the session waits for a
    resume. The relay used to take any close frame as the end and close the watch."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=TEXT)
        started = await recv_event(ws, "turn.started")
        await read_turn(ws, started["turn_id"], until="sentence")
        (session,) = relay.sessions
        closed = session.gateway
        (conn,) = gateway.connections
        await conn.ws.close(1011, "keepalive ping timeout")
        rest = await read_turn(ws, started["turn_id"])
        assert session.gateway is not closed  # resumed on a new gateway socket
    assert rest.done["status"] == "completed"


async def test_a_session_the_gateway_lost_ends_the_watch_with_a_readable_reason(gateway,
                                                                                relay):
    """A gateway restarted (or its session expired) refuses the resume: the watch's 1011
    said so in a Python dict cut at the close's 123 bytes ("gateway session lost:
    {'code': 'resume_failed', 'message': 'cannot resume: that ..."), not in words."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        session.core.resume_token = "the session a restarted gateway never had"
        session.gateway.transport.abort()
        await unless_hung(ws.wait_closed())
    assert ws.close_code == 1011
    assert ws.close_reason.startswith("gateway session lost: resume_failed: cannot resume")
    assert "{" not in ws.close_reason


async def test_a_gateway_going_away_during_the_resume_sends_the_watch_away_at_once(gateway,
                                                                                   relay):
    """The gateway stops (close 1001, protocol.md: its sessions end) while the relay resumes
    after a drop: the relay took the close for another drop and tried again until the
    resume window ran out (30 s), then closed the watch with 1011, where a close the gateway
    means is passed on at once (1001, as when it comes outside a resume)."""
    connect_upstream, stopping = relay.connect_upstream, []

    async def connecting(resume=None):
        gw = await connect_upstream(resume)
        if resume is not None and not stopping:  # the gateway stops as the relay resumes
            stopping.append(asyncio.create_task(gateway.aclose()))
            await unless_hung(gw.wait_closed())
            assert gw.close_code == 1001
        return gw

    relay.connect_upstream = connecting
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        session.gateway.transport.abort()  # the phone's uplink drops
        # (was: the resume window, then 1011: the close code tells)
        await unless_hung(ws.wait_closed())
    await stopping[0]
    assert (ws.close_code, ws.close_reason) == (1001, "server shutting down")


async def test_a_watch_gone_while_the_relay_resumes_leaves_no_gateway_socket():
    """The watch leaving while the relay waited for the gateway's answer to its resume
    left that gateway socket open (its pings answered) until the relay exited (engines
    review)."""
    sockets: list = []
    resume_asked = asyncio.Event()

    async def gateway(ws) -> None:  # TEST DOUBLE: drops its first socket, holds its answer
        sockets.append(ws)
        await ws.send(orjson.dumps({"type": "session.created", "session_id": "s1",
                                    "resume_token": "t", "audio": {"frame_ms": 40}}).decode())
        if len(sockets) == 1:
            ws.transport.abort()  # a network drop: the relay resumes on a new socket
            return
        assert orjson.loads(await ws.recv())["type"] == "session.resume"
        resume_asked.set()
        await ws.wait_closed()  # no answer: the watch leaves meanwhile

    async with relay_to(gateway, resume_window_s=30.0) as relay:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
            await recv_event(watch, "session.created")
            await unless_hung(resume_asked.wait())
        await unless_hung(sockets[1].wait_closed())


async def test_a_watch_gone_while_the_gateway_is_unreachable_is_let_go():
    """A message from the watch waits while the relay resumes the gateway session; the
    watch leaving then went unnoticed (nobody read its socket) for the whole resume window:
    relay.aclose() took 31 s, and a gateway back within it would have had the session
    resumed and the message sent for a watch that was gone."""
    async def gateway(ws) -> None:  # TEST DOUBLE: one session, then unreachable
        await ws.send(orjson.dumps({"type": "session.created", "session_id": "s1",
                                    "resume_token": "t", "audio": {"frame_ms": 40}}).decode())
        server.close(close_connections=False)  # nothing listens any more
        ws.transport.abort()  # and the phone's uplink drops

    server = await serve(gateway, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # (a window past the hang guard: a relay that waits it out fails as hung, where a
    # bound of seconds on the stop, the assertion before, could fail a slow machine's run;
    # and not much past it, so its clean-up below ends)
    relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", resume_window_s=HANG_S + 30)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
            await recv_event(watch, "session.created")
            (session,) = relay.sessions
            await session.gateway.wait_closed()  # the relay knows: it is resuming
            await send(watch, type="ping", id=1)  # waits for the gateway ...
        # ... and the watch has left
        await unless_hung(relay.aclose())  # its session ended (was: the window, 30 s, on)
        assert not relay.sessions
    finally:
        await relay.aclose()
        await server.wait_closed()


def _unreachable_after(relay: WatchRelay, failures: int) -> asyncio.Event:
    """The relay's next ``failures`` gateway connects fail as a phone without network
    does; the returned event is set at the last of them (later connects go through)."""
    connect_upstream, attempts, failed = relay.connect_upstream, 0, asyncio.Event()

    async def connecting(resume=None):
        nonlocal attempts
        if resume is not None and attempts < failures:
            attempts += 1
            if attempts == failures:
                failed.set()
            raise OSError("Network is unreachable")
        return await connect_upstream(resume)

    relay.connect_upstream = connecting
    return failed


async def test_the_relay_gives_up_within_the_gateways_shorter_resume_window(start_gateway):
    """The gateway announces its resume window in session.created; the relay kept trying
    for its own fixed 30 s, long after the gateway had let a 1 s session go, and the watch
    heard nothing all that time."""
    gw = await start_gateway(server={"resume_window_s": 1.0})
    # its own an hour (the default is 30 s), so that the bound of the wait below tells the
    # gateway's 1 s from it by far more than the 9 s a starved machine could eat
    relay = WatchRelay(f"ws://127.0.0.1:{gw.port}/v1/voice", resume_window_s=3600.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            _unreachable_after(relay, 10**6)  # the phone's network is gone for good
            (session,) = relay.sessions
            session.gateway.transport.abort()
            await asyncio.wait_for(ws.wait_closed(), 60)  # (was: an hour, its own)
        assert ws.close_code == 1011
    finally:
        await relay.aclose()


@contextlib.asynccontextmanager
async def hanging_up_in_front_of(port: int | None):
    """A TCP proxy to the gateway on ``port`` (None: no gateway) that, while its ``hang_up``
    event is set, closes each new connection before any answer, as a gateway that is
    starting up, or a TLS one dialled with ``ws://``, does (a TEST DOUBLE of the network in
    between); yields ``(proxy_port, hang_up, hung_up)``, ``hung_up`` set at the first it
    closed so."""
    hang_up, hung_up, pumps = asyncio.Event(), asyncio.Event(), set()

    async def pump(reader, writer):
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    async def proxy(reader, writer):
        if hang_up.is_set() or port is None:
            hung_up.set()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        pumps.update(asyncio.ensure_future(p) for p in
                     (pump(reader, up_writer), pump(up_reader, writer)))

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], hang_up, hung_up
    finally:
        server.close()
        for p in pumps:
            p.cancel()
        await server.wait_closed()


async def test_a_gateway_that_hangs_up_unanswered_is_unavailable():
    """A gateway socket closed before its HTTP answer (a TLS gateway dialled with ``ws://``,
    protocol.md, Auth; a proxy with no gateway behind it) raised past the relay: the watch
    got 1011 with no reason, and the relay logged a traceback, where the doc promises
    ``gateway unavailable: …``."""
    async with hanging_up_in_front_of(None) as (port, _hang_up, _hung_up):
        await _a_watch_is_told_the_gateway_is_unavailable(port)


async def _a_watch_is_told_the_gateway_is_unavailable(port: int) -> None:
    """A relay in front of ``port`` closes a watch's socket 1011 ``gateway unavailable: …``."""
    relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await unless_hung(ws.wait_closed())
        assert ws.close_code == 1011
        assert ws.close_reason.startswith("gateway unavailable: ")
    finally:
        await relay.aclose()


async def test_a_gateway_that_cannot_be_reached_leaves_no_traceback_in_the_log(caplog):
    """The README's relay run with no gateway listening: the watch got its 1011 ``gateway
    unavailable: …``, but the relay's log then showed asyncio's "Future exception was never
    retrieved" and the connect's whole traceback (the shielded connect's outer future kept
    the refusal unread), where the close reason alone says it."""
    import gc
    import socket

    with socket.socket() as closed:  # bound, never listening: a connect is refused
        closed.bind(("127.0.0.1", 0))
        await _a_watch_is_told_the_gateway_is_unavailable(closed.getsockname()[1])
    gc.collect()  # (an unread future's exception is logged when the future is freed)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.slow
async def test_a_resume_goes_on_past_a_gateway_that_hangs_up_unanswered(gateway):
    """The gateway restarting (or a proxy in front of it) closes the relay's resume socket
    before any answer: the relay gave up with an internal error (1011, no reason, a
    traceback in its log) at the first such socket, where it retries as after a refused
    connect, for as long as the resume window lasts."""
    async with hanging_up_in_front_of(gateway.port) as (port, hang_up, hung_up):
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", resume_window_s=5.0)
        await relay.start()
        try:
            async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
                await recv_event(ws, "session.created")
                (session,) = relay.sessions
                hang_up.set()
                session.gateway.transport.abort()  # the phone's uplink drops
                await unless_hung(hung_up.wait())
                hang_up.clear()  # the gateway answers again
                await send(ws, type="ping", id=1)
                assert (await unless_hung(recv_event(ws))) == {"type": "pong", "id": 1}
        finally:
            await relay.aclose()

@pytest.mark.slow
async def test_the_relay_resumes_within_the_gateways_longer_resume_window(gateway):
    """A gateway announcing a longer window than the relay's own (here its fallback, 0.5 s,
    for a gateway announcing none) is waited on for that long: the relay gave up on a
    session the gateway still held, and the watch lost its reply."""
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=0.5)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text=TEXT)
            started = await recv_event(ws, "turn.started")
            await read_turn(ws, started["turn_id"], until="sentence")
            # 5 connects fail: 0.1 + 0.2 + 0.4 + 0.8 s of backoff, past 0.5 s, within 30 s
            failed = _unreachable_after(relay, 5)
            (session,) = relay.sessions
            dropped = session.gateway
            dropped.transport.abort()
            rest = await read_turn(ws, started["turn_id"])
            assert failed.is_set() and session.gateway is not dropped
        assert rest.done["status"] == "completed"
    finally:
        await relay.aclose()


@pytest.mark.parametrize("stall", ["session.created", "session.resumed"])
async def test_a_stalled_gateway_holds_the_resume_no_longer_than_its_window(stall):
    """The relay waited for the fresh socket's session.created and for the answer to its
    session.resume without a bound: a gateway that took the socket and said nothing (its
    pings still answered) held the watch for ever, silent, long past the resume window."""
    sockets: list = []

    async def gateway(ws) -> None:  # TEST DOUBLE: drops its first socket, then stalls
        sockets.append(ws)
        created = orjson.dumps({"type": "session.created", "session_id": "s1",
                                "resume_token": "t", "resume_window_s": 0.5,
                                "audio": {"frame_ms": 40}}).decode()
        if len(sockets) == 1:
            await ws.send(created)
            ws.transport.abort()  # a network drop: the relay resumes on a new socket
            return
        if stall == "session.resumed":
            await ws.send(created)
            assert orjson.loads(await ws.recv())["type"] == "session.resume"
        await ws.wait_closed()  # no answer

    async with relay_to(gateway, resume_window_s=0.5) as relay:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
            await recv_event(watch, "session.created")
            await unless_hung(watch.wait_closed())  # (was: never)
        assert watch.close_code == 1011
        await unless_hung(sockets[-1].wait_closed())  # and the socket let go


async def first_sentence_ms(ws) -> float:
    """Read the watch's audio up to the end of the turn's first sentence: its ms (the
    watch's time is the gateway's for pcm16 at 16 kHz, same lengths)."""
    heard_ms = 0.0
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            heard_ms += (len(message) - HEADER.size) / 32
            if HEADER.unpack_from(message)[1] & FLAG_SENTENCE_END:
                return heard_ms


async def test_the_barge_in_mark_lost_with_the_gateway_socket_is_sent_again(start_gateway):
    """The watch reports it played 'Two meetings.' whole, then cancels; the phone's uplink
    drops with both unread. The relay sent the cancel again after the resume, not the mark
    before it, so the gateway cut its history from the older mark (half the sentence):
    'Two …' where the watch had heard 'Two meetings.' (protocol.md, Resume)."""
    gateway = await start_gateway([{
        "transcript": "What is on today?",
        "reply": "Two meetings. " + " ".join(["The first one is at ten, in the big room."] * 8)}])
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="What is on today?")
            started = await recv_event(ws, "turn.started")
            heard_ms = await first_sentence_ms(ws)  # all of 'Two meetings.'
            turn_id = started["turn_id"]
            await send(ws, type="playback", turn_id=turn_id, played_ms=heard_ms / 2)
            await send(ws, type="ping", id=1)
            await recv_event(ws, "pong")  # the gateway has the older mark
            (session,) = relay.sessions
            upstream = session.gateway
            async with lost_with_the_uplink(gateway, session, "cancel"):
                await send(ws, type="playback", turn_id=turn_id, played_ms=heard_ms)
                await send(ws, type="cancel")
            while (await recv_event(ws, "turn.done"))["turn_id"] != turn_id:
                pass
            assert session.gateway is not upstream  # resumed on a new socket
            (runner,) = gateway.runners.values()
            assert runner.session.history[-1] == {"role": "assistant",
                                                  "content": "Two meetings. …"}
    finally:
        await relay.aclose()


@pytest.mark.slow
async def test_a_cancel_lost_as_its_turn_ended_is_sent_again(start_gateway):
    """The watch cancels while the reply is still coming; the gateway, not having read it,
    ends the turn (turn.done completed) and the phone's uplink drops with the cancel unread.
    The relay took that turn.done for the cancel's answer and did not send it again, so the
    gateway kept the whole reply in its history, where the watch had heard one sentence
    (protocol.md, History: a cancel in the tail of a turn still counts)."""
    gateway = await start_gateway([{
        "transcript": "What is on today?",
        "reply": "Two meetings. The first one is at ten, in the big room, with the team."}])
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="What is on today?")
            started = await recv_event(ws, "turn.started")
            heard_ms = await first_sentence_ms(ws)  # 'Two meetings.', the rest to come
            (session,) = relay.sessions
            upstream = session.gateway
            (conn,) = gateway.connections
            conn.ws.transport.pause_reading()  # what goes up now stays unread ...
            await send(ws, type="playback", turn_id=started["turn_id"], played_ms=heard_ms)
            await send(ws, type="cancel")
            done = await recv_event(ws, "turn.done")  # (the gateway never saw the cancel)
            assert done["status"] == "completed"
            resumed, core_resumed = asyncio.Event(), session.core.resumed

            def resuming(*args):
                resumed.set()
                return core_resumed(*args)

            session.core.resumed = resuming
            conn.ws.transport.abort()  # ... and is lost with the uplink
            await unless_hung(resumed.wait())
            await send(ws, type="ping", id=1)
            await unless_hung(recv_event(ws, "pong"))  # after what went again
            assert session.gateway is not upstream
            (runner,) = gateway.runners.values()
            assert runner.session.history[-1] == {"role": "assistant",
                                                  "content": "Two meetings. …"}
    finally:
        await relay.aclose()


async def test_a_full_gateway_sends_the_watch_away_with_1013(start_gateway):
    """A gateway at max_sessions answers HTTP 503 server_full (protocol.md, Connection),
    which the relay passed on to the watch as 1011, an internal error; the gateway's own
    close for a full server is 1013 (try again later), as the relay passes on once the
    session is open."""
    from websockets.exceptions import ConnectionClosed

    gateway = await start_gateway([{"transcript": "Hi", "reply": "Hello."}],
                                  server={"max_sessions": 1})
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{gateway.port}/v1/voice") as other:
            await recv_event(other, "session.created")  # the one session it takes
            async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
        assert ws.close_code == 1013 and "full" in ws.close_reason
    finally:
        await relay.aclose()


def test_a_relay_whose_port_is_taken_says_so_without_a_traceback(capsys):
    """Started a second time on the phone (the port still held by the first), the relay
    died with asyncio's traceback; it says which address it could not listen on and which
    flags set it, and exits 1."""
    import socket

    from examples.watch_relay import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port} (--host, --port)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "env", "flag"), [
    (["--watch-token", "s3cret "], {}, "--watch-token (WATCH_RELAY_TOKENS)"),
    ([], {"WATCH_RELAY_TOKENS": "pässwort"}, "--watch-token (WATCH_RELAY_TOKENS)"),
    (["--token", "s3\ncret"], {}, "--token (VOICE_GATEWAY_TOKEN)"),
])
def test_a_token_no_header_carries_as_written_is_refused_at_start(argv, env, flag, capsys,
                                                                  monkeypatch):
    """The gateway refuses such a token at start (README, Security); the relay started with
    one: a watch sending "s3cret " or "pässwort" in its Authorization header (curl sends
    UTF-8, the header arrives stripped, as ISO-8859-1) was refused for the right token, and
    a --token with a line break failed every watch's session (1011, "invalid Authorization
    header"). (The port is taken: a relay that starts anyway exits 1, not 2.)"""
    import socket

    from examples.watch_relay import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--port", str(taken.getsockname()[1])])
    assert exited.value.code == 2
    assert f"{flag}: a token must be printable ASCII" in capsys.readouterr().err


def test_an_http_upstream_is_a_usage_error(capsys):
    """``--upstream http://...`` started the relay, and each watch was then closed with 1011
    ("isn't a valid URI"). (--opus-bitrate is out of range too: without the check of the
    URL, argparse would refuse that instead of the relay serving for ever.)"""
    from examples.watch_relay import main

    with pytest.raises(SystemExit) as exited:
        main(["--upstream", "http://127.0.0.1:8780/v1/voice", "--opus-bitrate", "1"])
    assert exited.value.code == 2
    assert ("--upstream must be the gateway's ws:// or wss:// URL, not "
            "'http://127.0.0.1:8780/v1/voice'") in capsys.readouterr().err


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_a_usage_error(port, capsys):
    """``--port 70000`` (a digit too many) died of bind()'s OverflowError, in a traceback
    (the gateway's own --port is checked)."""
    from examples.watch_relay import main

    with pytest.raises(SystemExit) as exited:
        main(["--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--port must be 0–65535, not {port}" in err and "Traceback" not in err


# ---- who may use the relay ------------------------------------------------------------------


async def test_a_bind_beyond_loopback_needs_a_watch_token_or_insecure_bind():
    """``--host 0.0.0.0`` served any watch on the network, with no word said: anyone on the
    phone's Wi-Fi used the gateway session, with the gateway token the relay holds. The
    gateway's own rule (auth.py ``refused_bind``) now holds for the relay too."""
    url = "ws://127.0.0.1:9/v1/voice"  # (not connected to: no watch comes)
    with pytest.raises(ValueError, match=r"refusing to listen on 0\.0\.0\.0 without a token: "
                       r"set a watch token \(--watch-token, WATCH_RELAY_TOKENS\) or pass "
                       r"--insecure-bind"):
        await WatchRelay(url, host="0.0.0.0").start()
    for relay in (WatchRelay(url, host="0.0.0.0", watch_tokens=["w"]),
                  WatchRelay(url, host="0.0.0.0", insecure_bind=True),
                  WatchRelay(url, host="localhost")):
        await relay.start()
        await relay.aclose()


def test_the_relay_refuses_a_public_bind_without_a_watch_token_before_binding(capsys):
    """The command line says why and exits 2, like ``voice-gateway serve``. (The port is
    taken: a relay that bound first would exit 1 for that, not serve for ever.)"""
    import socket

    from examples.watch_relay import main

    with socket.create_server(("0.0.0.0", 0)) as taken:
        assert main(["--host", "0.0.0.0", "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0 without a token" in err and "Traceback" not in err


@pytest.mark.parametrize("how", ["header", "query", "subprotocol"])
async def test_a_watch_presents_its_token_as_a_gateway_client_does(start_gateway, how):
    """With watch tokens, a watch without a valid one gets the gateway's 401
    ``unauthorized``; with one, presented any way the gateway takes, its session. The same
    connect call works against the gateway, so a watch app has one way for both."""
    from websockets.exceptions import InvalidStatus

    gateway = await start_gateway([{"transcript": "Hi", "reply": "Hello."}],
                                  server={"tokens": ["sekrit"]})
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", token="sekrit",
                       watch_tokens=["sekrit"])
    await relay.start()
    try:
        for url in (f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k",
                    f"ws://127.0.0.1:{gateway.port}/v1/voice?format=pcm16-16k"):
            with pytest.raises(InvalidStatus) as refused:
                await connect(url + "&token=wrong", subprotocols=["voice.v1", "bearer.wrong"])
            assert refused.value.response.status_code == 401
            assert orjson.loads(refused.value.response.body)["error"]["code"] == "unauthorized"
            # (the relay's said text/plain and application/json both: two Content-Types)
            assert refused.value.response.headers.get_all("Content-Type") == [
                "application/json"]
            presented = {"header": {"additional_headers": {"Authorization": "Bearer sekrit"}},
                         "query": {"uri": url + "&token=sekrit"},
                         "subprotocol": {"subprotocols": ["voice.v1", "bearer.sekrit"]}}[how]
            async with connect(**{"uri": url, **presented}) as ws:
                assert (await recv_event(ws))["type"] == "session.created"
                assert ws.subprotocol == ("voice.v1" if how == "subprotocol" else None)
    finally:
        await relay.aclose()


async def test_the_relay_takes_its_gateway_token_from_the_environment(start_gateway,
                                                                       monkeypatch):
    """``--token T`` showed the gateway token to every user of the machine (``ps``); the
    relay reads it from ``VOICE_GATEWAY_TOKEN`` too, and the gateway lets its session in
    (without it: 401 upstream, and the watch closed with 1011)."""
    gateway = await start_gateway([{"transcript": "Hi", "reply": "Hello."}],
                                  server={"tokens": ["sekrit"]})
    monkeypatch.setenv("VOICE_GATEWAY_TOKEN", "sekrit")  # (the process inherits it)
    command = [sys.executable, "-m", "examples.watch_relay", "--port", "0",
               "--upstream", f"ws://127.0.0.1:{gateway.port}/v1/voice"]
    with ServeProcess(command=command) as relay:
        listening = await asyncio.to_thread(relay.wait_for,
                                            lambda x: x.startswith("watch relay on"))
        async with connect(listening.split()[3].replace("opus|pcm16-16k", "pcm16-16k")) as ws:
            assert (await recv_event(ws))["type"] == "session.created"
        relay.signal(signal.SIGTERM)
        code, output = await asyncio.to_thread(relay.finish)
    assert code == 0 and "sekrit" not in output


async def test_a_relay_the_gateway_refuses_for_its_token_says_so_on_stderr(start_gateway,
                                                                            monkeypatch):
    """A relay started without the gateway's token (or with a wrong one) closed every watch
    with 1011 "gateway unavailable: server rejected WebSocket connection: HTTP 401", and
    said nothing where it runs: the person who can fix it saw no line. It now says on its
    stderr that the gateway refused it, and where its token comes from."""
    gateway = await start_gateway([{"transcript": "Hi", "reply": "Hello."}],
                                  server={"tokens": ["sekrit"]})
    command = [sys.executable, "-m", "examples.watch_relay", "--port", "0",
               "--upstream", f"ws://127.0.0.1:{gateway.port}/v1/voice"]
    monkeypatch.delenv("VOICE_GATEWAY_TOKEN", raising=False)  # (the process inherits it)
    with ServeProcess(command=command) as relay:
        listening = await asyncio.to_thread(relay.wait_for,
                                            lambda x: x.startswith("watch relay on"))
        async with connect(listening.split()[3].replace("opus|pcm16-16k", "pcm16-16k")) as ws:
            await unless_hung(ws.wait_closed())
        assert ws.close_code == 1011 and "HTTP 401" in ws.close_reason
        refused = await asyncio.to_thread(
            relay.wait_for, lambda x: x.startswith("watch relay: the gateway refused"))
        relay.signal(signal.SIGTERM)
        code, _ = await asyncio.to_thread(relay.finish)
    assert code == 0
    assert "HTTP 401" in refused and "VOICE_GATEWAY_TOKEN" in refused


# ---- stopping -----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signalled_relay_ends_its_gateway_sessions_at_once(gateway, sig):
    """Started in the background from a script (``python examples/watch_relay.py ... &``,
    whose shell sets SIGINT to ignored, as here), the relay ignored SIGINT, and SIGTERM
    killed it with its sockets open: the gateway saw a drop (1006) and kept the session
    for its resume window (30 s); so did SIGHUP, its terminal closed. Each signal now
    stops it cleanly: the watch gets 1001 ``server shutting down``, the gateway 1000,
    which ends the session at once."""
    from websockets.exceptions import ConnectionClosed

    command = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh",  # (exec: the signal reaches it)
               sys.executable, "-m", "examples.watch_relay", "--port", "0",
               "--upstream", f"ws://127.0.0.1:{gateway.port}/v1/voice"]
    with ServeProcess(command=command) as relay:
        listening = await asyncio.to_thread(relay.wait_for,
                                            lambda x: x.startswith("watch relay on"))
        url = listening.split()[3].replace("opus|pcm16-16k", "pcm16-16k")
        async with connect(url) as ws:
            await recv_event(ws, "session.created")
            (upstream,) = gateway.connections
            relay.signal(sig)
            # (the old relay, SIGINT ignored, stays open)
            async with hang_guard("the relay closing the watch's socket"):
                with pytest.raises(ConnectionClosed):
                    await recv_event(ws)
        assert (ws.close_code, ws.close_reason) == (1001, "server shutting down")
        await upstream.ws.wait_closed()
        assert upstream.ws.close_code == 1000  # a client's normal close: the session ends
        await unless_hung(gateway.wait_no_sessions())
        code, output = await asyncio.to_thread(relay.finish)
    assert code == 0 and "Traceback" not in output


@pytest.mark.parametrize("uplink", ["connecting", "no-session-created"])
async def test_a_stopping_relay_does_not_wait_for_a_gateway_socket_still_opening(uplink):
    """A watch's gateway socket that was still opening (its handshake, or the gateway's
    session.created, unanswered: an uplink gone quiet) held the relay's stop until its
    upstream_timeout_s (10 s from the command line; here an hour) or the connect's own
    10 s, a SIGTERM or a second one with it: the process stayed up. The stop closes the
    watch, and the socket opening for it goes at once."""
    taken, gone = asyncio.Event(), asyncio.Event()

    async def silent_tcp(reader, writer) -> None:  # TEST DOUBLE: takes the socket, says nothing
        taken.set()
        await reader.read()  # until the relay lets it go
        writer.close()  # (left open, its socket was a ResourceWarning once the loop closed)
        gone.set()

    async def silent_ws(ws) -> None:  # TEST DOUBLE: a WebSocket that sends no session.created
        taken.set()
        await ws.wait_closed()
        gone.set()

    async with contextlib.AsyncExitStack() as stack:
        if uplink == "connecting":
            server = await asyncio.start_server(silent_tcp, "127.0.0.1", 0)
            stack.push_async_callback(server.wait_closed)
            stack.callback(server.close)
        else:
            server = await stack.enter_async_context(serve(silent_ws, "127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", upstream_timeout_s=3600)
        await relay.start()
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
            await unless_hung(taken.wait())
            # (was: 10 s, the connect's own bound, and the hour for a session.created)
            await unless_hung(relay.aclose())
            await unless_hung(gone.wait())
            await watch.wait_closed()
        assert (watch.close_code, watch.close_reason) == (1001, "server shutting down")
        assert not relay.sessions


async def test_a_stopping_relay_gives_a_stalled_watch_and_uplink_a_bounded_close(monkeypatch):
    """The relay's stop waited for each close to be answered, websockets' 10 s each: a watch
    that had stopped reading, then a gateway socket that answered nothing (an uplink gone
    quiet, or the audio the relay left unread before the gateway's answer), held it 20 s,
    in which more signals did nothing. A watch now has WATCH_CLOSE_TIMEOUT_S to read up to
    the close (2 s, as the gateway gives its clients), and the gateway's answer is waited
    for GATEWAY_CLOSE_TIMEOUT_S (1 s: the close frame itself ends the session); both
    shortened here."""
    import examples.watch_relay as watch_relay

    monkeypatch.setattr(watch_relay, "WATCH_CLOSE_TIMEOUT_S", 0.2, raising=False)
    monkeypatch.setattr(watch_relay, "GATEWAY_CLOSE_TIMEOUT_S", 0.2, raising=False)

    def no_default_bounds(make):
        def made(*args, **kwargs):
            kwargs.setdefault("close_timeout", None)
            kwargs.setdefault("ping_interval", None)
            return make(*args, **kwargs)
        return made

    # websockets' own close timeout (10 s) and keepalive (a ping unanswered for 20 s) are
    # for ever here: a stop that leaves the relay's sockets to them hangs, where a bound of
    # seconds on the stop, the assertion before, could fail a slow machine's run
    monkeypatch.setattr(watch_relay, "serve", no_default_bounds(watch_relay.serve))
    monkeypatch.setattr(watch_relay, "connect", no_default_bounds(watch_relay.connect))
    quiet = asyncio.Event()

    async def stalled(ws) -> None:  # TEST DOUBLE: announces a session, then reads nothing
        await ws.send(orjson.dumps({"type": "session.created", "session_id": "s",
                                    "resume_token": "t", "audio": {"frame_ms": 40}}).decode())
        ws.transport.pause_reading()
        quiet.set()
        await ws.wait_closed()

    # (the stalled peers ping nobody either: their keepalive would end what they stalled)
    async with serve(stalled, "127.0.0.1", 0, ping_interval=None) as server:
        port = server.sockets[0].getsockname()[1]
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice")
        await relay.start()
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k",
                           ping_interval=None) as watch:
            await recv_event(watch, "session.created")
            await unless_hung(quiet.wait())
            watch.transport.pause_reading()  # the watch reads nothing more
            await unless_hung(relay.aclose())  # (was: 20 s, websockets' 10 s twice)
            watch.transport.resume_reading()
        assert not relay.sessions


async def test_without_watch_tokens_no_browser_page_uses_the_relay(start_gateway):
    """On the phone's loopback without watch tokens, any web page the phone's browser
    opened could connect to ws://127.0.0.1:8790 (a WebSocket is not bound by CORS) and use
    the gateway session, with the relay's gateway token. As the gateway without tokens,
    the relay now refuses a browser Origin (403 ``forbidden_origin``); a watch app sends
    none, and with a watch token a page is let in, as by the gateway with tokens."""
    from websockets.exceptions import InvalidStatus

    gateway = await start_gateway([{"transcript": "Hi", "reply": "Hello."}],
                                  server={"tokens": ["gw"]})
    upstream = f"ws://127.0.0.1:{gateway.port}/v1/voice"
    for watch_tokens, origin_allowed in (((), False), (("w",), True)):
        relay = WatchRelay(upstream, token="gw", watch_tokens=watch_tokens)
        await relay.start()
        try:
            url = f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k&token=w"
            if origin_allowed:
                async with connect(url, origin="https://any.example") as ws:
                    assert (await recv_event(ws))["type"] == "session.created"
            else:
                with pytest.raises(InvalidStatus) as refused:
                    await connect(url, origin="https://any.example")
                assert refused.value.response.status_code == 403
                body = orjson.loads(refused.value.response.body)
                assert body["error"]["code"] == "forbidden_origin"
                assert refused.value.response.headers.get_all("Content-Type") == [
                    "application/json"]
            async with connect(url) as ws:  # (no Origin: a watch app)
                assert (await recv_event(ws))["type"] == "session.created"
        finally:
            await relay.aclose()


class SessionsSeen(set):
    """``WatchRelay.sessions`` that sets ``emptied`` when its last session is let go: an
    event to wait for (the relay itself offers none)."""

    def __init__(self) -> None:
        super().__init__()
        self.emptied = asyncio.Event()

    def discard(self, session: object) -> None:
        super().discard(session)
        if not self:
            self.emptied.set()


@pytest.mark.parametrize("watch_stays", [True, False], ids=["watch-waits", "watch-leaves"])
async def test_a_gateway_that_never_says_session_created_is_given_up(watch_stays):
    """The relay waited for a new gateway socket's session.created without a bound: a
    gateway (or a proxy in front of it) that took the socket and said nothing held the
    watch, silent, for ever, and its socket with it after the watch left; and the relay's
    own stop (SIGTERM) waited on that session for ever. It waits as long as for the
    connect now (``upstream_timeout_s``), then sends the watch away with 1011 and lets the
    socket go."""
    sockets: list = []
    taken = asyncio.Event()

    async def gateway(ws) -> None:  # TEST DOUBLE: takes the socket, never says a word
        sockets.append(ws)
        taken.set()
        await ws.wait_closed()

    async with serve(gateway, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", upstream_timeout_s=0.5)
        relay.sessions = sessions = SessionsSeen()
        await relay.start()
        try:
            async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
                await unless_hung(taken.wait())
                if watch_stays:
                    await unless_hung(watch.wait_closed())  # (was: never)
                    assert watch.close_code == 1011
                    assert "gateway unavailable" in watch.close_reason
            await unless_hung(sockets[0].wait_closed())  # (was: never)
            # the session ends without the stop (its end follows the socket's by some steps
            # of the loop: "assert not relay.sessions" here passed only by their order)
            await unless_hung(sessions.emptied.wait())
        finally:
            await unless_hung(relay.aclose())  # (was: never)


CREATED = orjson.dumps({"type": "session.created", "session_id": "s", "resume_token": "t",
                       "resume_window_s": 5, "audio": {"frame_ms": 40}}).decode()


@pytest.mark.parametrize(("sent", "why"), [
    (["not json"], "gateway unavailable: the gateway sent a message that is not JSON"),
    (['{"type": "session.created"}'], "session.created is unreadable (KeyError: 'session_id')"),
    ([CREATED, "garbage{"], "the gateway sent a message that is not JSON"),
    ([CREATED, "[1]"], "the gateway sent [1], not a JSON object"),
    ([CREATED, '{"type": "error", "error": "x"}'], "cannot read (AttributeError"),
    ([CREATED, b"\x01\x00"], "cannot read (error: unpack_from"),
    ([CREATED, HEADER.pack(1, 0, 0, 1, 0) + b"\x01"], "cannot read (ValueError"),
], ids=["created-not-json", "created-without-its-id", "not-json", "not-an-object",
        "error-not-an-object", "frame-shorter-than-its-header", "half-a-sample"])
async def test_a_gateway_sending_what_the_relay_cannot_read_ends_the_session_saying_so(
        sent, why, caplog):
    """A gateway (or something answering in its place) that sent a message the relay could
    not read, text that is not JSON or not an object, a field of the wrong type, a binary
    frame shorter than its header or with half a sample, raised in the watch's handler:
    a traceback in the log ("connection handler failed") and websockets' bare 1011 for
    the watch. The watch gets 1011 saying what the gateway sent, the relay closes the
    gateway socket (1000: the session ends, a resume would replay the same), no
    traceback."""
    closed: list[int | None] = []
    gone = asyncio.Event()

    async def gateway(ws) -> None:  # TEST DOUBLE: says what the parameters say
        for message in sent:
            await ws.send(message)
        await ws.wait_closed()
        closed.append(ws.close_code)
        gone.set()

    async with relay_to(gateway, resume_window_s=5.0) as relay:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
            await unless_hung(watch.wait_closed())
        assert watch.close_code == 1011
        assert why in watch.close_reason, watch.close_reason
        await unless_hung(gone.wait())
        assert closed == [1000]
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_a_settings_change_lost_with_the_gateway_socket_is_sent_again(gateway, relay):
    """protocol.md, Resume: a ``session.update`` lost with the socket is sent again (it is
    idempotent). The relay sent again only a transcript, say or cancel: the watch's change
    never applied, and its ``session.updated`` never came."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        upstream = session.gateway
        async with lost_with_the_uplink(gateway, session, "session.update"):
            await send(ws, type="session.update", session={"max_lead_ms": 2000})
        updated = await unless_hung(recv_event(ws))
        assert session.gateway is not upstream  # resumed on a new socket
    assert updated["type"] == "session.updated"
    assert updated["session"]["max_lead_ms"] == 2000
    (runner,) = gateway.runners.values()
    assert runner.session.settings.max_lead_ms == 2000


async def test_a_ping_lost_with_the_gateway_socket_gets_its_pong(gateway, relay):
    """protocol.md, Resume: a message with no answer once the replay is in was lost; send it
    again. The relay sent again all but a ``ping``: the watch waited for its pong for ever
    (a watch that pings to learn the gateway has read what it sent before, as these tests
    do, waited on a gateway that had)."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        upstream = session.gateway
        async with lost_with_the_uplink(gateway, session, "ping"):
            await send(ws, type="ping", id=7)
        pong = await unless_hung(recv_event(ws))  # (was: never)
        assert session.gateway is not upstream  # resumed on a new socket
        await send(ws, type="ping", id=8)
        assert await unless_hung(recv_event(ws)) == {"type": "pong", "id": 8}
    assert pong == {"type": "pong", "id": 7}


async def test_an_invalid_messages_refusal_is_not_taken_for_a_lost_updates_answer(gateway,
                                                                                 relay):
    """The gateway read a malformed frame from the watch (its refusal, ``invalid_json``,
    lost with the socket, comes in the replay), then the phone's uplink dropped with the
    ``session.update`` sent after it. The relay took any error without a turn for the
    update's answer: the refusal of the frame was taken for it, the update was not sent
    again, and the watch's change never applied."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        upstream = session.gateway
        (runner,) = gateway.runners.values()
        refuse, refused = runner.protocol_error, asyncio.Event()

        def refusing(error, now):
            refuse(error, now)
            refused.set()

        runner.protocol_error = refusing
        runner._flush = lambda: None  # the refusal stays in the gateway's outbox ...
        await ws.send("{")
        await unless_hung(refused.wait())
        del runner._flush
        async with lost_with_the_uplink(gateway, session, "session.update"):
            await send(ws, type="session.update", session={"max_lead_ms": 2000})
        # ... and comes in the replay
        events = [await unless_hung(recv_event(ws))]
        while events[-1]["type"] != "session.updated":  # (was: never)
            events.append(await unless_hung(recv_event(ws)))
        assert session.gateway is not upstream  # resumed on a new socket
    assert [e["error"]["code"] for e in events[:-1]] == ["invalid_json"]
    assert events[-1]["session"]["max_lead_ms"] == 2000
    assert runner.session.settings.max_lead_ms == 2000


def test_core_sends_a_lost_invalid_message_again():
    """A message the gateway refuses, lost with the socket, was not sent again: the watch
    never had its error, and the refusal of a session.update sent after the resume was
    taken for it, so the update, answered, went up again after the next drop
    (tests/test_relay_properties.py found it)."""
    core = RelayCore(Pcm16kAudio())
    blank = _dumps(type="transcript", text="")
    core.sent(core.from_watch(blank)[0])
    core.resumed(0, None)  # the gateway never read it
    assert core.lost() == [blank]
    update = _dumps(type="session.update", session={"voice": "nope"})
    core.sent(core.from_watch(update)[0])
    refusals = [_dumps(type="error", error={"code": "invalid_field", "message": ""}),
                _dumps(type="error", error={"code": "unknown_voice", "message": ""})]
    for refusal in refusals:
        assert core.from_gateway(refusal) == [refusal]
    core.resumed(0, None)  # another drop
    assert core.lost() == []


async def test_a_lost_invalid_message_is_refused_after_the_resume(gateway, relay):
    """An invalid message lost with the phone's uplink goes again: the watch gets its
    error, before the pong of the ping sent after it."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        (session,) = relay.sessions
        upstream = session.gateway
        async with lost_with_the_uplink(gateway, session, "ping"):
            await send(ws, type="transcript", text="", event_id="lost")
            await send(ws, type="ping", id=1)
        error = await unless_hung(recv_event(ws))  # (was: only the pong)
        assert await unless_hung(recv_event(ws)) == {"type": "pong", "id": 1}
        assert session.gateway is not upstream  # resumed on a new socket
    assert error["type"] == "error" and error["error"]["code"] == "invalid_field"
    assert error["error"]["event_id"] == "lost"  # sent again as the watch sent it


async def test_event_ids_go_through_the_relay_both_ways(gateway, relay):
    """docs/watch-relay.md: the watch's messages go up with their ``event_id``, the
    gateway's errors come down naming it, and the relay's own refusals name it too; these
    come at once, ahead of the gateway's answers to messages sent before them, so only the
    ``event_id`` tells which message each error answers."""
    async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.update", session={"frame_ms": 33}, event_id="w1")
        await send(ws, type="relay.hello", format="opus", event_id="w2")
        await send(ws, type="cancel", turn_id=-1, event_id="w3")
        await send(ws, type="session.resume", session_id="s", resume_token="t", event_id="w4")
        await send(ws, type="session.resume", session_id="s", resume_token="t", event_id=4)
        await send(ws, type="say", text="Hello there.", event_id="w5")
        await send(ws, type="ping", id="end", event_id="w6")
        errors, answers = [], []
        while not answers or answers[-1] != {"type": "pong", "id": "end"}:
            event = await unless_hung(recv_event(ws))
            (errors if event["type"] == "error" else answers).append(event)
    assert sorted((e["error"]["code"], e["error"].get("event_id") or "") for e in errors) == [
        ("invalid_field", "w1"), ("invalid_field", "w3"),  # the gateway's
        ("invalid_message", ""), ("invalid_message", "w2"), ("invalid_message", "w4")]
    assert "turn.started" in [a["type"] for a in answers]
    assert all("event_id" not in orjson.dumps(a).decode() for a in answers)


async def test_a_first_hello_asking_for_an_unknown_format_is_refused_naming_it(relay):
    async with connect(f"ws://127.0.0.1:{relay.port}/") as ws:
        await send(ws, type="relay.hello", format="mp3", event_id="h1")
        error = await recv_event(ws)
    assert error["error"]["code"] == "invalid_field" and error["error"]["event_id"] == "h1"


ANSWERS = ("turn.started", "error", "session.updated", "pong")
HI, AGENDA = {"type": "transcript", "text": "Hi"}, {"type": "transcript",
                                                     "text": "What is on today?"}
BAD_UPDATE = {"type": "session.update", "session": {"frame_ms": 33}}


@pytest.mark.parametrize(("sent", "answered", "drops"), [
    ([HI], ["rate_limited"], 1),  # refused: the minute's one turn was had
    ([AGENDA], ["turn.started"], 1),  # (a minute later)
    ([HI, AGENDA], ["rate_limited", "turn.started"], 1),
    ([HI, AGENDA], ["rate_limited", "turn.started"], 2),  # dropped again in the replay
    ([{"type": "session.update", "session": {"max_lead_ms": 2000}}], ["session.updated"], 1),
    ([BAD_UPDATE], ["invalid_field"], 1),
    ([BAD_UPDATE, AGENDA], ["invalid_field", "turn.started"], 1),
], ids=["refused", "started", "refused-then-started", "dropped-in-the-replay", "updated",
        "update-refused", "update-refused-then-started"])
async def test_what_the_replay_answers_is_not_sent_again(start_gateway, sent, answered,
                                                         drops):
    """The gateway read what the watch sent, and its answers were lost with the socket: they
    come in the replay (protocol.md, Resume: a message with no answer once the replay is in
    was lost). The relay decided what was lost before it read the replay, from
    session.resumed's turn_id: a refused transcript (rate_limited) went again and was
    refused twice; one answered by a turn after a refusal went again and its second turn
    cut the first; a session.update went again and was answered twice."""
    gateway = await start_gateway([{"transcript": "What is on today?",
                                    "reply": "Two meetings. The first is at ten."}],
                                  server={"turns_per_minute": 1})
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            await send(ws, **AGENDA)
            await read_turn(ws)  # the minute's one turn
            (runner,) = gateway.runners.values()
            (conn,) = gateway.connections
            receive, read_all = runner.receive, asyncio.Event()

            def receiving(message, now):
                if message == ClientTranscript(AGENDA["text"]):
                    runner._turn_times.clear()  # a minute has passed since the refusal
                if message == ClientPing(0):
                    read_all.set()
                return receive(message, now)

            runner.receive = receiving
            runner._flush = lambda: None  # what the gateway sends stays in its outbox ...
            for message in sent:
                await send(ws, **message)
            await send(ws, type="ping", id=0)
            await unless_hung(read_all.wait())  # (it read all that came before)
            del runner._flush
            if drops == 2:  # the new socket drops too, after the replay's first message
                (session,) = relay.sessions
                from_gateway = session.core.from_gateway

                def relaying(message):
                    out = from_gateway(message)
                    if session.core.replaying and runner.connection is not None \
                            and gateway.metrics.sessions_resumed == 1:
                        runner.connection.ws.transport.abort()
                    return out

                session.core.from_gateway = relaying
            conn.ws.transport.abort()  # ... and comes in the replay
            answers: list[dict] = []
            for last in (0, 1):
                if last:  # after what the relay sent again, if anything
                    await send(ws, type="ping", id=1)
                while (event := await unless_hung(recv_event(ws))) != \
                        {"type": "pong", "id": last}:
                    answers += [event] if event["type"] in ANSWERS else []
            if "turn.started" in answered:
                done = await unless_hung(recv_event(ws, "turn.done"))
                assert done["status"] == "completed"  # (not cut by a second one)
        assert gateway.metrics.sessions_resumed == drops
    finally:
        await relay.aclose()
    assert [a["error"]["code"] if a["type"] == "error" else a["type"] for a in answers] \
        == answered


async def test_a_cancel_sent_after_a_barge_in_is_for_the_new_turn(start_gateway):
    """The watch stops a reply, asks again and stops that one too at once: the gateway read
    the first cancel and the transcript, and the phone's uplink dropped with the second
    cancel unread. The relay took the first turn's turn.done (cancelled) for the answer to
    both cancels and did not send the second again: the new reply played on."""
    more = " ".join(["The first one is at ten, in the big room."] * 4)
    gateway = await start_gateway([
        {"transcript": "What is on today?", "reply": "Two meetings. " + more},
        {"transcript": "And tomorrow?", "reply": "One meeting. " + more}])
    relay = WatchRelay(f"ws://127.0.0.1:{gateway.port}/v1/voice", resume_window_s=5.0)
    await relay.start()
    try:
        async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="What is on today?")
            started = await recv_event(ws, "turn.started")
            await first_sentence_ms(ws)
            (session,) = relay.sessions
            (runner,) = gateway.runners.values()
            (conn,) = gateway.connections
            receive, asked = runner.receive, asyncio.Event()

            def receiving(message, now):
                receive(message, now)
                if message == ClientTranscript("And tomorrow?"):
                    conn.ws.transport.pause_reading()  # what goes up now stays unread ...
                    asked.set()

            runner.receive = receiving
            runner._flush = lambda: None  # (and the gateway's answers come in the replay)
            await send(ws, type="cancel")
            await send(ws, type="transcript", text="And tomorrow?")
            await unless_hung(asked.wait())
            upstream, sent_up = session.gateway, asyncio.Event()
            send_up = upstream.send

            async def sending(message, *args, **kwargs):
                await send_up(message, *args, **kwargs)
                sent_up.set()

            upstream.send = sending
            await send(ws, type="cancel")
            await unless_hung(sent_up.wait())
            del runner._flush
            conn.ws.transport.abort()  # ... and is lost with the uplink
            done: dict[int, str] = {}
            while len(done) < 2:
                event = await unless_hung(recv_event(ws, "turn.done"))
                done[event["turn_id"]] = event["status"]
            assert session.gateway is not upstream
    finally:
        await relay.aclose()
    assert done == {started["turn_id"]: "cancelled", started["turn_id"] + 1: "cancelled"}


async def test_a_gateway_slower_to_answer_than_websockets_own_bound_is_waited_for(monkeypatch):
    """The relay bounds its gateway connect by ``upstream_timeout_s``, but websockets'
    ``connect`` kept its own ``open_timeout`` (10 s) inside it: a relay given more (a slow
    uplink) was cut at 10 s and then told the watch "no answer within" its own, longer, bound.
    Here websockets' default is 0.1 s, and the gateway answers the handshake 0.5 s late."""
    import examples.watch_relay as watch_relay

    def short_default(make):
        def made(*args, **kwargs):
            kwargs.setdefault("open_timeout", 0.1)  # (stands for websockets' own 10 s)
            return make(*args, **kwargs)
        return made

    monkeypatch.setattr(watch_relay, "connect", short_default(watch_relay.connect))

    async def late(connection, request):  # TEST DOUBLE: an uplink slow to answer
        await asyncio.sleep(0.5)  # (the scenario, not an ordering: a later answer only waits)

    async def gateway(ws) -> None:  # TEST DOUBLE
        await ws.send(orjson.dumps({"type": "session.created", "session_id": "s1",
                                    "resume_token": "t", "audio": {"frame_ms": 40}}).decode())
        await ws.wait_closed()

    async with serve(gateway, "127.0.0.1", 0, process_request=late) as server:
        port = server.sockets[0].getsockname()[1]
        relay = WatchRelay(f"ws://127.0.0.1:{port}/v1/voice", upstream_timeout_s=HANG_S)
        await relay.start()
        try:
            async with connect(f"ws://127.0.0.1:{relay.port}/?format=pcm16-16k") as watch:
                created = await unless_hung(recv_event(watch))
        finally:
            await unless_hung(relay.aclose())
    assert created["type"] == "session.created", created  # (was: a 1011 close)
