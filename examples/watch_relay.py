"""Watch relay: runs on the phone, holds the gateway session, and serves the watch a thinner
audio format over its own WebSocket.

    python examples/watch_relay.py --upstream ws://127.0.0.1:8780/v1/voice --port 8790
    # the watch connects to ws://127.0.0.1:8790/?format=opus   (or format=pcm16-16k)

Beyond the loopback (``--host 0.0.0.0``) it needs watch tokens (``--watch-token``,
``WATCH_RELAY_TOKENS``), presented as to the gateway, or ``--insecure-bind``. The gateway's
token is ``--token`` or ``VOICE_GATEWAY_TOKEN`` (which ``ps`` does not show).

The watch speaks protocol v1 (protocol.md) to the relay, with three differences:

* **Audio format.** Chosen by the watch with the query parameter ``?format=opus`` or
  ``?format=pcm16-16k``, or (no query parameter) by its first message
  ``{"type":"relay.hello","format":"opus"}``; the relay sends ``session.created`` once it
  knows the format. ``session.created.audio`` announces it:

  - ``{"format":"opus","sample_rate":24000,"channels":1,"frame_ms":20,"bitrate":24000,
    "pre_skip":312}``: one Opus packet (libopus, VOIP, 24 kHz mono, 20 ms) per binary frame.
    The encoder is new for every turn, so the watch starts a new decoder when ``turn_id``
    changes and drops the first ``pre_skip`` decoded samples of each turn (48 kHz samples, as
    in Ogg Opus: the encoder's 6.5 ms look-ahead). The last packet of each sentence is padded
    with silence to a whole 20 ms frame, and by at least the look-ahead, so all of a
    sentence's audio is decodable from that sentence's packets: the watch hears up to
    26.5 ms of extra silence per sentence, which ``sentence.done``'s ``audio_ms`` counts
    (below).
  - ``{"format":"pcm16","sample_rate":16000,"channels":1,"frame_ms":...}``: PCM16 LE mono
    at 16 kHz (resampled with soxr, one stream per sentence, flushed at its end), one binary
    frame per gateway frame.

  ``session.created`` carries the gateway's ``session_id`` and settings but no
  ``resume_token`` nor ``resume_window_s``: the relay, not the watch, resumes the gateway
  session. ``relay.upstream_audio`` is the gateway's own ``audio``.

* **Binary frames** (relay → watch) keep the gateway's 12-byte little-endian header:

  | offset | type | field |
  | --- | --- | --- |
  | 0 | u8 | version = 1 |
  | 1 | u8 | flags: bit0 = last frame of its sentence, bit1 = last frame of the turn |
  | 2 | u16 | sentence index |
  | 4 | u32 | turn_id (the gateway's) |
  | 8 | u32 | seq: the relay's own, per watch connection, from 0, +1 per frame, gapless |
  | 12 | … | one Opus packet, or PCM16 samples |

  A frame with an empty payload is, as upstream, only a turn's end marker (flags 0x03).

* **Playback marks** are in the watch's time (what it played, padding included); the relay
  translates ``played_ms`` to the gateway's audio time of the same turn before forwarding.
  With Opus, ``sentence.done``'s ``audio_ms`` is in the watch's time too (its padding
  included), so a ``played_ms`` built by adding them up, as protocol.md allows, is right.

Every other JSON message goes through unchanged both ways (``transcript``, ``say``,
``cancel``, ``session.update``, ``ping`` up; all events down), ``event_id`` included (a
mark keeps its own too). ``session.resume`` from the watch is answered with ``error``
``invalid_message`` (naming its ``event_id``, as the relay's other refusals do): when the
watch goes away the relay ends the gateway session. When the *gateway* socket drops (no
close frame), the relay reconnects and sends ``session.resume`` with the last gateway
``seq`` it saw, skips the replayed messages it had already relayed, relays the rest, then
sends again a ``transcript``, ``say``, ``cancel``, ``session.update``, ``ping`` or invalid
message (refused again: the watch gets its error) the replay left unanswered (a barge-in
after the last ``playback`` mark it sent for the turn, which the gateway cuts the turn's
history from; what the watch sends meanwhile waits until then), and the watch sees one
unbroken session. It tries for the gateway's announced ``resume_window_s``, every wait for
the gateway's answers to the resume bounded by it; if the resume fails, or the window runs
out, the watch is closed with 1011 (with the gateway's own 1000, 1001 or 1013 at once when
it ends the session by a close, during a resume too).

Structure: ``RelayCore`` is sans-I/O (messages in, messages out); ``OpusAudio`` /
``Pcm16kAudio`` turn a turn's 24 kHz PCM into the watch's frames and keep the ``Timeline``
that translates playback marks; ``WatchRelay`` is the asyncio shell. ``WatchDecoder`` is
what the watch does with the frames (used by the tests and bench/watch_bytes.py).
Needs ``av`` (PyAV, bundles libopus), ``soxr``, ``numpy``, ``websockets``, and the gateway
package itself (``pip install -e .``): it shares the rules of who may connect
(``gateway.io.auth``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import http
import importlib.util
import os
import struct
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeGuard

import numpy as np
import orjson
import soxr
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Event

from gateway.core.codec import (
    MAX_MESSAGE_BYTES,
    ClientCancel,
    ClientPing,
    ClientPlayback,
    ClientSay,
    ClientSessionUpdate,
    ClientTranscript,
    ProtocolError,
    decode_client,
    error_object,
    load_frame,
)
from gateway.io.aio import cancel_and_wait, stop_signal, unless_stopped
from gateway.io.auth import (
    SENDABLE_TOKEN,
    UNAUTHORIZED,
    UNSENDABLE_TOKEN,
    bind_address,
    check_token,
    configured_tokens,
    install_redaction,
    is_loopback,
    refused_bind,
    select_subprotocol,
)
from gateway.io.connection import message_allowed

HEADER = struct.Struct("<BBHII")  # version, flags, sentence, turn_id, seq
VERSION = 1
FLAG_SENTENCE_END, FLAG_TURN_END = 0x01, 0x02
SEQ_MOD = 2**32
UP_RATE = 24_000
UP_SAMPLES_PER_MS = UP_RATE // 1000
OPUS_FRAME = 480  # 20 ms at 24 kHz
FORMATS = ("opus", "pcm16-16k")
TOKENS_ENV = "WATCH_RELAY_TOKENS"
GATEWAY_TOKEN_ENV = "VOICE_GATEWAY_TOKEN"
"""The gateway token, where ``ps`` does not show it to every user of the machine as it shows
``--token``. Not the first of the gateway's ``VOICE_GATEWAY_TOKENS``: that is the list a
gateway accepts (a relay started where the gateway's environment is would send one of them
unasked), and its first changes when tokens are rotated."""
HOW_TO_SET_TOKENS = f"set a watch token (--watch-token, {TOKENS_ENV})"
WATCH_CLOSE_TIMEOUT_S = 2.0
"""How long a watch has to read up to the relay's close (``server shutting down``, or the
gateway's close passed on) before its TCP connection is aborted, as the gateway gives its
clients (protocol.md, 1001): websockets' 10 s held the relay's stop as long for a watch
that had stopped reading."""
GATEWAY_CLOSE_TIMEOUT_S = 1.0
"""How long the relay waits for the gateway's answer to its close before aborting the
socket: the close itself ends the session once the gateway reads it, whatever comes back."""
MESSAGE_BURST, MESSAGES_PER_S = 200, 50.0
"""The gateway's allowance of messages (``gateway.io.connection``'s, protocol.md, Limits),
which the relay holds each watch to itself (``WatchSocket``), pings and pongs included."""
CLOSE_TOO_MANY_MESSAGES = (1008, "too many messages")
HAS_PYAV = importlib.util.find_spec("av") is not None
NO_PYAV = "PyAV is not installed (pip install -e '.[watch]')"


@dataclass(frozen=True, slots=True)
class Packet:
    """One downstream frame before its header: payload, flags and sentence index."""

    payload: bytes
    flags: int
    sentence: int


class Timeline:
    """One turn's audio as the watch plays it vs as the gateway sent it, in milliseconds.

    ``add(down_ms, up_ms)`` appends a stretch (``up_ms`` 0 for inserted padding);
    ``to_upstream(played_ms)`` interpolates, clamped to what was sent."""

    def __init__(self) -> None:
        self._down = [0.0]
        self._up = [0.0]

    @property
    def down_ms(self) -> float:
        """The watch's time at the end of what was added."""
        return self._down[-1]

    def add(self, down_ms: float, up_ms: float) -> None:
        if down_ms <= 0:
            return
        self._down.append(self._down[-1] + down_ms)
        self._up.append(self._up[-1] + up_ms)

    def to_upstream(self, played_ms: float) -> float:
        if played_ms <= 0:
            return 0.0
        i = bisect.bisect_left(self._down, played_ms)
        if i >= len(self._down):
            return self._up[-1]
        d0, d1, u0, u1 = self._down[i - 1], self._down[i], self._up[i - 1], self._up[i]
        return u0 + (u1 - u0) * (played_ms - d0) / (d1 - d0)


class OpusAudio:
    """24 kHz PCM16 frames of one turn at a time → 20 ms Opus packets (one encoder per
    turn; each sentence's tail padded with silence, see the module docstring)."""

    def __init__(self, bitrate: int = 24_000) -> None:
        self.bitrate = bitrate
        self.pre_skip_24k = _opus_lookahead(bitrate)
        self.audio = {"format": "opus", "sample_rate": UP_RATE, "channels": 1, "frame_ms": 20,
                      "bitrate": bitrate, "pre_skip": 2 * self.pre_skip_24k}
        self.turn_id: int | None = None
        self.timeline = Timeline()
        self._encoder: Any = None
        self._pending = np.zeros(0, dtype="<i2")
        self._open = False  # audio fed since the last sentence end
        self._pts = 0
        self._ends: dict[int, float] = {}  # sentence → the watch's ms at its end
        self._told_ms = 0  # the watch's ms of the sentences ``sentence_ms`` has told

    def sentence_ms(self, sentence: Any, audio_ms: Any) -> Any:
        """``sentence.done``'s ``audio_ms`` in the watch's time: the sentence's audio and
        the silence padding its last packet (up to 26.5 ms, the module docstring), so that
        a ``played_ms`` built by adding them up (protocol.md) is the watch's time, as a
        mark must be. With the gateway's figure it fell short by every earlier sentence's
        padding, and the relay, taking it for the watch's time, sent the gateway a mark
        short of a sentence heard whole by up to 26.5 ms per sentence before it: past the
        20 ms a sentence's end may be short by, the history cut it. Rounded so that the
        figures add up to the watch's time to the ms. ``audio_ms`` as it is for a sentence
        whose end was not fed."""
        end = self._ends.pop(sentence, None)
        if end is None:
            return audio_ms
        told, self._told_ms = self._told_ms, round(end)
        return self._told_ms - told

    def feed(self, turn_id: int, sentence: int, flags: int, pcm: bytes) -> list[Packet]:
        if turn_id != self.turn_id:
            self.reset(turn_id)
        samples = np.frombuffer(pcm, dtype="<i2")
        if len(samples):
            self._open = True
            self._pending = np.concatenate([self._pending, samples])
            self.timeline.add(len(samples) / UP_SAMPLES_PER_MS, len(samples) / UP_SAMPLES_PER_MS)
        whole = len(self._pending) // OPUS_FRAME * OPUS_FRAME
        payloads = self._encode(self._pending[:whole])
        self._pending = self._pending[whole:]
        packets = [Packet(p, 0, sentence) for p in payloads]
        if flags & FLAG_SENTENCE_END:
            if self._open:
                pad = self.pre_skip_24k + (-(len(self._pending) + self.pre_skip_24k)) % OPUS_FRAME
                self.timeline.add(pad / UP_SAMPLES_PER_MS, 0.0)
                tail = np.concatenate([self._pending, np.zeros(pad, dtype="<i2")])
                packets += [Packet(p, 0, sentence) for p in self._encode(tail)]
                self._pending = np.zeros(0, dtype="<i2")
                self._open = False
                self._ends[sentence] = self.timeline.down_ms
            if packets:
                packets[-1] = Packet(packets[-1].payload, flags, sentence)
            else:  # an empty end-of-turn marker after the sentence had ended
                packets.append(Packet(b"", flags, sentence))
        return packets

    def reset(self, turn_id: int | None) -> None:
        """A new turn (or none): a fresh encoder and timeline, buffered samples dropped."""
        self.turn_id = turn_id
        self.timeline = Timeline()
        self._encoder = None if turn_id is None else _opus_encoder(self.bitrate)
        self._pending = np.zeros(0, dtype="<i2")
        self._open = False
        self._pts = 0
        self._ends.clear()
        self._told_ms = 0

    def _encode(self, samples: np.ndarray) -> list[bytes]:
        import av

        out: list[bytes] = []
        for start in range(0, len(samples), OPUS_FRAME):
            frame = av.AudioFrame.from_ndarray(samples[start:start + OPUS_FRAME].reshape(1, -1),
                                               format="s16", layout="mono")
            frame.sample_rate = UP_RATE
            frame.pts = self._pts
            self._pts += OPUS_FRAME
            out += [bytes(p) for p in self._encoder.encode(frame)]
        return out


def _opus_encoder(bitrate: int) -> Any:
    import av

    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate = UP_RATE
    encoder.layout = "mono"
    encoder.format = "s16"
    encoder.bit_rate = bitrate
    encoder.time_base = Fraction(1, UP_RATE)
    encoder.options = {"application": "voip", "frame_duration": "20"}
    encoder.open()
    return encoder


def _opus_lookahead(bitrate: int) -> int:
    """The encoder's look-ahead in 24 kHz samples: minus the first packet's pts."""
    import av

    encoder = _opus_encoder(bitrate)
    frame = av.AudioFrame.from_ndarray(np.zeros((1, OPUS_FRAME), dtype="<i2"), format="s16",
                                       layout="mono")
    frame.sample_rate, frame.pts = UP_RATE, 0
    (packet,) = encoder.encode(frame)
    return -int(packet.pts)


class Pcm16kAudio:
    """24 kHz PCM16 frames → 16 kHz PCM16 frames of the same length (one soxr stream per
    sentence, flushed at its end)."""

    RATE = 16_000

    def __init__(self) -> None:
        self.audio: dict[str, Any] = {"format": "pcm16", "sample_rate": self.RATE,
                                      "channels": 1}
        self.turn_id: int | None = None
        self.timeline = Timeline()
        self._stream = soxr.ResampleStream(UP_RATE, self.RATE, 1, dtype="int16")
        self._pending = np.zeros(0, dtype="<i2")
        self._sentence_up_ms = 0.0  # the sentence's gateway audio so far
        self._sentence_down_ms = 0.0  # and what of it went to the watch

    def feed(self, turn_id: int, sentence: int, flags: int, pcm: bytes) -> list[Packet]:
        if turn_id != self.turn_id:
            self.reset(turn_id)
        samples = np.frombuffer(pcm, dtype="<i2")
        end = bool(flags & FLAG_SENTENCE_END)
        if len(samples) or end:
            self._pending = np.concatenate(
                [self._pending, self._stream.resample_chunk(samples, last=end)])
        self._sentence_up_ms += len(samples) / UP_SAMPLES_PER_MS
        # soxr hands out blocks of ~490 samples, so a 40 ms frame gives 489 or 979 of
        # them: send the frame's own length once that much is there (a jitter buffer
        # wants even frames), and the rest at the sentence's end
        size = len(self._pending) if end else len(samples) * self.RATE // UP_RATE
        if not flags and (size == 0 or len(self._pending) < size):
            return []
        out, self._pending = self._pending[:size], self._pending[size:]
        down_ms = len(out) / (self.RATE / 1000)
        # the same audio at another rate: the watch's ms are the gateway's, and the
        # sentence's end settles what the resampler's delay left over
        self.timeline.add(down_ms, self._sentence_up_ms - self._sentence_down_ms if end
                          else down_ms)
        self._sentence_down_ms += down_ms
        if end:
            self._stream.clear()
            self._sentence_up_ms = self._sentence_down_ms = 0.0
        return [Packet(np.ascontiguousarray(out, dtype="<i2").tobytes(), flags, sentence)]

    def reset(self, turn_id: int | None) -> None:
        self.turn_id = turn_id
        self.timeline = Timeline()
        self._stream.clear()
        self._pending = np.zeros(0, dtype="<i2")
        self._sentence_up_ms = self._sentence_down_ms = 0.0


def make_audio(fmt: str, *, opus_bitrate: int = 24_000) -> OpusAudio | Pcm16kAudio:
    if fmt == "opus":
        return OpusAudio(opus_bitrate)
    if fmt == "pcm16-16k":
        return Pcm16kAudio()
    raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


class RelayCore:
    """The relay's logic, without I/O: gateway messages in → watch messages out, watch
    messages in → gateway messages out, and the bookkeeping a resume needs."""

    def __init__(self, audio: OpusAudio | Pcm16kAudio) -> None:
        self.audio = audio
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.last_seq: int | None = None
        """The gateway ``seq`` of the last frame received (for ``session.resume``)."""
        self.resume_window_s: float | None = None
        """How long the gateway keeps the session for a resume (its ``session.created``
        says; None when it does not)."""
        self._ended: tuple[int, Timeline] | None = None  # the last turn ended, still playing
        self._unanswered: list[tuple[str, str]] = []
        """(type, message): a ``transcript``, ``say``, ``cancel``, ``session.update`` or
        ``ping`` sent up whose effect has not been seen: lost if the gateway socket drops
        with it, so sent again after the resume (protocol.md, Resume). Also, as type
        ``invalid``, a message the gateway refuses (an error with no turn), until that
        refusal comes: its refusal is no session.update's answer, and it goes again too
        (refused again, it changes nothing): left out, the watch never had its error, and
        the next refusal (a session.update's) was taken for it, so that update went up a
        second time after the next drop."""
        self._answered_turn = 0
        """The newest turn whose ``transcript`` or ``say`` has left ``_unanswered``. The
        gateway handles messages in order and each valid one starts the next turn (or is
        refused, ``rate_limited``), so turn N answers the N-th one sent."""
        self._resumed_turn: int | None = None  # session.resumed's turn_id
        self._mark: tuple[int, str] | None = None
        """(turn_id, message): the last ``playback`` mark sent up, in the gateway's time; sent
        again before a lost barge-in (``lost``). Forgotten when a turn starts: the
        transcript that started it came, and the marks before it (a mark sent after it is
        for a turn the gateway has left)."""
        self._since_frame = 0  # gateway messages handled after that frame
        self._skip = 0  # replayed messages still to drop after a resume
        self._replay = 0  # and those still to come after them (the relay has not had them)
        self._seq = 0  # the watch's own frame seq

    # -- gateway → watch --

    def created(self, event: dict[str, Any]) -> str:
        """The gateway's first ``session.created`` → the watch's ``session.created``. (Not
        counted in ``_since_frame``: a resume without ``last_seq`` replays what followed
        it, never itself.) Raises ``GatewayMessageError`` for one the relay cannot read."""
        if event.get("type") != "session.created":
            raise GatewayMessageError(f"the gateway's first message was {_shown(event)}, "
                                      "not session.created")
        try:
            return self._created(event)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise GatewayMessageError(f"the gateway's session.created is unreadable "
                                      f"({type(exc).__name__}: {exc})") from exc

    def _created(self, event: dict[str, Any]) -> str:
        self.session_id, self.resume_token = event["session_id"], event["resume_token"]
        window = event.get("resume_window_s")
        if _is_number(window) and window >= 0:
            self.resume_window_s = float(window)
        down = {k: v for k, v in event.items() if k not in ("resume_token", "resume_window_s")}
        down["relay"] = {"upstream_audio": event.get("audio")}
        down["audio"] = dict(self.audio.audio)
        if isinstance(self.audio, Pcm16kAudio):  # one watch frame per gateway frame
            down["audio"]["frame_ms"] = event.get("audio", {}).get("frame_ms")
        return orjson.dumps(down).decode()

    def from_gateway(self, message: str | bytes) -> list[str | bytes]:
        """A gateway message → what goes to the watch. Raises ``GatewayMessageError`` for
        one the relay cannot read (not JSON, not an object, a field of the wrong type, a
        frame shorter than its header or with half a sample): it ended the watch's
        connection with a traceback in the log and websockets' bare 1011."""
        try:
            return self._from_gateway(message)
        except GatewayMessageError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, struct.error) as exc:
            raise GatewayMessageError(f"the gateway sent a message the relay cannot read "
                                      f"({type(exc).__name__}: {exc})") from exc

    def _from_gateway(self, message: str | bytes) -> list[str | bytes]:
        if self._skip:
            self._skip -= 1  # relayed before the gateway socket dropped
            return []
        if self._replay:
            self._replay -= 1
        if isinstance(message, bytes):
            _v, flags, sentence, turn_id, seq = HEADER.unpack_from(message)
            self.last_seq, self._since_frame = seq, 0
            return [self._frame(p, turn_id)
                    for p in self.audio.feed(turn_id, sentence, flags, message[HEADER.size:])]
        self._since_frame += 1
        event = gateway_event(message)
        kind = event.get("type")
        if kind == "turn.started":  # (only what the relay sent starts one)
            self._turns_started(event.get("turn_id"))
            self._mark = None  # it went up before the transcript that started this turn
        elif kind == "turn.done" and event.get("status") == "cancelled":
            # the cancels sent for it came (or a barge-in did their work): nothing left to
            # cancel. Not those after the next transcript or say: they are for its turn (the
            # gateway may not have read them). After a turn that ended otherwise a cancel
            # sent may have crossed its turn.done: it still cuts the turn's history while its
            # tail plays (protocol.md, History), so it stays to be sent again, until a
            # transcript or say after it is answered
            asked = self._oldest("transcript", "say")
            self._unanswered = [u for i, u in enumerate(self._unanswered)
                                if u[0] != "cancel" or asked is not None and i > asked]
        elif kind == "error" and "turn_id" not in event \
                and event.get("error", {}).get("code") == "rate_limited":
            self._answered(1)  # the oldest transcript or say, refused
        elif kind == "error" and "turn_id" not in event:
            # the oldest message refused as invalid, or the oldest session.update (refused),
            # whichever went first: the gateway answers in the order it reads. Taken for the
            # update's always, a malformed frame's refusal left an update lost after it
            # unsent again
            if (answered := self._oldest("invalid", "session.update")) is not None:
                del self._unanswered[:answered + 1]
        elif kind in ("session.updated", "pong"):
            # the oldest session.update came (applied), or the oldest ping: the gateway read
            # it, and all sent before it
            if (answered := self._oldest("session.update" if kind != "pong" else "ping")) \
                    is not None:
                del self._unanswered[:answered + 1]
        if kind == "turn.done" and (playing := self.audio.turn_id) is not None \
                and event.get("turn_id") == playing:
            # its tail plays on up to max_lead_ms, and marks for it still count (protocol.md,
            # History): keep its timeline
            self._ended = (playing, self.audio.timeline)
            self.audio.reset(None)  # a cancelled turn's buffered tail is never sent
        if kind in ("session.created", "session.resumed"):
            return []  # the relay's business, not the watch's
        if kind == "sentence.done" and isinstance(self.audio, OpusAudio) \
                and event.get("turn_id") == self.audio.turn_id:
            event["audio_ms"] = self.audio.sentence_ms(event.get("index"), event.get("audio_ms"))
            return [orjson.dumps(event).decode()]
        return [message]

    def _frame(self, packet: Packet, turn_id: int) -> bytes:
        header = HEADER.pack(VERSION, packet.flags, packet.sentence, turn_id, self._seq)
        self._seq = (self._seq + 1) % SEQ_MOD
        return header + packet.payload

    # -- watch → gateway --

    def sent(self, message: str) -> None:
        """``message`` (from ``from_watch``: a mark already in the gateway's time) went up on
        the gateway socket."""
        try:  # as the gateway reads it (its own codec)
            decoded = decode_client(message)
        except ProtocolError:
            # refused (an error with no turn): it does nothing, but its refusal is an answer
            # in the order the gateway reads, not the answer of a session.update
            self._unanswered.append(("invalid", message))
            return
        match decoded:
            case ClientTranscript() | ClientSay() | ClientCancel() | ClientSessionUpdate() \
                    | ClientPing():
                # (a session.update is answered, whether applied or refused: session.updated,
                # or an error; a ping by its pong, which the watch may be waiting for)
                self._unanswered.append((orjson.loads(message)["type"], message))
            case ClientPlayback(turn_id=turn_id):
                self._mark = (turn_id, message)

    def from_watch(self, message: str | bytes) -> tuple[str | None, str | None]:
        """(message for the gateway, reply for the watch); either may be None."""
        if isinstance(message, bytes):
            return None, _error("binary_not_supported", "the relay accepts text frames only")
        if len(message) > MAX_MESSAGE_BYTES // 4 and len(message.encode()) > MAX_MESSAGE_BYTES:
            # refused here, as the gateway would: sent up, one over its 80 KiB could meet
            # a gateway holding its budget of unfinished messages, whose 1009 lost the
            # session (and the phone's uplink carried up to 1 MiB for a refusal)
            return None, _error("message_too_large",
                                f"text frames are limited to {MAX_MESSAGE_BYTES} bytes")
        try:
            event = orjson.loads(message)
        except orjson.JSONDecodeError:
            return message, None  # the gateway answers invalid_json
        if not isinstance(event, dict):
            return message, None
        kind = event.get("type")
        if kind == "relay.hello":
            return None, _error("invalid_message", "relay.hello is only accepted first",
                                _event_id(message))
        if kind == "session.resume":
            return None, _error("invalid_message", "the watch cannot resume through the relay",
                                _event_id(message))
        if (kind == "playback" and (timeline := self._timeline(event.get("turn_id"))) is not None
                and _is_number(event.get("played_ms"))):
            # not rounded: a sentence's end must stay its end (a hair past it, and the
            # gateway's history has the next sentence begun: "Two meetings. …")
            played = timeline.to_upstream(event["played_ms"])
            # only the fields the gateway reads (it ignores others): the whole mark
            # re-encoded could grow past what the relay lets up (numbers written short,
            # "1e15", take 18 bytes), to where a gateway holding its budget of unfinished
            # messages closes with 1009, which the relay cannot resume from (the mark
            # would go up again first); every message the relay sends is 64 KiB at most
            # (the watch's event_id goes up too: a string never grows re-encoded)
            up = {"type": "playback", "turn_id": event["turn_id"], "played_ms": played}
            if "event_id" in event:
                up["event_id"] = event["event_id"]
            try:
                return orjson.dumps(up).decode(), None
            except orjson.JSONEncodeError:
                # an event_id nested past the 254 levels orjson writes (it reads 1,024): the
                # error ended the watch's session; the gateway refuses no mark without one
                del up["event_id"]
                return orjson.dumps(up).decode(), None
        return message, None

    def _timeline(self, turn_id: Any) -> Timeline | None:
        """The watch-to-gateway time of ``turn_id``: the turn playing, or the last one ended
        (its tail may still play); None for any other (its marks go as they are)."""
        if turn_id is None:
            return None
        if turn_id == self.audio.turn_id:
            return self.audio.timeline
        if self._ended is not None and turn_id == self._ended[0]:
            return self._ended[1]
        return None

    # -- resume --

    def resume_request(self) -> str:
        request: dict[str, Any] = {"type": "session.resume", "session_id": self.session_id,
                                   "resume_token": self.resume_token}
        if self.last_seq is not None:
            request["last_seq"] = self.last_seq
        return orjson.dumps(request).decode()

    def resumed(self, replayed: int, turn_id: int | None = None) -> None:
        """The gateway re-sends ``replayed`` messages; the first ones were already relayed.
        ``turn_id``: ``session.resumed``'s, the session's latest turn. What the drop lost is
        known once the rest of them is in (``replaying``, then ``lost``)."""
        self._skip = min(self._since_frame, replayed)
        self._replay = replayed - self._skip
        self._resumed_turn = turn_id

    @property
    def replaying(self) -> bool:
        """Messages of the resume's replay are still to come (``from_gateway``)."""
        return self._replay > 0

    def lost(self) -> list[str]:
        """After the replay: what to send again, in order. The gateway answers each
        ``transcript`` or ``say`` as it reads it (its ``turn.started``, or a refusal), each
        ``session.update`` (``session.updated``, or a refusal) and each ``ping`` (its
        ``pong``, which the watch may be waiting for), and refuses an invalid message (an
        ``error``: it goes again, refused again, so the watch gets its error), so what went
        up before
        the drop and has no answer once the replay is in was lost with it (protocol.md,
        Resume); so may a ``cancel`` be. Decided from ``session.resumed``'s ``turn_id``
        before the replay, a refusal in it was not counted: the refused transcript went
        again, or one after it answered by a turn (a second turn cut the first), and each
        second answer was taken for a later message's; a ``session.update`` whose answer
        was in it went again too. They stay unanswered until their effect is seen, and go
        again after another drop.

        Before them goes the last ``playback`` mark sent up, when a barge-in (a ``cancel``,
        ``transcript`` or ``say``) goes again and the mark is for the session's latest
        turn: the gateway cuts the turn's history from the mark it has when the
        barge-in comes (protocol.md, Resume), and an older one is up to a mark interval
        early. It is the newest mark the relay sent, so any mark that reached the gateway is
        it or an older one: sending it again never moves the gateway's count back (twice is
        harmless)."""
        again = [m for _kind, m in self._unanswered]
        if self._mark is not None and self._mark[0] == self._resumed_turn and \
                self._oldest("cancel", "transcript", "say") is not None:
            again.insert(0, self._mark[1])
        return again

    def _turns_started(self, turn_id: Any) -> None:
        """The gateway has started every turn up to ``turn_id``."""
        if isinstance(turn_id, int) and turn_id > self._answered_turn:
            self._answered(turn_id - self._answered_turn)
            self._answered_turn = turn_id

    def _oldest(self, *kinds: str) -> int | None:
        """Where the oldest message of one of ``kinds`` is in ``_unanswered`` (None: none)."""
        return next((i for i, (kind, _m) in enumerate(self._unanswered) if kind in kinds),
                    None)

    def _answered(self, count: int) -> None:
        """The ``count`` oldest transcripts or says came, and all sent before them."""
        for _ in range(count):
            asked = self._oldest("transcript", "say")
            if asked is None:
                return
            del self._unanswered[:asked + 1]


NO_HELLO = "expected ?format= or a relay.hello first message"
"""The reason of the close 1008 for a watch that named no format."""


def hello_format(message: str | bytes) -> str:
    """The format a watch's first message asks for, when its URL had no ``?format=``: a
    ``relay.hello``'s. Raises ``ProtocolError`` for any other, with the gateway's code for
    what is wrong with it (protocol.md, Errors), which the watch gets before its close
    1008: ``binary_not_supported``, ``message_too_large``, ``invalid_json``,
    ``invalid_message`` (not a ``relay.hello``), ``invalid_field`` (a format the relay does
    not make); the last two name the message's ``event_id``, as the gateway's refusals do."""
    hello = load_frame(message)  # (the gateway's own first checks)
    named = _event_id(message) if isinstance(hello, dict) else None
    if not isinstance(hello, dict) or hello.get("type") != "relay.hello":
        raise ProtocolError("invalid_message", "the first message must be a relay.hello "
                            '({"type":"relay.hello","format":...}), or the URL must hold '
                            "?format=", event_id=named)
    fmt = hello.get("format")
    if fmt not in FORMATS:
        raise ProtocolError("invalid_field", f"format must be one of {FORMATS}",
                            event_id=named)
    return str(fmt)


def _server_full(exc: Exception) -> bool:
    """The gateway refused the socket for want of room: HTTP 503 ``server_full``."""
    if not isinstance(exc, InvalidStatus) or exc.response.status_code != 503:
        return False
    try:
        return bool(orjson.loads(exc.response.body or b"")["error"]["code"] == "server_full")
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return False


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _error(code: str, message: str, event_id: str | None = None) -> str:
    return orjson.dumps({"type": "error", "error": error_object(code, message, event_id)}
                        ).decode()


def _event_id(message: str | bytes) -> str | None:
    """The ``event_id`` the gateway reads in ``message`` (its own codec: none when it is not
    a good one): the relay's own refusals name it as the gateway's do (protocol.md, Errors)."""
    try:
        return decode_client(message).event_id
    except ProtocolError as error:
        return error.event_id


# ---- asyncio shell --------------------------------------------------------------------------


RESUMABLE_CLOSES = (1006, 1007, 1011)
"""Gateway closes after which its session waits for a resume (protocol.md, Close codes):
a dropped socket, bad UTF-8, a keepalive timeout. Not 1009, although the session waits
after it too: the gateway closes so only a message over 64 KiB (over 1 MiB, or over 80 KiB
while it holds its budget of unfinished messages), and the relay sends none (it refuses a
watch's own, ``message_too_large``, and a translated ``playback`` mark goes up with the
fields the gateway reads only). One that came anyway (a proxy with a smaller limit) would be for a
message the relay sends again after the resume, to meet the same close: the watch gets
1011 at once instead."""


class UpstreamLost(Exception):
    """The gateway session could not be resumed, or the gateway ended it: the watch is
    closed with ``code``."""

    def __init__(self, message: str, code: int = 1011) -> None:
        super().__init__(message)
        self.code = code


class GatewayMessageError(UpstreamLost):
    """The gateway sent a message the relay cannot read: the session ends (a resume would
    replay it), and the watch is closed with 1011 saying so."""


def gateway_event(message: str | bytes) -> dict[str, Any]:
    """A gateway text message as the object it must be; ``GatewayMessageError`` if not."""
    if isinstance(message, bytes):
        raise GatewayMessageError("the gateway sent a binary frame where an event was due")
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError as exc:
        raise GatewayMessageError(f"the gateway sent a message that is not JSON ({exc})") \
            from exc
    if not isinstance(event, dict):
        raise GatewayMessageError(f"the gateway sent {_shown(event)}, not a JSON object")
    return event


def _shown(value: Any) -> str:
    """A value of the gateway's, as short as a close reason needs it."""
    text = repr(value.get("type") if isinstance(value, dict) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ended(exc: ConnectionClosed) -> UpstreamLost | None:
    """The gateway closed its socket on purpose (a close frame that leaves no session
    waiting for a resume, protocol.md, Close codes): what to tell the watch; None for a
    drop. Its code goes on as it came where it says the same to the watch (1008 ``too many
    messages``: the watch's own flood, not a gateway bug); 1011 for any other."""
    if exc.rcvd is None or exc.rcvd.code in RESUMABLE_CLOSES:
        return None
    code = exc.rcvd.code if exc.rcvd.code in (1000, 1001, 1008, 1013) else 1011
    return UpstreamLost(exc.rcvd.reason or "gateway closed", code)


class RelaySession:
    """One watch connection and the gateway session behind it."""

    def __init__(self, relay: WatchRelay, watch: ServerConnection, core: RelayCore) -> None:
        self.relay, self.watch, self.core = relay, watch, core
        self.gateway: ClientConnection | None = None
        self._ready = asyncio.Event()  # set while self.gateway is usable (or gone for good)
        self._gone = False
        self._closing = False

    async def _open(self) -> dict[str, Any]:
        """A gateway socket (``self.gateway``) and its ``session.created``, waited for as
        long as its connect: a gateway (or a proxy) that took the socket and said nothing
        held the watch, and after it left the socket and the relay's stop, for ever."""
        async with asyncio.timeout(self.relay.upstream_timeout_s):
            self.gateway = await self.relay.connect_upstream()
            return gateway_event(await self.gateway.recv())

    async def _open_unless_left(self) -> dict[str, Any] | None:
        """``_open()``, or None once the watch has left (the relay's stop closes it): the
        stop waited for the connect, up to upstream_timeout_s, on an uplink that answered
        nothing. A socket on its way is given GATEWAY_CLOSE_TIMEOUT_S to open, to be closed
        cleanly: a handshake cut after the gateway had answered it left a session that the
        gateway kept for a resume."""
        opening = asyncio.ensure_future(self._open())
        try:
            opened = await unless_stopped(asyncio.shield(opening), self.watch.wait_closed())
            if opened is not None:  # (read from the shield: its own copy of a refusal,
                return opened.result()  # left unread, was logged with its traceback)
            await asyncio.wait((opening,), timeout=GATEWAY_CLOSE_TIMEOUT_S)
            if opening.done() and not opening.cancelled():
                opening.exception()  # (the watch is gone: nobody to tell why)
            return None
        finally:
            await cancel_and_wait(opening)

    async def run(self) -> None:
        try:
            # (InvalidHandshake: a refusal, or a socket closed before any answer, as a
            # gateway starting up or a TLS one dialled with ws:// closes it)
            created = await self._open_unless_left()
        except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError,
                GatewayMessageError) as exc:
            if self.gateway is not None:  # (silent: it answers no close either)
                self.gateway.close_timeout = GATEWAY_CLOSE_TIMEOUT_S
                await self.gateway.close(1000)
            if isinstance(exc, TimeoutError):
                exc = TimeoutError(f"no answer within "
                                   f"{self.relay.upstream_timeout_s:g} s")
            if _server_full(exc):  # as the gateway closes a socket it has no room for
                await self.watch.close(1013, "server full: try again later")
            else:
                if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403):
                    # (the relay's own setting, not the watch's: its runner must see it)
                    print(f"watch relay: the gateway refused the relay: {exc} (its token: "
                          "--token or VOICE_GATEWAY_TOKEN)", file=sys.stderr, flush=True)
                await self.watch.close(1011, f"gateway unavailable: {exc}"[:120])
            return
        if created is None:  # the watch left first: the socket opened for it goes too
            if self.gateway is not None:
                self.gateway.close_timeout = GATEWAY_CLOSE_TIMEOUT_S
                await self.gateway.close(1000)
            return
        self._ready.set()
        try:
            watch_created = self.core.created(created)
            del created  # (held by this frame for the whole session: 1.5 KiB a watch)
            await self.watch.send(watch_created)
            del watch_created
            async with asyncio.TaskGroup() as tasks:
                down = tasks.create_task(self._gateway_to_watch())
                try:
                    await self._watch_to_gateway()
                finally:
                    self._closing = True
                    down.cancel()
        except ConnectionClosed:
            pass  # the watch left before its session.created: end the gateway session too
        except GatewayMessageError as exc:  # (its session.created: the gateway socket goes)
            await self.watch.close(exc.code, f"gateway unavailable: {exc}"[:120])
        finally:
            if self.gateway is not None:  # the watch left: end the gateway session (the
                # gateway ends it on reading the close; waiting for its answer held the
                # relay's stop 10 s on an uplink gone quiet, or while the audio the relay
                # had left unread, for a watch that read none, sat before it)
                self.gateway.close_timeout = GATEWAY_CLOSE_TIMEOUT_S
                await self.gateway.close(1000)

    async def _watch_to_gateway(self) -> None:
        try:
            async for message in self.watch:
                up, reply = self.core.from_watch(message)
                if reply is not None:
                    await self.watch.send(reply)
                if up is not None:
                    await self._send_upstream(up)
        except ConnectionClosed:
            return  # the watch dropped (no close frame): the usual way a watch leaves

    async def _send_upstream(self, message: str) -> None:
        """Waits out a gateway reconnect; dropped if the gateway session is gone, or once the
        watch has left (its session is ending: nothing more goes up for it)."""
        while True:
            if not await self._until_ready():
                return
            gateway = self.gateway
            if self._gone or gateway is None:
                return
            try:
                await gateway.send(message)
                self.core.sent(message)
                return
            except ConnectionClosed:
                if self.gateway is gateway:  # the reader has not replaced it yet
                    self._ready.clear()

    async def _until_ready(self) -> bool:
        """Wait until the gateway socket is usable (or gone for good: ``_gone``): True; or
        until the watch leaves: False. (The watch's reader waits here, so a watch that left
        is noticed by its socket's close, not by reading it.)"""
        if self._ready.is_set():
            return True
        ready = asyncio.ensure_future(self._ready.wait())
        left = asyncio.ensure_future(self.watch.wait_closed())
        try:
            done, _ = await asyncio.wait((ready, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            left.cancel()
        return left not in done

    async def _gateway_to_watch(self) -> None:
        while True:
            gateway = self.gateway
            assert gateway is not None
            lost: UpstreamLost | None
            try:
                while True:
                    for out in self.core.from_gateway(await gateway.recv()):
                        if not await self._to_watch(out):
                            return  # the watch is gone: its reader ends the session
            except ConnectionClosed as exc:
                if self._closing:
                    return
                lost = _ended(exc)  # None: a drop
            except GatewayMessageError as exc:  # (run's end closes the gateway socket)
                lost = exc
            if self.gateway is gateway:
                self._ready.clear()
            try:
                if lost is None:
                    await self._resume()
            except UpstreamLost as exc:
                lost = exc
            if lost is not None:  # tell the watch
                self._gone = True
                self._ready.set()
                await self.watch.close(lost.code, str(lost)[:120])
                return

    async def _to_watch(self, message: str | bytes) -> bool:
        """Send to the watch; False once it is gone (a closed watch is not a gateway error)."""
        try:
            await self.watch.send(message)
            return True
        except ConnectionClosed:
            return False

    async def _resume(self) -> None:
        """Resume the gateway session on a new socket within the gateway's resume window
        (from now: the gateway counts it from when it noticed the drop, about the same
        time), every wait for its answer bounded by what is left of it: a gateway that
        takes the socket and says nothing is given up at the deadline, not when the
        keepalive notices. Then relays the replay, and sends again what it left unanswered
        (``RelayCore.lost``). Raises ``UpstreamLost`` when the window runs out, the
        gateway refuses, or it ends the session meanwhile (going away: 1001)."""
        loop = asyncio.get_running_loop()
        window = self.core.resume_window_s
        deadline = loop.time() + (self.relay.resume_window_s if window is None else window)
        delay = 0.1
        while loop.time() < deadline:
            gateway: ClientConnection | None = None
            try:
                async with asyncio.timeout_at(deadline):
                    gateway = await self.relay.connect_upstream(self.core.session_id)
                    await gateway.recv()  # the fresh session's session.created: ignored
                    await gateway.send(self.core.resume_request())
                    answer = gateway_event(await gateway.recv())
                if answer.get("type") == "session.resumed":
                    # the replay, then what the drop lost goes again (known once the replay
                    # is in), before anything newer: until then the watch's messages wait
                    # (one sent meanwhile would be matched to the replay's answers). Not
                    # bounded by the window: the session is back (a gateway gone silent
                    # now is the keepalive's)
                    replayed = answer.get("replayed", 0)
                    if not isinstance(replayed, int) or replayed < 0:
                        raise GatewayMessageError(f"the gateway's session.resumed has "
                                                  f"replayed {_shown(replayed)}")
                    self.core.resumed(replayed, answer.get("turn_id"))
                    while self.core.replaying:
                        for out in self.core.from_gateway(await gateway.recv()):
                            await self._to_watch(out)
                    for message in self.core.lost():
                        await gateway.send(message)
            except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError) as exc:
                if isinstance(exc, ConnectionClosed) and (ended := _ended(exc)) is not None:
                    # (a gateway going away, 1001: not a drop to retry until the window ends)
                    raise ended from None
                if gateway is not None:  # (at the deadline: not kept, resumed or not)
                    gateway.close_timeout = GATEWAY_CLOSE_TIMEOUT_S  # (this silent: no answer)
                    await gateway.close(1000)
                # back off before the next attempt
                await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                delay = min(delay * 2, 2.0)
                continue
            except BaseException:  # the watch left meanwhile (cancelled): not kept open
                if gateway is not None:
                    await asyncio.shield(gateway.close(1000))
                raise
            if answer.get("type") != "session.resumed":
                await gateway.close(1000)
                error = answer.get("error")
                why = (f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict)
                       else f"answered {answer.get('type')!r}")
                # (a reason a person reads, not a Python dict cut at the close's 123 bytes)
                raise UpstreamLost(f"gateway session lost: {why}")
            self.gateway = gateway
            self._ready.set()
            return
        raise UpstreamLost("gateway unreachable or silent for the whole resume window")


class WatchSocket(ServerConnection):
    """A watch's connection: every message the watch sends counts toward the gateway's
    allowance (``MESSAGE_BURST`` at once, then ``MESSAGES_PER_S``), WebSocket pings and pongs
    too, as the gateway counts them. websockets answers each ping itself: a watch sending
    them and reading none of the pongs had every one queued in the relay's memory (4 million
    in 15 s took it from 42 MB to 530 MB RSS), and a flood of messages the relay refuses
    itself (binary frames, a second ``relay.hello``) never reached the gateway's count,
    while answering them held the other watches' replies (1.3 s). Past the allowance the
    watch is closed with the gateway's 1008 ``too many messages`` (its session ends), the
    relay reads no more of it, and its connection is aborted if it has not closed its end
    ``close_timeout`` later."""

    __slots__ = ("_abort_later", "_allowance", "_allowance_at")
    """(Slots: in the connection's attribute dict, these made every watch 2.1 KiB larger,
    the dict a size up.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._allowance, self._allowance_at = float(MESSAGE_BURST), self.loop.time()
        self._abort_later: asyncio.TimerHandle | None = None
        """Set once flooded: the abort of a watch that has not closed its end by then."""

    def data_received(self, data: bytes) -> None:
        if self._abort_later is None:  # (flooded: nothing more is read, nor answered)
            super().data_received(data)

    def process_event(self, event: Event) -> None:
        if self._abort_later is not None:
            return  # (read with the flood's last message: dropped)
        if isinstance(event, Frame) and (event.fin or event.opcode in (Opcode.PING,
                                                                     Opcode.PONG)) \
                and event.opcode is not Opcode.CLOSE and not self._allowed(self.loop.time()):
            self.protocol.fail(*CLOSE_TOO_MANY_MESSAGES)  # (sends it, reads no more)
            self.send_data()
            self._abort_later = self.loop.call_later(self.close_timeout or 0.0,
                                                     self.transport.abort)
            return
        super().process_event(event)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_later is not None:
            self._abort_later.cancel()
        super().connection_lost(exc)

    def _allowed(self, now: float) -> bool:
        """One more message from the watch at ``now``: False past the allowance."""
        allowed, self._allowance = message_allowed(
            self._allowance, self._allowance_at, now, burst=MESSAGE_BURST, per_s=MESSAGES_PER_S)
        self._allowance_at = now
        return allowed


class WatchRelay:
    """The relay's WebSocket server (``start()``, ``port``, ``aclose()``).

    ``resume_window_s``: how long to try resuming a dropped gateway session when the
    gateway's ``session.created`` does not announce its own window (it does since
    protocol v1's ``resume_window_s``; the announced one is used)."""

    def __init__(self, upstream_url: str, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, opus_bitrate: int = 24_000,
                 resume_window_s: float = 30.0, hello_timeout_s: float = 10.0,
                 watch_tokens: Sequence[str] = (), insecure_bind: bool = False,
                 upstream_timeout_s: float = 10.0) -> None:
        self.upstream_url, self.host, self.requested_port = upstream_url, host, port
        self.upstream_timeout_s = upstream_timeout_s
        """How long a new gateway socket may take to connect, and a new session to be
        announced (``session.created``)."""
        self.token, self.opus_bitrate = token, opus_bitrate
        self.watch_tokens, self.insecure_bind = tuple(watch_tokens), insecure_bind
        self.resume_window_s, self.hello_timeout_s = resume_window_s, hello_timeout_s
        self.sessions: set[RelaySession] = set()
        self._server: Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        """Listen. Raises ``ValueError`` for a bind beyond the loopback without a watch
        token or ``insecure_bind`` (the gateway's own rule: anyone who reached the port
        would use the gateway session, with the relay's gateway token), ``OSError`` when
        the address cannot be bound."""
        if (why := refused_bind(self.host, self.watch_tokens, self.insecure_bind,
                                HOW_TO_SET_TOKENS)) is not None:
            raise ValueError(why)
        install_redaction()  # (a watch's ?token= in a logged request line)
        self._server = await serve(self._handle, bind_address(self.host), self.requested_port,
                                   compression=None, max_size=2**20,
                                   close_timeout=WATCH_CLOSE_TIMEOUT_S,
                                   process_request=self._authorize,
                                   select_subprotocol=select_subprotocol,
                                   create_connection=WatchSocket)

    def _authorize(self, watch: ServerConnection, request: Request) -> Response | None:
        """With watch tokens, a watch presents one as a gateway client does (auth.py:
        ``Authorization: Bearer``, ``?token=``, a ``bearer.<token>`` subprotocol next to
        ``voice.v1``), or gets the gateway's HTTP 401 ``unauthorized``. Without them, no
        browser page is let in (403 ``forbidden_origin``, the gateway's rule without tokens:
        ``origin_allowlist``): any site the phone's browser opens could otherwise use the
        gateway session through ws://127.0.0.1 (a WebSocket is not bound by CORS), and a
        watch app sends no ``Origin``."""
        if not self.watch_tokens:
            if not request.headers.get_all("Origin"):
                return None
            return _refused(watch, http.HTTPStatus.FORBIDDEN, "forbidden_origin",
                            "a browser page may use the relay only with a watch token "
                            "(--watch-token)")
        if check_token(request, self.watch_tokens):
            return None
        return _refused(watch, http.HTTPStatus.UNAUTHORIZED, "unauthorized", UNAUTHORIZED)

    async def aclose(self) -> None:
        """Stop: each watch gets close 1001 ``server shutting down`` (as from the gateway),
        and its gateway session close 1000, which ends it at once (protocol.md: a client's
        normal close), not a drop the gateway would keep it for a resume after."""
        if self._server is not None:
            self._server.close(code=1001, reason="server shutting down")
            await self._server.wait_closed()

    async def connect_upstream(self, resume: str | None = None) -> ClientConnection:
        """A socket to the gateway; ``resume``: the session it is for (``?resume=``, which
        lets it in even when the gateway is full)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        url = self.upstream_url
        if resume is not None:
            parts = urllib.parse.urlsplit(url)
            url = parts._replace(query=urllib.parse.urlencode(
                [*urllib.parse.parse_qsl(parts.query), ("resume", resume)])).geturl()
        # (asyncio.timeout: wait_for on Python 3.11 drops a cancellation that comes in the
        # step the socket opens, and the relay, told to stop, went on with a socket; the
        # bound is that one alone: websockets' own open_timeout, 10 s, cut a longer one)
        async with asyncio.timeout(self.upstream_timeout_s):
            return await connect(url, compression=None, max_size=2**20,
                                 additional_headers=headers, open_timeout=None)

    async def _handle(self, watch: ServerConnection) -> None:
        assert watch.request is not None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(watch.request.path).query)
        fmt = query.get("format", [None])[0]
        event_id = None  # the relay.hello's
        try:
            if fmt is None:
                try:
                    async with asyncio.timeout(self.hello_timeout_s):
                        first = await watch.recv()
                except (TimeoutError, ConnectionClosed):  # (no message to answer)
                    await watch.close(1008, NO_HELLO)
                    return
                fmt, event_id = hello_format(first), _event_id(first)
            elif fmt not in FORMATS:
                raise ProtocolError("invalid_field", f"format must be one of {FORMATS}")
        except ProtocolError as exc:
            with contextlib.suppress(ConnectionClosed):
                await watch.send(_error(exc.code, exc.message, exc.event_id))
                await watch.close(1008, "unknown audio format" if exc.code == "invalid_field"
                                  else NO_HELLO)
            return
        if fmt == "opus" and not HAS_PYAV:
            await watch.send(_error("invalid_field", f"this relay cannot encode Opus: {NO_PYAV}; "
                                    "ask for format=pcm16-16k", event_id))
            await watch.close(1008, "opus unavailable on this relay")
            return
        session = RelaySession(self, watch, RelayCore(make_audio(fmt,
                                                                 opus_bitrate=self.opus_bitrate)))
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)


def _refused(watch: ServerConnection, status: http.HTTPStatus, code: str,
             message: str) -> Response:
    """The gateway's JSON refusal of a handshake."""
    response = watch.respond(status, orjson.dumps(
        {"error": {"code": code, "message": message}}).decode())
    del response.headers["Content-Type"]  # (respond's text/plain: setting one adds one)
    response.headers["Content-Type"] = "application/json"
    return response


# ---- what the watch does ---------------------------------------------------------------------


class WatchDecoder:
    """Reference watch side: turns the relay's binary frames back into PCM16 mono.

    ``feed(frame)`` returns ``(turn_id, sentence, flags, pcm)`` with ``pcm`` at
    ``self.rate`` (48 kHz for Opus, as libopus decodes; 16 kHz for pcm16)."""

    def __init__(self, audio: dict[str, Any]) -> None:
        self.format = audio["format"]
        self.rate = 48_000 if self.format == "opus" else audio["sample_rate"]
        self.pre_skip = int(audio.get("pre_skip", 0))
        self._turn: int | None = None
        self._decoder: Any = None
        self._to_skip = 0

    def feed(self, frame: bytes) -> tuple[int, int, int, bytes]:
        _v, flags, sentence, turn_id, _seq = HEADER.unpack_from(frame)
        payload = frame[HEADER.size:]
        if self.format != "opus" or not payload:
            return turn_id, sentence, flags, payload
        import av

        if turn_id != self._turn:
            self._turn, self._to_skip = turn_id, self.pre_skip
            self._decoder = av.CodecContext.create("libopus", "r")
            self._decoder.sample_rate, self._decoder.layout = 48_000, "mono"
        pcm = b"".join(
            np.ascontiguousarray(f.to_ndarray().reshape(-1), dtype="<i2").tobytes()
            for f in self._decoder.decode(av.Packet(payload)))
        drop = min(self._to_skip, len(pcm) // 2)
        self._to_skip -= drop
        return turn_id, sentence, flags, pcm[2 * drop:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Relay a gateway session to a watch.")
    p.add_argument("--upstream", default="ws://127.0.0.1:8780/v1/voice",
                   help="the gateway's voice socket (default %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="where the watch connects (default %(default)s)")
    p.add_argument("--port", type=int, default=8790, help="its port (default %(default)s)")
    p.add_argument("--token", help="gateway bearer token (or, not shown by ps, "
                   f"{GATEWAY_TOKEN_ENV}=T; the flag wins)")
    p.add_argument("--watch-token", action="append", help="a token the watch must present "
                   f"(repeatable; also {TOKENS_ENV}=a,b). Without any, only loopback may be "
                   "bound")
    p.add_argument("--insecure-bind", action="store_true", help="allow a non-loopback --host "
                   "without a watch token (anyone who reaches the port uses the gateway)")
    p.add_argument("--opus-bitrate", type=int, default=24_000,
                   help="bits/s (24000–32000; default %(default)s)")
    args = p.parse_args(argv)
    if urllib.parse.urlsplit(args.upstream).scheme not in ("ws", "wss"):  # (http: a traceback)
        p.error(f"--upstream must be the gateway's ws:// or wss:// URL, not {args.upstream!r}")
    if not 24_000 <= args.opus_bitrate <= 32_000:
        p.error(f"--opus-bitrate must be 24000–32000, not {args.opus_bitrate}")
    if not 0 <= args.port <= 65535:  # (bind()'s OverflowError: a traceback)
        p.error(f"--port must be 0–65535, not {args.port}")
    if any(not t.strip() for t in args.watch_token or ()):  # (`--watch-token "$UNSET"`)
        p.error("--watch-token cannot be empty")
    watch_tokens = configured_tokens(args.watch_token, TOKENS_ENV)
    token = args.token if args.token is not None else (
        os.environ.get(GATEWAY_TOKEN_ENV, "").strip() or None)
    # (as the gateway's own: a watch could not send one beyond them as written, and was
    # refused for the right token; a --token beyond them failed every watch's session)
    if any(not SENDABLE_TOKEN.fullmatch(t) for t in watch_tokens):
        p.error(f"--watch-token ({TOKENS_ENV}): {UNSENDABLE_TOKEN}")
    if token is not None and not SENDABLE_TOKEN.fullmatch(token):
        p.error(f"--token ({GATEWAY_TOKEN_ENV}): {UNSENDABLE_TOKEN}")

    async def run() -> int:
        # SIGTERM killed the relay with its sockets open, and the gateway kept each session
        # for its resume window (30 s); a relay started with `&` from a script ignored
        # SIGINT (the shell's SIG_IGN, which Python keeps: no KeyboardInterrupt), and
        # closing its terminal (SIGHUP) killed it as SIGTERM had. All three now stop it
        # cleanly, as `voice-gateway serve` (a SIGHUP ignored by `nohup` stays ignored);
        # taken before the banner, so a signal sent once it shows is not missed.
        stop = stop_signal()
        relay = WatchRelay(args.upstream, host=args.host, port=args.port, token=token,
                           opus_bitrate=args.opus_bitrate, watch_tokens=watch_tokens,
                           insecure_bind=args.insecure_bind)
        try:
            await relay.start()
        except ValueError as exc:  # a public bind without a watch token
            print(f"watch relay: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # the port taken (a relay already running), a wrong --host
            print(f"watch relay: cannot listen on {args.host}:{args.port} (--host, --port): "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        formats = "opus|pcm16-16k" if HAS_PYAV else "pcm16-16k"
        print(f"watch relay on ws://{args.host}:{relay.port}/?format={formats} "
              f"→ {args.upstream}", file=sys.stderr)
        if not HAS_PYAV:
            print(f"no Opus: {NO_PYAV}", file=sys.stderr)
        print("watch auth: " + (f"{len(watch_tokens)} token(s) required" if watch_tokens else
                                "NONE, and bound beyond loopback (--insecure-bind): anyone who "
                                "reaches this port uses the gateway" if args.insecure_bind
                                and not is_loopback(args.host) else
                                "none (no --watch-token: loopback only)"), file=sys.stderr)
        try:
            await stop.wait()
        finally:
            await relay.aclose()
        return 0

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
