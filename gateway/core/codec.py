"""Protocol v1 codec: client JSON text frames in, typed messages out; events and audio
frames out. Pure: no I/O, no clock.

``decode_client`` either returns one of the ``Client*`` dataclasses or raises
``ProtocolError`` with a stable ``code`` (see protocol.md, "Errors"). The caller turns the
error into an ``error`` event; the session stays usable.
"""

from __future__ import annotations

import math
import struct
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

PROTOCOL_VERSION = 1
SAMPLE_RATE = 24_000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000  # PCM16 mono: 48 bytes per millisecond

MAX_MESSAGE_BYTES = 64 * 1024
"""Largest client text frame answered with an event; larger ones get ``message_too_large``."""
MAX_TEXT_CHARS = 4_000
"""Longest ``transcript``/``say`` text."""
MAX_INSTRUCTIONS_CHARS = 16_000
MAX_EVENT_ID_CHARS = 64
"""Longest ``event_id`` a client message may carry (code points; at least one): room for a
UUID (36) or OpenAI Realtime's own ``event_…`` ids, with a prefix."""
FRAME_MS_CHOICES = (20, 40, 60, 80, 100, 120)
MAX_LEAD_MS_RANGE = (100, 30_000)
"""Smallest and largest ``max_lead_ms`` a ``session.update`` may ask for. A server's own
default is held to the smallest only (``gateway.config.SessionDefaults``)."""
LEAD_BELOW_FRAME = "a lead of one frame or less lets the next frame out only once the " \
    "client has run dry, an underrun on every frame"
"""Why ``max_lead_ms`` must be more than ``frame_ms`` (``Pacer.may_send``): a refusal's
reason, for a ``session.update`` and for the server's own defaults alike."""

FRAME_HEADER = struct.Struct("<BBHII")
"""u8 version, u8 flags, u16 sentence index, u32 turn_id, u32 seq (little-endian)."""
FLAG_SENTENCE_END = 0x01
FLAG_TURN_END = 0x02


class ProtocolError(Exception):
    """A client message that cannot be accepted. ``code`` is stable and documented.
    ``event_id``: the refused message's own (``decode_client`` sets it on what it raises for
    an object whose ``event_id`` it could read), echoed in the ``error`` event so that a
    client that sent several messages at once knows which one it answers."""

    def __init__(self, code: str, message: str, turn_id: int | None = None,
                 event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.turn_id = turn_id
        self.event_id = event_id


# --- client messages ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientSessionUpdate:
    settings: dict[str, Any]
    """Validated subset of the session settings (only the keys the client sent)."""
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClientTranscript:
    text: str
    event_id: str | None = None
    """The client's name for the message (every message may have one): the ``error`` that
    refuses it says it, and so does its turn's error."""


@dataclass(frozen=True, slots=True)
class ClientSay:
    text: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClientCancel:
    turn_id: int | None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClientPlayback:
    turn_id: int
    played_ms: float
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClientPing:
    id: Any = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClientResume:
    """Handled by the connection (first message only), never by ``Session.receive``."""

    session_id: str
    resume_token: str
    last_seq: int | None
    event_id: str | None = None


ClientMessage = (
    ClientSessionUpdate | ClientTranscript | ClientSay | ClientCancel | ClientPlayback | ClientPing
)


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], required: bool = True,
           what: str | None = None):
    """``obj[name]`` if it is a ``kind``; ``what`` names the kind in the error."""
    if name not in obj or obj[name] is None:
        if required:
            raise ProtocolError("missing_field", f"field {name!r} is required")
        return None
    value = obj[name]
    # bool is an int in Python; never accept it where a number is asked for
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)) \
            or not isinstance(value, kind):
        raise ProtocolError("invalid_field", f"field {name!r} must be {what or _kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", dict: "an object",
             bool: "a boolean"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def blank(text: str) -> bool:
    """``text`` holds nothing to say or answer: white space and invisible format characters
    only (zero-width spaces and joiners, direction marks and isolates, a byte-order mark, a
    soft hyphen: Unicode's Cf). A ``say`` of those completed with nothing spoken."""
    return not any(c.strip() and unicodedata.category(c) != "Cf" for c in text)


def _text(obj: dict[str, Any]) -> str:
    text = _field(obj, "text", str)
    if len(text) > MAX_TEXT_CHARS:
        raise ProtocolError("text_too_long", f"text is {len(text)} characters; the limit is "
                            f"{MAX_TEXT_CHARS}")
    if blank(text):
        raise ProtocolError("invalid_field", "field 'text' is empty" if not text.strip() else
                            "field 'text' is empty: invisible characters only")
    return text


def _bound(value: float) -> str:
    """A range bound as a client can read it back: 4294967295, not 4.29497e+09."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _number(obj: dict[str, Any], name: str, lo: float, hi: float, integer: bool = False,
            required: bool = False):
    """A number in [lo, hi]. ``integer``: JSON does not tell 40 from 40.0 (JSON Schema's
    "integer" takes both, and Python's json writes floats as 40.0), so an integral float
    is taken as the integer it is; 40.5 is not an integer."""
    value = _field(obj, name, (int, float), required=required,
                   what="an integer" if integer else "a number")
    if value is None:
        return None
    if integer and isinstance(value, float):
        if not value.is_integer():  # (also refuses inf and nan)
            raise ProtocolError("invalid_field", f"field {name!r} must be an integer")
        value = int(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ProtocolError("invalid_field", f"field {name!r} must be between {_bound(lo)} and "
                            f"{_bound(hi)}")
    return value


def _settings(session: dict[str, Any]) -> dict[str, Any]:
    """The settings a ``session.update`` sent, checked. A null value (at any level) stays
    ``None`` in the result: it puts that setting back to the server's default, so the
    ``session`` object of ``session.created`` can be sent back as it is."""
    out = _group(session, "session setting", _SETTINGS)
    for key, group in (("llm", _LLM_SETTINGS), ("segmenter", _SEGMENTER_SETTINGS)):
        if out.get(key) is not None:
            out[key] = _group(out[key], f"{key} setting", group)
    return out


def _group(obj: dict[str, Any], what: str,
           parsers: dict[str, Callable[[dict[str, Any], str], Any]]) -> dict[str, Any]:
    unknown = set(obj) - set(parsers)
    if unknown:
        raise ProtocolError("invalid_field", f"unknown {what}(s): {', '.join(sorted(unknown))}")
    return {key: None if obj[key] is None else parse(obj, key)
            for key, parse in parsers.items() if key in obj}


def _instructions(obj: dict[str, Any], name: str) -> str:
    instructions = _field(obj, name, str)
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise ProtocolError("text_too_long", f"instructions are limited to "
                            f"{MAX_INSTRUCTIONS_CHARS} characters")
    return instructions


def _frame_ms(obj: dict[str, Any], name: str) -> int:
    frame_ms = _number(obj, name, FRAME_MS_CHOICES[0], FRAME_MS_CHOICES[-1], integer=True,
                       required=True)
    if frame_ms not in FRAME_MS_CHOICES:
        raise ProtocolError("invalid_field", f"frame_ms must be one of {FRAME_MS_CHOICES}")
    return frame_ms


def _max_lead(obj: dict[str, Any], name: str) -> int:
    """The upper bound is the session's: MAX_LEAD_MS_RANGE's, or the server's own default
    where that is larger (``Session`` checks it)."""
    lo, hi = MAX_LEAD_MS_RANGE
    value = _number(obj, name, -math.inf, math.inf, integer=True, required=True)
    if not lo <= value <= 2**53:
        raise ProtocolError("invalid_field", f"field {name!r} must be between {lo} and {hi} "
                            "(or up to the server's own default, when larger)")
    return value


def _int_in(lo: int, hi: int) -> Callable[[dict[str, Any], str], int]:
    return lambda obj, name: _number(obj, name, lo, hi, integer=True, required=True)


def _kind(kind: type) -> Callable[[dict[str, Any], str], Any]:
    return lambda obj, name: _field(obj, name, kind)


_SETTINGS: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "voice": _kind(str),
    "instructions": _instructions,
    "llm": _kind(dict),
    "frame_ms": _frame_ms,
    "max_lead_ms": _max_lead,
    "segmenter": _kind(dict),
}
_LLM_SETTINGS: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "model": _kind(str),
    "temperature": lambda obj, name: _number(obj, name, 0, 2, required=True),
    "max_tokens": _int_in(1, 32_768),
}
_SEGMENTER_SETTINGS: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "first_min_words": _int_in(0, 50), "first_phrase_words": _int_in(0, 50),
    "first_max_words": _int_in(0, 50),
    "min_chars": _int_in(0, 1000), "max_chars": _int_in(40, 4000),
    "quote_max_chars": _int_in(0, 4000),
}


def error_object(code: str, message: str, event_id: str | None = None) -> dict[str, Any]:
    """An ``error`` event's ``error`` object. ``event_id``: that of the client message it
    answers (the refused one, or the ``transcript``/``say`` that started the failed turn),
    inside the object as OpenAI Realtime has it: the event's own top level stays free."""
    error = {"code": code, "message": message}
    if event_id is not None:
        error["event_id"] = event_id
    return error


def load_frame(data: str | bytes) -> Any:
    """The JSON value of one client frame, before any check of its fields. Raises
    ``ProtocolError`` for a binary frame, one over ``MAX_MESSAGE_BYTES`` or one that is not
    JSON (``binary_not_supported``, ``message_too_large``, ``invalid_json``)."""
    if isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError("binary_not_supported",
                            "binary frames are not accepted from clients; send JSON text")
    if len(data) > MAX_MESSAGE_BYTES // 4 and len(data.encode("utf-8", "surrogatepass")) > \
            MAX_MESSAGE_BYTES:
        raise ProtocolError("message_too_large",
                            f"text frames are limited to {MAX_MESSAGE_BYTES} bytes")
    try:
        # orjson refuses NaN, Infinity, lone surrogates, nesting past 1,024 levels, and a
        # number beyond a double's range ("1e400": JSON allows a parser that limit)
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"not valid JSON: {exc}") from None


def decode_client(data: str | bytes) -> ClientMessage | ClientResume:
    """Parse one client WebSocket message. Raises ``ProtocolError`` for anything invalid."""
    obj = load_frame(data)
    if not isinstance(obj, dict):
        raise ProtocolError("invalid_message", "a message must be a JSON object with a 'type'")
    event_id = obj.get("event_id")
    if event_id is not None and (type(event_id) is not str
                                 or not 0 < len(event_id) <= MAX_EVENT_ID_CHARS):
        # (no event_id of its own: the client is told which field, not which message)
        raise ProtocolError("invalid_field", "field 'event_id' must be a string of 1 to "
                            f"{MAX_EVENT_ID_CHARS} characters")
    try:
        return _message(obj, event_id)
    except ProtocolError as error:
        error.event_id = event_id
        raise


def _message(obj: dict[str, Any], event_id: str | None) -> ClientMessage | ClientResume:
    """The message ``obj`` (a JSON object) is, whose ``event_id`` (checked) is ``event_id``."""
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("invalid_message", "field 'type' is required and must be a string")
    match kind:
        case "transcript":
            return ClientTranscript(_text(obj), event_id)
        case "say":
            return ClientSay(_text(obj), event_id)
        case "cancel":
            turn_id = _number(obj, "turn_id", 0, 2**32 - 1, integer=True)
            return ClientCancel(turn_id, event_id)
        case "playback":
            turn_id = _number(obj, "turn_id", 0, 2**32 - 1, integer=True, required=True)
            played = _number(obj, "played_ms", 0, 24 * 3600 * 1000, required=True)
            return ClientPlayback(turn_id, float(played), event_id)
        case "session.update":
            session = _field(obj, "session", dict)
            return ClientSessionUpdate(_settings(session), event_id)
        case "ping":
            ping_id = obj.get("id")
            try:  # the pong echoes it, one level down: refuse what cannot be encoded back
                orjson.dumps({"id": ping_id})
            except orjson.JSONEncodeError:
                raise ProtocolError("invalid_field", "field 'id' cannot be echoed "
                                    "(nested too deeply)") from None
            return ClientPing(ping_id, event_id)
        case "session.resume":
            session_id = _field(obj, "session_id", str)
            token = _field(obj, "resume_token", str)
            last_seq = _number(obj, "last_seq", -1, 2**32 - 1, integer=True)
            return ClientResume(session_id[:128], token[:256],
                                None if last_seq is None or last_seq < 0 else last_seq,
                                event_id)
        case _:
            raise ProtocolError("unknown_type", f"unknown message type {kind[:64]!r}")


# --- server side ------------------------------------------------------------------------


def encode_event(event: dict[str, Any]) -> str:
    return orjson.dumps(event).decode()


def frame_header(flags: int, sentence: int, turn_id: int, seq: int) -> bytes:
    return FRAME_HEADER.pack(PROTOCOL_VERSION, flags, sentence & 0xFFFF, turn_id, seq & 0xFFFFFFFF)


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """A decoded binary frame (what a client sees)."""

    flags: int
    sentence: int
    turn_id: int
    seq: int
    pcm: bytes

    @property
    def sentence_end(self) -> bool:
        return bool(self.flags & FLAG_SENTENCE_END)

    @property
    def turn_end(self) -> bool:
        return bool(self.flags & FLAG_TURN_END)


def decode_frame(data: bytes) -> AudioFrame:
    if len(data) < FRAME_HEADER.size:
        raise ProtocolError("invalid_frame", "frame shorter than its 12-byte header")
    version, flags, sentence, turn_id, seq = FRAME_HEADER.unpack_from(data)
    if version != PROTOCOL_VERSION:
        raise ProtocolError("invalid_frame", f"unknown frame version {version}")
    return AudioFrame(flags, sentence, turn_id, seq, bytes(data[FRAME_HEADER.size:]))
