"""One voice session and its turns, as a sans-I/O state machine.

Everything that changes a session's state lives here. Inputs are facts, each a method
taking ``now`` (seconds, any monotonic origin) and returning the effects the caller must
execute, in order:

* ``receive(message, now)``        a decoded client message (``codec.decode_client``)
* ``protocol_error(error, now)``   a client message that failed to decode
* ``llm_delta / llm_done / llm_failed``   from the LLM stream of a turn
* ``audio / synthesis_done / synthesis_failed``   from the lane worker of a turn's segment
* ``tick(now)``                    the pacing timer fired (see ``wake_at``)

Effects are commands (``SendEvent``, ``SendAudio``, ``SendFrames``, ``StartLlm``,
``CancelLlm``, ``StartSynthesis``, ``CancelSynthesis``, ``Received``, ``ProbeListener``).
Inputs that belong to a turn carry its ``turn_id``; anything for a turn that is no longer
active is ignored (the fence that makes late chunks after a barge-in harmless).

After executing the effects the caller asks ``wake_at()`` when to call ``tick`` next.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from engines.base import LlmRequest
from gateway.core import codec
from gateway.core.codec import (
    BYTES_PER_MS,
    FLAG_SENTENCE_END,
    FLAG_TURN_END,
    LEAD_BELOW_FRAME,
    ClientCancel,
    ClientMessage,
    ClientPing,
    ClientPlayback,
    ClientSay,
    ClientSessionUpdate,
    ClientTranscript,
    ProtocolError,
)
from gateway.core.pacer import Pacer
from gateway.core.segmenter import Segment, Segmenter, SegmenterConfig, heard_prefix

_MS_PER_CHAR = 65.0
"""Speech length estimate (about 15 characters per second) for text not yet synthesized."""
_WHOLE_SLACK_MS = 20.0
"""A sentence played to within this of its end was heard whole: no word is that short, and
a client that counts what it played by adding up ``sentence.done``'s ``audio_ms`` (whole
milliseconds) falls short by up to 0.5 ms a sentence, which cut its last word."""

DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Your replies are spoken aloud: answer in one to three "
    "short sentences of plain text, without markdown, lists or emoji."
)


# --- effects ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendEvent:
    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendAudio:
    """One binary frame, header included. ``duration_ms`` is the payload's audio length."""

    data: bytes
    duration_ms: float


@dataclass(frozen=True, slots=True)
class SendFrames:
    """Several binary frames of one segment, headers included, to be sent in this order:
    the whole frames a pacer refill releases, none of them the segment's last (no flags).
    Each holds ``frame_ms`` of audio. One effect for the run instead of a ``SendAudio`` per
    frame: a refill releases 8-10 frames, and every effect costs its dispatch."""

    frames: list[bytes]
    frame_ms: float


@dataclass(frozen=True, slots=True)
class StartLlm:
    turn_id: int
    request: LlmRequest


@dataclass(frozen=True, slots=True)
class CancelLlm:
    turn_id: int


def listed_voice(voice: str, voices: Iterable[str]) -> str | None:
    """``voice`` as ``voices`` spell it, or None when none is it: the same name in other
    letter case is the same voice ("Serena" is the model card's, "serena" the checkpoint's,
    and every engine that lists both spellings' speaker takes either). Spelt as listed, so
    that an engine that matches names exactly gets one it knows."""
    known = set(voices)
    if voice in known:
        return voice
    key = voice.casefold()
    return min((v for v in known if v.casefold() == key), default=None)


def _voice_list(voices: frozenset[str], shown: int = 20) -> str:
    names = sorted(voices)
    if len(names) <= shown:
        return f"available: {', '.join(names)}"
    return (f"available: {', '.join(names[:shown])}, … ({len(names)} in all; "
            "GET /v1/audio/voices lists them)")


@dataclass(frozen=True, slots=True)
class StartSynthesis:
    turn_id: int
    index: int
    text: str
    voice: str | None
    deadline: float
    """When the listener needs this segment's first audio (seconds, clock of ``now``)."""
    since: float | None = None
    """When the turn's first segment was ready, for every segment after the first: the lane
    ranks playing streams oldest first (``gateway.core.scheduler``, rule 2b)."""
    max_lead: float | None = None
    """Seconds: the session's ``max_lead_ms``: the lane makes audio at most this far ahead
    of the listener (``gateway.core.scheduler``, rule 3)."""


@dataclass(frozen=True, slots=True)
class CancelSynthesis:
    turn_id: int


@dataclass(frozen=True, slots=True)
class Received:
    """The client has every message up to and including the audio frame ``seq`` (a
    ``playback`` mark says it played past that frame): what is kept for a resume may be
    dropped up to there."""

    seq: int


@dataclass(frozen=True, slots=True)
class ProbeListener:
    """The client went quiet while it should be playing: ask the socket whether anyone is
    there (a WebSocket ping). Answered: ``listener_answered``. Not answered: the socket is
    gone without a word (a half-open connection, a phone in a tunnel, a suspended app), so
    drop it; the session then waits for a resume instead of sending audio nobody receives,
    past what the resume buffer can give back."""

    silent_s: float
    """How long nothing had come from the client."""


LISTENER_SILENT_S = 2.0
"""Nothing for this long from a client that sends ``playback`` marks (protocol.md: every
200-500 ms while it plays) and should still be playing: ``ProbeListener``."""
UNMARKED_SILENT_S = 10.0
"""The same for a client that sends no marks in the turn (it may send nothing at all while
it listens: probed less often, still well before the resume buffer (~20 s) is outrun)."""

SYNTHESIS_ERROR_CODES = frozenset({"engine_failed", "engine_timeout", "engine_unavailable",
                                   "internal_error"})
LLM_ERROR_CODES = frozenset({"llm_failed", "llm_unavailable", "llm_empty_reply"})
"""The codes protocol.md gives a turn whose synthesis, or LLM stream, failed. An engine's or
a backend's own code (``engine_runaway``, ``voice_unknown``, ``bad_request``, ...) goes to
the client as ``engine_failed`` (``llm_failed``), with that code leading the message
(``_documented``): a client meets only the codes of protocol.md's table."""


def _documented(code: str, message: str, codes: frozenset[str],
                other: str) -> tuple[str, str]:
    return (code, message) if code in codes else (other, f"{code}: {message}")


Effect = (SendEvent | SendAudio | SendFrames | StartLlm | CancelLlm | StartSynthesis
          | CancelSynthesis | Received | ProbeListener)


# --- settings -----------------------------------------------------------------------------


def _model_list(models: frozenset[str], own: str | None) -> str:
    names = sorted(models | ({own} if own else set()))
    if not names:
        return ("only the LLM server's default model is used here (the server offers more "
                "with [llm] models)")
    return f"offered: {', '.join(names)} (the server's [llm] model and models)"


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What a client may change with ``session.update``."""

    voice: str | None = None
    instructions: str = DEFAULT_INSTRUCTIONS
    llm_model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    frame_ms: int = 40
    max_lead_ms: int = 1000
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)

    def to_event(self) -> dict[str, Any]:
        seg = self.segmenter
        return {
            "voice": self.voice,
            "instructions": self.instructions,
            "llm": {"model": self.llm_model, "temperature": self.temperature,
                    "max_tokens": self.max_tokens},
            "frame_ms": self.frame_ms,
            "max_lead_ms": self.max_lead_ms,
            "segmenter": {"first_min_words": seg.first_min_words,
                          "first_phrase_words": seg.first_phrase_words,
                          "first_max_words": seg.first_max_words,
                          "min_chars": seg.min_chars, "max_chars": seg.max_chars,
                          "quote_max_chars": seg.quote_max_chars},
        }

    def updated(self, changes: dict[str, Any], defaults: SessionSettings) -> SessionSettings:
        """These settings with ``changes`` (``codec``'s checked ``session.update``) made; a
        ``None`` puts that setting back to its value in ``defaults``."""
        new = self
        for key, value in changes.items():
            if key == "llm":
                renames = {"model": "llm_model", "temperature": "temperature",
                           "max_tokens": "max_tokens"}
                value = dict.fromkeys(renames) if value is None else value
                new = replace(new, **{renames[k]: getattr(defaults, renames[k]) if v is None
                                      else v for k, v in value.items()})
            elif key == "segmenter":
                base = defaults.segmenter
                new = replace(new, segmenter=base if value is None else replace(
                    new.segmenter, **{k: getattr(base, k) if v is None else v
                                      for k, v in value.items()}))
            else:
                new = replace(new, **{key: getattr(defaults, key) if value is None else value})
        return new


@dataclass(frozen=True, slots=True)
class SessionLimits:
    history_turns: int = 20
    """User/assistant pairs kept for the LLM; older ones are dropped first."""
    max_reply_chars: int = 32_000
    """Longest LLM reply a turn takes (about half an hour of speech). A runaway LLM, or one
    delta of megabytes, stops there: the stream is closed and the turn fails with
    ``llm_failed`` after speaking what came before. It also bounds the turn's text events
    (escaped JSON, ``text.delta`` plus ``sentence``) to ~0.6 MB, inside the default 1 MiB
    outbox, so a client is never closed as a slow consumer for the LLM's output alone."""


# --- turns --------------------------------------------------------------------------------


@dataclass(slots=True)
class _SegmentAudio:
    segment: Segment
    pending: bytearray = field(default_factory=bytearray)
    synthesized: bool = False  # the engine finished this segment
    announced: bool = False  # `sentence` event sent
    sent_ms: float = 0.0
    made_ms: float = 0.0
    """Audio received from the engine: ``sent_ms`` plus what ``pending`` holds, and what it
    held when the turn ended (``_end_turn`` drops it, the sentence's length still counts)."""
    engine: str | None = None
    finished: bool = False  # last frame and `sentence.done` sent
    cut_short: bool = False  # an engine failed mid-sentence: the rest of it is not said


@dataclass(slots=True)
class Turn:
    id: int
    source: str  # "transcript" | "say"
    user_text: str
    started: float
    settings: SessionSettings
    segmenter: Segmenter
    pacer: Pacer
    reply: str = ""
    segments: list[_SegmentAudio] = field(default_factory=list)
    current: int = 0  # index of the segment whose frames are being sent
    llm_done: bool = False
    """No more text comes: the LLM finished, failed or was stopped (a ``say``: at once)."""
    ended: bool = False
    """``turn.done`` was sent."""
    failed: tuple[str, str] | None = None  # (code, message) of the first failure
    t_first_delta: float | None = None
    t_first_segment: float | None = None
    t_first_audio: float | None = None
    tokens_per_s: float | None = None
    engines: list[str] = field(default_factory=list)
    last_frame_turn_end: bool = False
    held_bytes: int = 0  # audio received from engines and not yet sent, all segments
    sent_until: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    """(turn audio sent, in ms, seq of the frame that ended it) per run of frames sent:
    what a ``playback`` mark's ``played_ms`` proves the client received. A client that
    reports playback keeps a few; one that never does leaves at most 64 (~20 s of runs)."""
    marking: bool = False
    """The client sent a ``playback`` mark in this turn, so it should send more while it
    plays: its silence says more, sooner (``LISTENER_SILENT_S``)."""
    playing_out: bool = False
    """Ended completed or failed, its history entry all it sent, while its last audio may
    still be playing: a barge-in before that playback ends keeps only what the client's
    mark says it heard (``_barge_in_after_the_end``)."""
    too_long: bool = False
    """The LLM refused the request as longer than its context with no history left to
    forget: the turn is not remembered, as any later request holding it would be too long
    as well (it cost the next turn a refused request before it was forgotten)."""
    event_id: str | None = None
    """The ``event_id`` of the ``transcript`` or ``say`` that started the turn: its error,
    if it has one, says it (with ``turn_id``)."""


class Session:
    """State of one connection. Not thread-safe: call from one task/thread at a time."""

    def __init__(
        self,
        session_id: str,
        *,
        settings: SessionSettings | None = None,
        limits: SessionLimits | None = None,
        voices: Iterable[str] | None = None,
        llm_models: Iterable[str] | None = None,
        reads_digits: bool = True,
    ) -> None:
        self.id = session_id
        self.settings = self.defaults = settings or SessionSettings()
        """``defaults``: the server's settings, what a null in ``session.update`` restores."""
        self.limits = limits or SessionLimits()
        self.voices = frozenset(voices) if voices is not None else None
        self.llm_models = frozenset(llm_models) if llm_models is not None else None
        """The LLM models a ``session.update`` may name besides the server's own (None:
        any): the LLM server loads the one asked for, for every session."""
        self.reads_digits = reads_digits
        self.history: list[dict[str, str]] = []
        self.turn: Turn | None = None
        self._next_turn_id = 1
        self._seq = 0
        self.held = False
        """True while no client is attached: frames stay in the session (the listener is
        not playing), so a resume continues where the listener stopped."""
        self._probing = False
        """A ``ProbeListener`` is out, not answered yet."""
        self._heard_at = -math.inf
        """When the client last showed it is there: any message, an answered probe."""

    # ---- opening ---------------------------------------------------------------------

    def open(self, *, resume_token: str | None = None, resume_window_s: float | None = None,
             default_voice: str | None = None) -> list[Effect]:
        """``default_voice``: the voice that speaks while the session's ``voice`` is null."""
        event: dict[str, Any] = {
            "type": "session.created",
            "session_id": self.id,
            "protocol": codec.PROTOCOL_VERSION,
            "audio": {"format": "pcm16", "sample_rate": codec.SAMPLE_RATE,
                      "frame_ms": self.settings.frame_ms},
            "session": self.settings.to_event(),
            "default_voice": default_voice,
        }
        if resume_token is not None:
            event["resume_token"] = resume_token
            event["resume_window_s"] = resume_window_s
        return [SendEvent(event)]

    # ---- client input ----------------------------------------------------------------

    def receive(self, message: ClientMessage, now: float) -> list[Effect]:
        self._heard_at = now
        match message:
            case ClientTranscript(text=text, event_id=event_id):
                return self._start_turn("transcript", text, now, event_id)
            case ClientSay(text=text, event_id=event_id):
                return self._start_turn("say", text, now, event_id)
            case ClientCancel(turn_id=turn_id):
                return self._cancel(turn_id, now)
            case ClientPlayback(turn_id=turn_id, played_ms=played_ms):
                return self._playback(turn_id, played_ms, now)
            case ClientSessionUpdate(settings=changes, event_id=event_id):
                return self._update_settings(changes, now, event_id)
            case ClientPing(id=ping_id):
                event: dict[str, Any] = {"type": "pong"}
                if ping_id is not None:
                    event["id"] = ping_id
                return [SendEvent(event)]
            case _:
                assert_never(message)

    def _cancel(self, turn_id: int | None, now: float) -> list[Effect]:
        """``cancel``: end the turn in progress (only when it is ``turn_id``, if given).
        Idempotent: for a turn that ended already it is only a barge-in after the end
        (``_barge_in_after_the_end``)."""
        turn = self.turn
        if turn is None or turn_id not in (None, turn.id):
            return []  # nothing to cancel, or a cancel that raced with the end of its turn
        if turn.ended:
            self._barge_in_after_the_end(now)
            return []
        return self._end_turn(turn, "cancelled", now)

    def _playback(self, turn_id: int, played_ms: float, now: float) -> list[Effect]:
        """A ``playback`` mark for the turn in progress (it paces the rest), or for the
        latest turn after its ``turn.done``, while its last audio plays on: it proves what
        the client has (``Received``) and, for a reply, what it heard still counts
        (``playing_out``). A mark for any other turn is ignored."""
        turn = self.turn
        if turn is None or turn.id != turn_id:
            return []
        turn.pacer.mark(played_ms, now)
        received = self._received(turn, min(played_ms, turn.pacer.sent_ms))
        if turn.ended:
            return received
        turn.marking = True
        return received + self._pump(turn, now)

    def _update_settings(self, changes: dict[str, Any], now: float,
                         event_id: str | None = None) -> list[Effect]:
        """``session.update``: all of ``changes`` or, at the first bad one, none (refused
        with an ``error`` that names the update's ``event_id``)."""
        voice = changes.get("voice")
        if voice is not None and self.voices is not None \
                and voice != self.defaults.voice:  # (the server's own is always good)
            listed = listed_voice(voice, self.voices)
            if listed is None:
                return self.protocol_error(ProtocolError(
                    "unknown_voice", f"unknown voice {voice!r}; {_voice_list(self.voices)}",
                    event_id=event_id), now)
            changes = {**changes, "voice": listed}
        llm = changes.get("llm")
        model = llm.get("model") if isinstance(llm, dict) else None
        if model is not None and self.llm_models is not None and \
                model not in self.llm_models and model != self.defaults.llm_model:
            return self.protocol_error(ProtocolError(
                "unknown_model", f"LLM model {model!r} is not offered here; "
                f"{_model_list(self.llm_models, self.defaults.llm_model)}",
                event_id=event_id), now)
        lead, most = changes.get("max_lead_ms"), self.max_lead_ms_limit
        if lead is not None and lead > most:
            return self.protocol_error(ProtocolError(
                "invalid_field", f"field 'max_lead_ms' must be between "
                f"{codec.MAX_LEAD_MS_RANGE[0]} and {most}", event_id=event_id), now)
        settings = self.settings.updated(changes, self.defaults)
        if settings.max_lead_ms <= settings.frame_ms:
            # (as merged: either may be the one this update leaves as it was)
            return self.protocol_error(ProtocolError("invalid_field", f"max_lead_ms "
                f"({settings.max_lead_ms}) must be more than frame_ms ({settings.frame_ms}): "
                f"{LEAD_BELOW_FRAME}", event_id=event_id), now)
        self.settings = settings
        return [SendEvent({"type": "session.updated", "session": self.settings.to_event()})]

    @property
    def max_lead_ms_limit(self) -> int:
        """The largest ``max_lead_ms`` a ``session.update`` may ask for: the protocol's, or
        the server's own default where that is larger (so it can be sent back as it is)."""
        return max(codec.MAX_LEAD_MS_RANGE[1], self.defaults.max_lead_ms)

    def protocol_error(self, error: ProtocolError, now: float) -> list[Effect]:
        """The ``error`` event refusing a client message: with the message's ``event_id``
        when it had one (``ProtocolError.event_id``)."""
        event: dict[str, Any] = {"type": "error", "error": codec.error_object(
            error.code, error.message, error.event_id)}
        if error.turn_id is not None:
            event["turn_id"] = error.turn_id
        return [SendEvent(event)]

    # ---- LLM input -------------------------------------------------------------------

    def llm_delta(self, turn_id: int, text: str, now: float) -> list[Effect]:
        turn = self._active(turn_id)
        if turn is None or turn.llm_done or not text:
            return []
        if turn.t_first_delta is None:
            turn.t_first_delta = now
        room = self.limits.max_reply_chars - len(turn.reply)
        over = len(text) > room
        if over:
            text = text[:room]
        turn.reply += text
        effects: list[Effect] = []
        if text:
            effects.append(SendEvent({"type": "text.delta", "turn_id": turn.id,
                                      "delta": text}))
            effects += self._add_segments(turn, turn.segmenter.feed(text), now)
        if over:
            effects.append(CancelLlm(turn.id))
            effects += self.llm_failed(
                turn.id, "llm_failed", f"the reply passed {self.limits.max_reply_chars:,} "
                "characters; the rest is not spoken", now)
        return effects

    def llm_done(self, turn_id: int, tokens_per_s: float | None, now: float,
                 thought_chars: int = 0) -> list[Effect]:
        """The LLM finished its reply. One with nothing in it but white space (nothing
        came, or only a thought of ``thought_chars`` characters, which is never said)
        fails the turn with ``llm_empty_reply``: it said ``completed`` with no audio and no
        error, and the listener heard nothing without knowing why."""
        turn = self._active(turn_id)
        if turn is None or turn.llm_done:
            return []
        turn.tokens_per_s = tokens_per_s
        if not turn.reply.strip():
            return self.llm_failed(turn_id, "llm_empty_reply", _empty_reply(thought_chars), now)
        turn.llm_done = True
        effects = self._add_segments(turn, turn.segmenter.finish(), now)
        return effects + self._pump(turn, now)

    def llm_failed(self, turn_id: int, code: str, message: str, now: float) -> list[Effect]:
        """The LLM stream broke. Sentences already complete are still spoken, the last one
        too if its end came before the break (``Segmenter.abandon``); the rest of the text
        is dropped and the turn ends ``failed``."""
        turn = self._active(turn_id)
        if turn is None or turn.llm_done:
            return []
        turn.llm_done = True
        code, message = _documented(code, message, LLM_ERROR_CODES, "llm_failed")
        effects = self._turn_error(turn, code, message)
        effects += self._add_segments(turn, turn.segmenter.abandon(), now)
        return effects + self._pump(turn, now)

    def llm_context_full(self, turn_id: int, message: str, now: float) -> list[Effect]:
        """The LLM refused the turn's request as longer than its context (before any text):
        the older half of the history (rounded up) is forgotten and the request made again,
        so a conversation grown past the context goes on instead of failing every turn
        from then on. With no history left to forget, the turn fails (``llm_failed``) and
        is not remembered (``Turn.too_long``)."""
        turn = self._active(turn_id)
        if turn is None or turn.llm_done:
            return []
        users = [i for i, m in enumerate(self.history) if m["role"] == "user"]
        if turn.reply or not users:
            turn.too_long = not turn.reply
            return self.llm_failed(turn_id, "llm_failed", message, now)
        forget = (len(users) + 1) // 2
        del self.history[: users[forget] if forget < len(users) else len(self.history)]
        return [StartLlm(turn.id, self._llm_request(turn))]

    # ---- synthesis input -------------------------------------------------------------

    def audio(self, turn_id: int, index: int, pcm: bytes, engine: str, now: float) -> list[Effect]:
        turn = self._active(turn_id)
        if turn is None or index >= len(turn.segments):
            return []
        seg = turn.segments[index]
        if seg.synthesized:
            return []
        if seg.engine is None:
            seg.engine = engine
        if engine not in turn.engines:
            turn.engines.append(engine)
        seg.pending += pcm
        seg.made_ms += len(pcm) / BYTES_PER_MS
        turn.held_bytes += len(pcm)
        return self._pump(turn, now) if index == turn.current else []

    def synthesis_done(self, turn_id: int, index: int, now: float,
                       cut_short: bool = False) -> list[Effect]:
        """The engine finished a segment; ``cut_short``: it failed mid-sentence and another
        engine speaks the next ones (the segment ends where it stopped, no word twice, and
        its ``sentence.done`` says so)."""
        turn = self._active(turn_id)
        if turn is None or index >= len(turn.segments):
            return []
        seg = turn.segments[index]
        seg.synthesized = True
        seg.cut_short = cut_short
        return self._pump(turn, now)

    def synthesis_failed(self, turn_id: int, index: int, code: str, message: str,
                         now: float) -> list[Effect]:
        """An engine failed on a segment: the turn ends ``failed`` (a fallback engine, when
        configured, has already had its chance below this layer). The complete sentences
        before it are still spoken, as after an LLM failure (their audio is made, only
        held back by pacing); it and the rest of the reply are not. One whose ``sentence``
        went out already ends the turn at once.

        It may come after the segment's ``synthesis_done``, and counts all the same: a lane
        reports a success and then a failure of one job only when handling the success
        raised (a bug in the shell: ``Lane._consumer_failed``, ``internal_error``), and it
        has then taken the turn's other jobs off without a word. Ignored, it left the turn
        waiting for ever for the rest of its sentences (tests/test_faults.py). An engine
        never reports both (a job's step ends it done or failed, once; a fallback's cut
        segment ends done, ``cut_short``)."""
        turn = self._active(turn_id)
        if turn is None or index >= len(turn.segments):
            return []
        code, message = _documented(code, message, SYNTHESIS_ERROR_CODES, "engine_failed")
        if turn.segments[index].announced or index < turn.current or \
                not all(seg.synthesized for seg in turn.segments[:index]):
            # the turn ends with the sentences the client was told of (announced in order):
            # metrics counted the unreached ones too, unlike a failure that leaves whole ones
            kept = sum(seg.announced for seg in turn.segments)
            effects = self._turn_error(turn, code, message)
            # stopped before the cut, for all of it: the end's own cancel would be a second
            effects += self._stop_work(turn, turn.segments)
            del turn.segments[kept:]
            return effects + [e for e in self._end_turn(turn, "failed", now)
                              if not isinstance(e, CancelSynthesis)]
        effects = [*self._turn_error(turn, code, message),
                   *self._stop_work(turn, turn.segments[index:])]
        turn.held_bytes -= sum(len(seg.pending) for seg in turn.segments[index:])
        del turn.segments[index:]
        return effects + self._pump(turn, now)

    # ---- time ------------------------------------------------------------------------

    def tick(self, now: float) -> list[Effect]:
        turn = self.turn
        if turn is None or turn.ended:
            return []
        return self._pump(turn, now)

    def wake_at(self) -> float | None:
        """When ``tick`` may release more frames, or None when only new input can. (A quiet
        listener is probed when audio is released to it (``_pump``): no audio going out, no
        audio lost, and no second deadline per session: folding the probe's time in here
        moved each session's timer back and forth per chunk; bench/capacity.py stream at
        400 sessions, alternating runs: 0.0139-0.0140 CPU ms per frame against 0.0117-0.0122
        without the probe; checked in ``_pump``: 0.0126-0.0149 (median 0.0132) against
        0.0125-0.0130 (0.0127) in four pairs.)"""
        turn = self.turn
        if (self.held or turn is None or turn.ended
                or turn.current >= len(turn.segments)):
            return None
        if not self._frame_ready(turn, turn.segments[turn.current]):
            return None
        return turn.pacer.wake_at()

    def listener_answered(self, now: float) -> list[Effect]:
        """The socket answered a ``ProbeListener``: someone is there (playing or not); ask
        again after it is quiet as long again."""
        self._probing = False
        self._heard_at = now
        return []

    def _probe_at(self, turn: Turn) -> float | None:
        """When to probe the listener: after ``LISTENER_SILENT_S`` (a client that marks) or
        ``UNMARKED_SILENT_S`` (one that does not) with nothing from it, if it should still
        be playing then (by what was sent): a client that ran dry sends no marks."""
        if (self._probing or self.held or turn.ended
                or turn.pacer.marks_end is None):
            return None
        due = self._heard_at + (LISTENER_SILENT_S if turn.marking else UNMARKED_SILENT_S)
        return due if turn.pacer.marks_end > due else None

    @property
    def frames_sent(self) -> int:
        """Binary frames sent so far, modulo 2**32: the next frame's ``seq``."""
        return self._seq

    def resume(self, replayed_ms: float, now: float) -> list[Effect]:
        """A client is attached again and is being sent ``replayed_ms`` of the current
        turn's audio it missed: it will play that first, after whatever it still holds from
        before a short drop, so frames held meanwhile go out only as that plays down (at
        most ``max_lead_ms`` ahead in all, never a fresh lead on top)."""
        self.held = False
        self._probing = False  # (its socket is gone)
        self._heard_at = now
        turn = self.turn
        if turn is None or turn.ended:
            return []
        # The estimate counted the replayed frames as received.
        turn.pacer.resumed(replayed_ms, now)
        return self._pump(turn, now)

    def deadline(self, turn_id: int, now: float) -> float | None:
        """When the listener of ``turn_id`` runs out of audio, counting the audio sent and
        the audio made but not yet sent (None: turn not active). The next chunk of the
        turn's synthesis is due then.

        It does not move with ``now``: a listener who already ran dry (or one whose first
        audio is due) has a deadline in the past — when it ran dry, when the first segment
        was ready — and the most overdue goes first. A deadline that slid with the clock
        (``max(now, ...)``) would make every starved head's heap key stale at every decision:
        measured at 1,000 sessions, the scheduler then re-filed every head per step, spent
        90 % of the loop doing it, and the overload it caused never cleared."""
        turn = self._active(turn_id)
        if turn is None:
            return None
        if self.held:
            # Nobody listens: nothing is due until ``resume``. The listener's clock stopped
            # at the drop, and counting on from it fed a detached session in real time for
            # the whole resume window; even filling one lead for the resume ranked it as
            # the oldest stream, ahead of the live ones it starved (bench/SCHEDULER.md).
            return math.inf
        pacer = turn.pacer
        if pacer.play_end is not None:
            due = pacer.play_end
        else:
            due = turn.t_first_segment if turn.t_first_segment is not None else turn.started
        return due + turn.held_bytes / BYTES_PER_MS / 1000.0

    def lead_ms(self, turn_id: int, now: float) -> float | None:
        turn = self._active(turn_id)
        return None if turn is None else turn.pacer.lead_ms(now)

    def shutdown(self, now: float) -> list[Effect]:
        """The server is going away: a turn in progress ends ``failed`` with the error
        ``shutting_down`` (its listener may play out what it holds), before the
        connection closes (1001)."""
        turn = self.turn
        if turn is None or turn.ended:
            return []
        return self._fail(turn, "shutting_down", "the gateway is shutting down", now)

    def close(self, now: float) -> list[Effect]:
        """The connection is going away: stop whatever runs for this session. Nothing is
        sent; a turn in progress ends ``cancelled``, and its ``turn.done`` comes back as a
        ``SendEvent`` only for the record (the gateway's turn counters)."""
        turn = self.turn
        if turn is None or turn.ended:
            return []
        return [e for e in self._end_turn(turn, "cancelled", now)
                if not isinstance(e, SendEvent | SendAudio | SendFrames)
                or isinstance(e, SendEvent) and e.event["type"] == "turn.done"]

    # ---- internals -------------------------------------------------------------------

    def _active(self, turn_id: int) -> Turn | None:
        turn = self.turn
        if turn is None or turn.id != turn_id or turn.ended:
            return None
        return turn

    def _start_turn(self, source: str, text: str, now: float,
                    event_id: str | None = None) -> list[Effect]:
        effects: list[Effect] = []
        if self.turn is not None and not self.turn.ended:
            effects += self._end_turn(self.turn, "cancelled", now)  # barge-in by text
        self._barge_in_after_the_end(now)
        turn_id = self._next_turn_id
        self._next_turn_id = (self._next_turn_id % 0xFFFFFFFF) + 1
        s = self.settings
        turn = Turn(
            id=turn_id, source=source, user_text=text, started=now, settings=s,
            segmenter=Segmenter(s.segmenter, reads_digits=self.reads_digits),
            pacer=Pacer(max_lead_ms=s.max_lead_ms, frame_ms=s.frame_ms), event_id=event_id,
        )
        self.turn = turn
        effects.append(SendEvent({"type": "turn.started", "turn_id": turn_id, "source": source}))
        if source == "say":
            turn.reply = text
            turn.llm_done = True
            segments = turn.segmenter.feed(text) + turn.segmenter.finish()
            effects += self._add_segments(turn, segments, now)
            effects += self._pump(turn, now)
        else:
            effects.append(StartLlm(turn_id, self._llm_request(turn)))
        return effects

    def _llm_request(self, turn: Turn) -> LlmRequest:
        s = turn.settings
        messages = [{"role": "system", "content": s.instructions}, *self.history,
                    {"role": "user", "content": turn.user_text}]
        return LlmRequest(messages=messages, model=s.llm_model, temperature=s.temperature,
                          max_tokens=s.max_tokens)

    def _add_segments(self, turn: Turn, segments: list[Segment], now: float) -> list[Effect]:
        effects: list[Effect] = []
        for segment in segments:
            speakable = bool(segment.spoken.strip())
            first = speakable and turn.t_first_segment is None  # the turn's first audio
            if first:  # (the metric: ready to speak)
                turn.t_first_segment = now
            turn.segments.append(_SegmentAudio(segment))
            if speakable:
                deadline = now if first else turn.pacer.deadline(now)
                # the stream starts here, even after a segment with nothing to say (an
                # emoji line, a code block): a since would rank it as a stream already
                # playing, behind every one short of audio (scheduler rule 2b)
                since = None if first else turn.t_first_segment
                effects.append(StartSynthesis(turn.id, segment.index, segment.spoken,
                                              turn.settings.voice, deadline, since,
                                              turn.settings.max_lead_ms / 1000.0))
            else:  # nothing to say (an emoji, a lone list marker): no audio expected
                turn.segments[-1].synthesized = True
        if segments:
            effects += self._pump(turn, now)
        return effects

    def _frame_ready(self, turn: Turn, seg: _SegmentAudio) -> bool:
        """Is there a frame to send for ``seg`` right now (pacing aside)?

        Less than a full frame is held back until the segment is synthesized, so that the
        segment's last frame carries its flags.
        """
        frame_bytes = turn.settings.frame_ms * BYTES_PER_MS
        if len(seg.pending) > frame_bytes:
            return True
        return seg.synthesized and (len(seg.pending) > 0 or not seg.finished)

    def _pump(self, turn: Turn, now: float) -> list[Effect]:
        """Release every frame that is ready and due; end the turn when all is sent; ask a
        listener gone quiet whether it is there (``ProbeListener``)."""
        effects = self._release(turn, now)
        probe = self._probe_at(turn)
        if probe is not None and now >= probe:
            self._probing = True
            effects.append(ProbeListener(silent_s=now - self._heard_at))
        return effects

    def _release(self, turn: Turn, now: float) -> list[Effect]:
        effects: list[Effect] = []
        if turn.ended:  # a pump nested in this call ended it already
            return effects
        frame_bytes = turn.settings.frame_ms * BYTES_PER_MS
        while turn.current < len(turn.segments):
            seg = turn.segments[turn.current]
            if not self._frame_ready(turn, seg):
                return effects
            if seg.pending and not seg.announced:
                effects.append(self._announce(turn, seg))
            if not seg.pending:
                # synthesized, nothing left: the segment ends without another frame
                effects += self._finish_segment(turn, seg)
                continue
            if self.held:
                return effects
            whole = (len(seg.pending) - 1) // frame_bytes  # whole frames, none the last
            if whole > 1:
                run = min(whole, turn.pacer.frames_allowed(now, turn.settings.frame_ms))
                if run > 1:
                    effects.append(self._frames(turn, seg, run, frame_bytes, now))
                    continue
            take = min(frame_bytes, len(seg.pending))
            if not turn.pacer.may_send(now, take / BYTES_PER_MS):
                return effects
            effects.append(self._frame(turn, seg, take, now))
            if seg.synthesized and not seg.pending:  # that was its last frame
                effects += self._finish_segment(turn, seg)
        if turn.llm_done and turn.current >= len(turn.segments):
            if turn.t_first_audio is not None and not turn.last_frame_turn_end:
                # The end of the turn became known after its last audio frame went out
                # (the LLM finished late, or the last segments were silent): close the
                # turn with a frame that carries no samples.
                effects.append(self._closing_frame(turn))
            effects += self._end_turn(turn, "failed" if turn.failed else "completed", now)
        return effects

    @staticmethod
    def _received(turn: Turn, played_ms: float) -> list[Effect]:
        """The frames a client that played ``played_ms`` of ``turn`` must have received."""
        sent_until = turn.sent_until
        seq = None
        while sent_until and sent_until[0][0] <= played_ms:
            seq = sent_until.popleft()[1]
        return [] if seq is None else [Received(seq)]

    def _closing_frame(self, turn: Turn) -> SendAudio:
        index = turn.segments[-1].segment.index
        header = codec.frame_header(FLAG_SENTENCE_END | FLAG_TURN_END, index, turn.id, self._seq)
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        turn.last_frame_turn_end = True
        return SendAudio(header, 0.0)

    def _is_last_segment(self, turn: Turn, index: int) -> bool:
        return turn.llm_done and index == len(turn.segments) - 1

    def _announce(self, turn: Turn, seg: _SegmentAudio) -> SendEvent:
        seg.announced = True
        segment = seg.segment
        return SendEvent({"type": "sentence", "turn_id": turn.id, "index": segment.index,
                          "text": segment.text, "spoken": segment.spoken,
                          "engine": seg.engine})

    def _frame(self, turn: Turn, seg: _SegmentAudio, take: int, now: float) -> SendAudio:
        """The next ``take`` bytes of ``seg`` as one frame, flagged as the segment's last
        (and the turn's) when nothing more comes for it."""
        payload = bytes(seg.pending[:take])
        del seg.pending[:take]
        turn.held_bytes -= take
        flags = 0
        if seg.synthesized and not seg.pending:
            flags |= FLAG_SENTENCE_END
            if self._is_last_segment(turn, turn.current):
                flags |= FLAG_TURN_END
        duration = take / BYTES_PER_MS
        header = codec.frame_header(flags, seg.segment.index, turn.id, self._seq)
        self._sent(turn, seg, 1, duration, bool(flags & FLAG_TURN_END), now)
        return SendAudio(header + payload, duration)

    def _sent(self, turn: Turn, seg: _SegmentAudio, n: int, duration: float, turn_end: bool,
              now: float) -> None:
        """Bookkeeping for ``n`` frames of ``duration`` ms each that went out just now."""
        self._seq = (self._seq + n) & 0xFFFFFFFF
        seg.sent_ms += n * duration
        turn.pacer.sent(n * duration, now)
        turn.sent_until.append((turn.pacer.sent_ms, (self._seq - 1) & 0xFFFFFFFF))
        turn.last_frame_turn_end = turn_end
        if turn.t_first_audio is None:
            turn.t_first_audio = now

    def _frames(self, turn: Turn, seg: _SegmentAudio, n: int, frame_bytes: int,
                now: float) -> SendFrames:
        """``n`` whole frames of ``seg`` that are not its last (no flags): what ``_frame``
        does ``n`` times, with one pacer update for the run. A pacer refill releases 8-10
        frames at once."""
        frame_ms = turn.settings.frame_ms
        index, turn_id, seq = seg.segment.index, turn.id, self._seq
        pending = seg.pending
        frames = [codec.frame_header(0, index, turn_id, (seq + k) & 0xFFFFFFFF)
                  + pending[k * frame_bytes:(k + 1) * frame_bytes] for k in range(n)]
        del pending[:n * frame_bytes]
        turn.held_bytes -= n * frame_bytes
        self._sent(turn, seg, n, frame_ms, False, now)
        return SendFrames(frames, frame_ms)

    def _finish_segment(self, turn: Turn, seg: _SegmentAudio) -> list[Effect]:
        effects: list[Effect] = []
        if not seg.announced:
            effects.append(self._announce(turn, seg))
        seg.finished = True
        turn.current += 1
        done = {"type": "sentence.done", "turn_id": turn.id, "index": seg.segment.index,
                "audio_ms": round(seg.sent_ms)}
        if seg.cut_short:
            done["cut_short"] = True
        effects.append(SendEvent(done))
        return effects

    def _fail(self, turn: Turn, code: str, message: str, now: float) -> list[Effect]:
        return [*self._turn_error(turn, code, message), *self._end_turn(turn, "failed", now)]

    @staticmethod
    def _turn_error(turn: Turn, code: str, message: str) -> list[Effect]:
        """The turn's ``error`` event, or none once it has one (protocol.md: a turn's first
        failure is its error; what fails after it, an engine on a sentence the LLM's failure
        left to say, a shutdown, ends the turn without another): the turn ends ``failed``."""
        if turn.failed:
            return []
        turn.failed = (code, message)
        return [SendEvent({"type": "error", "turn_id": turn.id,
                           "error": codec.error_object(code, message, turn.event_id)})]

    @staticmethod
    def _stop_work(turn: Turn, segments: list[_SegmentAudio]) -> list[Effect]:
        """No more text for the turn (its LLM stream closed) and no more audio for
        ``segments`` (the turn's synthesis cancelled while one of them is still made)."""
        effects: list[Effect] = []
        if not turn.llm_done and turn.source == "transcript":
            effects.append(CancelLlm(turn.id))
        if any(not s.synthesized for s in segments):
            effects.append(CancelSynthesis(turn.id))
        turn.llm_done = True
        return effects

    def _end_turn(self, turn: Turn, status: str, now: float) -> list[Effect]:
        effects = self._stop_work(turn, turn.segments)
        turn.ended = True
        if turn.source == "transcript":
            self._remember(turn, status)
            # (a failed turn still plays out the sentences it sent)
            turn.playing_out = status in ("completed", "failed")
        if turn.failed and status == "cancelled":
            # cancelled (or barged in on) while the sentences complete before its error
            # were still said: its error was sent, so it ends failed (protocol.md: a turn
            # error is followed by turn.done failed), as the turn counters count it; the
            # history keeps what the marks show was heard, as for any cut reply
            status = "failed"
        for seg in turn.segments:
            seg.pending.clear()
        turn.held_bytes = 0
        effects.append(SendEvent({"type": "turn.done", "turn_id": turn.id, "status": status,
                                  "metrics": self._metrics(turn, now)}))
        return effects

    def _barge_in_after_the_end(self, now: float) -> None:
        """A cancel or a new turn while the last reply (completed or failed) may still be
        playing: a turn ends when its last frame is sent, up to ``max_lead_ms`` before it
        has played, and its history entry said all it sent. Now it says what the marks
        (the one sent on barge-in: protocol.md) show was heard, as for a reply cut while it
        was sent. Without a mark, or once the playback should have ended, it stays whole."""
        turn = self.turn
        if turn is None or not turn.playing_out:
            return
        turn.playing_out = False
        pacer = turn.pacer
        if pacer.played_ms is None or pacer.played_ms >= pacer.sent_ms or \
                pacer.marks_end is None or now >= pacer.marks_end:
            return
        if self.history and self.history[-1]["role"] == "assistant":  # (its entry: the last)
            self.history[-1]["content"] = self._spoken_reply(turn, "cancelled") or "…"

    def _spoken_reply(self, turn: Turn, status: str) -> str:
        """The assistant text the listener heard: all of it for a completed turn; what was
        sent for a failed one (the client plays it out: an earlier mark says nothing of its
        end); for a cut one, what the client reported played (else what was sent). The
        sentence that was playing is cut by words (Chinese and Japanese: by characters),
        each weighed as it is read (``heard_prefix``), in proportion to its audio
        (estimated from its spoken length while unknown), then ``…``; a reply cut between two
        sentences ends in ``…`` too, so the LLM knows it did not finish, whatever side of
        the boundary a mark landed on. A sentence its engine cut short (``cut_short``: the
        next engine went on with the next sentence) is kept only as far as its audio went,
        by its estimated length, then ``…``. Sentences keep the reply's own white space
        between them (a paragraph break, a list's newlines), as a completed reply does:
        joined by spaces, the LLM was shown its reply as one line."""
        if status == "completed" and not any(seg.cut_short for seg in turn.segments):
            return turn.reply.strip()
        played = turn.pacer.played_ms
        heard_ms = turn.pacer.sent_ms if played is None or status != "cancelled" else played
        said = ""  # the sentences heard whole, each after its gap in the reply
        heard_to = 0  # the end in the reply of the sentences heard whole
        cut = False  # the last of them was cut short by its engine (it ends in "…")
        for seg in turn.segments:
            if heard_ms <= 0:
                break
            text = seg.segment.text
            between = turn.reply[heard_to:seg.segment.start]
            gap = between if said and between and not between.strip() else " "
            estimated_ms = len(seg.segment.spoken) * _MS_PER_CHAR  # (what the engine says)
            if seg.finished and heard_ms >= seg.sent_ms - _WHOLE_SLACK_MS:
                cut = seg.cut_short
                said += gap + (_cut(text, seg.sent_ms / max(seg.sent_ms, estimated_ms))
                               if cut else text)
                heard_ms -= seg.sent_ms
                heard_to = seg.segment.start + len(text)
                continue
            known_ms = seg.made_ms
            total_ms = known_ms if seg.synthesized and not seg.cut_short else max(
                known_ms, estimated_ms)
            return (said + gap + _cut(text, heard_ms / total_ms if total_ms else 0.0)).strip()
        if turn.reply[heard_to:].strip() and not cut:  # cut at a sentence's end, went on
            said += " …"
        return said.strip()

    def _remember(self, turn: Turn, status: str) -> None:
        # Roles must alternate (Gemma's chat template refuses two user messages in a row):
        # a reply interrupted before anything was heard is recorded as an ellipsis.
        if turn.too_long:
            return
        spoken = self._spoken_reply(turn, status) or "…"
        self.history.append({"role": "user", "content": turn.user_text})
        self.history.append({"role": "assistant", "content": spoken})
        # keep the newest turns; a turn starts at a user message
        keep = self.limits.history_turns
        if keep == 0:  # (users[-0] would be the first, not none)
            self.history.clear()
            return
        users = [i for i, m in enumerate(self.history) if m["role"] == "user"]
        if len(users) > keep:
            del self.history[: users[len(users) - keep]]

    def _metrics(self, turn: Turn, now: float) -> dict[str, Any]:
        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - turn.started) * 1000.0, 1)

        return {
            "ttft_ms": ms(turn.t_first_delta),
            "first_sentence_ms": ms(turn.t_first_segment),
            "ttfa_ms": ms(turn.t_first_audio),
            "audio_ms": round(turn.pacer.sent_ms),
            "duration_ms": ms(now),
            "llm_tokens_per_s": None if turn.tokens_per_s is None
            else round(turn.tokens_per_s, 1),
            "engine": turn.engines[0] if turn.engines else None,
            "engines": list(turn.engines),
            "underruns": turn.pacer.underruns,
            "sentences": len(turn.segments),
        }


def _empty_reply(thought_chars: int) -> str:
    if thought_chars:
        return (f"the LLM's reply was only a thought ({thought_chars:,} characters, not "
                "said): nothing to say")
    return "the LLM's reply was empty: nothing to say"


def _cut(text: str, share: float) -> str:
    """``text`` heard to ``share`` of its audio, marked cut (``…``): a sentence interrupted."""
    part = heard_prefix(text, share)
    return f"{part} …" if part else "…"
