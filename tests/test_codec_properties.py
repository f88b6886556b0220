"""Property tests of the protocol codec: whatever a client sends, ``decode_client`` returns
a well-formed message or raises ``ProtocolError`` with a documented code; valid messages
decode to the right dataclass; audio frame headers round-trip for every field value."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gateway.core.codec import (
    FRAME_HEADER,
    PROTOCOL_VERSION,
    ClientCancel,
    ClientPing,
    ClientPlayback,
    ClientResume,
    ClientSay,
    ClientSessionUpdate,
    ClientTranscript,
    ProtocolError,
    decode_client,
    decode_frame,
    encode_event,
    frame_header,
)
from gateway.core.session import SendAudio, SendEvent, SendFrames, Session

PROTOCOL_MD = Path(__file__).resolve().parents[1] / "protocol.md"


def documented_codes() -> set[str]:
    """The codes of the "Errors" table in protocol.md (read, not copied)."""
    text = PROTOCOL_MD.read_text()
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))


def documented_limit(row: str) -> int:
    """A number of protocol.md's "Limits" table (read, not copied): the tests hold the
    codec to what the protocol says, not to the codec's own constants."""
    found = re.search(r"^\| " + re.escape(row) + r" \| ([\d,]+) (characters|KiB) \|",
                      PROTOCOL_MD.read_text(), flags=re.MULTILINE)
    assert found, row
    return int(found[1].replace(",", "")) * (1024 if found[2] == "KiB" else 1)


TEXT_CHARS = documented_limit("`transcript` / `say` text")
EVENT_ID_CHARS = documented_limit("`event_id`")
INSTRUCTIONS_CHARS = documented_limit("`instructions`")
MESSAGE_BYTES = documented_limit("text frame answered with an error")
FRAME_MS = tuple(int(ms) for ms in re.search(r"^\| `frame_ms` \| one of ([\d, ]+) \|",
                                              PROTOCOL_MD.read_text(),
                                              flags=re.MULTILINE)[1].split(", "))


def test_the_documented_limits_were_found():
    assert (TEXT_CHARS, INSTRUCTIONS_CHARS, MESSAGE_BYTES) == (4_000, 16_000, 65_536)
    assert EVENT_ID_CHARS == 64
    assert FRAME_MS == (20, 40, 60, 80, 100, 120)


def test_frame_ms_takes_exactly_the_documented_durations():
    for ms in range(0, 201):
        raw = json.dumps({"type": "session.update", "session": {"frame_ms": ms}})
        try:
            message = decode_client(raw)
        except ProtocolError as error:
            assert ms not in FRAME_MS and error.code == "invalid_field", ms
        else:
            assert message == ClientSessionUpdate({"frame_ms": ms}) and ms in FRAME_MS


CODES = documented_codes()
# codes only the session or a turn can produce (not decode_client)
DECODE_CODES = CODES - {"unknown_voice", "llm_unavailable", "llm_failed", "engine_failed",
                        "internal_error"}
TYPES = ["session.update", "transcript", "say", "cancel", "playback", "ping"]
FIELDS = ["type", "event_id", "text", "turn_id", "played_ms", "session", "id", "voice",
          "instructions", "llm", "frame_ms", "max_lead_ms", "segmenter", "model",
          "temperature", "max_tokens", "first_min_words", "first_phrase_words",
          "first_max_words", "min_chars", "max_chars", "quote_max_chars"]


def test_documented_codes_were_found():
    assert {"invalid_json", "invalid_message", "unknown_type", "missing_field",
            "invalid_field", "text_too_long", "message_too_large",
            "binary_not_supported"} <= DECODE_CODES


# --- strategies ---------------------------------------------------------------------------

# every code point, lone surrogates included (hypothesis excludes category Cs by default)
any_char = st.characters(exclude_categories=())
any_text = st.text(any_char, max_size=60)
good_event_id = st.text(st.characters(exclude_categories=("Cs",)), min_size=1,
                        max_size=EVENT_ID_CHARS)

huge_ints = st.one_of(st.integers(), st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
                      st.integers(min_value=-(2**70), max_value=2**70),
                      st.sampled_from([10**30, -(10**30), 10**400]))
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(st.none(), st.booleans(), huge_ints, floats, any_text,
                    st.sampled_from(TYPES + FIELDS + ["", " ", "\u0000"]))
keys = st.one_of(st.sampled_from(FIELDS), any_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25,
)


@st.composite
def message_like(draw):
    """An object shaped like a client message with any field of any type."""
    obj = draw(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4))
    if draw(st.booleans()):
        obj["type"] = draw(st.one_of(st.sampled_from(TYPES), json_values))
    if draw(st.booleans()):
        obj["session"] = draw(st.one_of(
            st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4), json_values))
    if draw(st.booleans()):  # a good one, whatever else is wrong (a wrong one: FIELDS)
        obj["event_id"] = draw(good_event_id)
    return obj


def dumps_any(value, ascii_only: bool) -> str:
    # stdlib json: writes huge ints exactly, NaN/Infinity as bare words (not JSON), and
    # lone surrogates either raw (ensure_ascii=False) or as \\udXXX escapes
    return json.dumps(value, ensure_ascii=ascii_only)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# --- the central property: only ProtocolError, only documented codes ----------------------


def readable_event_id(data: str | bytes) -> str | None:
    """The ``event_id`` an ``error`` answering ``data`` must echo (protocol.md, Errors): a
    good one (a string of 1 to 64 code points) of a text frame the gateway reads, that is a
    JSON object; None for anything else."""
    if not isinstance(data, str) or len(data.encode("utf-8", "surrogatepass")) > MESSAGE_BYTES:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    event_id = obj.get("event_id") if isinstance(obj, dict) else None
    return event_id if isinstance(event_id, str) and 0 < len(event_id) <= EVENT_ID_CHARS \
        else None


def check_decode(data: str | bytes) -> None:
    """Decode and check the outcome is either an error with a documented code or a message
    that the rest of the gateway can use without failing; either way with the message's own
    ``event_id`` when it had a readable one, else none."""
    try:
        message = decode_client(data)
    except ProtocolError as error:
        assert error.code in DECODE_CODES, error.code
        assert isinstance(error.message, str) and error.message
        assert error.event_id == readable_event_id(data), (error.code, error.event_id)
        return
    assert message.event_id == readable_event_id(data)
    check_valid(message)


def check_valid(message) -> None:
    """A decoded message obeys protocol.md, and the session can act on it."""
    match message:
        case ClientTranscript(text=text) | ClientSay(text=text):
            assert isinstance(text, str) and 1 <= len(text) <= TEXT_CHARS and text.strip()
        case ClientCancel(turn_id=turn_id):
            assert turn_id is None or (type(turn_id) is int and 0 <= turn_id < 2**32)
        case ClientPlayback(turn_id=turn_id, played_ms=played_ms):
            assert type(turn_id) is int
            assert type(played_ms) is float and math.isfinite(played_ms) and played_ms >= 0
        case ClientPing(id=ping_id):
            pong = {"type": "pong"} if ping_id is None else {"type": "pong", "id": ping_id}
            assert orjson.loads(encode_event(pong)) == pong
        case ClientSessionUpdate(settings=changes):
            check_settings(changes)
            # the update applies, and a turn under the new settings runs
            s = Session("p")
            effects = s.receive(message, 0.0)
            assert [e.event["type"] for e in effects if isinstance(e, SendEvent)] in (
                ["session.updated"], ["error"])
            s.receive(ClientSay("Hello there, this is one sentence. And a second one."), 0.0)
            out = s.audio(s.turn.id, 0, b"\x01\x00" * 24_000, "x", 0.0)
            out += s.synthesis_done(s.turn.id, 0, 0.0)
            out += s.tick(10.0)
            assert any(isinstance(e, SendAudio | SendFrames) for e in out)
        case _:
            raise AssertionError(f"not a client message: {message!r}")


def check_settings(changes: dict) -> None:
    """Checked values of the right type and range, or None: back to the server's default."""
    for key, value in changes.items():
        if value is None:
            continue
        match key:
            case "voice":
                assert isinstance(value, str)
            case "instructions":
                assert isinstance(value, str) and len(value) <= INSTRUCTIONS_CHARS
            case "frame_ms":
                assert value in FRAME_MS and type(value) is int
            case "max_lead_ms":
                # (above 30,000 only where the server's default is: Session checks that)
                assert type(value) is int and 100 <= value
            case "llm":
                assert set(value) <= {"model", "temperature", "max_tokens"}
            case "segmenter":
                bounds = {"first_min_words": (0, 50), "first_phrase_words": (0, 50),
                          "first_max_words": (0, 50), "min_chars": (0, 1000),
                          "max_chars": (40, 4000), "quote_max_chars": (0, 4000)}
                for k, v in value.items():
                    lo, hi = bounds[k]
                    assert v is None or type(v) is int and lo <= v <= hi, (k, v)
            case _:
                raise AssertionError(f"unknown setting {key}")


@given(st.text(any_char, max_size=200))
@example("\ud800")
@example('{"type":"say","text":"\ud800"}')
@example('{"type":"say","text":"\\ud800"}')
@example('{"type":"ping","id":' + nested(300) + "}")
@example('{"type":"ping","id":' + nested(254) + "}")  # the pong adds one level
@example('{"type":"cancel","turn_id":' + "9" * 400 + "}")
@example('{"type":"cancel","turn_id":1e400}')
@example('{"type":"playback","turn_id":1,"played_ms":NaN}')
@example('{"type":"session.update","session":{"max_lead_ms":null}}')
@example('{"type":"session.update","session":{"segmenter":{"min_chars":null}}}')
@example('{"type":"session.update","session":{"llm":{"temperature":null}}}')
@example('{"type":"session.update","session":{"segmenter":{"min_chars":1000,"max_chars":40}}}')
@example(nested(5000))
def test_any_text_decodes_or_raises_a_documented_protocol_error(data):
    check_decode(data)


def test_null_puts_a_setting_or_a_group_back_to_the_default():
    """protocol.md (session.update): ``null`` resets a setting, or a whole ``llm`` /
    ``segmenter`` group; the examples above only required it to decode or be refused."""
    got = decode_client('{"type":"session.update","session":{"max_lead_ms":null,'
                        '"voice":null,"segmenter":{"min_chars":null},"llm":null}}')
    assert got == ClientSessionUpdate({"max_lead_ms": None, "voice": None,
                                       "segmenter": {"min_chars": None}, "llm": None})


@given(st.binary(max_size=100))
def test_binary_is_always_refused(data):
    for value in (data, bytearray(data), memoryview(data)):
        try:
            decode_client(value)
        except ProtocolError as error:
            assert error.code == "binary_not_supported" and "JSON text" in error.message
        else:
            raise AssertionError("binary accepted")


@given(json_values, st.booleans())
def test_any_json_value_decodes_or_raises_a_documented_protocol_error(value, ascii_only):
    check_decode(dumps_any(value, ascii_only))


@settings(max_examples=400)
@given(message_like(), st.booleans())
def test_message_shaped_objects_with_wrong_types_everywhere(obj, ascii_only):
    check_decode(dumps_any(obj, ascii_only))


@given(st.sampled_from(TYPES), st.sampled_from(["text", "turn_id", "played_ms", "session",
                                                 "id"]),
       st.integers(min_value=1, max_value=1500))
def test_deep_nesting_in_any_field(kind, name, depth):
    check_decode(f'{{"type":"{kind}","{name}":{nested(depth)}}}')
    check_decode(f'{{"type":"session.update","session":{{"llm":{nested(depth, "{}")}}}}}')


@given(st.integers(min_value=MESSAGE_BYTES - 64, max_value=MESSAGE_BYTES + 64),
       st.sampled_from(["a", "é", "\u20ac", "\U0001f600"]))
def test_size_limit_is_in_utf8_bytes(size, char):
    prefix, suffix = '{"type":"say","text":"', '"}'
    n = (size - len(prefix) - len(suffix)) // len(char.encode())
    data = prefix + char * n + suffix
    nbytes = len(data.encode())
    try:
        decode_client(data)
    except ProtocolError as error:
        if nbytes > MESSAGE_BYTES:
            assert error.code == "message_too_large" and str(MESSAGE_BYTES) in error.message
        else:
            assert error.code == "text_too_long"  # under the frame limit, over 4,000 chars
    else:
        raise AssertionError("a 64 KiB say was accepted")


# --- valid messages round-trip -------------------------------------------------------------

good_text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1,
                    max_size=TEXT_CHARS).filter(lambda t: t.strip() != "")
u32 = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def valid_settings(draw):
    out = {}
    if draw(st.booleans()):
        out["voice"] = draw(st.text(max_size=20))
    if draw(st.booleans()):
        out["instructions"] = draw(st.text(max_size=200))
    if draw(st.booleans()):
        out["frame_ms"] = draw(st.sampled_from(FRAME_MS))
    if draw(st.booleans()):
        out["max_lead_ms"] = draw(st.integers(100, 30_000))
    if draw(st.booleans()):
        out["llm"] = draw(st.fixed_dictionaries({}, optional={
            "model": st.text(max_size=20),
            "temperature": st.one_of(st.integers(0, 2), st.floats(0, 2)),
            "max_tokens": st.integers(1, 32_768)}))
    if draw(st.booleans()):
        out["segmenter"] = draw(st.fixed_dictionaries({}, optional={
            "first_min_words": st.integers(0, 50), "first_phrase_words": st.integers(0, 50),
            "first_max_words": st.integers(0, 50), "min_chars": st.integers(0, 1000),
            "max_chars": st.integers(40, 4000), "quote_max_chars": st.integers(0, 4000)}))
    return out



SURROGATE = re.compile("[\ud800-\udfff]")


def parseable(value) -> bool:
    """JSON the gateway reads (and a pong can echo): no NaN/Infinity, no number beyond a
    double's range, no lone surrogate (not Unicode; a client cannot send it as UTF-8
    text)."""
    if isinstance(value, str):
        return not SURROGATE.search(value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 1e308
    if isinstance(value, list):
        return all(parseable(v) for v in value)
    if isinstance(value, dict):
        return all(parseable(k) and parseable(v) for k, v in value.items())
    return True


def as_parsed(value):
    """``value`` as orjson reads it back: integers beyond 64 bits become floats."""
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -(2**63) <= value < 2**64):
        return float(value)
    if isinstance(value, list):
        return [as_parsed(v) for v in value]
    if isinstance(value, dict):
        return {k: as_parsed(v) for k, v in value.items()}
    return value


extra_fields = st.dictionaries(st.text(max_size=8).filter(parseable).filter(
    lambda k: k not in {"type", "event_id", "text", "turn_id", "played_ms", "session", "id"}),
    json_values.filter(parseable), max_size=3)


@st.composite
def valid_messages(draw):
    """(wire object, the dataclass it must decode to)."""
    pair = draw(valid_messages_without_event_id())
    event_id = draw(st.one_of(st.none(), good_event_id))
    if event_id is None:
        if draw(st.booleans()):
            pair[0]["event_id"] = None  # (null: as though absent)
        return pair
    obj, expected = pair
    return {**obj, "event_id": event_id}, replace(expected, event_id=event_id)


@st.composite
def valid_messages_without_event_id(draw):
    kind = draw(st.sampled_from(TYPES))
    extra = draw(extra_fields)  # unknown fields are ignored on client messages
    match kind:
        case "transcript" | "say":
            text = draw(good_text)
            cls = ClientTranscript if kind == "transcript" else ClientSay
            return {**extra, "type": kind, "text": text}, cls(text)
        case "cancel":
            turn_id = draw(st.one_of(st.none(), u32))
            obj = {**extra, "type": kind}
            if turn_id is not None or draw(st.booleans()):
                obj["turn_id"] = turn_id  # an explicit null means "the turn in progress"
            return obj, ClientCancel(turn_id)
        case "playback":
            turn_id = draw(u32)
            played = draw(st.one_of(st.integers(0, 24 * 3600 * 1000),
                                    st.floats(0, 24 * 3600 * 1000)))
            return ({**extra, "type": kind, "turn_id": turn_id, "played_ms": played},
                    ClientPlayback(turn_id, float(played)))
        case "ping":
            obj = {**extra, "type": kind}
            ping_id = None
            if draw(st.booleans()):
                ping_id = draw(json_values.filter(parseable))
                obj["id"] = ping_id
            return obj, ClientPing(ping_id)
        case "session.update":
            s = draw(valid_settings())
            return {**extra, "type": kind, "session": s}, ClientSessionUpdate(s)
    raise AssertionError(kind)


@settings(max_examples=300)
@given(valid_messages(), st.booleans())
def test_valid_messages_decode_to_their_dataclass(pair, ascii_only):
    obj, expected = pair
    data = dumps_any(obj, ascii_only)
    assume(len(data.encode("utf-8", "surrogatepass")) <= MESSAGE_BYTES)
    message = decode_client(data)
    assert type(message) is type(expected)
    if isinstance(expected, ClientPing):
        assert message.id == as_parsed(expected.id)
        assert message.event_id == expected.event_id
    else:
        assert message == expected
    check_valid(message)


# --- event_id: the client's name for a message, echoed by the error answering it ----------

GOOD = {  # every client message, as little as it takes
    "transcript": ({"text": "Hi there"}, ClientTranscript("Hi there")),
    "say": ({"text": "Hi there"}, ClientSay("Hi there")),
    "cancel": ({}, ClientCancel(None)),
    "playback": ({"turn_id": 3, "played_ms": 120}, ClientPlayback(3, 120.0)),
    "ping": ({"id": 7}, ClientPing(7)),
    "session.update": ({"session": {"frame_ms": 20}}, ClientSessionUpdate({"frame_ms": 20})),
    "session.resume": ({"session_id": "s", "resume_token": "t"}, ClientResume("s", "t", None)),
}


@pytest.mark.parametrize("kind", GOOD)
def test_every_message_takes_an_event_id_or_none(kind):
    fields, expected = GOOD[kind]
    assert expected.event_id is None
    assert decode_client(json.dumps({"type": kind, **fields})) == expected
    assert decode_client(json.dumps({"type": kind, **fields, "event_id": None})) == expected
    for event_id in ("e", "evt_0123456789abcdef", "x" * EVENT_ID_CHARS, "😀" * EVENT_ID_CHARS,
                     " ", "\u0000 ünï"):
        got = decode_client(json.dumps({"event_id": event_id, "type": kind, **fields}))
        assert got == replace(expected, event_id=event_id)


@pytest.mark.parametrize("kind", GOOD)
@pytest.mark.parametrize("event_id", [
    "", "x" * (EVENT_ID_CHARS + 1), "😀" * (EVENT_ID_CHARS + 1), 7, 0, 1.5, True, False,
    [], ["e1"], {}, {"id": "e1"}])
def test_a_bad_event_id_is_an_invalid_field_naming_it_and_the_message_is_refused(kind,
                                                                               event_id):
    """Lengths count code points (an emoji is one): 64 emoji pass, 65 do not. A wrong one
    refuses the message, as any field of the wrong type does (a cancel or a mark too: a
    client that names its messages wants to hear which was refused), and the error has no
    event_id: the message had none that could be read."""
    fields, _ = GOOD[kind]
    with pytest.raises(ProtocolError) as refused:
        decode_client(json.dumps({"type": kind, **fields, "event_id": event_id}))
    assert (refused.value.code, refused.value.event_id) == ("invalid_field", None)
    assert refused.value.message == \
        f"field 'event_id' must be a string of 1 to {EVENT_ID_CHARS} characters"


@pytest.mark.parametrize(("raw", "code"), [
    ('{"event_id":"e1"}', "invalid_message"),
    ('{"event_id":"e1","type":null}', "invalid_message"),
    ('{"event_id":"e1","type":"Say","text":"x"}', "unknown_type"),
    ('{"event_id":"e1","type":"say"}', "missing_field"),
    ('{"event_id":"e1","type":"say","text":7}', "invalid_field"),
    ('{"event_id":"e1","type":"say","text":" "}', "invalid_field"),
    ('{"event_id":"e1","type":"say","text":"' + "a" * 4001 + '"}', "text_too_long"),
    ('{"type":"cancel","turn_id":-1,"event_id":"e1"}', "invalid_field"),
    ('{"type":"playback","turn_id":1,"event_id":"e1"}', "missing_field"),
    ('{"type":"ping","id":' + nested(254) + ',"event_id":"e1"}', "invalid_field"),
    ('{"type":"session.update","session":{"frame_ms":30},"event_id":"e1"}', "invalid_field"),
    ('{"type":"session.update","session":{"llm":{"top_p":1}},"event_id":"e1"}',
     "invalid_field"),
    ('{"type":"session.resume","resume_token":"t","event_id":"e1"}', "missing_field"),
])
def test_a_refused_object_names_its_event_id_wherever_the_field_is(raw, code):
    with pytest.raises(ProtocolError) as refused:
        decode_client(raw)
    assert (refused.value.code, refused.value.event_id) == (code, "e1")


@pytest.mark.parametrize(("raw", "code"), [
    ('{"event_id":"e1","type":"ping"', "invalid_json"),
    ('{"event_id":"e1","type":"ping","id":NaN}', "invalid_json"),
    ('{"event_id":"e1","type":"say","text":"\\ud800"}', "invalid_json"),  # a lone surrogate
    ('{"event_id":"e1","x":' + nested(1024) + "}", "invalid_json"),
    ('[{"event_id":"e1","type":"ping"}]', "invalid_message"),  # not an object
    ('"e1"', "invalid_message"),
    ('{"event_id":"e1","type":"say","text":"' + "a" * 65_600 + '"}', "message_too_large"),
    (b'{"event_id":"e1","type":"ping"}', "binary_not_supported"),
])
def test_an_error_answering_no_readable_message_has_no_event_id(raw, code):
    with pytest.raises(ProtocolError) as refused:
        decode_client(raw)
    assert (refused.value.code, refused.value.event_id) == (code, None)


# --- audio frames ----------------------------------------------------------------------------


@given(st.integers(0, 255), st.integers(0, 2**16 - 1), u32, u32, st.binary(max_size=200))
def test_frame_header_round_trips_for_every_field_value(flags, sentence, turn_id, seq, pcm):
    data = frame_header(flags, sentence, turn_id, seq) + pcm
    assert len(data) == FRAME_HEADER.size + len(pcm)
    assert data[0] == PROTOCOL_VERSION
    frame = decode_frame(data)
    assert (frame.flags, frame.sentence, frame.turn_id, frame.seq, frame.pcm) == (
        flags, sentence, turn_id, seq, pcm)
    assert frame.sentence_end == bool(flags & 1) and frame.turn_end == bool(flags & 2)


@given(st.integers(0, 2**40), st.integers(0, 2**20))
def test_seq_wraps_at_2_32_and_sentence_at_2_16(seq, sentence):
    frame = decode_frame(frame_header(3, sentence, 1, seq))
    assert frame.seq == seq % 2**32 and frame.sentence == sentence % 2**16


@given(st.binary(max_size=40))
def test_decode_frame_raises_only_protocol_error(data):
    try:
        frame = decode_frame(data)
    except ProtocolError as error:
        assert error.code == "invalid_frame" and isinstance(error.message, str) and error.message
        assert len(data) < FRAME_HEADER.size or data[0] != PROTOCOL_VERSION
    else:
        assert data[0] == PROTOCOL_VERSION and frame.pcm == data[FRAME_HEADER.size:]


@pytest.mark.parametrize(("raw", "message"), [
    # turn ids are u32 in playback as in cancel (a playback with -1 used to go unanswered)
    ('{"type":"playback","turn_id":-1,"played_ms":0}',
     "field 'turn_id' must be between 0 and 4294967295"),
    ('{"type":"playback","turn_id":4294967296,"played_ms":0}',
     "field 'turn_id' must be between 0 and 4294967295"),
    ('{"type":"cancel","turn_id":4294967296}',
     "field 'turn_id' must be between 0 and 4294967295"),
    ('{"type":"session.update","session":{"frame_ms":200}}',
     "field 'frame_ms' must be between 20 and 120"),
    ('{"type":"playback","turn_id":1,"played_ms":86400001}',
     "field 'played_ms' must be between 0 and 86400000"),
    ('{"type":"session.update","session":{"llm":{"temperature":2.5}}}',
     "field 'temperature' must be between 0 and 2"),
])
def test_range_errors_name_the_exact_bounds(raw, message):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "invalid_field" and str(info.value) == message


@pytest.mark.parametrize("raw", [
    # JSON lets a parser limit numbers to a double's range (RFC 8259, section 6): orjson
    # refuses what is beyond it, and so does the gateway, anywhere in the message. (The
    # standard library used to read these instead, and it let a lone surrogate through
    # beside one: a "say" of it killed the engine lane for every session.)
    '{"type":"playback","turn_id":1,"played_ms":1e400}',
    '{"type":"playback","turn_id":1e400,"played_ms":0}',
    '{"type":"cancel","turn_id":' + "9" * 5000 + "}",
    '{"type":"session.resume","session_id":"s","resume_token":"t","last_seq":-1e400}',
    '{"type":"ping","id":[1,-1e400]}',
    '{"type":"ping","id":7,"note":1e400}',
    '{"type":"say","text":"Hi.","n":' + "1" * 400 + "}",
    '{"type":"say","x":1e400,"text":"hello \\ud800 world"}',
    '{"type":"session.update","x":1e400,"session":{"instructions":"\\ud800"}}',
    '{"type":"ping","x":1e400,"id":"\\ud800"}',
    '{"type":"ping","x":1e400,"id":' + nested(1000) + "}",
    '{"type":"ping","id":NaN}',
    '{"type":"ping","id":1e400',
])
def test_numbers_beyond_a_double_are_invalid_json_wherever_they_are(raw):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "invalid_json"


@pytest.mark.parametrize(("raw", "expected"), [
    # JSON does not tell 40 from 40.0 (Python's json.dumps writes floats so): an integral
    # number is the integer it is, and comes out an int
    ('{"type":"cancel","turn_id":7.0}', ClientCancel(7)),
    ('{"type":"playback","turn_id":1e2,"played_ms":2000.0}', ClientPlayback(100, 2000.0)),
    ('{"type":"session.update","session":{"frame_ms":40.0,"max_lead_ms":2E3,'
     '"segmenter":{"max_chars":200.0},"llm":{"max_tokens":64.0}}}',
     ClientSessionUpdate({"llm": {"max_tokens": 64}, "frame_ms": 40, "max_lead_ms": 2000,
                          "segmenter": {"max_chars": 200}})),
    ('{"type":"session.resume","session_id":"s","resume_token":"t","last_seq":5.0}',
     ClientResume("s", "t", 5)),
])
def test_an_integral_number_is_an_integer_however_it_is_written(raw, expected):
    message = decode_client(raw)
    assert repr(message) == repr(expected)  # (7 == 7.0, but their reprs differ)


@pytest.mark.parametrize("raw", [
    '{"type":"cancel","turn_id":7.5}',
    '{"type":"session.update","session":{"frame_ms":40.5}}',
    '{"type":"session.resume","session_id":"s","resume_token":"t","last_seq":0.1}',
])
def test_a_fraction_is_not_an_integer(raw):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "invalid_field" and str(info.value).endswith("must be an integer")


def test_a_ping_id_nests_at_most_253_levels_as_protocol_md_says():
    assert decode_client('{"type":"ping","id":' + nested(253) + "}") == ClientPing(
        orjson.loads(nested(253)))
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode_client('{"type":"ping","id":' + nested(254) + "}")


@pytest.mark.parametrize(("field", "limit", "wrap"), [
    ("text", TEXT_CHARS, lambda s: {"type": "say", "text": s}),
    ("text", TEXT_CHARS, lambda s: {"type": "transcript", "text": s}),
    ("instructions", INSTRUCTIONS_CHARS,
     lambda s: {"type": "session.update", "session": {"instructions": s}}),
])
def test_texts_up_to_their_documented_limit_pass_and_one_more_is_text_too_long(field, limit,
                                                                               wrap):
    assert decode_client(json.dumps(wrap("a" * limit)))  # exactly at the limit
    with pytest.raises(ProtocolError) as info:
        decode_client(json.dumps(wrap("a" * (limit + 1))))
    assert info.value.code == "text_too_long"
    assert str(limit) in info.value.message


@pytest.mark.parametrize("text", ["", " ", "\n\t ",
                                  # invisible characters only: a say of them completed with
                                  # nothing spoken, a transcript went to the LLM
                                  "\u200b", "\u200e\u200f", " \u2067\u2069\ufeff\u00ad\u2060 "])
def test_a_blank_text_is_refused_as_empty(text):
    for kind in ("say", "transcript"):
        with pytest.raises(ProtocolError) as info:
            decode_client(json.dumps({"type": kind, "text": text}))
        assert info.value.code == "invalid_field" and "'text' is empty" in info.value.message


@pytest.mark.parametrize("text", ["\u200bHi", "\u200e\u05e9\u05dc\u05d5\u05dd",
                                  "\U0001f44d", "\U0001f468\u200d\U0001f469", "-", "."])
def test_a_text_with_anything_visible_is_taken(text):
    for kind in ("say", "transcript"):
        assert decode_client(json.dumps({"type": kind, "text": text})).text == text


@pytest.mark.parametrize(("raw", "expected"), [
    # a wrong type is answered with what the field takes
    ('{"type":"say","text":5}', "field 'text' must be a string"),
    ('{"type":"cancel","turn_id":"3"}', "field 'turn_id' must be an integer"),
    ('{"type":"playback","turn_id":1,"played_ms":"9"}', "field 'played_ms' must be a number"),
    ('{"type":"session.update","session":[]}', "field 'session' must be an object"),
    ('{"type":"session.update","session":{"voice":1}}', "field 'voice' must be a string"),
    ('{"type":"session.update","session":{"llm":"gpt"}}', "field 'llm' must be an object"),
    ('{"type":"session.update","session":{"max_lead_ms":true}}',
     "field 'max_lead_ms' must be an integer"),
    ('{"type":"cancel","turn_id":true}', "field 'turn_id' must be an integer"),  # not 1
])
def test_a_wrong_type_error_says_what_the_field_takes(raw, expected):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "invalid_field" and str(info.value) == expected


@pytest.mark.parametrize(("raw", "names"), [
    ('{"type":"session.update","session":{"frame_ms":50}}', ["frame_ms", "40"]),
    ('{"type":"session.update","session":{"max_lead_ms":99}}', ["max_lead_ms", "100"]),
    ('{"type":"session.update","session":{"max_lead_ms":-5}}', ["max_lead_ms", "100"]),
    ('{"type":"session.update","session":{"max_lead_ms":9007199254740993}}',
     ["max_lead_ms"]),
    ('{"type":"session.update","session":{"max_lead_ms":1e300}}', ["max_lead_ms"]),
    ('{"type":"session.update","session":{"top_p":1}}', ["session setting", "top_p"]),
    ('{"type":"session.update","session":{"llm":{"top_p":1}}}', ["llm setting", "top_p"]),
    ('{"type":"session.update","session":{"segmenter":{"min_words":1}}}',
     ["segmenter setting", "min_words"]),
])
def test_a_setting_out_of_range_or_unknown_is_an_invalid_field_naming_it(raw, names):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "invalid_field"
    for name in names:
        assert name in info.value.message


def documented_ranges() -> dict[str, tuple[int, int]]:
    """The ranges of protocol.md's "Session settings" (`name` lo–hi), read, not copied."""
    section = PROTOCOL_MD.read_text().split("Session settings", 1)[1].split("### Server", 1)[0]
    number = r"(\d+(?:,\d{3})*)"
    return {name: (int(lo.replace(",", "")), int(hi.replace(",", ""))) for name, lo, hi in
            re.findall(rf"`(\w+)`(?: \|)? (?:integer )?{number}–{number}", section)}


RANGES = documented_ranges()
GROUPS = {"temperature": "llm", "max_tokens": "llm", "first_min_words": "segmenter",
          "first_phrase_words": "segmenter", "first_max_words": "segmenter",
          "min_chars": "segmenter",
          "max_chars": "segmenter", "quote_max_chars": "segmenter"}


def test_the_documented_ranges_were_found():
    assert set(RANGES) == {*GROUPS, "max_lead_ms"}
    assert RANGES["max_tokens"] == (1, 32_768) and RANGES["max_lead_ms"] == (100, 30_000)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_a_setting_takes_its_documented_range_and_nothing_past_it(name):
    """Both ends of each range protocol.md gives apply, and one step past either is an
    ``invalid_field`` (the codec's, or the session's for ``max_lead_ms``)."""
    lo, hi = RANGES[name]
    step = 0.01 if name == "temperature" else 1

    def outcome(value) -> str:
        setting = {name: value} if name not in GROUPS else {GROUPS[name]: {name: value}}
        try:
            message = decode_client(json.dumps({"type": "session.update", "session": setting}))
        except ProtocolError as error:
            return error.code
        (effect,) = Session("s").receive(message, 0.0)
        return effect.event["error"]["code"] if effect.event["type"] == "error" else "ok"

    assert [outcome(v) for v in (lo, hi, lo - step, hi + step)] == \
        ["ok", "ok", "invalid_field", "invalid_field"]


def test_max_lead_ms_beyond_30_000_is_left_to_the_session_up_to_2_53():
    # a server's own default may be larger (Session checks); the codec only refuses what
    # no int of a double could be
    big = ClientSessionUpdate({"max_lead_ms": 2**53})
    raw = json.dumps({"type": "session.update", "session": {"max_lead_ms": 2**53}})
    assert decode_client(raw) == big


@pytest.mark.parametrize(("raw", "field"), [
    ('{"type":"playback","played_ms":0}', "turn_id"),
    ('{"type":"playback","turn_id":1}', "played_ms"),
    ('{"type":"playback","turn_id":1,"played_ms":null}', "played_ms"),
    ('{"type":"say"}', "text"),
    ('{"type":"session.update"}', "session"),
    ('{"type":"session.resume","resume_token":"t"}', "session_id"),
])
def test_a_missing_required_field_is_missing_field_naming_it(raw, field):
    with pytest.raises(ProtocolError) as info:
        decode_client(raw)
    assert info.value.code == "missing_field" and f"'{field}'" in info.value.message


@pytest.mark.parametrize(("last_seq", "expected"), [
    ("", None), (',"last_seq":null', None), (',"last_seq":-1', None),  # no frame received
    (',"last_seq":0', 0), (',"last_seq":4294967295', 4294967295),
])
def test_resume_last_seq_minus_one_or_absent_is_none_and_any_u32_is_kept(last_seq, expected):
    raw = '{"type":"session.resume","session_id":"s","resume_token":"t"' + last_seq + "}"
    assert decode_client(raw) == ClientResume("s", "t", expected)


def test_u32_turn_ids_decode_up_to_the_largest():
    assert decode_client('{"type":"cancel","turn_id":4294967295}') == ClientCancel(4294967295)
    assert decode_client('{"type":"playback","turn_id":4294967295,"played_ms":5}') == \
        ClientPlayback(4294967295, 5.0)
    with pytest.raises(ProtocolError) as info:
        decode_client('{"type":"session.resume","session_id":"s","resume_token":"t",'
                      '"last_seq":4294967296}')
    assert info.value.code == "invalid_field"
    with pytest.raises(ProtocolError) as info:  # -1 means none received; -2 means nothing
        decode_client('{"type":"session.resume","session_id":"s","resume_token":"t",'
                      '"last_seq":-2}')
    assert info.value.code == "invalid_field"


# --- turn errors: an engine's or an LLM backend's own code reaches a client documented ----


def engine_codes() -> set[str]:
    """Every code an engine or LLM backend raises (``EngineError("code", ...)`` in
    engines/, read, not copied)."""
    found: set[str] = set()
    for path in (PROTOCOL_MD.parent / "engines").glob("*.py"):
        found |= set(re.findall(r'EngineError\(\s*"([a-z_]+)"', path.read_text()))
    return found


def turn_error(fail) -> dict:
    """The ``error`` event of a turn whose LLM or engine ``fail``s on its first sentence."""
    s = Session("s")
    s.receive(ClientTranscript("hello there"), 0.0)
    s.llm_delta(1, "A complete sentence. More", 0.0)
    (error,) = [e.event for e in fail(s) if isinstance(e, SendEvent)
                and e.event["type"] == "error"]
    assert error["turn_id"] == 1
    return error["error"]


def test_every_code_an_engine_raises_reaches_a_client_as_a_documented_one():
    """protocol.md's codes are stable, and a client codes against that table. The qwen3
    and chatterbox runaway guards' ``engine_runaway`` went to the client as it was, and
    so would ``voice_unknown``, ``engine_busy``, ``engine_closed`` or ``bad_request``."""
    codes = engine_codes()
    assert {"engine_failed", "engine_runaway", "voice_unknown", "llm_failed"} <= codes
    for code in sorted(codes):
        for fail in (lambda s, c=code: s.synthesis_failed(1, 0, c, "boom", 0.0),
                     lambda s, c=code: s.llm_failed(1, c, "boom", 0.0)):
            assert turn_error(fail)["code"] in CODES, code


def test_an_engines_own_code_is_told_as_engine_failed_and_named_in_the_message():
    error = turn_error(lambda s: s.synthesis_failed(1, 0, "engine_runaway", "too long", 0.0))
    assert error == {"code": "engine_failed", "message": "engine_runaway: too long"}
    for code in ("engine_failed", "engine_timeout", "engine_unavailable", "internal_error"):
        error = turn_error(lambda s, c=code: s.synthesis_failed(1, 0, c, "boom", 0.0))
        assert error == {"code": code, "message": "boom"}
    error = turn_error(lambda s: s.llm_failed(1, "bad_request", "no", 0.0))
    assert error == {"code": "llm_failed", "message": "bad_request: no"}
    for code in ("llm_failed", "llm_unavailable"):
        assert turn_error(lambda s, c=code: s.llm_failed(1, c, "boom", 0.0))["code"] == code
