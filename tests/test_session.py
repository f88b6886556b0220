"""Session core: inputs in, exact effects out, with a fake clock. No sockets, no threads."""

from __future__ import annotations

import json
import math

import pytest

from gateway.core.codec import (
    BYTES_PER_MS,
    LEAD_BELOW_FRAME,
    ClientCancel,
    ClientPing,
    ClientPlayback,
    ClientSay,
    ClientSessionUpdate,
    ClientTranscript,
    ProtocolError,
    decode_client,
    decode_frame,
)
from gateway.core.session import (
    LISTENER_SILENT_S,
    UNMARKED_SILENT_S,
    CancelLlm,
    CancelSynthesis,
    ProbeListener,
    Received,
    SendAudio,
    SendEvent,
    SendFrames,
    Session,
    SessionLimits,
    SessionSettings,
    StartLlm,
    StartSynthesis,
)


def events(effects, kind=None):
    out = [e.event for e in effects if isinstance(e, SendEvent)]
    return [e for e in out if kind is None or e["type"] == kind]


def frames(effects):
    out = []
    for e in effects:
        if isinstance(e, SendAudio):
            out.append(decode_frame(e.data))
        elif isinstance(e, SendFrames):
            out += [decode_frame(f) for f in e.frames]
    return out


def pcm(ms: float) -> bytes:
    n = int(ms * BYTES_PER_MS)
    return bytes([1, 0]) * (n // 2)


class Clock:
    """Fake clock: seconds, advanced by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> float:
        self.t += ms / 1000.0
        return self.t


@pytest.fixture
def clock():
    return Clock()


def start(session: Session, clock: Clock, text="hello there") -> int:
    effects = session.receive(ClientTranscript(text), clock())
    (started,) = events(effects, "turn.started")
    (llm,) = [e for e in effects if isinstance(e, StartLlm)]
    assert llm.turn_id == started["turn_id"]
    return started["turn_id"]


def test_open_announces_protocol_and_audio_format():
    (effect,) = Session("s1").open()
    assert effect.event["type"] == "session.created"
    assert effect.event["protocol"] == 1
    assert effect.event["audio"] == {"format": "pcm16", "sample_rate": 24000, "frame_ms": 40}
    assert effect.event["session_id"] == "s1" and "resume_token" not in effect.event


def test_open_gives_what_a_client_needs_to_resume_and_the_voice_that_speaks():
    (effect,) = Session("s1").open(resume_token="tok", resume_window_s=30.0,
                                   default_voice="af_heart")
    assert (effect.event["session_id"], effect.event["resume_token"],
            effect.event["resume_window_s"], effect.event["default_voice"]) == (
        "s1", "tok", 30.0, "af_heart")


def test_a_protocol_error_names_the_turn_it_is_about():
    s = Session("s")
    (with_turn,) = s.protocol_error(ProtocolError("invalid_field", "bad", turn_id=7), 0.0)
    (without,) = s.protocol_error(ProtocolError("invalid_json", "bad"), 0.0)
    assert with_turn.event["turn_id"] == 7 and "turn_id" not in without.event


def test_transcript_starts_llm_with_instructions_history_and_settings(clock):
    s = Session("s", settings=SessionSettings(instructions="be brief", temperature=0.3))
    effects = s.receive(ClientTranscript("what time is it"), clock())
    (llm,) = [e for e in effects if isinstance(e, StartLlm)]
    assert llm.request.messages == [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "what time is it"}]
    assert llm.request.temperature == 0.3


def test_full_turn_frames_flags_and_events_in_order(clock):
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_delta(tid, "Hello there. How", clock.advance(100))
    assert events(out, "text.delta") == [{"type": "text.delta", "turn_id": tid,
                                          "delta": "Hello there. How"}]
    out += s.llm_delta(tid, " are", clock())
    (job,) = [e for e in out if isinstance(e, StartSynthesis)]
    assert (job.index, job.text) == (0, "Hello there.")
    assert job.deadline == clock()
    out = s.audio(tid, 0, pcm(100), "espeak", clock.advance(10))
    # 100 ms = 2 full 40 ms frames + 20 ms; the tail is held until the sentence is complete
    assert events(out, "sentence") == [{"type": "sentence", "turn_id": tid, "index": 0,
                                        "text": "Hello there.", "spoken": "Hello there.",
                                        "engine": "espeak"}]
    assert [len(f.pcm) for f in frames(out)] == [40 * BYTES_PER_MS] * 2
    out = s.synthesis_done(tid, 0, clock())
    (last,) = frames(out)
    assert last.sentence_end and not last.turn_end and len(last.pcm) == 20 * BYTES_PER_MS
    assert events(out, "sentence.done")[0]["audio_ms"] == 100
    out = s.llm_delta(tid, " you?", clock.advance(5))
    assert not [e for e in out if isinstance(e, StartSynthesis)]  # no word after "?" yet
    out = s.llm_done(tid, 51.54321, clock.advance(5))
    (job,) = [e for e in out if isinstance(e, StartSynthesis)]
    assert job.text == "How are you?"
    s.audio(tid, 1, pcm(40), "espeak", clock())
    out = s.synthesis_done(tid, 1, clock())
    (last,) = frames(out)
    assert last.sentence_end and last.turn_end and last.sentence == 1
    (done,) = events(out, "turn.done")
    assert done["status"] == "completed"
    m = done["metrics"]
    assert m["ttft_ms"] == 100.0 and m["ttfa_ms"] == 110.0 and m["audio_ms"] == 140
    assert m["llm_tokens_per_s"] == 51.5 and m["engine"] == "espeak"  # (to 0.1 tok/s)
    # frame sequence numbers are gapless from 0
    assert s.history == [{"role": "user", "content": "hello there"},
                         {"role": "assistant", "content": "Hello there. How are you?"}]


def test_seq_is_gapless_across_turns(clock):
    s = Session("s")
    seqs = []
    for _ in range(3):
        effects = s.receive(ClientSay("One sentence here."), clock())
        effects += s.audio(effects[0].event["turn_id"] if False else s.turn.id, 0, pcm(130),
                           "x", clock())
        effects += s.synthesis_done(s.turn.id, 0, clock.advance(2000))
        seqs += [f.seq for f in frames(effects)]
    assert seqs == list(range(len(seqs)))


def test_pacing_holds_frames_beyond_max_lead_and_releases_on_tick(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    out = s.receive(ClientSay("A long sentence to speak."), clock())
    tid = s.turn.id
    out = s.audio(tid, 0, pcm(1000), "x", clock())
    assert len(frames(out)) == 5  # 5 × 40 ms reach the 200 ms lead
    wake = s.wake_at()
    # lead is at the limit; wake once it has dropped by the refill (half the lead here)
    assert wake == pytest.approx(clock() + 0.1)
    clock.advance(100)
    out = s.tick(clock())
    assert len(frames(out)) == 2  # one wake-up, several frames; never past the limit
    assert s.lead_ms(tid, clock()) == pytest.approx(180)
    assert s.wake_at() == pytest.approx(clock() + 0.08)


def test_playback_marks_move_the_estimate_by_what_the_client_fell_behind(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(1000), "x", clock())  # 200 ms sent
    clock.advance(100)
    # the wall clock says 100 ms were played, the client says 40 ms: its mark is 60 ms old
    # by now, or its buffer started 60 ms late; the first mark cannot tell, and every mark
    # is as late as the link's round trip, so it is the link's: 2 frames due, as by the clock
    out = s.receive(ClientPlayback(tid, 40.0), clock())
    assert len(frames(out)) == 2
    assert s.lead_ms(tid, clock()) == pytest.approx(180)
    clock.advance(100)
    # 60 ms played in 100 ms: it fell 40 ms further behind (a stall), which counts
    out = s.receive(ClientPlayback(tid, 100.0), clock())
    assert len(frames(out)) == 2  # it holds 80 + 40 ms by the estimate: 2 frames, not 3
    assert s.lead_ms(tid, clock()) == pytest.approx(200)


def test_barge_in_by_transcript_cancels_and_fences_late_chunks(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "First sentence here. Second one", clock())
    s.audio(tid, 0, pcm(1000), "x", clock())
    out = s.receive(ClientTranscript("stop, new question"), clock.advance(50))
    assert [type(e) for e in out[:3]] == [CancelLlm, CancelSynthesis, SendEvent]
    (done,) = events(out, "turn.done")
    assert done == {**done, "turn_id": tid, "status": "cancelled"}
    (started,) = events(out, "turn.started")
    assert started["turn_id"] == tid + 1
    # the old turn's engine and LLM keep talking for a moment: nothing comes out
    assert s.audio(tid, 0, pcm(200), "x", clock()) == []
    assert s.synthesis_done(tid, 0, clock()) == []
    assert s.llm_delta(tid, " more", clock()) == []
    # history keeps what was sent (no playback marks): 960 ms of a sentence estimated at
    # 1.3 s (its synthesis had not finished), so two of its three words
    assert s.history == [{"role": "user", "content": "hello there"},
                         {"role": "assistant", "content": "First sentence …"}]


def test_cancel_is_idempotent_and_ignores_other_turn_ids(clock):
    s = Session("s")
    tid = start(s, clock)
    assert s.receive(ClientCancel(tid + 7), clock()) == []
    out = s.receive(ClientCancel(None), clock())
    assert events(out, "turn.done")[0]["status"] == "cancelled"
    assert s.receive(ClientCancel(None), clock()) == []


def test_a_sentence_played_to_its_last_frame_is_kept_whole_in_history(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four. Five six seven eight. Nine ten", clock())
    s.audio(tid, 0, pcm(400), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.receive(ClientPlayback(tid, 400.0), clock.advance(400))  # exactly sentence 0's audio
    s.receive(ClientCancel(tid), clock())
    # whole, and cut there: the LLM knows it did not finish (as a reply cut before anything
    # was heard is an ellipsis); a mark a hair past the boundary said so, one on it did not
    assert s.history[1]["content"] == "One two three four. …"


@pytest.mark.parametrize("opening", ["🙂\n", "```\ncode\n```\n"], ids=["emoji", "code"])
def test_a_turns_first_audio_is_asked_for_as_a_new_stream_after_a_silent_segment(clock,
                                                                               opening):
    """A reply that opens with nothing to say (an emoji line, a code block): its first
    speakable segment starts the stream, so it carries no ``since``. It carried the turn's
    start as one, and the lane ranked it as a stream already playing, behind every
    playing stream short of audio, instead of first audio due now (scheduler rule 2b)."""
    s = Session("s")
    tid = start(s, clock)
    reply = opening + "Hello there, this is the answer. A second one."
    out = s.llm_delta(tid, reply, clock()) + s.llm_done(tid, None, clock())
    first, *rest = [e for e in out if isinstance(e, StartSynthesis)]
    assert first.index == 1 and first.since is None and first.deadline == clock()
    assert [job.since for job in rest] == [clock()]  # the next ones: the same stream


def test_turn_done_reports_when_text_sentence_and_audio_first_came(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One two", clock.advance(100))
    s.llm_delta(tid, " three. Four", clock.advance(50))
    s.audio(tid, 0, pcm(40), "x", clock.advance(200))
    s.synthesis_done(tid, 0, clock())
    out = s.llm_done(tid, None, clock())
    out += s.synthesis_done(tid, 1, clock())
    metrics = events(out, "turn.done")[0]["metrics"]
    assert (metrics["ttft_ms"], metrics["first_sentence_ms"], metrics["ttfa_ms"]) == (
        100.0, 150.0, 350.0)


def test_a_segment_with_nothing_to_say_is_not_the_first_ready_to_speak(clock):
    """A reply opening with a code block: its first segment has nothing to say, and set
    first_sentence_ms, which protocol.md calls the first segment ready to speak."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "```\nx = 1\n```\n", clock.advance(100))
    s.llm_delta(tid, "That sets x. Done", clock.advance(200))
    out = s.llm_done(tid, None, clock())
    for index, segment in enumerate(s.turn.segments):
        if not segment.synthesized:
            s.audio(tid, index, pcm(40), "x", clock())
            out += s.synthesis_done(tid, index, clock())
    assert events(out, "turn.done")[0]["metrics"]["first_sentence_ms"] == 300.0


def test_playback_marks_decide_what_history_keeps(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four. Five six seven eight. Nine ten", clock())
    s.audio(tid, 0, pcm(400), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.audio(tid, 1, pcm(400), "x", clock())
    s.synthesis_done(tid, 1, clock())
    s.receive(ClientPlayback(tid, 600.0), clock.advance(600))
    s.receive(ClientCancel(tid), clock())
    assert s.history[1]["content"] == "One two three four. Five six …"


def test_a_cut_reply_keeps_its_paragraphs_in_history(clock):
    """The sentences heard keep the reply's own white space between them, as a whole reply
    does: joined by spaces, a list or a paragraph break reached the LLM as one line."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Two things:\n\n- Milk and eggs.\n- Bread.\n\nNine ten eleven twelve.",
                clock())
    s.llm_done(tid, None, clock())
    assert [seg.segment.text for seg in s.turn.segments] == [
        "Two things:", "- Milk and eggs.", "- Bread.", "Nine ten eleven twelve."]
    for index in range(4):
        s.audio(tid, index, pcm(400), "x", clock())
        s.synthesis_done(tid, index, clock())
    s.tick(clock.advance(1400))  # (1 s of lead: sent to 2.4 s)
    s.receive(ClientPlayback(tid, 1400.0), clock())
    s.receive(ClientCancel(tid), clock())
    assert s.history[1]["content"] == "Two things:\n\n- Milk and eggs.\n- Bread.\n\nNine ten …"


def sent_ahead(clock, earlier: bool = False) -> tuple[Session, int]:
    """A reply of two 1 s sentences, both synthesized; paced out to 0.9 s in, when 1.8 s of
    it has been sent (max_lead_ms 1000). ``earlier``: after a turn with an empty reply."""
    s = Session("s")
    if earlier:
        s.llm_done(start(s, clock, "before"), None, clock())
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four five. Six seven eight nine ten. ", clock())
    s.llm_done(tid, None, clock())
    for index in (0, 1):
        s.audio(tid, index, pcm(1000), "x", clock())
        s.synthesis_done(tid, index, clock())
    t0 = clock()
    while (wake := s.wake_at()) is not None and wake <= t0 + 0.9:
        clock.t = wake
        assert not events(s.tick(clock()), "turn.done")
    assert s.turn.pacer.sent_ms == 1800
    return s, tid


@pytest.mark.parametrize("earlier", [False, True])
@pytest.mark.parametrize("barge_in", ["transcript", "cancel"])
def test_a_barge_in_after_the_last_frame_went_out_keeps_what_was_heard(clock, barge_in,
                                                                       earlier):
    """The mark a client sends on barge-in (protocol.md) let the last frames out, so the
    turn ended completed, up to max_lead_ms before it had played; the barge-in then found
    no turn, and the history kept the whole reply, half of it never heard (core review).
    Only that reply is cut, not one before it (``earlier``)."""
    s, tid = sent_ahead(clock, earlier)
    clock.t += 0.1  # 1.0 s in: the first sentence heard, the second not started
    done = events(s.receive(ClientPlayback(tid, 1000.0), clock()), "turn.done")
    assert [d["status"] for d in done] == ["completed"]
    assert s.history[-1]["content"] == "One two three four five. Six seven eight nine ten."
    if barge_in == "transcript":
        s.receive(ClientTranscript("stop, something else"), clock())
    else:
        assert s.receive(ClientCancel(tid), clock()) == []  # the turn is over: no event
    assert [m["content"] for m in s.history if m["role"] == "assistant"] == \
        ["…"] * earlier + ["One two three four five. …"]


def test_a_failed_turn_keeps_what_it_sent_and_a_later_barge_in_cuts_it(clock):
    """A failed turn still plays out its complete sentences, but its history was fixed at
    turn.done from the last periodic mark, cutting what the listener then heard, and a
    barge-in after it was ignored (conversation probe)."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four five. Six seven eight nine ten. Eleven", clock())
    for index in (0, 1):
        s.audio(tid, index, pcm(1000), "x", clock())
        s.synthesis_done(tid, index, clock())
    s.receive(ClientPlayback(tid, 250.0), clock.advance(250))  # a periodic mark
    s.llm_failed(tid, "llm_unavailable", "the stream broke", clock())
    done = []
    while (wake := s.wake_at()) is not None and not done:
        clock.t = wake
        done = events(s.tick(clock()), "turn.done")
    assert [d["status"] for d in done] == ["failed"]
    assert s.history[1]["content"] == "One two three four five. Six seven eight nine ten. …"
    # the listener stops it half-way through the second sentence
    s.receive(ClientPlayback(tid, 1500.0), clock())
    s.receive(ClientTranscript("stop"), clock())
    assert s.history[1]["content"] == "One two three four five. Six seven …"



@pytest.mark.parametrize("barge_in", ["cancel", "transcript"])
def test_a_failed_turn_cancelled_while_its_sentences_are_still_said_ends_failed(clock,
                                                                                barge_in):
    """protocol.md (Errors): a turn error is followed by ``turn.done`` ``failed``. The LLM
    broke after whole sentences, which are still said; a cancel or a barge-in before
    their end stops them, and the turn that sent its error ends ``failed``, not
    ``cancelled``."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence here. The second one here. And", clock())
    out = s.llm_failed(tid, "llm_failed", "HTTP 500", clock())
    assert events(out, "error") and not events(out, "turn.done")
    s.audio(tid, 0, pcm(400), "x", clock())
    if barge_in == "cancel":
        out = s.receive(ClientCancel(tid), clock.advance(100))
    else:
        out = s.receive(ClientTranscript("stop, something else"), clock.advance(100))
    assert [e.turn_id for e in out if isinstance(e, CancelSynthesis)] == [tid]
    (done,) = [d for d in events(out, "turn.done") if d["turn_id"] == tid]
    assert done["status"] == "failed" and not events(out, "error")


def test_a_barge_in_after_a_failed_turn_weighs_its_cut_sentence_by_all_its_audio(clock):
    """An engine fails mid-sentence while most of the sentence's audio is held back by
    pacing: the end drops what was held, and a barge-in after it then weighed what was
    heard against the part sent alone, so a mark showing less played kept more words
    than the turn's end had ("One …", then "One two …" at 0.9 of the 1 s sent)."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four five six. Seven", clock())
    s.audio(tid, 0, pcm(4000), "x", clock())  # 1 s (the lead) goes out, 3 s are held back
    s.synthesis_failed(tid, 0, "engine_failed", "boom", clock())
    assert s.history[1]["content"] == "One …"  # 1 s of the sentence's 4 s
    s.receive(ClientPlayback(tid, 900.0), clock.advance(900))
    s.receive(ClientTranscript("stop"), clock())
    assert s.history[1]["content"] == "One …"

@pytest.mark.parametrize(("text", "heard_ms", "kept"), [
    # into the second sentence by less than a word: still said to be cut there
    ("One two three four five. Six seven eight nine ten.", 1100,
     "One two three four five. …"),
    # Chinese has no spaces: cut by characters, not kept or dropped whole
    ("今天的会议讨论了预算。大家都同意推迟。", 1600, "今天的会议讨论了预算。 大家都同 …"),
    # a word is weighed by the words it is read as: the amount is nine of the thirteen
    # ("one thousand ... cents"), not one of five, and was still being said at 80 %
    ("Fine. It cost $1,234.56 in total.", 1800, "Fine. It cost …"),
    # "example dot org slash a slash b": seven of eleven, still being said half-way
    ("Fine. See example.org/a/b for the rest.", 1500, "Fine. See …"),
    ("Fine. See example.org/a/b for the rest.", 1750, "Fine. See example.org/a/b …"),
    # a mark read as nothing is not kept as if heard
    ("Fine. — Then we go on.", 1200, "Fine. …"),
])
def test_the_sentence_playing_at_a_barge_in_is_marked_cut(clock, text, heard_ms, kept):
    s = Session("s", settings=SessionSettings(max_lead_ms=30_000))  # all sent at once
    tid = start(s, clock)
    s.llm_delta(tid, text + " More", clock())
    for index in (0, 1):
        s.audio(tid, index, pcm(1000), "x", clock())
        s.synthesis_done(tid, index, clock())
    s.receive(ClientPlayback(tid, heard_ms), clock.advance(heard_ms))
    s.receive(ClientTranscript("stop"), clock())
    assert s.history[1]["content"] == kept


def test_sentences_played_to_their_reported_length_are_heard_whole(clock):
    """sentence.done's audio_ms is whole milliseconds; a client adding them up to say what
    it played fell short of the audio by a fraction of a millisecond, and the history cut
    the last word of a sentence it heard to the end (clean-room client)."""
    s = Session("s", settings=SessionSettings(max_lead_ms=30_000))  # all sent at once
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence is here. The second one too. And a third", clock())
    reported = []
    for index in (0, 1):
        s.audio(tid, index, b"\1\0" * 42_631, "x", clock())  # 1,776.29 ms
        reported += events(s.synthesis_done(tid, index, clock()), "sentence.done")
    played = sum(d["audio_ms"] for d in reported)
    assert played == 2 * 1776 < s.turn.pacer.sent_ms
    s.receive(ClientPlayback(tid, played), clock.advance(played))
    s.receive(ClientTranscript("stop"), clock())
    assert s.history[1]["content"] == "The first sentence is here. The second one too. …"


def test_a_reply_played_out_before_the_next_turn_stays_whole(clock):
    """Once its playback should have ended, or without a mark, the reply was heard whole."""
    s, tid = sent_ahead(clock)
    s.receive(ClientPlayback(tid, 1000.0), clock.advance(100))  # it ends here, all sent
    s.receive(ClientTranscript("and then?"), clock.advance(1500))  # after playback's end
    assert s.history[1]["content"] == "One two three four five. Six seven eight nine ten."
    s, tid = sent_ahead(clock)
    clock.advance(200)
    s.tick(clock())  # the last frames go out: completed, no mark about it
    s.receive(ClientCancel(None), clock.advance(100))
    assert s.history[1]["content"] == "One two three four five. Six seven eight nine ten."


def test_llm_failure_speaks_what_is_complete_then_fails(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Complete sentence. Incomplete one", clock())
    out = s.llm_failed(tid, "llm_failed", "HTTP 500", clock())
    assert events(out, "error") == [{"type": "error", "turn_id": tid,
                                     "error": {"code": "llm_failed", "message": "HTTP 500"}}]
    assert not events(out, "turn.done")
    s.audio(tid, 0, pcm(40), "x", clock())
    out = s.synthesis_done(tid, 0, clock())
    assert frames(out)[-1].turn_end
    assert events(out, "turn.done")[0]["status"] == "failed"


def test_llm_failure_right_after_a_sentence_end_speaks_that_sentence(clock):
    s = Session("s")
    tid = start(s, clock)
    assert not [e for e in s.llm_delta(tid, "It is done. ", clock())
                if isinstance(e, StartSynthesis)]  # the segmenter waits for what follows
    out = s.llm_failed(tid, "llm_failed", "malformed JSON", clock.advance(50))
    (job,) = [e for e in out if isinstance(e, StartSynthesis)]
    assert job.text == "It is done." and job.deadline == clock()  # first audio: due now
    s.audio(tid, 0, pcm(40), "x", clock())
    out = s.synthesis_done(tid, 0, clock())
    assert events(out, "turn.done")[0]["status"] == "failed"


@pytest.mark.parametrize("chunks", [
    ["First one. Second one. " * 4 + "Tail that never ends"],   # one delta past the cap
    ["First one. ", "Second one. " * 7, "Tail that never ends"],  # the cap falls in the last
])
def test_a_reply_past_max_reply_chars_is_cut_spoken_up_to_there_and_fails(clock, chunks):
    s = Session("s", limits=SessionLimits(max_reply_chars=100))
    tid = start(s, clock)
    out = []
    for chunk in chunks:
        out += s.llm_delta(tid, chunk, clock())
    deltas = "".join(e["delta"] for e in events(out, "text.delta"))
    assert deltas == "".join(chunks)[:100] == s.turn.reply
    assert [e.turn_id for e in out if isinstance(e, CancelLlm)] == [tid]  # the stream closes
    (error,) = events(out, "error")
    assert error == {"type": "error", "turn_id": tid, "error": {
        "code": "llm_failed", "message": "the reply passed 100 characters; the rest is not "
        "spoken"}}
    jobs = [e for e in out if isinstance(e, StartSynthesis)]
    # whole sentences before the cut are spoken; the one it cuts is not
    assert {j.text for j in jobs} <= {"First one.", "Second one."} and len(jobs) >= 6
    assert len(" ".join(j.text for j in jobs)) > 100 - len("Second one. ") * 2
    assert s.llm_delta(tid, "more text.", clock()) == []  # whatever still arrives is dropped
    for job in jobs:
        s.audio(tid, job.index, pcm(40), "x", clock())
        out = s.synthesis_done(tid, job.index, clock())
    assert events(out, "turn.done")[0]["status"] == "failed"


def test_llm_unavailable_before_any_text_fails_at_once(clock):
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_failed(tid, "llm_unavailable", "connection refused", clock.advance(30))
    assert [e["type"] for e in events(out)] == ["error", "turn.done"]
    assert events(out, "turn.done")[0]["status"] == "failed"
    assert events(out, "turn.done")[0]["metrics"]["duration_ms"] == 30.0


def test_engine_failure_ends_turn_failed_and_stops_llm(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Complete sentence. More", clock())
    out = s.synthesis_failed(tid, 0, "engine_failed", "boom", clock.advance(250))
    assert isinstance(out[1], CancelLlm)
    assert events(out, "error") == [{"type": "error", "turn_id": tid,
                                     "error": {"code": "engine_failed", "message": "boom"}}]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["duration_ms"] == 250.0


def test_an_engine_failing_on_a_later_sentence_still_speaks_the_complete_ones(clock):
    """Sentence 1's engine fails while sentence 0, made whole, is still held back by pacing:
    sentence 0 is spoken to its end, then the turn ends failed, as after an LLM failure. It
    was cut where pacing stood (a second into three, mid-word), without its sentence.done."""
    s = Session("s")  # max_lead_ms 1000
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence is complete. The second", clock())
    out = s.audio(tid, 0, pcm(3000), "x", clock()) + s.synthesis_done(tid, 0, clock())
    assert sum(len(f.pcm) for f in frames(out)) == 1000 * BYTES_PER_MS  # the lead
    (job,) = [e for e in s.llm_delta(tid, " one fails. More", clock())
              if isinstance(e, StartSynthesis)]
    out = s.synthesis_failed(tid, job.index, "engine_failed", "boom", clock.advance(500))
    assert events(out) == [{"type": "error", "turn_id": tid,
                            "error": {"code": "engine_failed", "message": "boom"}}]
    assert {type(e) for e in out} >= {CancelLlm, CancelSynthesis}
    while (wake := s.wake_at()) is not None:
        clock.t = max(clock.t, wake)
        out += s.tick(clock.t)
    sent = frames(out)
    assert sum(len(f.pcm) for f in sent) == 2000 * BYTES_PER_MS and sent[-1].turn_end
    assert events(out, "sentence.done") == [{"type": "sentence.done", "turn_id": tid,
                                             "index": 0, "audio_ms": 3000}]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["audio_ms"] == 3000
    assert s.history[-1] == {"role": "assistant",
                             "content": "The first sentence is complete. …"}


def _engine_fails_on_the_sentence_playing(s, tid, clock):
    return s.synthesis_failed(tid, 0, "engine_failed", "boom", clock())


def _engine_fails_on_a_later_sentence(s, tid, clock):
    out = s.synthesis_done(tid, 0, clock())
    return out + s.synthesis_failed(tid, 1, "engine_failed", "boom", clock())


def _the_gateway_shuts_down(s, tid, clock):
    return s.shutdown(clock())


@pytest.mark.parametrize("then", [_engine_fails_on_the_sentence_playing,
                                  _engine_fails_on_a_later_sentence, _the_gateway_shuts_down])
def test_a_turn_that_fails_twice_tells_the_client_its_first_failure_only(clock, then):
    """protocol.md (Errors): a turn has at most one ``error``, its first failure's. The LLM
    broke after two whole sentences, which are still spoken; an engine failing on one of
    them, or a shutdown, ends the turn (``failed`` already) without a second error: an
    app that shows a turn's error showed the engine's, or replaced the cause by it."""
    s = Session("s", settings=SessionSettings(max_lead_ms=40))
    tid = start(s, clock)
    out = s.llm_delta(tid, "The first sentence here. The second one here. And", clock())
    out += s.llm_failed(tid, "llm_failed", "HTTP 500", clock())
    out += s.audio(tid, 0, pcm(400), "x", clock())  # announced, held back by pacing
    out += then(s, tid, clock)
    while not s.turn.ended and (wake := s.wake_at()) is not None:
        clock.t = max(clock.t, wake)
        out += s.tick(clock.t)
    assert events(out, "error") == [{"type": "error", "turn_id": tid, "error": {
        "code": "llm_failed", "message": "HTTP 500"}}]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed"


def test_an_engine_failure_after_the_turn_failed_still_stops_its_synthesis(clock):
    """The second failure sends no error, yet does all the first would have: the sentence
    its engine failed on and those after it are not said, their synthesis stops."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence here. The second one here. And", clock())
    s.llm_failed(tid, "llm_failed", "HTTP 500", clock())
    s.audio(tid, 0, pcm(400), "x", clock())
    out = s.synthesis_failed(tid, 0, "engine_failed", "boom", clock())
    assert [type(e) for e in out] == [CancelSynthesis, SendEvent]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["sentences"] == 1


def test_turn_end_known_late_is_closed_with_an_empty_frame(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Spoken sentence. Hmm ", clock())  # sentence 0 is certain
    s.audio(tid, 0, pcm(80), "x", clock())
    out = s.synthesis_done(tid, 0, clock())
    last_seq = frames(out)[-1].seq
    assert frames(out)[-1].sentence_end and not frames(out)[-1].turn_end
    s.llm_done(tid, None, clock())
    out = s.synthesis_done(tid, 1, clock())  # the engine had nothing to say for "Hmm"
    (closing,) = frames(out)
    assert closing.turn_end and closing.sentence_end and closing.pcm == b""
    assert (closing.sentence, closing.seq) == (1, last_seq + 1)
    assert [e["type"] for e in events(out)] == ["sentence", "sentence.done", "turn.done"]
    assert events(out, "turn.done")[0]["status"] == "completed"


def test_a_closing_frame_names_the_last_sentence_holds_no_audio_and_takes_its_seq(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "One here. Two here. Three here. Hmm ", clock())  # three certain
    out = []
    for index in range(3):
        out += s.audio(tid, index, pcm(40), "x", clock())
        out += s.synthesis_done(tid, index, clock())
    s.llm_done(tid, None, clock())
    out += s.synthesis_done(tid, 3, clock())  # nothing to say for "Hmm": the turn ends late
    closing = [e for e in out if isinstance(e, SendAudio)][-1]
    assert closing.duration_ms == 0.0
    frame = decode_frame(closing.data)
    assert frame.turn_end and frame.pcm == b"" and frame.sentence == 3
    out = s.receive(ClientSay("Next turn."), clock())
    out += s.audio(s.turn.id, 0, pcm(40), "x", clock())
    out += s.synthesis_done(s.turn.id, 0, clock())
    assert frames(out)[0].seq == frame.seq + 1 == s.frames_sent - 1  # gapless after it


@pytest.mark.parametrize("reply, thought_chars, message", [
    ("", 0, "the LLM's reply was empty: nothing to say"),
    (" \n", 0, "the LLM's reply was empty: nothing to say"),
    ("", 1234, "the LLM's reply was only a thought (1,234 characters, not said): nothing "
               "to say"),
])
def test_a_reply_with_nothing_to_say_fails_the_turn_and_says_why(clock, reply, thought_chars,
                                                                  message):
    """It ended completed, with no frame and no error: the listener heard nothing and
    never knew why. The history keeps the turn, as after any failure before a word."""
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_delta(tid, reply, clock()) + s.llm_done(tid, None, clock.advance(30),
                                                        thought_chars)
    assert frames(out) == []
    assert events(out, "error") == [{"type": "error", "turn_id": tid, "error": {
        "code": "llm_empty_reply", "message": message}}]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["duration_ms"] == 30.0
    assert s.history[-1] == {"role": "assistant", "content": "…"}


def test_a_reply_of_exactly_max_reply_chars_is_spoken_whole(clock):
    s = Session("s", limits=SessionLimits(max_reply_chars=20))
    tid = start(s, clock)
    out = s.llm_delta(tid, "Exactly twenty char.", clock())
    assert len(s.turn.reply) == 20 and not events(out, "error")
    assert not [e for e in out if isinstance(e, CancelLlm)]


def test_more_reply_once_max_reply_chars_is_reached_sends_no_empty_delta_and_fails(clock):
    """A reply that reaches the cap exactly and then goes on: the next delta has no room
    left at all, so nothing of it is sent (no empty ``text.delta``), the stream closes and
    the turn fails saying why, as when a delta crosses the cap."""
    s = Session("s", limits=SessionLimits(max_reply_chars=20))
    tid = start(s, clock)
    s.llm_delta(tid, "Exactly twenty char.", clock())
    out = s.llm_delta(tid, " More", clock())
    assert not events(out, "text.delta") and s.turn.reply == "Exactly twenty char."
    assert [e.turn_id for e in out if isinstance(e, CancelLlm)] == [tid]
    assert events(out, "error") == [{"type": "error", "turn_id": tid, "error": {
        "code": "llm_failed", "message": "the reply passed 20 characters; the rest is not "
        "spoken"}}]


def test_a_completed_turn_keeps_the_reply_as_written_in_history(clock):
    s = Session("s")
    reply = "First line.\nSecond line."
    tid = start(s, clock)
    s.llm_delta(tid, reply, clock())
    s.llm_done(tid, None, clock())
    for index in range(2):
        s.audio(tid, index, pcm(40), "x", clock())
        out = s.synthesis_done(tid, index, clock())
    assert events(out, "turn.done")[0]["status"] == "completed"
    assert s.history[-1] == {"role": "assistant", "content": reply}


def test_a_sentence_cut_short_by_its_engine_says_so(clock):
    s = Session("s")
    s.receive(ClientSay("First one here. Second one."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(80), "qwen3", clock())
    out = s.synthesis_done(tid, 0, clock(), cut_short=True)
    assert events(out, "sentence.done") == [{"type": "sentence.done", "turn_id": tid,
                                             "index": 0, "audio_ms": 80, "cut_short": True}]
    s.audio(tid, 1, pcm(40), "espeak", clock())
    out = s.synthesis_done(tid, 1, clock.advance(1000))
    assert "cut_short" not in events(out, "sentence.done")[0]


def test_a_sentence_cut_short_by_its_engine_is_remembered_only_as_far_as_it_was_said(clock):
    """sentence.done cut_short: the engine failed mid-sentence and another said the next
    ones; the rest of that sentence was never said. The history kept the whole reply, so
    the LLM took the words the listener never heard as said."""
    s = Session("s", settings=SessionSettings(max_lead_ms=30_000))
    tid = start(s, clock)
    s.llm_delta(tid, "The meeting is at three in room four. It takes an hour.", clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(650), "qwen3", clock())  # about 10 of its 37 characters
    s.synthesis_done(tid, 0, clock(), cut_short=True)
    s.audio(tid, 1, pcm(1200), "espeak", clock())
    out = s.synthesis_done(tid, 1, clock())
    assert events(out, "turn.done")[0]["status"] == "completed"
    assert s.history[-1]["content"] == "The meeting … It takes an hour."
    # a barge-in while it plays out cuts it the same way, and then where the mark says
    s.receive(ClientPlayback(tid, 1000.0), clock.advance(1000))
    s.receive(ClientCancel(None), clock())
    assert s.history[-1]["content"] == "The meeting … It …"


def test_session_update_and_unknown_voice(clock):
    s = Session("s", voices=["en-us", "en-gb"])
    out = s.receive(ClientSessionUpdate({"voice": "en-gb", "frame_ms": 20}), clock())
    assert events(out)[0]["session"]["voice"] == "en-gb"
    assert s.settings.frame_ms == 20
    out = s.receive(ClientSessionUpdate({"voice": "klingon"}), clock())
    assert events(out)[0]["error"] == {"code": "unknown_voice", "message":
                                       "unknown voice 'klingon'; available: en-gb, en-us"}
    assert s.settings.voice == "en-gb"
    # a long list is cut, and says so (it read as if the first 20 were all of them)
    many = Session("s", voices=[f"v{i:03}" for i in range(144)])
    (error,) = events(many.receive(ClientSessionUpdate({"voice": "x"}), clock()))
    assert error["error"]["message"].endswith(
        "v018, v019, … (144 in all; GET /v1/audio/voices lists them)")


@pytest.mark.parametrize(("update", "code"), [
    ({"voice": "klingon"}, "unknown_voice"),
    ({"llm": {"model": "gpt-9"}}, "unknown_model"),
    ({"max_lead_ms": 30_001}, "invalid_field"),
    ({"frame_ms": 120, "max_lead_ms": 120}, "invalid_field"),
])
@pytest.mark.parametrize("event_id", ["u1", None])
def test_a_session_update_refused_by_the_session_names_its_event_id(clock, update, code,
                                                                     event_id):
    """The refusals the session decides (after the codec took the message) say which
    message they answer, as the codec's own do: a client sends its settings and a
    transcript at once and must tell the update's refusal from the transcript's."""
    s = Session("s", voices=["en-us"], llm_models=["m"])
    (error,) = events(s.receive(ClientSessionUpdate(update, event_id), clock()))
    assert error["error"]["code"] == code and "turn_id" not in error
    assert error["error"].get("event_id") == event_id
    assert ("event_id" in error["error"]) == (event_id is not None)


def test_a_protocol_error_carries_the_event_id_of_the_message_it_refuses():
    s = Session("s")
    (named,) = s.protocol_error(ProtocolError("rate_limited", "wait", event_id="t9"), 0.0)
    (unnamed,) = s.protocol_error(ProtocolError("invalid_json", "bad"), 0.0)
    assert named.event == {"type": "error", "error": {"code": "rate_limited",
                                                      "message": "wait", "event_id": "t9"}}
    assert unnamed.event == {"type": "error", "error": {"code": "invalid_json",
                                                        "message": "bad"}}


def _llm_breaks(s, tid, clock):
    return s.llm_failed(tid, "llm_unavailable", "connection refused", clock())


def _llm_says_nothing(s, tid, clock):
    return s.llm_done(tid, None, clock())


def _engine_breaks(s, tid, clock):
    out = s.llm_delta(tid, "One sentence here. And", clock())
    return out + s.synthesis_failed(tid, 0, "engine_runaway", "too long", clock())


@pytest.mark.parametrize("fail", [_llm_breaks, _llm_says_nothing, _engine_breaks,
                                  _the_gateway_shuts_down])
def test_a_turns_error_names_the_event_id_of_the_transcript_that_started_it(clock, fail):
    """protocol.md (Errors): a turn's error comes long after its transcript, with other
    messages answered between; it names that transcript's ``event_id``, a turn started
    without one has none, and no success answer (``turn.started``, ``turn.done``,
    ``session.updated``, ``pong``) echoes one."""
    s = Session("s")
    out = s.receive(ClientSessionUpdate({"frame_ms": 20}, "u1"), clock())
    out += s.receive(ClientPing(1, "p1"), clock())
    out += s.receive(ClientTranscript("Hello there", "t1"), clock())
    tid = s.turn.id
    out += s.receive(ClientPlayback(tid, 0.0, "m1"), clock())  # (named, and answered by none)
    out += fail(s, tid, clock)
    (error,) = events(out, "error")
    assert error["turn_id"] == tid and error["error"]["event_id"] == "t1"
    assert [e for e in events(out) if e["type"] != "error" and "event_id" in str(e)] == []
    # the next turn, unnamed, fails unnamed: the name went with its own turn
    s.receive(ClientTranscript("Again"), clock())
    (error,) = events(fail(s, s.turn.id, clock), "error")
    assert error["turn_id"] == s.turn.id and "event_id" not in error["error"]


def test_a_says_error_names_the_say(clock):
    s = Session("s")
    out = s.receive(ClientSay("One sentence here.", "s1"), clock())
    out += s.synthesis_failed(s.turn.id, 0, "engine_failed", "boom", clock())
    (error,) = events(out, "error")
    assert error == {"type": "error", "turn_id": s.turn.id, "error": {
        "code": "engine_failed", "message": "boom", "event_id": "s1"}}


def test_a_voice_named_in_other_letter_case_is_the_listed_one(clock):
    """The model card writes "Serena", the checkpoint lists "serena": a session asking for
    "Serena" was refused (``unknown_voice``) although every engine speaking it takes
    either spelling. It gets the voice, spelt as listed (an engine may match exactly)."""
    s = Session("s", voices=["serena", "en-us"])
    out = s.receive(ClientSessionUpdate({"voice": "Serena"}), clock())
    assert events(out)[0]["session"]["voice"] == "serena"
    assert s.settings.voice == "serena"
    out = s.receive(ClientSessionUpdate({"voice": "EN-US"}), clock())
    assert s.settings.voice == "en-us"
    # two lanes' engines spelling one speaker two ways: the same one, whichever is given
    both = Session("s", voices=["serena", "Serena"])
    for asked in ("Serena", "serena"):
        both.receive(ClientSessionUpdate({"voice": asked}), clock())
        assert both.settings.voice == asked
    both.receive(ClientSessionUpdate({"voice": "SERENA"}), clock())
    assert both.settings.voice == "Serena"  # (the first of the spellings in order)
    (error,) = events(s.receive(ClientSessionUpdate({"voice": "serenade"}), clock()))
    assert error["error"]["code"] == "unknown_voice"


def test_a_null_setting_goes_back_to_the_servers_default(clock):
    server = SessionSettings(voice="en-gb", temperature=0.3, max_lead_ms=2000)
    s = Session("s", settings=server, voices=["en-us", "en-gb"])
    s.receive(ClientSessionUpdate({
        "voice": "en-us", "instructions": "Be terse.", "frame_ms": 20, "max_lead_ms": 500,
        "llm": {"model": "m", "temperature": 1.5, "max_tokens": 9},
        "segmenter": {"min_chars": 30, "max_chars": 200}}), clock())
    assert s.settings != server
    # one key of a group, then a whole group, then the rest
    s.receive(ClientSessionUpdate({"llm": {"temperature": None},
                                   "segmenter": {"min_chars": None}}), clock())
    assert (s.settings.temperature, s.settings.llm_model) == (0.3, "m")
    assert (s.settings.segmenter.min_chars, s.settings.segmenter.max_chars) == (0, 200)
    out = s.receive(ClientSessionUpdate(dict.fromkeys(
        ("voice", "instructions", "frame_ms", "max_lead_ms", "llm", "segmenter"))), clock())
    assert s.settings == server
    assert events(out)[0]["session"] == server.to_event()


def test_the_settings_a_session_reports_can_be_sent_back_as_they_are(clock):
    # what session.created says, through the codec, is accepted and changes nothing; an
    # operator's lead beyond what a client may ask for included (a load script's hours)
    for server in (SessionSettings(), SessionSettings(max_lead_ms=3_600_000, voice="en-us",
                                                      temperature=0.7)):
        s = Session("s", settings=server, voices=["en-us"])
        (created,) = events(s.open())
        message = decode_client(json.dumps({"type": "session.update",
                                            "session": created["session"]}))
        (updated,) = events(s.receive(message, clock()))
        assert updated == {"type": "session.updated", "session": created["session"]}
        assert s.settings == server


def test_max_lead_ms_beyond_the_sessions_limit_is_refused(clock):
    for server_lead, limit in ((1000, 30_000), (3_600_000, 3_600_000)):
        s = Session("s", settings=SessionSettings(max_lead_ms=server_lead))
        assert s.max_lead_ms_limit == limit
        s.receive(ClientSessionUpdate({"max_lead_ms": limit}), clock())
        assert s.settings.max_lead_ms == limit
        (error,) = events(s.receive(ClientSessionUpdate({"max_lead_ms": limit + 1}), clock()))
        assert error["error"] == {"code": "invalid_field", "message":
                                  f"field 'max_lead_ms' must be between 100 and {limit}"}
        assert s.settings.max_lead_ms == limit


def test_a_lead_of_one_frame_or_less_is_refused_as_merged(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=100))
    for update, lead, frame in (({"frame_ms": 100}, 100, 100),  # the lead left as it was
                                ({"frame_ms": 120, "max_lead_ms": 120}, 120, 120)):
        (error,) = events(s.receive(ClientSessionUpdate(update), clock()))
        assert error["error"] == {"code": "invalid_field", "message":
                                  f"max_lead_ms ({lead}) must be more than frame_ms ({frame}): "
                                  f"{LEAD_BELOW_FRAME}"}
        assert (s.settings.frame_ms, s.settings.max_lead_ms) == (40, 100)  # none of it
    s.receive(ClientSessionUpdate({"frame_ms": 120, "max_lead_ms": 140}), clock())
    assert (s.settings.frame_ms, s.settings.max_lead_ms) == (120, 140)
    (error,) = events(s.receive(ClientSessionUpdate({"max_lead_ms": None}), clock()))
    assert error["error"]["message"].startswith("max_lead_ms (100) must be more than "
                                                "frame_ms (120)")  # the server's 100


def test_every_segmenter_knob_is_reported_and_can_be_updated(clock):
    from dataclasses import fields

    from gateway.core.segmenter import SegmenterConfig

    s = Session("s")
    knobs = {f.name for f in fields(SegmenterConfig)}
    assert set(s.settings.to_event()["segmenter"]) == knobs
    out = s.receive(ClientSessionUpdate({"segmenter": {"quote_max_chars": 0}}), clock())
    assert events(out)[0]["session"]["segmenter"]["quote_max_chars"] == 0
    assert s.settings.segmenter.quote_max_chars == 0


@pytest.mark.parametrize(("knob", "value", "first"), [
    ("first_phrase_words", 4, "The home team won 3 to 2"),
    ("first_max_words", 3, "The home team")])
def test_session_update_first_segment_knobs_cut_the_first_segment(clock, knob, value, first):
    s = Session("s")
    assert s.settings.to_event()["segmenter"][knob] == 0
    out = s.receive(ClientSessionUpdate({"segmenter": {knob: value}}), clock())
    assert events(out)[0]["session"]["segmenter"][knob] == value
    assert s.settings.segmenter.first_min_words == 4  # the other knobs keep their values
    tid = start(s, clock)
    out = s.llm_delta(tid, "The home team won 3 to 2 in overtime", clock.advance(100))
    assert [e.text for e in out if isinstance(e, StartSynthesis)] == [first]
    out = s.receive(ClientSessionUpdate({"segmenter": {knob: None}}), clock())
    assert events(out)[0]["session"]["segmenter"][knob] == 0


def test_ping_pong(clock):
    assert events(Session("s").receive(ClientPing(7), clock())) == [{"type": "pong", "id": 7}]


def test_history_is_bounded(clock):
    from gateway.core.session import SessionLimits

    s = Session("s", limits=SessionLimits(history_turns=2))
    for i in range(5):
        tid = start(s, clock, f"question {i}")
        s.llm_done(tid, None, clock())
    assert [m["content"] for m in s.history] == ["question 3", "…", "question 4", "…"]


def test_a_history_of_no_turns_keeps_none(clock):
    """``[session] history_turns = 0`` is allowed; every turn's end raised IndexError (the
    shell's internal_error, close 1011) instead (core review)."""
    from gateway.core.session import SessionLimits

    s = Session("s", limits=SessionLimits(history_turns=0))
    for i in range(2):
        tid = start(s, clock, f"question {i}")
        s.llm_done(tid, None, clock())
        assert s.history == []
    s.receive(ClientTranscript("and now?"), clock())
    assert events(s.receive(ClientCancel(None), clock()), "turn.done")
    assert s.history == []
    # a barge-in after a reply ended, while it still plays: nothing to cut either
    tid = start(s, clock, "one more")
    s.llm_delta(tid, "A reply that plays on.", clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(800), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.tick(clock())
    assert s.turn.ended
    s.receive(ClientPlayback(tid, 200), clock.advance(200))
    assert s.receive(ClientCancel(None), clock()) == [] and s.history == []


def test_deadline_counts_audio_held_back_by_pacing(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    due = clock()
    assert s.deadline(tid, clock()) == due  # first audio: due when the segment was ready
    clock.advance(50)
    assert s.deadline(tid, clock()) == due  # ... and stays there: overdue, not "now"
    s.audio(tid, 0, pcm(1000), "x", clock())
    # 200 ms sent (the lead), 800 ms held: the listener is covered for a whole second,
    # so just-in-time scheduling can let other work take the lane until then
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 1.0, abs=1e-9)
    assert s.deadline(tid + 1, clock()) is None


def test_a_playback_mark_before_any_audio_leaves_the_first_audio_due_when_ready(clock):
    """A mark that comes before the turn's first frame (0 ms: nothing to play yet) says
    nothing of a timeline: the first audio stays due when its segment was ready, as for a
    listener that sent no mark, not when the mark came (that ranked it behind listeners
    who waited less)."""
    s = Session("s")
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    due = clock()
    s.receive(ClientPlayback(tid, 0), clock.advance(300))
    assert s.deadline(tid, clock()) == due


def test_first_audio_is_due_when_the_first_segment_was_ready_not_when_the_turn_began(clock):
    s = Session("s")
    tid = start(s, clock)
    ready = clock.advance(300)  # the LLM's first sentence takes 300 ms
    s.llm_delta(tid, "First sentence here. And", ready)
    clock.advance(100)
    assert s.deadline(tid, clock()) == ready


def test_deadline_of_a_starved_listener_does_not_slide_with_the_clock(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=1000, frame_ms=40))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(110), "x", clock())  # two 40 ms frames go out, 30 ms is held back
    ran_dry = clock() + 0.080                 # (a part frame waits for the segment's end)
    assert s.deadline(tid, clock()) == pytest.approx(ran_dry + 0.030)
    for _ in range(5):  # the listener starves: the deadline stays where it was
        clock.advance(100)
        assert s.deadline(tid, clock()) == pytest.approx(ran_dry + 0.030)


def test_nothing_is_due_for_a_detached_session_until_it_resumes(clock):
    # Nobody listens: the listener's clock stopped at the drop. Counting on from it made a
    # detached turn due in real time, ahead of live listeners, for the whole resume window.
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(320), "x", clock())  # the lead goes out, 120 ms is held back
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 0.32)
    s.held = True  # the socket dropped
    for _ in range(3):
        assert s.deadline(tid, clock()) == math.inf
        clock.advance(5000)
    # a resume with 40 ms replayed: due again, and the lead counts the replay: 40 ms
    # replayed + 80 ms released (the segment's last frame waits for its end) = 120 ms
    out = s.resume(40, clock())
    assert sum(len(f.pcm) for f in frames(out)) / BYTES_PER_MS == pytest.approx(80)
    assert s.lead_ms(tid, clock()) == pytest.approx(120)
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 0.16)


def test_a_resume_releases_no_fresh_lead_on_top_of_a_long_replay(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(200), "x", clock())
    s.held = True
    s.audio(tid, 0, pcm(200), "x", clock())
    clock.advance(2000)
    assert frames(s.resume(600, clock())) == []  # the replay alone is past the lead
    clock.advance(450)  # 150 ms of replay left: frames again, up to the lead
    assert sum(len(f.pcm) for f in frames(s.tick(clock()))) / BYTES_PER_MS == pytest.approx(40)
    assert s.lead_ms(tid, clock()) == pytest.approx(190)


def test_a_short_blip_keeps_what_the_listener_still_holds(clock):
    # The player goes on playing its buffer while the socket is down: a resume 60 ms later
    # must not release a whole new lead on top of it (three quick blips stacked 3.6 s).
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(1000), "x", clock())  # 200 ms out, the rest held back
    for _ in range(3):
        s.held = True
        clock.advance(60)
        holds = s.lead_ms(tid, clock())  # what it still has: 140 ms, then more
        released = sum(len(f.pcm) for f in frames(s.resume(0, clock()))) / BYTES_PER_MS
        assert holds + released <= 200  # topped up to the lead, not a lead on top
        s.tick(clock.advance(100))
    # frames lost in flight (counted as received, never were) come back as the replay
    s.held = True
    clock.advance(20)
    lead = s.lead_ms(tid, clock())
    assert frames(s.resume(80, clock())) == []
    assert s.lead_ms(tid, clock()) == pytest.approx(lead)


def test_frames_longer_than_the_lead_still_flow(clock):
    # frame_ms 120 with max_lead_ms 100 (which session.update and the config refuse): each
    # frame goes out when the listener runs dry
    s = Session("s", settings=SessionSettings(frame_ms=120, max_lead_ms=100))
    s.receive(ClientSay("Something to say here."), clock())
    tid = s.turn.id
    assert len(frames(s.audio(tid, 0, pcm(600), "x", clock()))) == 1
    wake = s.wake_at()
    assert wake == pytest.approx(clock() + 0.12)
    clock.advance(120)
    assert len(frames(s.tick(clock()))) == 1


def test_a_playback_mark_says_which_frames_the_client_has(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    s.receive(ClientSay("Something long enough to say here."), clock())
    tid = s.turn.id
    first = frames(s.audio(tid, 0, pcm(400), "x", clock()))  # 9 frames (the last is held)
    more = frames(s.audio(tid, 0, pcm(200), "x", clock.advance(100)))  # 5 more
    assert [f.seq for f in first + more] == list(range(14))
    # played 200 ms: inside the first run of frames (360 ms), so nothing is proven yet
    out = s.receive(ClientPlayback(tid, 200.0), clock.advance(100))
    assert [e for e in out if isinstance(e, Received)] == []
    # played past the first run: the client has frames 0-8 and everything before them
    out = s.receive(ClientPlayback(tid, 380.0), clock.advance(180))
    assert [e for e in out if isinstance(e, Received)] == [Received(8)]
    # a mark past what was sent proves no more than what was sent
    out = s.receive(ClientPlayback(tid, 10_000.0), clock.advance(10))
    assert [e for e in out if isinstance(e, Received)] == [Received(13)]
    again = s.receive(ClientPlayback(tid, 10_000.0), clock())
    assert [e for e in again if isinstance(e, Received)] == []  # said once


@pytest.mark.parametrize("source", ["say", "transcript"])
def test_marks_after_turn_done_prove_the_last_frames_received_after_a_say_too(clock, source):
    """A turn's last lead of audio goes out before its turn.done and plays on after it; the
    marks the client sends meanwhile prove it has those frames, and the resume buffer lets
    them go. After a say they were ignored (only a reply's were taken, for its history):
    a session idle after a say kept its last ~1.5 s of audio buffered (77 KB at the default
    lead, 297 bytes after a reply) until its next turn."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    if source == "say":
        s.receive(ClientSay("Something long enough to say here."), clock())
        tid = s.turn.id
    else:
        tid = start(s, clock)
        s.llm_delta(tid, "Something long enough to say here.", clock())
        s.llm_done(tid, None, clock())
    out = s.audio(tid, 0, pcm(2000), "x", clock()) + s.synthesis_done(tid, 0, clock())
    out += run_until(s, clock, clock() + 5)
    last = frames(out)[-1]
    assert last.turn_end and events(out, "turn.done")
    out = s.receive(ClientPlayback(tid, 2000.0), clock())
    assert [e for e in out if isinstance(e, Received)] == [Received(last.seq)]
    assert [e for e in out if not isinstance(e, Received)] == []  # and nothing else


def probes(effects) -> int:
    return sum(isinstance(e, ProbeListener) for e in effects)


def playing(clock, *, mark: bool = True) -> tuple[Session, int]:
    """A turn with 20 s of audio made, 1 s lead sent; the client marks once at the start."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(20_000), "x", clock())
    if mark:
        s.receive(ClientPlayback(tid, 0.0), clock())
    return s, tid


REFILL_S = 0.4
"""The pacer's refill period: a session ticks at least this often while it releases audio,
and a quiet listener is probed from those ticks."""


def run_until(s: Session, clock, until: float) -> list:
    """Fire the session's timer as the shell does, until ``until`` (seconds)."""
    out = []
    while (wake := s.wake_at()) is not None and wake <= until:
        clock.t = max(clock.t, wake)
        out += s.tick(clock())
    clock.t = max(clock.t, until)
    return out


def test_a_marking_listener_gone_quiet_is_probed_once_until_it_answers(clock):
    s, tid = playing(clock)
    heard = clock()
    out = run_until(s, clock, heard + LISTENER_SILENT_S - 0.01)
    assert probes(out) == 0 and frames(out)  # audio flows, no probe yet
    out = run_until(s, clock, heard + LISTENER_SILENT_S + REFILL_S)
    assert probes(out) == 1
    out = run_until(s, clock, heard + 3 * LISTENER_SILENT_S)
    assert probes(out) == 0  # one question at a time
    assert s.listener_answered(clock()) == []
    answered = clock()
    out = run_until(s, clock, answered + LISTENER_SILENT_S - 0.01)
    assert probes(out) == 0
    assert probes(run_until(s, clock, answered + LISTENER_SILENT_S + REFILL_S)) == 1


def test_marks_keep_the_probe_away(clock):
    s, tid = playing(clock)
    for _ in range(20):  # a mark every 500 ms, as protocol.md asks
        out = run_until(s, clock, clock() + 0.5)
        assert probes(out) == 0
        played = s.turn.pacer.sent_ms - s.lead_ms(tid, clock())
        s.receive(ClientPlayback(tid, played), clock())


def test_a_client_that_sends_no_marks_is_probed_after_a_longer_silence(clock):
    s, tid = playing(clock, mark=False)
    start = clock()
    assert probes(run_until(s, clock, start + UNMARKED_SILENT_S - 0.01)) == 0
    out = run_until(s, clock, start + UNMARKED_SILENT_S + REFILL_S)
    (probe,) = [e for e in out if isinstance(e, ProbeListener)]
    assert UNMARKED_SILENT_S <= probe.silent_s <= UNMARKED_SILENT_S + REFILL_S
    s, tid = playing(clock, mark=False)
    for _ in range(3):  # any message shows the client is there: a ping will do
        clock.advance(UNMARKED_SILENT_S * 1000 - 10)
        assert probes(s.tick(clock())) == 0
        s.receive(ClientPing(1), clock())


def test_no_probe_when_held_or_when_nothing_is_left_to_play(clock):
    s, _ = playing(clock)
    s.held = True  # no socket to ask
    assert s.wake_at() is None
    # a short reply: the listener has played it all before it was due to mark again
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    s.receive(ClientSay("Short."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(500), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.receive(ClientPlayback(tid, 0.0), clock())
    assert probes(run_until(s, clock, clock() + 15)) == 0


def test_a_resume_counts_as_hearing_from_the_listener(clock):
    s, tid = playing(clock)
    assert probes(run_until(s, clock, clock() + LISTENER_SILENT_S + REFILL_S)) == 1
    s.held = True  # unanswered: the shell dropped the socket
    clock.advance(10_000)
    s.resume(0, clock())
    back = clock()
    assert probes(run_until(s, clock, back + LISTENER_SILENT_S - 0.01)) == 0
    assert probes(run_until(s, clock, back + LISTENER_SILENT_S + REFILL_S)) == 1


def test_shutdown_fails_the_turn_in_progress_and_leaves_an_idle_session_alone(clock):
    s = Session("s")
    assert s.shutdown(clock()) == []  # no turn yet
    tid = start(s, clock)
    s.llm_delta(tid, "One sentence here. And", clock())
    out = s.shutdown(clock.advance(100))
    assert any(isinstance(e, CancelLlm) for e in out)
    assert any(isinstance(e, CancelSynthesis) for e in out)
    assert events(out, "error") == [{"type": "error", "turn_id": tid, "error": {
        "code": "shutting_down", "message": "the gateway is shutting down"}}]
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["duration_ms"] == 100.0
    assert s.shutdown(clock()) == []  # ended already


def test_close_stops_the_turn_and_reports_it_cancelled_without_sending(clock):
    s = Session("s")
    assert s.close(clock()) == []
    tid = start(s, clock)
    s.llm_delta(tid, "One sentence here. And", clock())
    out = s.close(clock.advance(100))
    assert [type(e) for e in out] == [CancelLlm, CancelSynthesis, SendEvent]
    (done,) = events(out, "turn.done")
    assert done["status"] == "cancelled" and done["metrics"]["duration_ms"] == 100.0
    assert s.close(clock()) == []


def test_a_session_resumed_before_its_first_turn_sends_nothing(clock):
    s = Session("s")
    s.held = True
    assert s.resume(0, clock()) == [] and not s.held


def test_no_lead_is_reported_for_a_turn_that_is_not_active(clock):
    s = Session("s")
    assert s.lead_ms(1, clock()) is None
    tid = start(s, clock)
    s.receive(ClientCancel(tid), clock())
    assert s.lead_ms(tid, clock()) is None


def test_a_turn_closed_by_a_silent_last_sentence_ends_with_an_empty_frame_after_its_done(clock):
    """protocol.md, Binary frames: the zero-sample frame closes the turn, after the last
    sentence's sentence.done and just before turn.done (core review: undocumented)."""
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_delta(tid, "Hello there. ```\nx = 1\n```\n", clock())
    out += s.llm_done(tid, None, clock())
    out += s.audio(tid, 0, pcm(200), "x", clock())
    out += s.synthesis_done(tid, 0, clock())
    order = []
    for e in out:
        if isinstance(e, SendEvent) and e.event["type"] in ("sentence.done", "turn.done"):
            order.append((e.event["type"], e.event.get("index")))
        elif isinstance(e, SendAudio | SendFrames):
            order += [("frame", (f.sentence, f.flags, len(f.pcm))) for f in frames([e])]
    assert order[-5:] == [("frame", (0, 1, 1920)), ("sentence.done", 0), ("sentence.done", 1),
                          ("frame", (1, 3, 0)), ("turn.done", None)]


@pytest.mark.parametrize("barge_in", [False, True])
def test_a_say_is_not_added_to_the_history(clock, barge_in):
    """protocol.md: a ``say`` is "not added to the LLM history", whether it played to
    the end or was cut by the next turn (a barge-in after the end must not rewrite the
    reply before it either)."""
    s = Session("s")
    tid = start(s, clock, "hello")
    s.llm_delta(tid, "Hi there.", clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(400), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.tick(clock.advance(1000))
    assert s.turn.ended
    say = s.receive(ClientSay("Hello there, this is one sentence."), clock.advance(1000))
    (started,) = events(say, "turn.started")
    s.audio(started["turn_id"], 0, pcm(1000), "x", clock())
    s.synthesis_done(started["turn_id"], 0, clock())
    s.tick(clock())
    assert s.turn.ended
    if barge_in:  # it still plays: the client marks 200 ms and asks something
        s.receive(ClientPlayback(started["turn_id"], 200), clock.advance(200))
    effects = s.receive(ClientTranscript("and now"), clock())
    (llm,) = [e for e in effects if isinstance(e, StartLlm)]
    assert [m["content"] for m in llm.request.messages[1:]] == ["hello", "Hi there.",
                                                               "and now"]


def test_a_sentence_cut_while_its_audio_is_held_back_is_cut_in_proportion_to_all_of_it(clock):
    """protocol.md (History): the sentence that was playing is cut by words in proportion
    to its audio, all of it, the part pacing still holds back included: 500 ms heard of a
    2 s sentence keeps its first quarter."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    tid = start(s, clock)
    s.llm_delta(tid, "One two three four five six seven eight.", clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(2000), "x", clock())
    s.synthesis_done(tid, 0, clock())
    s.tick(clock())
    assert s.turn.pacer.sent_ms == 1000  # a second held back by pacing
    s.receive(ClientPlayback(tid, 500.0), clock.advance(500))
    assert 0 < s.turn.pacer.sent_ms < 2000  # some of it still held back
    s.receive(ClientCancel(tid), clock())
    assert s.history[1]["content"] == "One two …"


def test_a_sentence_cut_while_it_is_still_synthesized_is_cut_by_its_estimated_length(clock):
    """protocol.md (History): while the sentence that was playing is still being
    synthesized, its length is estimated from its text, not taken as the audio made so
    far: 500 ms heard of 1 s made of a 40-character sentence (about 2.6 s) keeps less than
    its first half."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000))
    tid = start(s, clock)
    text = "One two three four five six seven eight."
    s.llm_delta(tid, text, clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(1000), "x", clock())  # more to come
    s.tick(clock())
    s.receive(ClientPlayback(tid, 500.0), clock.advance(500))
    s.receive(ClientCancel(tid), clock())
    # 8 words heard to 500 of about 2,600 ms: one whole word (half the audio made: four)
    assert s.history[1]["content"] == "One …"


def test_a_sentence_still_synthesized_is_estimated_by_what_its_engine_is_given(clock):
    """The estimate counts the text the engine says, not the text written: for an engine
    that does not read digits "$1,234.56" is said in 64 characters, and the sentence,
    estimated from its 27 written ones (1.8 s), kept "It cost" after 500 ms of some 5 s."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000), reads_digits=False)
    tid = start(s, clock)
    s.llm_delta(tid, "It cost $1,234.56 in total.", clock())
    s.llm_done(tid, None, clock())
    s.audio(tid, 0, pcm(1000), "x", clock())  # more to come
    s.tick(clock())
    s.receive(ClientPlayback(tid, 500.0), clock.advance(500))
    s.receive(ClientCancel(tid), clock())
    assert s.history[1]["content"] == "It …"


def test_a_request_past_the_llm_context_forgets_the_older_half_of_history_and_asks_again(
        clock):
    """``llm_context_full``: the older half of the history (rounded up) goes and the same
    turn asks again, until no history is left to forget; then the turn fails."""
    s = Session("s")
    for i in range(3):
        tid = start(s, clock, f"question {i}")
        s.llm_done(tid, None, clock())
    tid = start(s, clock, "question 3")

    def asked(effects) -> list[str]:
        (again,) = effects
        assert isinstance(again, StartLlm) and again.turn_id == tid
        assert again.request.messages[0]["role"] == "system"
        return [m["content"] for m in again.request.messages[1:]]

    # three turns before: two go (half of three, rounded up)
    assert asked(s.llm_context_full(tid, "too long", clock())) == ["question 2", "…",
                                                                   "question 3"]
    assert asked(s.llm_context_full(tid, "too long", clock())) == ["question 3"]
    out = s.llm_context_full(tid, "too long", clock())  # nothing left to forget
    assert events(out) == [
        {"type": "error", "turn_id": tid, "error": {"code": "llm_failed", "message": "too long"}},
        *events(out, "turn.done")]
    assert events(out, "turn.done")[0]["status"] == "failed"
    assert s.llm_context_full(tid, "too long", clock()) == []  # the turn is over
    # the transcript that did not fit alone is not kept: the next turn's request held it,
    # and the LLM refused that one too before it was forgotten
    assert s.history == []
    (request,) = [e.request for e in s.receive(ClientTranscript("question 4"), clock())
                  if isinstance(e, StartLlm)]
    assert [m["content"] for m in request.messages[1:]] == ["question 4"]


def test_a_context_refusal_after_the_reply_began_fails_the_turn_and_keeps_the_history(clock):
    """Text already came (and was shown): asking again would say it twice."""
    s = Session("s")
    first = start(s, clock, "question 0")
    s.llm_done(first, None, clock())
    tid = start(s, clock, "question 1")
    s.llm_delta(tid, "Well", clock())
    (error,) = events(s.llm_context_full(tid, "too long", clock()), "error")
    assert error["error"] == {"code": "llm_failed", "message": "too long"}
    assert s.history[0] == {"role": "user", "content": "question 0"}
    assert s.llm_context_full(first, "too long", clock()) == []  # an earlier turn's


def test_deadline_counts_what_is_held_after_a_single_frame_went_out(clock):
    """A frame sent on its own (not a run of them) is no longer held: 60 ms came, one
    40 ms frame went out, 20 ms waits for the segment's end."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000, frame_ms=40))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    out = s.audio(tid, 0, pcm(60), "x", clock())
    assert [len(f.pcm) for f in frames(out)] == [40 * BYTES_PER_MS]
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 0.040 + 0.020)


def test_deadline_drops_the_audio_of_sentences_an_engine_failure_cut_off(clock):
    """The engine fails on the second sentence before it was announced: its audio made so
    far is never sent, so it no longer covers the listener; the first one's still does."""
    s = Session("s", settings=SessionSettings(max_lead_ms=40, frame_ms=40))
    s.receive(ClientSay("First one here. Second one here."), clock())
    tid = s.turn.id
    s.audio(tid, 0, pcm(200), "x", clock())  # 40 ms sent (the lead), 160 ms held
    s.synthesis_done(tid, 0, clock())
    s.audio(tid, 1, pcm(100), "x", clock())  # held behind the first sentence
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 0.300)
    (error,) = events(s.synthesis_failed(tid, 1, "engine_failed", "boom", clock()), "error")
    assert error["error"]["code"] == "engine_failed"
    assert s.deadline(tid, clock()) == pytest.approx(clock() + 0.200)


@pytest.mark.parametrize(("fail", "expected"), [
    (lambda s, tid, now: s.llm_failed(tid, "bad_request", "HTTP 400", now),
     {"code": "llm_failed", "message": "bad_request: HTTP 400"}),
    (lambda s, tid, now: s.synthesis_failed(tid, 0, "engine_runaway", "too long", now),
     {"code": "engine_failed", "message": "engine_runaway: too long"}),
])
def test_a_backends_own_error_code_reaches_the_client_as_a_documented_one(clock, fail,
                                                                          expected):
    """protocol.md's table is all a client meets: a code of the LLM server's or an
    engine's own leads the message of ``llm_failed`` (``engine_failed``)."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Hello there. How", clock())
    (error,) = events(fail(s, tid, clock()), "error")
    assert error["error"] == expected


@pytest.mark.parametrize(("rule", "failing"), [
    ("the sentence failing went out already", 0),
    ("an earlier sentence is still being made", 1),
])
def test_an_engine_failure_that_cannot_leave_whole_sentences_ends_the_turn_at_once(
        clock, rule, failing):
    """``synthesis_failed``: only when every sentence before the failing one is made and
    the failing one was not announced are the complete ones still spoken; otherwise the
    turn ends ``failed`` there and then, its unsent audio dropped."""
    s = Session("s", settings=SessionSettings(max_lead_ms=40))
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence is complete. The second one too. More", clock())
    s.audio(tid, 0, pcm(400), "x", clock())  # announced; 40 ms sent, the rest held
    out = s.synthesis_failed(tid, failing, "engine_failed", "boom", clock())
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed", rule
    assert done["metrics"]["sentences"] == 1, rule  # the one announced: the client's count
    assert {type(e) for e in out} >= {CancelLlm, CancelSynthesis}, rule
    assert s.wake_at() is None and s.tick(clock.advance(1000)) == [], rule
    assert s.deadline(tid, clock()) is None, rule


def test_input_for_a_turn_that_ended_or_never_was_is_ignored(clock):
    """The shell's tasks may report after a barge-in ended their turn (a late chunk, a late
    error): every input names its turn, and one for another turn changes nothing."""
    s = Session("s")
    old = start(s, clock)
    s.llm_delta(old, "An old reply. Still", clock())
    tid = start(s, clock, "and now?")  # barge-in: the old turn ended
    s.llm_delta(tid, "A new reply here. And", clock())
    out = s.audio(tid, 0, pcm(100), "x", clock())
    assert events(out, "sentence")[0]["text"] == "A new reply here." and frames(out)
    history = [dict(m) for m in s.history]
    for turn_id in (old, tid + 1):
        assert s.llm_delta(turn_id, "late.", clock()) == []
        assert s.llm_done(turn_id, 10.0, clock()) == []
        assert s.llm_failed(turn_id, "llm_failed", "late", clock()) == []
        assert s.llm_context_full(turn_id, "late", clock()) == []
        assert s.audio(turn_id, 0, pcm(100), "x", clock()) == []
        assert s.synthesis_done(turn_id, 0, clock()) == []
        assert s.synthesis_failed(turn_id, 0, "engine_failed", "late", clock()) == []
        assert s.receive(ClientPlayback(turn_id, 100), clock()) == []  # no Received
    # a segment index the turn does not have (yet)
    assert s.audio(tid, 5, pcm(100), "x", clock()) == []
    assert s.synthesis_done(tid, 5, clock()) == []
    assert s.synthesis_failed(tid, 5, "engine_failed", "late", clock()) == []
    assert s.history == history and not s.turn.ended and s.turn.id == tid
    # a stream that already finished says nothing more
    s.llm_done(tid, 10.0, clock())
    assert s.llm_done(tid, 10.0, clock()) == []
    assert s.llm_failed(tid, "llm_failed", "late", clock()) == []
    assert s.llm_context_full(tid, "late", clock()) == []
    # a segment already made takes no more audio (the turn goes on with the next one)
    assert frames(s.synthesis_done(tid, 0, clock()))[-1].sentence_end
    assert not s.turn.ended
    due = s.deadline(tid, clock())
    assert s.audio(tid, 0, pcm(100), "x", clock()) == []
    assert s.deadline(tid, clock()) == due  # not held for the listener either
    (last,) = frames(s.audio(tid, 1, pcm(40), "x", clock()) + s.synthesis_done(tid, 1, clock()))
    assert last.turn_end and len(last.pcm) == 40 * BYTES_PER_MS


def test_turn_ids_start_at_1_and_go_up_by_one_and_an_empty_delta_says_nothing(clock):
    """protocol.md: ``turn_id`` starts at 1, +1 per turn (a transcript's or a ``say``'s)."""
    s = Session("s")
    assert start(s, clock) == 1
    # a stream's empty chunk: no text.delta, and it is not the first token either
    assert s.llm_delta(1, "", clock.advance(50)) == []
    s.llm_delta(1, "Hello", clock.advance(100))
    (done,) = events(s.receive(ClientSay("Hi."), clock()), "turn.done")
    assert done["turn_id"] == 1 and done["metrics"]["ttft_ms"] == 150.0
    assert s.turn is not None and s.turn.id == 2
    assert start(s, clock) == 3


def test_a_later_sentence_is_asked_for_by_when_the_listener_runs_dry_with_the_sessions_lead(
        clock):
    """``StartSynthesis`` for the lane: the first sentence is due at once (a new stream);
    a later one when the audio sent so far has played (the stream's start kept for rule
    2b), and each carries the session's ``max_lead_ms`` in seconds (rule 3)."""
    s = Session("s", settings=SessionSettings(max_lead_ms=600))
    tid = start(s, clock)
    ready = clock.advance(100)
    (first,) = [e for e in s.llm_delta(tid, "First sentence here. Second", ready)
                if isinstance(e, StartSynthesis)]
    assert (first.index, first.deadline, first.since, first.max_lead) == (0, ready, None, 0.6)
    sent_at = clock.advance(100)
    s.audio(tid, 0, pcm(200), "x", sent_at)  # four whole frames go out: 160 ms
    (later,) = [e for e in s.llm_delta(tid, " one here. Third", clock.advance(50))
                if isinstance(e, StartSynthesis)]
    assert (later.index, later.since, later.max_lead) == (1, ready, 0.6)
    assert later.deadline == pytest.approx(sent_at + 0.160)


def test_only_a_sentences_last_frame_is_flagged_and_a_turn_names_its_first_engine(clock):
    """Frames sent one at a time or in a run, before a sentence's end, carry no flag (a
    client takes ``sentence_end`` as the sentence's last sample). A turn whose sentences
    two engines spoke (a fallback) reports both, the first as ``engine``."""
    s = Session("s", settings=SessionSettings(max_lead_ms=1000, frame_ms=40))
    s.receive(ClientSay("First one here. Second one here."), clock())
    tid = s.turn.id
    single = frames(s.audio(tid, 0, pcm(60), "kokoro", clock()))  # one frame, 20 ms held
    run = frames(s.audio(tid, 0, pcm(200), "kokoro", clock()))  # a run of whole frames
    assert len(single) == 1 and len(run) > 1
    assert all(not f.sentence_end and not f.turn_end for f in single + run)
    (last,) = frames(s.synthesis_done(tid, 0, clock()))
    assert last.sentence_end and not last.turn_end
    out = s.audio(tid, 1, pcm(40), "espeak", clock()) + s.synthesis_done(tid, 1, clock())
    assert frames(out)[-1].turn_end
    (done,) = events(out, "turn.done")
    assert done["metrics"]["engine"] == "kokoro"
    assert done["metrics"]["engines"] == ["kokoro", "espeak"]


def test_there_is_nothing_to_wake_for_before_a_turn_or_its_first_sentence(clock):
    """``wake_at`` and ``tick`` with nothing to send: the shell asks after every input."""
    s = Session("s")
    assert s.wake_at() is None and s.tick(clock()) == []  # no turn yet
    tid = start(s, clock)
    assert s.wake_at() is None and s.tick(clock()) == []  # no text yet
    s.llm_delta(tid, "Hello there, how", clock())
    assert s.wake_at() is None  # no sentence yet
    s.llm_delta(tid, " are you doing today? Fine", clock())
    assert frames(s.audio(tid, 0, pcm(60), "x", clock()))  # one frame; 20 ms wait for more
    assert s.wake_at() is None  # only more audio (or its end) can release them


def test_a_silent_sentence_that_is_next_to_play_is_done_at_once(clock):
    """A sentence with nothing to say (an emoji line) has no audio to wait for: it is
    announced and done with the text that made it, not at the next input."""
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_delta(tid, "🙂\n", clock())
    assert [(e["type"], e["index"]) for e in events(out)[1:]] == [("sentence", 0),
                                                                  ("sentence.done", 0)]
    assert events(out, "sentence.done")[0]["audio_ms"] == 0


def test_a_turn_ended_by_adding_its_last_silent_sentence_ends_once(clock):
    """The LLM's end brings a last sentence with nothing to say after all the audio went
    out: adding it ends the turn, and the end's own pump must not end it again."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "Hello there, this is the answer.\n\n🙂", clock())
    s.audio(tid, 0, pcm(200), "x", clock())
    s.synthesis_done(tid, 0, clock())
    out = s.llm_done(tid, None, clock())
    assert [e["type"] for e in events(out)] == ["sentence", "sentence.done", "turn.done"]
    assert [f.turn_end for f in frames(out)] == [True]
    assert [m["role"] for m in s.history] == ["user", "assistant"]


def test_an_empty_reply_without_a_thought_count_is_called_empty(clock):
    s = Session("s")
    tid = start(s, clock)
    out = s.llm_done(tid, None, clock.advance(12.34))
    assert events(out, "error")[0]["error"]["message"] == (
        "the LLM's reply was empty: nothing to say")
    assert events(out, "turn.done")[0]["metrics"]["duration_ms"] == 12.3  # to 0.1 ms


def test_frames_paced_one_at_a_time_after_a_sentences_end_carry_no_flag_until_its_last(clock):
    """A sentence made whole while pacing holds its audio goes out a frame per refill:
    only the very last frame says ``sentence_end`` (and ``turn_end``)."""
    s = Session("s", settings=SessionSettings(max_lead_ms=200, frame_ms=40))
    s.receive(ClientSay("First one here."), clock())
    tid = s.turn.id
    out = s.audio(tid, 0, pcm(600), "x", clock()) + s.synthesis_done(tid, 0, clock())
    out += run_until(s, clock, clock() + 2)
    sent = frames(out)
    assert sum(len(f.pcm) for f in sent) == 600 * BYTES_PER_MS
    assert [(f.sentence_end, f.turn_end) for f in sent] == [(False, False)] * (
        len(sent) - 1) + [(True, True)]


def test_input_for_the_segment_after_the_turns_last_is_ignored(clock):
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "A first reply here. And", clock())
    beyond = len(s.turn.segments)
    assert s.audio(tid, beyond, pcm(100), "x", clock()) == []
    assert s.synthesis_done(tid, beyond, clock()) == []
    assert s.synthesis_failed(tid, beyond, "engine_failed", "late", clock()) == []
    assert not s.turn.ended and s.turn.failed is None


@pytest.mark.parametrize("failing", [0, 1], ids=["announced", "made-not-sent"])
def test_a_failure_after_the_segments_success_still_ends_the_turn(clock, failing):
    """The lane reports a job done and then failed only when handling the success raised
    (a shell bug, ``internal_error``), and its other jobs are gone by then: the turn must
    not wait for them (``synthesis_failed`` does not look at ``synthesized``)."""
    s = Session("s", settings=SessionSettings(max_lead_ms=40))
    tid = start(s, clock)
    s.llm_delta(tid, "The first sentence is complete. The second one too. More", clock())
    s.audio(tid, 0, pcm(400), "x", clock())  # announced; the rest held by pacing
    s.synthesis_done(tid, 0, clock())
    s.audio(tid, 1, pcm(400), "x", clock())  # made, not yet announced
    s.synthesis_done(tid, 1, clock())
    out = s.synthesis_failed(tid, failing, "internal_error", "TypeError: a bug", clock())
    (error,) = events(out, "error")
    assert error["error"]["code"] == "internal_error"
    for _ in range(40):  # what is still spoken plays out (none of the failed sentence)
        if events(out, "turn.done"):
            break
        out = s.tick(clock.advance(40))
    (done,) = events(out, "turn.done")
    assert done["status"] == "failed" and done["metrics"]["sentences"] == 1
    assert s.turn.ended and s.wake_at() is None


def test_an_engine_failing_on_the_next_sentence_after_all_was_sent_closes_the_turn(clock):
    """Every sentence before it has gone out whole: the turn ends with the empty frame
    that says ``turn_end`` (the last frame sent said only ``sentence_end``)."""
    s = Session("s")
    tid = start(s, clock)
    s.llm_delta(tid, "A first reply here. A second one. And", clock())
    s.audio(tid, 0, pcm(80), "x", clock())
    assert frames(s.synthesis_done(tid, 0, clock()))[-1].sentence_end
    out = s.synthesis_failed(tid, 1, "engine_failed", "boom", clock())
    (closing,) = frames(out)
    assert closing.turn_end and closing.pcm == b"" and closing.sentence == 0
    assert events(out, "turn.done")[0]["status"] == "failed"


def test_a_detached_session_sends_no_frames_until_it_resumes(clock):
    s = Session("s", settings=SessionSettings(max_lead_ms=200))
    s.receive(ClientSay("Something long to say here."), clock())
    tid = s.turn.id
    s.held = True
    assert frames(s.audio(tid, 0, pcm(400), "x", clock())) == []
    assert frames(s.tick(clock.advance(1000))) == []
    assert frames(s.resume(0, clock()))


def test_turn_ids_wrap_inside_u32_and_never_to_0(clock):
    """protocol.md: ``turn_id`` is a u32 in every frame header, starting at 1."""
    s = Session("s")
    s._next_turn_id = 0xFFFFFFFF  # four billion turns later
    out = s.receive(ClientSay("Last one."), clock())
    assert events(out, "turn.started")[0]["turn_id"] == 0xFFFFFFFF
    out = s.audio(0xFFFFFFFF, 0, pcm(40), "x", clock()) + s.synthesis_done(
        0xFFFFFFFF, 0, clock())
    assert frames(out)[-1].turn_id == 0xFFFFFFFF
    assert events(s.receive(ClientSay("Next."), clock()), "turn.started")[0]["turn_id"] == 1
