"""The listener model (gateway.core.pacer): a run of frames decided at once lets exactly as
many go as one frame at a time would."""

from __future__ import annotations

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


@settings(max_examples=2000, deadline=None)
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


@settings(max_examples=500, deadline=None)
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


def test_a_playback_mark_before_any_audio_does_not_make_the_first_frame_an_underrun():
    pacer = Pacer(max_lead_ms=1000)
    pacer.mark(0, 0.0)
    pacer.sent(40, 0.5)
    assert pacer.underruns == 0


def test_the_deadline_is_when_the_listener_runs_out_of_audio():
    pacer = Pacer(max_lead_ms=1000)
    assert pacer.deadline(0.3) == 0.3  # nothing sent: due now
    pacer.sent(1000, 0.0)
    assert pacer.deadline(0.2) == pytest.approx(1.0)
    assert pacer.deadline(1.5) == 1.5  # already starved: due now


def test_a_playback_mark_below_an_earlier_one_changes_nothing():
    pacer = Pacer(max_lead_ms=2000)
    pacer.sent(2000, 0.0)
    pacer.mark(500, 0.5)
    pacer.mark(300, 0.6)  # older (resent after a resume, by a relay): what was played stays
    assert pacer.played_ms == 500
    # as without it: the client went on playing after its 500 ms mark, it did not stop
    assert pacer.lead_ms(0.6) == pytest.approx(1400)
