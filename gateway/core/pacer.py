"""Playback model of one listener: how much audio it holds at time ``now``.

The client plays frames back to back. When a frame arrives after the client ran out of
audio, playback restarts at arrival (an underrun). So after sending a frame of ``d`` ms at
``now``: ``play_end = max(play_end, now) + d``; the client's buffered lead is
``play_end - now``. A ``playback`` mark (``played_ms``) replaces the estimate with what the
client says it holds: ``sent_ms - played_ms``; one below an earlier mark of the turn (a
resent one) changes nothing.

Pure: every method takes ``now`` in seconds from any monotonic origin.
"""

from __future__ import annotations

from dataclasses import dataclass

_EPSILON_MS = 1e-6  # float time arithmetic must not let one extra frame through


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
        self.sent_ms += duration_ms

    def deadline(self, now: float) -> float:
        """When the listener runs out of audio: the due time of the next chunk."""
        return now if self.play_end is None else max(now, self.play_end)

    def mark(self, played_ms: float, now: float) -> None:
        played_ms = min(played_ms, self.sent_ms)
        if self.played_ms is not None and played_ms < self.played_ms:
            return  # older than a mark already taken: what was played stays played
        self.played_ms = played_ms
        self.play_end = now + (self.sent_ms - played_ms) / 1000.0
