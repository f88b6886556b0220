"""The listener model (gateway.core.pacer): a run of frames decided at once lets exactly as
many go as one frame at a time would."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.pacer import Pacer


def one_at_a_time(pacer: Pacer, now: float, frame_ms: float, limit: int = 10_000) -> int:
    n = 0
    while n < limit and pacer.may_send(now, frame_ms):
        pacer.sent(frame_ms, now)
        n += 1
    return n


@settings(max_examples=2000)
@given(max_lead=st.integers(100, 30_000), frame_ms=st.sampled_from([10, 20, 40, 60, 100]),
       sent=st.lists(st.tuples(st.floats(0, 5), st.integers(0, 200)), max_size=8),
       now=st.floats(0, 20))
def test_frames_allowed_matches_may_send_frame_by_frame(max_lead, frame_ms, sent, now):
    a, b = Pacer(max_lead_ms=max_lead, frame_ms=frame_ms), Pacer(max_lead_ms=max_lead,
                                                                   frame_ms=frame_ms)
    t = 0.0
    for dt, frames in sent:  # the same history for both: frames sent at moments t
        t += dt
        for pacer in (a, b):
            for _ in range(frames):
                pacer.sent(frame_ms, t)
    now = t + now
    assert a.frames_allowed(now, frame_ms) == one_at_a_time(b, now, frame_ms)


def test_a_starved_listener_gets_the_first_frame_and_the_rest_up_to_the_lead():
    pacer = Pacer(max_lead_ms=1000)
    assert pacer.frames_allowed(0.0, 40) == 25
    pacer.sent(25 * 40, 0.0)  # one second ahead
    assert pacer.frames_allowed(0.0, 40) == 0
    assert pacer.frames_allowed(0.4, 40) == 10  # 400 ms played
    assert Pacer(max_lead_ms=100).frames_allowed(0.0, 250) == 1  # longer than the lead


@pytest.mark.parametrize(("now", "frame_ms", "goes"), [
    (0.02, 20, True),  # 980 ms ahead: the frame takes the lead to the limit exactly
    (0.0195, 20, False),  # 980.5 ms ahead: it would pass the limit by half a millisecond
    (2.0, 1500, True),  # starved: the next frame goes, even one longer than the limit
])
def test_a_frame_goes_only_if_the_lead_stays_within_the_limit(now, frame_ms, goes):
    """The limit is exact: ``_EPSILON_MS`` absorbs float rounding, not part of a
    millisecond; ``may_send`` (one frame) and ``frames_allowed`` (a run) agree."""
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)
    assert pacer.may_send(now, frame_ms) is goes
    assert pacer.frames_allowed(now, frame_ms) == int(goes)


@settings(max_examples=500)
@given(max_lead=st.integers(10, 30_000), frame_ms=st.sampled_from([10, 20, 40, 60, 100]),
       refill=st.integers(0, 2_000), sent=st.lists(st.tuples(st.floats(0, 5),
                                                                st.integers(1, 200)),
                                                      min_size=1, max_size=8))
def test_the_wake_up_always_lets_at_least_one_frame_go(max_lead, frame_ms, refill, sent):
    pacer = Pacer(max_lead_ms=max_lead, frame_ms=frame_ms, refill_ms=refill)
    t = 0.0
    for dt, frames in sent:
        t += dt
        pacer.sent(frames * frame_ms, t)
    wake = pacer.wake_at()
    assert wake is not None and wake <= pacer.play_end
    assert pacer.frames_allowed(wake, frame_ms) >= 1  # a timer that sends nothing spins


def test_the_wake_up_comes_once_the_lead_has_dropped_by_the_refill():
    assert Pacer(max_lead_ms=1000).wake_at() is None  # nothing sent: frames go as they come
    default = Pacer(max_lead_ms=2000)  # the session's: the refill is 400 ms (its docstring)
    default.sent(2000, 0.0)
    assert default.wake_at() == pytest.approx(0.4)
    pacer = Pacer(max_lead_ms=1000, frame_ms=40, refill_ms=400)
    pacer.sent(1000, 0.0)  # full: one second ahead
    assert pacer.wake_at() == pytest.approx(0.4)
    assert pacer.lead_ms(pacer.wake_at()) == pytest.approx(600)
    assert pacer.frames_allowed(pacer.wake_at(), 40) == 10  # one wake-up, 400 ms of frames
    capped = Pacer(max_lead_ms=500, frame_ms=40, refill_ms=400)  # refill: half the lead
    capped.sent(500, 0.0)
    assert capped.wake_at() == pytest.approx(0.25)
    short = Pacer(max_lead_ms=30, frame_ms=40)  # a lead shorter than a frame
    short.sent(40, 0.0)
    assert short.wake_at() == pytest.approx(0.04)  # when it has played it all


def test_frames_sent_back_to_back_are_no_underrun():
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(40, 0.0)
    pacer.sent(40, 0.0)  # ahead of playback
    pacer.sent(40, 0.08)  # still playing the second frame
    pacer.sent(40, 0.12)  # exactly as the third one ends
    assert pacer.underruns == 0
    assert pacer.lead_ms(0.12) == pytest.approx(40)
    assert len(pacer._runs) == 1  # a send as the audio ends continues the run
    assert pacer.clock_end == pytest.approx(pacer.play_end) == pytest.approx(0.16)


def test_each_frame_arriving_after_the_listener_ran_out_counts_one_underrun():
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(0.5, 0.0)  # however little audio it had
    pacer.sent(40, 1.0)
    assert pacer.underruns == 1
    assert pacer.lead_ms(1.0) == pytest.approx(40)  # playback restarts at arrival
    pacer.sent(40, 1.02)
    assert pacer.underruns == 1
    pacer.sent(40, 2.0)
    pacer.sent(40, 3.0)
    assert pacer.underruns == 3


@pytest.mark.parametrize(("max_lead", "frame_ms", "underruns"), [
    (100, 120, 49), (120, 120, 49), (100, 100, 49),  # refused: session.update, the config
    (140, 120, 0), (120, 100, 0), (100, 80, 0), (1000, 40, 0)])
def test_a_lead_of_one_frame_or_less_runs_dry_before_every_frame(max_lead, frame_ms,
                                                                 underruns):
    # Frames released at each wake-up, which a timer serves a millisecond late: with no
    # more than one frame of lead, the next frame may go only once the client has none.
    pacer, now = Pacer(max_lead_ms=max_lead, frame_ms=frame_ms), 0.0
    for _ in range(50):
        for _ in range(pacer.frames_allowed(now, frame_ms)):
            pacer.sent(frame_ms, now)
        wake = pacer.wake_at()
        assert wake is not None
        now = max(now, wake) + 0.001
    assert pacer.underruns == underruns


def test_a_playback_mark_before_any_audio_does_not_make_the_first_frame_an_underrun():
    pacer = Pacer(max_lead_ms=1000)
    pacer.mark(0, 0.0)
    pacer.sent(40, 0.5)
    assert pacer.underruns == 0


def test_the_deadline_is_when_the_listener_runs_out_of_audio():
    pacer = Pacer(max_lead_ms=1000)
    assert pacer.deadline(0.3) == 0.3  # nothing sent: due now
    assert pacer.lead_ms(0.3) == 0.0
    pacer.sent(1000, 0.0)
    assert pacer.deadline(0.2) == pytest.approx(1.0)
    assert pacer.deadline(1.5) == 1.5  # already starved: due now
    assert pacer.lead_ms(1.5) == 0.0  # and it holds nothing, not a negative lead


def test_a_playback_mark_below_an_earlier_one_changes_nothing():
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(2000, 0.0)
    pacer.mark(500, 0.5)
    pacer.mark(300, 0.6)  # older (resent after a resume, by a relay): what was played stays
    assert pacer.played_ms == 500
    # as without it: the client went on playing after its 500 ms mark, it did not stop
    assert pacer.lead_ms(0.6) == pytest.approx(1400)


def listen_over(pacer: Pacer, one_way_s: float, audio_ms: float = 10_000, *,
                stall: tuple[float, float] | None = None, mark_every_s: float = 0.25,
                jitter_s: float = 0.0, late: tuple[float, float] | None = None
                ) -> dict[str, float]:
    """A client ``one_way_s`` away (each way) that plays in real time, marks every
    ``mark_every_s`` while it plays (protocol.md), and (``stall``: from, seconds) stops
    playing for a while; every other mark takes ``jitter_s`` longer up. The server sends
    what the pacer allows, when it allows it; the audio is ready at 0 (``late``: the audio
    after ``late[0]`` ms only at ``late[1]`` s, a sentence its engine made late). Fake
    clock, events in time order. Returns the client's underruns and the most audio sent
    ahead of what it had played."""
    frame = 40.0
    events: list[tuple[float, int, str, float]] = [(0.0, 0, "pump", 0.0)]
    order = marks = 0
    end: float | None = None  # when the client has played all it received
    fed = left = 0.0
    left = audio_ms
    if late is not None:
        events.append((late[1], 0, "pump", 0.0))  # (a heap: it is the latest)
    underruns, ahead = 0, 0.0
    frozen: tuple[float, float, float] | None = None  # stall: from, until, what it had played

    def push(t: float, kind: str, value: float = 0.0) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, value))

    def played(t: float) -> float:
        if end is None:
            return 0.0
        at = fed - max(0.0, end - t) * 1000.0
        if frozen is not None and frozen[0] <= t < frozen[1]:
            return max(at, frozen[2])  # (the end moved by the whole stall at its start)
        return at

    while events:
        now, _, kind, value = heapq.heappop(events)
        if kind == "pump":
            ready = left if late is None or now >= late[1] else late[0] - pacer.sent_ms
            n = min(pacer.frames_allowed(now, frame), int(max(0.0, ready) // frame))
            if n:
                pacer.sent(n * frame, now)
                left -= n * frame
                for _ in range(n):
                    push(now + one_way_s, "frame")
                ahead = max(ahead, pacer.sent_ms - played(now))
            if left and (wake := pacer.wake_at()) is not None:
                push(max(wake, now + 1e-3), "pump")
        elif kind == "frame":
            if end is not None and end < now:
                underruns += 1
            if end is None:
                push(now + mark_every_s, "mark")
            end = (now if end is None else max(end, now)) + frame / 1000.0
            fed += frame
        elif kind == "stall":
            frozen = (now, now + value, played(now))
            end = max(end, now) + value  # nothing plays for a while
        elif kind == "mark":
            marks += 1
            push(now + one_way_s + jitter_s * (marks % 2), "arrive", played(now))
            if left or now < end:
                push(now + mark_every_s, "mark")
        elif kind == "arrive":
            pacer.mark(value, now)
            push(now, "pump")
        if stall is not None and kind == "frame" and fed == frame:
            push(stall[0], "stall", stall[1])
    return {"underruns": underruns, "ahead_ms": ahead}


@pytest.mark.parametrize(("one_way_s", "jitter_s"), [
    (0.0, 0.0), (0.1, 0.0), (0.3, 0.0), (0.5, 0.0), (0.8, 0.0), (1.5, 0.0), (0.5, 0.2)])
def test_a_client_on_a_long_link_never_runs_dry(one_way_s, jitter_s):
    """Each mark is one uplink delay old when it arrives, and the frames sent since it are
    still on their way down: taken as fresh, a mark put the estimate one round trip later
    than the client, and with 500 ms each way the client ran dry on every refill (marks
    fresh: 17-23 underruns here in 10 s, bench/slow_link.py: 60-100 in a 22 s turn). A gap
    measured against an estimate earlier marks moved took each mark's jitter as the link
    getting faster, until the round trip it kept was gone (with ``jitter_s``)."""
    pacer = Pacer(max_lead_ms=1000)
    seen = listen_over(pacer, one_way_s, jitter_s=jitter_s)
    assert seen["underruns"] == 0
    assert pacer.underruns == 0


def test_a_sentence_made_late_is_no_faster_link():
    """The audio stops for 1 s (the next sentence is late), so the timeline without marks
    starts again at its send: a mark of the first sentence arriving after that is a round
    trip behind where that sentence was played, not behind the restart (measured against
    the restart, its gap was the link's round trip less the pause, and every later refill
    came that much too late)."""
    pacer = Pacer(max_lead_ms=1000)
    seen = listen_over(pacer, 0.5, audio_ms=12_000, late=(2_000, 3.0))
    assert seen["underruns"] == 1  # the late sentence's own, and the server counts it too
    assert pacer.underruns == 1
    assert pacer.link_lag == pytest.approx(1.0)


def test_marks_still_hold_the_audio_back_while_the_client_stalls():
    """What a mark says beyond the link's round trip is the client falling behind: a client
    that stops playing for 3 s is not sent 3 s more audio."""
    for one_way_s in (0.0, 0.5):
        pacer = Pacer(max_lead_ms=1000)
        seen = listen_over(pacer, one_way_s, stall=(2.0, 3.0))
        assert seen["underruns"] == 0
        # at most the lead, the round trip its marks take, a mark interval and a frame
        assert seen["ahead_ms"] <= 1000 + 2 * one_way_s * 1000 + 250 + 40 + 1e-6


def test_the_first_mark_on_audio_measures_the_round_trip_and_later_ones_the_stall():
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)  # the client gets it at 0.5 and plays from then
    pacer.mark(250, 1.25)  # played at 0.75, arrives at 1.25: 1 s behind the estimate
    assert pacer.link_lag == pytest.approx(1.0)
    assert pacer.play_end == pytest.approx(1.0)  # unchanged: that was the link
    pacer.mark(500, 1.5)  # the same link: still no change
    assert pacer.play_end == pytest.approx(1.0)
    pacer.mark(500, 1.75)  # it played nothing in 250 ms: it stalled
    assert pacer.play_end == pytest.approx(1.25)
    assert pacer.marks_end == pytest.approx(2.25)  # when its marks will say it is done
    pacer.resumed(0, 1.75)  # a new socket: its next mark measures its link again
    assert pacer.link_lag is None


def test_the_link_lag_is_the_smallest_gap_of_the_turn():
    """A mark held up on its way (uplink jitter) says the link is slower than it is: the
    next mark on time takes the lag back down, and the client is not taken for ahead."""
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)  # 250 ms each way: played 0.25 to 1.25
    pacer.mark(100, 0.75)  # said at 0.35, 150 ms late up: a gap of 0.65
    assert pacer.link_lag == pytest.approx(0.65)
    pacer.mark(300, 0.8)  # said at 0.55, on time: the round trip
    assert pacer.link_lag == pytest.approx(0.5)
    assert pacer.play_end == pytest.approx(1.0)


def test_a_client_ahead_of_the_estimate_is_believed():
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)
    pacer.mark(600, 0.5)  # played faster than the clock (or counted what it got)
    assert pacer.play_end == pytest.approx(0.9)


def test_a_resumed_socket_measures_its_own_link():
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)
    pacer.mark(100, 0.6)  # 250 ms each way
    assert pacer.link_lag == pytest.approx(0.5)
    pacer.resumed(300, 2.0)  # dropped; it had 700 ms, the other 300 come again now
    assert pacer.link_lag is None
    assert pacer.play_end == pytest.approx(2.3)
    pacer.mark(800, 2.3)  # 100 ms each way now: played 100 ms of the replay by 2.2
    assert pacer.link_lag == pytest.approx(0.2)
    assert pacer.play_end == pytest.approx(2.3)


def test_the_timeline_keeps_a_bounded_history():
    old, kept = Pacer(max_lead_ms=1000), Pacer(max_lead_ms=1000)
    for pacer in (old, kept):
        for i in range(1000):  # an engine slower than real time, and no marks: dry each frame
            pacer.sent(40, i * 0.1)
        assert len(pacer._runs) == 64  # the last 64 restarts: frames 936 to 999
    old.mark(400, 100.0)  # from before the runs kept: taken as it says
    assert old.link_lag is None
    assert old.play_end == pytest.approx(100.0 + (40_000 - 400) / 1000)
    kept.mark(936 * 40 + 20, 100.0)  # within the oldest run kept: played by 93.62 at best
    assert kept.link_lag == pytest.approx(100.0 - 93.62)


def test_audio_sent_while_the_client_still_plays_continues_its_timeline():
    """The timeline without marks restarts only at a send after it ran dry: a second
    sentence sent while the first still plays is played after it, not from its send. A
    mark on a link with no delay then measures no round trip (measured from the second
    send, it took 400 ms of that sentence for link, and the client's buffer for as much)."""
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(500, 0.0)
    pacer.sent(500, 0.1)  # queued behind the first: played from 0.5 on
    pacer.mark(700, 0.7)  # fresh: the link takes no time
    assert pacer.link_lag == pytest.approx(0.0)
    assert pacer.play_end == pytest.approx(1.0)
    assert pacer.marks_end == pytest.approx(1.0)


def test_a_client_fed_ahead_for_a_long_turn_plays_one_run():
    """40 s of 40 ms frames, each sent 20 ms before the audio before it runs out: one
    continuous run, however long. A mark on time at its end then measures just the round
    trip, and moves nothing (a timeline that lost time per frame took the late sends for
    restarts, and the round trip for 20 ms longer)."""
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(40, 0.0)
    for k in range(1, 1000):
        pacer.sent(40, k * 0.040 - 0.020)
    pacer.mark(40_000, 40.0 + 0.1)  # all played by 40 s, said 100 ms later
    assert pacer.link_lag == pytest.approx(0.1, abs=1e-6)
    assert pacer.play_end == pytest.approx(40.0, abs=1e-6)


def test_a_mark_of_nothing_played_yet_is_on_the_timeline():
    """A player whose first audio is still on its way to the speaker says 0 ms (the
    console's count, less the output latency, is clamped there): that measures the round
    trip like any mark, and holds nothing back (taken as fresh, it pushed the estimate a
    round trip late: 300 ms less lead)."""
    pacer = Pacer(max_lead_ms=1000)
    pacer.sent(1000, 0.0)
    pacer.mark(0, 0.3)
    assert pacer.link_lag == pytest.approx(0.3)
    assert pacer.play_end == pytest.approx(1.0)
    assert pacer.lead_ms(0.3) == pytest.approx(700)


def test_a_mark_beyond_the_audio_sent_counts_as_all_of_it():
    """protocol.md (playback): a ``played_ms`` beyond the audio sent counts as all of it;
    it must not hold back the marks that follow, as a mark above them would."""
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(1000, 0.0)
    pacer.mark(5000, 1.0)  # all of it, on a link with no delay
    assert pacer.played_ms == 1000 and pacer.play_end == pytest.approx(1.0)
    pacer.sent(1000, 1.0)
    pacer.mark(1200, 1.5)  # 200 ms of the next second played in 500: it stalled 300
    assert pacer.play_end == pytest.approx(2.3)
    assert pacer.lead_ms(1.5) == pytest.approx(800)


def test_the_marks_end_is_the_play_end_one_link_lag_later():
    """``marks_end``: when the client's marks will say it played everything sent."""
    pacer = Pacer(max_lead_ms=1000)
    assert pacer.marks_end is None  # nothing sent
    pacer.sent(1000, 0.0)
    assert pacer.marks_end == pytest.approx(1.0)  # no mark yet: no lag known
    pacer.mark(100, 0.6)  # 250 ms each way
    assert pacer.marks_end == pytest.approx(pacer.play_end + 0.5) == pytest.approx(1.5)
    ahead = Pacer(max_lead_ms=1000)
    ahead.sent(1000, 0.0)
    ahead.mark(600, 0.5)  # ahead of the timeline: no lag to add, and none taken off
    assert ahead.marks_end == pytest.approx(ahead.play_end) == pytest.approx(0.9)


def test_a_resume_continues_the_timeline_of_a_client_that_still_had_audio():
    """``resumed``: the listener plays what it had, then the replay. Still playing when
    the replay comes, it plays the replay right after, not from its send: a mark on a link
    with no delay then measures none. (Clock origin at 1,000 s: any monotonic origin.)"""
    t = 1000.0
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(1000, t)
    pacer.resumed(300, t + 0.5)  # it got 700, played 500: 200 left, then the replay
    assert pacer.play_end == pytest.approx(t + 1.0)
    pacer.mark(800, t + 0.8)
    assert pacer.link_lag == pytest.approx(0.0)
    assert pacer.play_end == pytest.approx(t + 1.0)
    before = Pacer(max_lead_ms=2000)  # a first mark on audio from before the replay
    before.sent(1000, t)
    before.resumed(300, t + 0.5)
    before.mark(600, t + 0.6)
    assert before.link_lag == pytest.approx(0.0)


def test_a_replay_after_the_client_ran_dry_plays_from_its_send():
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(1000, 0.0)
    pacer.resumed(300, 0.8)  # it got 700 and played them all by 0.7: the replay from 0.8
    assert pacer.play_end == pytest.approx(1.1)
    pacer.mark(800, 0.9)  # no delay on the new link
    assert pacer.link_lag == pytest.approx(0.0)
    assert pacer.play_end == pytest.approx(1.1)
    # a sentence that started after a dry spell, replayed whole: it plays from the replay
    again = Pacer(max_lead_ms=2000)
    again.sent(500, 0.0)
    again.sent(500, 1.0)  # played from 1.0: the client ran dry at 0.5
    again.resumed(700, 1.2)  # it got only the first 300 ms
    again.mark(400, 1.3)
    assert again.link_lag == pytest.approx(0.0)
    assert again.play_end == pytest.approx(1.9)


@pytest.mark.parametrize("resume_at", [0.5, 0.0])  # 0.0: at the very moment of the send
def test_a_replay_of_all_the_audio_plays_from_the_resume(resume_at):
    """A socket dropped before any frame of the turn arrived: all of it comes again, and
    the timeline starts over at the resume (a mark on a link with no delay measures none)."""
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(1000, 0.0)
    pacer.resumed(1000, resume_at)
    assert pacer.play_end == pytest.approx(resume_at + 1.0)
    pacer.mark(200, resume_at + 0.2)
    assert pacer.link_lag == pytest.approx(0.0, abs=1e-9)
    assert pacer.play_end == pytest.approx(resume_at + 1.0)


def test_a_resume_before_any_audio_has_no_timeline():
    pacer = Pacer(max_lead_ms=1000)
    pacer.resumed(0, 1.0)
    assert pacer.play_end is None and pacer.clock_end is None and pacer.wake_at() is None


def test_a_run_after_a_dry_spell_plays_from_its_send_whatever_the_mark_says():
    """A mark in the first run, arriving after audio sent once the client ran dry: that
    audio plays from its send, not right after the first run."""
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(500, 0.0)  # 250 ms each way: played 0.25 to 0.75
    pacer.sent(500, 0.6)  # the timeline ran dry at 0.5: this plays from 0.6 on
    pacer.mark(250, 0.75)  # played at 0.5, arrives at 0.75
    assert pacer.link_lag == pytest.approx(0.5)
    assert pacer.play_end == pytest.approx(1.1)


@pytest.mark.parametrize(("resume_at", "send_at", "plays_at"), [
    (0.5, 0.9, 1.1),  # it still had audio: the replay ends at 1.0, the next sentence after
    (0.5, 1.05, 1.15),  # the next sentence comes after the replay ran out: from its send
    (0.8, 1.05, 1.2),  # it ran dry before the replay (0.8 to 1.1): the next one after it
])
def test_audio_after_a_replay_plays_on_the_replays_timeline(resume_at, send_at, plays_at):
    """A link with no delay: the first mark after the resume, taken as the timeline plays
    it, measures no round trip (clock origin at 1,000 s)."""
    t = 1000.0
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(1000, t)
    pacer.resumed(300, t + resume_at)  # it got 700 of the 1000
    pacer.sent(200, t + send_at)
    pacer.mark(1100, t + plays_at)
    assert pacer.link_lag == pytest.approx(0.0, abs=1e-9)
