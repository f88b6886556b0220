"""Playback model of one listener: how much audio it holds at time ``now``.

The client plays frames back to back. When a frame arrives after the client ran out of
audio, playback restarts at arrival (an underrun). So after sending a frame of ``d`` ms at
``now``: ``play_end = max(play_end, now) + d``; the client's buffered lead is
``play_end - now``.

A ``playback`` mark (``played_ms``) is old when it arrives: the client played it one
uplink delay ago, and it holds less than ``sent_ms - played_ms`` by the frames still on
their way down. Taken as fresh (``play_end = now + (sent_ms - played_ms)``), it put the
estimate one round trip (plus the downlink's queue) later than the client's playback, and
the buffer the client really held shrank by as much: with 500 ms each way, it ran dry at
every refill (bench/slow_link.py).

So the pacer also keeps the timeline without marks (``clock_end``, ``_runs``: playback from
each frame's send, the earliest a client can play it, restarting at a send after it ran
dry). A mark's gap is how long ago, when it arrives, that timeline played ``played_ms``: a
client that started on arrival and never stalled played it one downlink delay later, and
says so one uplink delay later still, so no gap is below the round trip, and any stall,
late start or dry spell of the client only adds to it. The turn's smallest gap
(``link_lag``) is the link's; only the rest moves ``play_end``: the client is taken to be
that much behind the timeline from ``played_ms`` on. Measured against the timeline, not
against an estimate earlier marks moved, the jitter of one mark does not carry into the
next, and a pause in the audio (a late sentence) is not taken for the link getting faster.
A mark below an earlier one of the turn (a resent one) changes nothing.

Pure: every method takes ``now`` in seconds from any monotonic origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_EPSILON_MS = 1e-6  # float time arithmetic must not let one extra frame through
_MAX_RUNS = 64  # the timeline's restarts kept past the highest mark


@dataclass(slots=True)
class Pacer:
    max_lead_ms: float
    frame_ms: float = 40.0
    refill_ms: float = 400.0
    """Hysteresis: the lead moves between ``max_lead_ms - refill_ms`` and ``max_lead_ms``
    (``refill_ms`` is capped at half the lead). Each refill is one socket write per
    session: 400 ms instead of 200 halves the writes and cut the gateway's CPU per frame
    by a fifth at 1,000 streaming sessions (bench/capacity.py: 0.024 → 0.019 ms)."""
    sent_ms: float = 0.0
    play_end: float | None = None
    """When the client will have played everything sent so far (seconds, clock of ``now``)."""
    underruns: int = 0
    played_ms: float | None = None
    """Highest ``played_ms`` reported by the client, if any."""
    clock_end: float | None = None
    """``play_end`` as the sends alone make it, marks left out (seconds)."""
    _runs: list[tuple[float, float]] = field(default_factory=list)
    """That timeline: (when, ``sent_ms`` then) at each start of continuous playback, from
    the one the highest mark is in (earlier ones are dropped), at most ``_MAX_RUNS``. (A
    list: an empty deque costs 10 times the bytes, at 10,000 sessions.)"""
    link_lag: float | None = None
    """Smallest gap (seconds) seen between a mark taken as fresh and ``clock_end``: the
    link's round trip, not the client falling behind (None: no mark on audio yet)."""

    def lead_ms(self, now: float) -> float:
        """Audio the client holds but has not played yet, in ms (0 when starved)."""
        if self.play_end is None:
            return 0.0
        return max(0.0, (self.play_end - now) * 1000.0)

    def may_send(self, now: float, duration_ms: float) -> bool:
        """May a frame of ``duration_ms`` go out now without the lead passing the limit?
        A listener with nothing left to play always gets the next frame, even one longer
        than the limit."""
        lead = self.lead_ms(now)
        return lead <= _EPSILON_MS or lead + duration_ms <= self.max_lead_ms + _EPSILON_MS

    def frames_allowed(self, now: float, frame_ms: float) -> int:
        """How many frames of ``frame_ms`` ``may_send`` would let go now, one after the
        other (each sent frame adds its duration to the lead)."""
        lead = self.lead_ms(now)
        first = 0
        if lead <= _EPSILON_MS:
            first, lead = 1, frame_ms
        return first + max(0, int((self.max_lead_ms + _EPSILON_MS - lead) // frame_ms))

    def wake_at(self) -> float | None:
        """When to release frames again: once the lead has dropped by ``refill_ms`` (at
        least one frame), so one wake-up sends several frames instead of one timer per
        frame (None: no audio sent yet, frames go out as they come)."""
        if self.play_end is None:
            return None
        drop = max(min(self.refill_ms, self.max_lead_ms / 2), self.frame_ms)
        return self.play_end - max(0.0, self.max_lead_ms - drop) / 1000.0

    def sent(self, duration_ms: float, now: float) -> None:
        if self.play_end is not None and self.play_end < now and self.sent_ms > 0:
            self.underruns += 1
        start = now if self.play_end is None else max(self.play_end, now)
        self.play_end = start + duration_ms / 1000.0
        if self.clock_end is None or self.clock_end < now:
            self._runs.append((now, self.sent_ms))
            if len(self._runs) > _MAX_RUNS:  # a turn starved frame after frame, unmarked
                del self._runs[0]
            self.clock_end = now
        self.clock_end += duration_ms / 1000.0
        self.sent_ms += duration_ms

    def deadline(self, now: float) -> float:
        """When the listener runs out of audio: the due time of the next chunk."""
        return now if self.play_end is None else max(now, self.play_end)

    @property
    def marks_end(self) -> float | None:
        """When the client's marks will say it has played everything sent: ``play_end`` on
        the clock of their arrival (one ``link_lag`` later), for a barge-in that arrives."""
        if self.play_end is None:
            return None
        return self.play_end + max(0.0, self.link_lag or 0.0)

    def mark(self, played_ms: float, now: float) -> None:
        """The client reports it has played ``played_ms`` (see the module docstring)."""
        played_ms = min(played_ms, self.sent_ms)
        if self.played_ms is not None and played_ms < self.played_ms:
            return  # older than a mark already taken: what was played stays played
        self.played_ms = played_ms
        if self.sent_ms <= 0:
            return  # no audio yet: nothing to time (the first is due when it is ready)
        reported = now + (self.sent_ms - played_ms) / 1000.0  # as if the mark were fresh
        while len(self._runs) > 1 and self._runs[1][1] < played_ms:
            del self._runs[0]  # played by the client: no later mark goes back there
        start, at = self._runs[0]
        if played_ms < at:  # before the runs kept: its gap is unknown, take it as fresh
            self.play_end = reported
            return
        gap = now - (start + (played_ms - at) / 1000.0)
        self.link_lag = gap if self.link_lag is None else min(self.link_lag, gap)
        # a client ahead of the timeline (a negative gap: it counts what it got, not what it
        # played) is believed as it reports
        behind = gap - max(0.0, self.link_lag)
        # from played_ms on, it plays what was sent, each run no earlier than its send
        end = start + (played_ms - at) / 1000.0 + behind
        for i, (start, at) in enumerate(self._runs):
            upto = self._runs[i + 1][1] if i + 1 < len(self._runs) else self.sent_ms
            if i:
                end = max(end, start)
            end += (upto - max(at, played_ms)) / 1000.0
        self.play_end = end

    def resumed(self, replayed_ms: float, now: float) -> None:
        """A new socket, being sent ``replayed_ms`` it missed: the listener played what it
        had (if any is left, a short blip) and then gets the replay; the round trip of the
        new link is measured again from its next mark."""
        replayed = replayed_ms / 1000.0
        if self.play_end is not None:
            self.play_end = max(now, self.play_end - replayed) + replayed
        if self.clock_end is not None:
            again = self.sent_ms - replayed_ms
            while self._runs and self._runs[-1][1] >= again:
                self._runs.pop()  # (what it replays plays after what it had)
            if not self._runs or self.clock_end - replayed < now:
                self._runs.append((now, again))  # it ran dry, or will, before the replay
            self.clock_end = max(now, self.clock_end - replayed) + replayed
        self.link_lag = None
