"""The reference phone client end to end against the real gateway (replay LLM + espeak)."""

from __future__ import annotations

import asyncio
import wave

import numpy as np
import pytest

from examples import phone_client

REPLIES = (
    {"transcript": "Hello", "reply": "Hi. Nice to hear you."},
    {"transcript": "Time", "reply": "It is noon. Lunch is soon, and then a walk in the park "
                                    "with the dog, if the rain holds off until two."},
)


@pytest.fixture
async def gateway(start_gateway):
    return await start_gateway(REPLIES)


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
    client = phone_client.PhoneClient(f"ws://127.0.0.1:{gateway.port}/v1/voice", tmp_path,
                                      phone_client.ClockPlayer(), verbose=False)
    # hear 0.6 s of the long reply, then say something else
    await client.run(phone_client._from_list(["Time", "Hello"]), sequential=True,
                     barge_in_after=0.6)
    assert [r["status"] for r in client.results] == ["cancelled", "completed"]
    cut, full = client.results
    # pacing held the server to max_lead ahead of what the marks said was played
    assert cut["metrics"]["audio_ms"] < 0.6 * 1000 + 1000 + 200
    _, first = read_wav(client.saved[0])
    assert len(first) / 24 == pytest.approx(cut["metrics"]["audio_ms"], abs=1)
