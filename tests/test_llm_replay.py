"""ReplayLlm: which reply, how it is cut, how it is paced (with a fake clock)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.base import LlmDelta, LlmDone, LlmRequest
from engines.llm_replay import ReplayLlm, load_replies, normalise, split_tokens
from engines.registry import create_llm

LONG = "Tell me a story."


class FakeClock:
    """Time that moves only when the backend sleeps (or the test says so)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def ask(text: str, **kw) -> LlmRequest:
    return LlmRequest(messages=[{"role": "user", "content": text}], **kw)


async def run(llm: ReplayLlm, request: LlmRequest, clock: FakeClock | None = None):
    """[(time, event)] for every event of one stream."""
    return [(clock.now if clock else None, e) async for e in llm.stream(request)]


def text_of(timed) -> str:
    return "".join(e.text for _, e in timed if isinstance(e, LlmDelta))


async def test_known_transcript_gets_its_reply_exactly():
    llm = ReplayLlm(tokens_per_s=0)
    replies = [json.loads(line) for line in _replies_lines()]
    for item in replies[:5] + replies[-5:]:
        assert text_of(await run(llm, ask(item["transcript"]))) == item["reply"]


async def test_match_is_on_the_last_user_message_normalised():
    llm = ReplayLlm(tokens_per_s=0)
    messages = [
        {"role": "system", "content": "You are a voice assistant."},
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once upon a time..."},
        {"role": "user", "content": "  how much is the ELECTRICITY bill  "},
    ]
    reply = text_of(await run(llm, LlmRequest(messages)))
    assert reply.startswith("This month's bill is $184.50")
    assert normalise("What’s the  Wi-Fi password?!") == normalise("whats the wi fi password")


async def test_unknown_transcript_gets_a_stable_reply_from_the_set():
    one, other = ReplayLlm(tokens_per_s=0), ReplayLlm(tokens_per_s=0, seed=7)
    unknown = [f"Question number {i} nobody scripted?" for i in range(20)]
    picks = [text_of(await run(one, ask(q))) for q in unknown]
    assert picks == [text_of(await run(other, ask(q))) for q in unknown]
    assert set(picks) <= set(one.replies.values())
    assert len(set(picks)) > 5  # spread over the set, not one fallback line
    assert text_of(await run(one, ask(""))) in one.replies.values()


async def test_pacing_follows_tokens_per_s_in_bursts():
    clock = FakeClock()
    llm = ReplayLlm(tokens_per_s=20, chunk_tokens=(2, 5), clock=clock, sleep=clock.sleep)
    start = clock.now
    timed = await run(llm, ask(LONG), clock)
    *deltas, (_, done) = timed
    sent = 0
    for at, event in deltas:
        n = len(split_tokens(event.text))
        sent += n
        assert at - start == pytest.approx(sent / 20)  # delivered when its last token is due
    sizes = [len(split_tokens(e.text)) for _, e in deltas]
    assert all(2 <= s <= 5 for s in sizes[:-1]) and 1 <= sizes[-1] <= 5
    assert len(set(sizes)) > 1  # bursty, not uniform
    tokens = len(split_tokens(llm.replies[normalise(LONG)]))
    assert sent == tokens
    assert clock.now - start == pytest.approx(tokens / 20)
    assert done == LlmDone(
        finish_reason="stop",
        tokens_per_s=20.0,
        usage={
            "prompt_tokens": len(split_tokens(LONG)),
            "completion_tokens": tokens,
            "total_tokens": len(split_tokens(LONG)) + tokens,
            "generation_tokens_per_second": 20.0,
        },
    )


async def test_speed_scales_the_pace():
    slow, fast = FakeClock(), FakeClock()
    await run(ReplayLlm(tokens_per_s=10, clock=slow, sleep=slow.sleep), ask(LONG))
    await run(ReplayLlm(tokens_per_s=10, speed=4, clock=fast, sleep=fast.sleep), ask(LONG))
    assert sum(slow.sleeps) == pytest.approx(4 * sum(fast.sleeps))


async def test_a_late_consumer_does_not_accumulate_drift():
    clock = FakeClock()
    llm = ReplayLlm(tokens_per_s=10, chunk_tokens=(3, 3), clock=clock, sleep=clock.sleep)
    start = clock.now
    stream = llm.stream(ask(LONG))
    await anext(stream)
    clock.now += 2.0  # the consumer was busy for 2 s (6.7 chunks' worth)
    async for _ in stream:
        pass
    tokens = len(split_tokens(llm.replies[normalise(LONG)]))
    assert clock.now - start == pytest.approx(tokens / 10)
    assert clock.sleeps[1:7] == [0.0] * 6  # it caught up without sleeping


@pytest.mark.parametrize("options", [{"tokens_per_s": 0}, {"speed": 0}])
async def test_unpaced_never_sleeps_and_reports_no_rate(options):
    clock = FakeClock()
    llm = ReplayLlm(clock=clock, sleep=clock.sleep, **options)
    timed = await run(llm, ask(LONG), clock)
    assert clock.sleeps == []
    assert text_of(timed) == llm.replies[normalise(LONG)]
    done = timed[-1][1]
    assert done.tokens_per_s is None and "generation_tokens_per_second" not in done.usage


async def test_max_tokens_cuts_the_reply_with_finish_length():
    llm = ReplayLlm(tokens_per_s=0)
    timed = await run(llm, ask(LONG, max_tokens=7))
    full = llm.replies[normalise(LONG)]
    assert text_of(timed) == "".join(split_tokens(full)[:7])
    assert timed[-1][1].finish_reason == "length"
    assert timed[-1][1].usage["completion_tokens"] == 7


async def test_chunking_is_deterministic_per_seed():
    async def chunks(seed: int) -> list[str]:
        llm = ReplayLlm(tokens_per_s=0, seed=seed)
        return [e.text for _, e in await run(llm, ask(LONG)) if isinstance(e, LlmDelta)]

    assert await chunks(1) == await chunks(1)
    assert await chunks(1) != await chunks(2)


async def test_cancelling_mid_stream_is_clean():
    llm = ReplayLlm(tokens_per_s=50)
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in llm.stream(ask(LONG)):
            got_one.set()

    task = asyncio.create_task(consume())
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@given(st.text())
def test_split_tokens_loses_nothing(text):
    pieces = split_tokens(text)
    assert "".join(pieces) == text
    assert all(pieces)


def test_split_tokens_looks_like_word_pieces():
    assert split_tokens("It's 3:30 p.m., okay?") == [
        "It", "'", "s", " 3", ":", "30", " p", ".", "m", ".", ",", " okay", "?",
    ]  # fmt: skip
    assert split_tokens("extraordinary") == ["extrao", "rdinar", "y"]


def _replies_lines() -> list[str]:
    from importlib import resources

    text = resources.files("engines").joinpath("data/replies.jsonl").read_text("utf-8")
    return [line for line in text.splitlines() if line.strip()]


def test_the_shipped_set_covers_the_hard_cases():
    replies = list(load_replies().values())
    assert len(replies) >= 40
    everything = "\n".join(replies)
    for case in [
        "3:30 p.m.", "a.m.", "Dr.", "St.", "U.S.", "e.g.", "i.e.", "$184.50", "%", "8.4 km",
        "23.7 km", "2.4.1", "192.168.1.42", "example.org", '"', "**", "\n1. ", "\n- ", "...",
        "😊", "?", "!", "`",
    ]:  # fmt: skip
        assert case in everything, case
    assert any(len(r.split()) == 1 for r in replies)  # one-word replies
    assert max(r.count(". ") for r in replies) >= 5  # a long multi-sentence reply


def test_bad_files_are_refused_with_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"transcript": "a", "reply": "b"}\n{"transcript": "c"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_replies(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"transcript": "Hi!", "reply": "b"}\n{"transcript": "hi", "reply": "c"}\n')
    with pytest.raises(ValueError, match="duplicate"):
        load_replies(dup)


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    """As loadgen reads its transcripts: its first line was refused, not an object."""
    bom = tmp_path / "bom.jsonl"
    bom.write_text('\ufeff{"transcript": "Ping?", "reply": "Pong."}\n', encoding="utf-8")
    assert load_replies(bom) == {"ping": "Pong."}


async def test_custom_file_and_registry(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text('{"transcript": "Ping?", "reply": "Pong."}\n')
    llm = create_llm("replay", path=own, tokens_per_s=0)
    assert llm.name == "replay"
    assert text_of(await run(llm, ask("ping"))) == "Pong."
    assert text_of(await run(llm, ask("anything else"))) == "Pong."
    await llm.aclose()
