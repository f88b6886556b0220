"""The listener model (gateway.core.pacer): a run of frames decided at once lets exactly as
many go as one frame at a time would."""

from __future__ import annotations

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
