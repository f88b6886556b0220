"""Audio messages are framed with headers websockets serialized once per length
(``gateway.io.connection.binary_header``): the bytes must be the library's own, and the
server must never negotiate an extension that would change them."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from gateway.io.connection import binary_header
from tests.wsclient import gapless, read_turn, recv_event, send


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 1932, 65535, 65536, 70000])
def test_header_and_payload_are_the_frame_websockets_would_write(length):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    expected = Frame(Opcode.BINARY, payload).serialize(mask=False, extensions=[])
    assert binary_header(length) + payload == expected


async def test_a_client_offering_deflate_gets_no_extension_and_well_framed_audio(
        start_gateway):
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there. How are you?"}])
    # websockets' client offers permessage-deflate by default
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        assert ws.protocol.extensions == []
        assert (await recv_event(ws))["type"] == "session.created"
        await send(ws, type="transcript", text="Hello")
        turn = await read_turn(ws)  # the client's parser checks every header it reads
        assert turn.done["status"] == "completed"
        gapless(turn)
        assert turn.audio_ms > 500
        assert [e["type"] for e in turn.events].count("sentence") == 2


def test_the_example_turn_of_protocol_md_is_a_turn_a_client_can_decode():
    """A client's author checks a frame parser against protocol.md's example turn: its
    headers must decode as the table says (little-endian), say what their notes say, and
    add up to the ``audio_ms`` of its events at the default ``frame_ms`` (its last frame
    said seq 0x6b: 49 frames for a sentence of 1,410 ms, which takes 36)."""
    import json
    import re
    from pathlib import Path

    from gateway.core.codec import decode_frame, frame_header

    text = (Path(__file__).resolve().parent.parent / "protocol.md").read_text()
    block = text.split("## Example turn", 1)[1].split("```", 2)[1]
    frames, events = [], []
    for line in block.splitlines():
        if m := re.match(r"← binary\s+((?:[0-9a-f]+ ){5}) \+ ([\d,]+) bytes\s+(.*)", line):
            header = bytes.fromhex(m[1].replace(" ", ""))
            frame = decode_frame(header + bytes(int(m[2].replace(",", ""))))
            assert frame_header(frame.flags, frame.sentence, frame.turn_id, frame.seq) == header
            frames.append((frame, m[3]))
        elif line.startswith("← {"):
            events.append(json.loads(line[2:]))
    frame_ms = 40  # the default: 960 samples, 1,920 bytes a frame
    for frame, note in frames:
        assert frame.turn_id == 1
        if (seq := re.search(r"seq (\d+)", note)) is not None:
            assert frame.seq == int(seq[1])
        if (sentence := re.search(r"sentence (\d+)", note)) is not None:
            assert frame.sentence == int(sentence[1])
        assert ("bit0" in note) == frame.sentence_end and ("bit1" in note) == frame.turn_end
        assert len(frame.pcm) == frame_ms * 48 or frame.sentence_end
    done = {e["index"]: e["audio_ms"] for e in events if e["type"] == "sentence.done"}
    ends = [frame for frame, _ in frames if frame.sentence_end]
    first = 0
    for end in ends:  # a sentence: full frames from the one after the last one's end
        assert done[end.sentence] == (end.seq - first) * frame_ms + len(end.pcm) // 48
        first = end.seq + 1
    turn_done = next(e for e in events if e["type"] == "turn.done")
    assert turn_done["metrics"]["audio_ms"] == sum(done.values())
    assert ends[-1].turn_end
