"""Stateful property test of the session core: random interleavings of client messages,
LLM stream events, synthesis events (for the current turn and stale ones) and timer ticks on
a monotonic fake clock. Every effect is checked against the protocol's order guarantees."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gateway.core.codec import (
    BYTES_PER_MS,
    FRAME_MS_CHOICES,
    ClientCancel,
    ClientPing,
    ClientPlayback,
    ClientSay,
    ClientSessionUpdate,
    ClientTranscript,
    decode_frame,
)
from gateway.core.session import (
    LISTENER_SILENT_S,
    CancelLlm,
    CancelSynthesis,
    ProbeListener,
    Received,
    SendAudio,
    SendEvent,
    SendFrames,
    Session,
    SessionSettings,
    StartLlm,
    StartSynthesis,
)

SAY = ["Hello there.", "One. Two three. Four five six!", "Dr. Patel calls at 3 p.m. today.",
       "🙂", "- a list\n- of items", "Short, then a longer clause follows here; and more.",
       "Hmm"]
DELTAS = ["Hello", " there.", " How are", " you?", "", "\n", " It costs $12.50", ",", " 🙂",
          " Dr. Smith said so.", " and then", " — ", "!", " ok"]


@dataclass
class TurnLog:
    source: str
    frame_ms: int
    done: int = 0
    turn_end_frames: int = 0
    sentences: list[int] = field(default_factory=list)
    sentence_done: list[int] = field(default_factory=list)
    current_sentence: int | None = None
    synth: set[int] = field(default_factory=set)
    made: set[int] = field(default_factory=set)
    """segments whose synthesis this machine said done"""
    sent_ms: float = 0.0


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.session = Session("prop", voices=["a", "b"], settings=SessionSettings(
            max_lead_ms=300))
        self.t = 100.0
        self.next_seq = 0
        self.turns: dict[int, TurnLog] = {}
        self.frame_end: dict[int, tuple[int, float]] = {}
        """seq -> (turn_id, the turn's audio in ms up to the end of that frame)"""
        self.mark: tuple[int, float] | None = None
        """(turn_id, played_ms) of the playback mark whose effects are being checked"""
        self.received = -1
        (created,) = self.session.open()
        assert created.event["type"] == "session.created"

    # ---- the checker: every effect of every input goes through here ------------------

    def check(self, effects) -> None:
        for effect in effects:
            match effect:
                case SendAudio(data=data, duration_ms=duration):
                    self.check_frame(data, duration)
                case SendFrames(frames=frames, frame_ms=duration):
                    assert len(frames) > 1
                    for data in frames:  # whole frames, none a segment's last
                        assert not decode_frame(data).sentence_end
                        self.check_frame(data, duration)
                case SendEvent(event=event):
                    self.check_event(event)
                case StartLlm(turn_id=tid):
                    log = self.turns[tid]
                    assert log.source == "transcript" and not log.done
                case StartSynthesis(turn_id=tid, index=index, text=text):
                    log = self.turns[tid]
                    assert not log.done and text.strip() and index not in log.synth
                    log.synth.add(index)
                case CancelLlm(turn_id=tid) | CancelSynthesis(turn_id=tid):
                    assert tid in self.turns
                case Received(seq=seq):
                    # only a mark proves receipt, and only of frames of its turn that it
                    # covers; said once, in order
                    assert self.mark is not None and seq in self.frame_end, (seq, self.mark)
                    turn_id, end_ms = self.frame_end[seq]
                    assert turn_id == self.mark[0] and end_ms <= self.mark[1] + 1e-6
                    assert seq > self.received
                    self.received = seq
                case ProbeListener(silent_s=silent):
                    # a listener quiet while its audio should play is asked if it is there
                    # (protocol.md, playback), never sooner than after LISTENER_SILENT_S
                    assert silent >= LISTENER_SILENT_S, silent
                case _:
                    raise AssertionError(effect)

    def check_frame(self, data: bytes, duration: float) -> None:
        frame = decode_frame(data)
        assert frame.seq == self.next_seq, (frame.seq, self.next_seq)  # gapless from 0
        self.next_seq += 1
        log = self.turns.get(frame.turn_id)
        assert log is not None, "frame before turn.started"
        assert not log.done, "frame after turn.done"
        assert self.session.turn is not None and frame.turn_id == self.session.turn.id
        assert len(frame.pcm) <= log.frame_ms * BYTES_PER_MS and len(frame.pcm) % 2 == 0
        assert duration == len(frame.pcm) / BYTES_PER_MS
        log.sent_ms += duration
        self.frame_end[frame.seq] = (frame.turn_id, log.sent_ms)
        if not frame.pcm:
            assert frame.turn_end and frame.sentence_end, "empty frame only to end a turn"
        else:
            # `sentence` i comes right before the first frame of sentence i
            assert frame.sentence == log.current_sentence, (frame.sentence, log.sentences)
        if frame.turn_end:
            log.turn_end_frames += 1
            assert log.turn_end_frames == 1, "two turn-end frames"
            assert frame.sentence_end

    def check_event(self, event: dict) -> None:
        kind = event["type"]
        if kind == "turn.started":
            tid = event["turn_id"]
            assert tid not in self.turns and tid == len(self.turns) + 1
            assert self.session.turn is not None
            self.turns[tid] = TurnLog(event["source"], self.session.turn.settings.frame_ms)
            return
        if "turn_id" not in event:
            assert kind in {"session.updated", "pong", "error"}, event
            return
        log = self.turns.get(event["turn_id"])
        assert log is not None, f"{kind} before turn.started"
        assert not log.done, f"{kind} after turn.done"
        match kind:
            case "turn.done":
                log.done += 1
                assert event["status"] in {"completed", "cancelled", "failed"}
                if event["status"] == "completed":
                    assert log.sentence_done == log.sentences
            case "sentence":
                assert event["index"] == len(log.sentences), "sentences out of order"
                log.sentences.append(event["index"])
                log.current_sentence = event["index"]
            case "sentence.done":
                assert event["index"] == len(log.sentence_done) == log.sentences[-1]
                log.sentence_done.append(event["index"])
            case "text.delta":
                assert log.source == "transcript" and event["delta"]
            case "error":
                assert event["error"]["code"] in {"llm_failed", "llm_unavailable",
                                                  "llm_empty_reply", "engine_failed"}
            case _:
                raise AssertionError(event)

    # ---- helpers ---------------------------------------------------------------------

    def now(self, advance_ms: float = 0.0) -> float:
        self.t += advance_ms / 1000.0
        return self.t

    def pick_turn(self, data, current_bias: bool = True) -> int:
        """The current turn most of the time; else a stale or never-started id."""
        cur = self.session.turn.id if self.session.turn else 1
        choices = [cur] * 4 if current_bias else []
        choices += list(self.turns) + [cur + 1, 0]
        return data.draw(st.sampled_from(choices))

    def pick_index(self, data, tid: int) -> int:
        log = self.turns.get(tid)
        known = sorted(log.synth) if log else []
        return data.draw(st.sampled_from(known + [len(known), 0, 99]) if known else
                         st.sampled_from([0, 1, 99]))

    # ---- client messages ----------------------------------------------------------------

    @rule(text=st.sampled_from(["what now", "tell me more", "stop"]),
          advance=st.floats(0, 200))
    def transcript(self, text, advance):
        self.check(self.session.receive(ClientTranscript(text), self.now(advance)))

    @rule(text=st.sampled_from(SAY), advance=st.floats(0, 200))
    def say(self, text, advance):
        self.check(self.session.receive(ClientSay(text), self.now(advance)))

    @rule(data=st.data(), explicit=st.booleans())
    def cancel(self, data, explicit):
        tid = self.pick_turn(data) if explicit else None
        self.check(self.session.receive(ClientCancel(tid), self.now()))

    @rule(data=st.data(), played=st.floats(0, 20_000), within=st.booleans())
    def playback(self, data, played, within):
        tid = self.pick_turn(data)
        log = self.turns.get(tid)
        if within and log is not None:  # somewhere inside what the turn has sent so far
            played = data.draw(st.floats(0, 1.1)) * log.sent_ms
        self.mark = (tid, played)
        try:
            self.check(self.session.receive(ClientPlayback(tid, played), self.now()))
        finally:
            self.mark = None

    @precondition(lambda self: self.session.turn is not None)
    @rule(share=st.floats(0, 1), advance=st.floats(0, 500))
    def playback_of_the_latest_turn(self, share, advance):
        """A client playing the latest turn, marking a share of what it was sent."""
        tid = self.session.turn.id
        played = share * self.turns[tid].sent_ms
        self.mark = (tid, played)
        try:
            self.check(self.session.receive(ClientPlayback(tid, played), self.now(advance)))
        finally:
            self.mark = None

    @rule(frame_ms=st.sampled_from(FRAME_MS_CHOICES), lead=st.integers(100, 2000),
          voice=st.sampled_from(["a", "b", "nope"]))
    def session_update(self, frame_ms, lead, voice):
        effects = self.session.receive(ClientSessionUpdate(
            {"frame_ms": frame_ms, "max_lead_ms": lead, "voice": voice}), self.now())
        (event,) = [e.event for e in effects]
        refused = voice == "nope" or lead <= frame_ms  # (a lead of one frame or less)
        assert event["type"] == ("error" if refused else "session.updated")
        self.check([e for e in effects if e.event["type"] != "error"])

    @rule(ping_id=st.one_of(st.none(), st.integers(), st.text(max_size=5)))
    def ping(self, ping_id):
        effects = self.session.receive(ClientPing(ping_id), self.now())
        assert [e.event for e in effects] == [
            {"type": "pong"} if ping_id is None else {"type": "pong", "id": ping_id}]

    # ---- LLM ---------------------------------------------------------------------------

    @rule(data=st.data(), text=st.sampled_from(DELTAS), advance=st.floats(0, 100))
    def llm_delta(self, data, text, advance):
        self.check(self.session.llm_delta(self.pick_turn(data), text, self.now(advance)))

    @rule(data=st.data(), rate=st.one_of(st.none(), st.floats(0, 500)))
    def llm_done(self, data, rate):
        self.check(self.session.llm_done(self.pick_turn(data), rate, self.now()))

    @rule(data=st.data(), code=st.sampled_from(["llm_failed", "llm_unavailable"]))
    def llm_failed(self, data, code):
        self.check(self.session.llm_failed(self.pick_turn(data, current_bias=False), code,
                                           "boom", self.now()))

    # ---- synthesis -------------------------------------------------------------------------

    @rule(data=st.data(), samples=st.integers(0, 6000), advance=st.floats(0, 100))
    def audio(self, data, samples, advance):
        tid = self.pick_turn(data)
        index = self.pick_index(data, tid)
        self.check(self.session.audio(tid, index, b"\x01\x00" * samples, "x",
                                      self.now(advance)))

    @rule(data=st.data())
    def synthesis_done(self, data):
        tid = self.pick_turn(data)
        index = self.pick_index(data, tid)
        self.check(self.session.synthesis_done(tid, index, self.now()))
        if tid in self.turns:
            self.turns[tid].made.add(index)

    def synthesizing(self) -> tuple[int, int] | None:
        """(turn, segment) the lane works on: the current turn's first one asked and not
        done yet."""
        turn = self.session.turn
        log = self.turns.get(turn.id) if turn is not None and not turn.ended else None
        left = sorted(log.synth - log.made) if log is not None else []
        return (turn.id, left[0]) if left else None

    @precondition(lambda self: self.synthesizing() is not None)
    @rule(samples=st.integers(0, 6000), done=st.booleans(), advance=st.floats(0, 100))
    def audio_in_order(self, samples, done, advance):
        """The lane's audio for the segment it works on, in order: the rules above pick a
        turn and a segment at random, and without this one a turn seldom got far enough
        to send frames (36 frame effects in 150 runs, no ``Received``, no closing frame)."""
        tid, index = self.synthesizing()
        now = self.now(advance)
        self.check(self.session.audio(tid, index, b"\x01\x00" * samples, "x", now))
        if done:
            self.check(self.session.synthesis_done(tid, index, now))
            self.turns[tid].made.add(index)

    @rule(data=st.data())
    def synthesis_failed(self, data):
        tid = self.pick_turn(data, current_bias=False)
        self.check(self.session.synthesis_failed(tid, self.pick_index(data, tid),
                                                 "engine_failed", "boom", self.now()))

    # ---- time ----------------------------------------------------------------------------

    @rule(advance=st.floats(0, 1500))
    def tick(self, advance):
        self.check(self.session.tick(self.now(advance)))

    @precondition(lambda self: self.session.wake_at() is not None)
    @rule()
    def tick_when_asked(self):
        wake = self.session.wake_at()
        self.t = max(self.t, wake)
        effects = self.session.tick(self.t)
        self.check(effects)
        assert any(isinstance(e, SendAudio | SendFrames) for e in effects), "woken for nothing"

    # ---- invariants ------------------------------------------------------------------------

    @invariant()
    def one_turn_done_per_ended_turn(self):
        current = self.session.turn
        for tid, log in self.turns.items():
            active = current is not None and current.id == tid and not current.ended
            assert log.done == (0 if active else 1), (tid, log.done)

    @invariant()
    def the_core_reports_only_what_it_sent(self):
        if self.session.turn is not None and self.session.turn.ended:
            assert self.session.wake_at() is None

    def teardown(self):
        active = self.session.turn is not None and not self.session.turn.ended
        effects = self.session.close(self.now())
        assert not any(isinstance(e, SendAudio | SendFrames) for e in effects)
        # nothing to send: the turn.done of a turn cut short comes back for the record only
        assert [e.event["type"] for e in effects if isinstance(e, SendEvent)] == \
            (["turn.done"] if active else [])
        self.check([e for e in effects if not isinstance(e, SendEvent)])


SessionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60)
TestSessionProperties = SessionMachine.TestCase


# ---- regressions found by the machine above (turn.done was sent twice) --------------------


def turn_done_count(effects) -> int:
    return sum(1 for e in effects if isinstance(e, SendEvent) and e.event["type"] == "turn.done")


def test_say_with_nothing_to_speak_ends_its_turn_once():
    s = Session("r")
    effects = s.receive(ClientSay("🙂"), 0.0)
    assert turn_done_count(effects) == 1
    assert s.turn.ended


def test_reply_ending_in_silent_text_ends_its_turn_once():
    s = Session("r")
    effects = s.receive(ClientTranscript("hi"), 0.0)
    tid = s.turn.id
    effects += s.llm_delta(tid, "🙂", 0.0)
    effects += s.llm_done(tid, None, 0.0)
    assert turn_done_count(effects) == 1
    assert s.turn.ended and s.wake_at() is None


# ---- playback marks and what they prove received ------------------------------------------

@settings(max_examples=300)
@given(steps=st.lists(st.tuples(st.integers(1, 400), st.floats(0, 300), st.floats(0, 1.1)),
                      min_size=1, max_size=30),
       max_lead=st.integers(100, 2000), frame_ms=st.sampled_from(FRAME_MS_CHOICES))
def test_a_mark_proves_received_only_frames_it_covers_and_all_of_them(steps, max_lead,
                                                                      frame_ms):
    # Each step: the engine makes `ms` of audio, time advances, the client reports having
    # played a share of what was sent. Received(seq) must name a frame sent before the mark
    # that ends within what was played, never go back, and a mark covering everything sent
    # proves the last frame sent.
    s = Session("s", settings=SessionSettings(max_lead_ms=max_lead, frame_ms=frame_ms))
    s.receive(ClientSay("A long enough sentence to speak for a while."), 0.0)
    tid, t, sent_ms, last = s.turn.id, 0.0, 0.0, -1
    ends: dict[int, float] = {}  # seq -> turn audio up to the end of that frame

    def sent(effects) -> None:
        nonlocal sent_ms
        for e in effects:
            if isinstance(e, SendAudio):
                sent_ms += e.duration_ms
                ends[decode_frame(e.data).seq] = sent_ms
            elif isinstance(e, SendFrames):
                for data in e.frames:
                    sent_ms += e.frame_ms
                    ends[decode_frame(data).seq] = sent_ms

    for ms, advance, share in steps:
        t += advance / 1000
        sent(s.audio(tid, 0, b"\x01\x00" * (ms * BYTES_PER_MS // 2), "x", t))
        sent(s.tick(t))
        played = share * sent_ms
        known = dict(ends)  # the frames sent before this mark
        effects = s.receive(ClientPlayback(tid, played), t)
        received = [e.seq for e in effects if isinstance(e, Received)]
        sent(effects)
        assert len(received) <= 1
        for seq in received:
            assert seq in known and known[seq] <= played + 1e-6 and seq > last
            last = seq
        if known and share >= 1.0:  # everything sent was played: the last frame is proven
            assert last == max(known)


def test_a_marking_listener_gone_quiet_while_audio_plays_is_probed():
    """The machine's own steps, as Hypothesis found them: one mark, then 2 s of nothing
    while audio should play. The core probes the listener (``ProbeListener``), which
    the checker once took for an effect the core never makes."""
    state = SessionMachine()
    state.say(advance=0.0, text="Hello there.")
    state.playback_of_the_latest_turn(advance=0.0, share=0.0)
    state.tick(advance=401.0)
    state.tick(advance=1500.0)
    state.audio_in_order(advance=100.0, done=False, samples=961)
    state.teardown()
