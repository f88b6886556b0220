"""Variants of the live lane's deadline rule in the calibrated simulator (bench/scheduler.py),
ramp scenario (sessions with LLM replies): kept to reproduce bench/SCHEDULER.md, section 4.

    python -m bench.scheduler_variants [--duration 600] [--slack 0,0.3,0.6,1] [--lead 1,2]

``slack``: "keep playing listeners fed first": a new turn's first chunk is due ``slack``
seconds after its submission instead of at once, so a listener that is playing and holds
less than ``slack`` of audio goes first. ``lead``: ``max_lead`` (just in time).

    python -m bench.scheduler_variants --holds [--duration 600]
    python -m bench.scheduler_variants --placements [--duration 1800] [--sessions 6]

LLM-aware start-of-playback prebuffer (section 5 of bench/SCHEDULER.md): a reply's first
audio is held until the listener holds ``A * (1 - 1/r)`` seconds, where ``A`` is the first
sentence's length and ``r`` the predicted RTF of its stream: 0.97 (TTS beside a decoding
LLM, calibration.json) or 0.44 (idle), times a margin, times the number of streams the lane
feeds at once (the new one and every playing stream with queued work). Below ``r = 1`` the
rate sustains the sentence and nothing is held. Also ``protect_lead`` (rule 2b) and the
ranking (``Rank``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# run as a script, bench/ comes first on the path and would shadow engines/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import scheduler as sim
from gateway.core.scheduler import Job, Priority, Rank


def variant(slack: float, lead: float) -> Any:
    class FeedFirstLane(sim.SimLane):
        def __init__(self, s: sim.Sim, name: str, max_lead: float):
            super().__init__(s, name, lead, rank=Rank.DEADLINE)
            self.sched.deadline_of = self._feed_first

        @staticmethod
        def _feed_first(job: Job, now: float) -> float:
            sj: sim.SimJob = job.payload
            if sj.priority is not Priority.INTERACTIVE:
                return job.deadline
            if sj.turn.play_end is None:
                return job.deadline + slack
            return sj.turn.play_end

    class FeedFirst(sim.Scheduler):
        def __init__(self, s: sim.Sim, **kw: Any):
            super().__init__(s, **kw)
            self.gpu = FeedFirstLane(s, "gpu", lead)

    return FeedFirst


class HeldTurn(sim.Turn):
    """A listener whose playback starts only once ``hold(turn)`` seconds are buffered (or
    the first segment is complete). TTFA is then the start of playback."""

    hold: Any = None
    _buffered: float = 0.0
    _pending: list | None = None
    _playing: bool = False

    def deliver(self, seg: int, dur: float, now: float) -> None:
        if not self._playing:
            self._buffered += dur
            self._pending = (self._pending or []) + [(seg, dur)]
            job = self.segments[seg]
            if self._buffered + 1e-9 < self.hold(self) and job.produced_s + 1e-9 < job.audio_s:
                return
            self._playing = True
            for s_, d in self._pending:
                super().deliver(s_, d, now)
            return
        super().deliver(seg, dur, now)


def holding(margin: float, rank: Rank = Rank.STREAM_AGE, protect: float = 0.4) -> Any:
    class Holding(sim.Scheduler):
        def __init__(self, s: sim.Sim, **kw: Any):
            super().__init__(s, rank=rank, **kw)
            self.gpu.sched.protect_lead = protect
            gpu = self.gpu

            def hold(turn: HeldTurn) -> float:
                if margin <= 0:
                    return 0.0
                r = (0.97 if s.llm_streams else 0.44) * margin
                playing = sum(1 for o in gpu.sched.owners() if o != id(turn)
                              and gpu.sched._queues[o][0].payload.turn.chunks)
                r *= playing + 1
                return turn.segments[0].audio_s * max(0.0, 1.0 - 1.0 / r)
            HeldTurn.hold = staticmethod(hold)
    return Holding


def holds(model: sim.Model, args: argparse.Namespace) -> None:
    sim.HUB_TURN, plain = HeldTurn, sim.HUB_TURN
    try:
        print("variant: per sessions: lane load, underruns, stall s, TTFA p50/p90 ms")
        for label, factory in (
                ("edf, no hold", holding(0.0, Rank.DEADLINE)),
                ("stream age (protect 0.2)", holding(0.0, protect=0.2)),
                ("stream age (protect 0.4)", holding(0.0)),
                ("stream age (protect 0.7)", holding(0.0, protect=0.7)),
                ("edf + hold x1.1", holding(1.1, Rank.DEADLINE)),
                ("stream age + hold x1.0", holding(1.0)),
                ("stream age + hold x1.1", holding(1.1)),
                ("stream age + hold x1.2", holding(1.2))):
            row = ramp(model, args, factory, lambda n, r: (
                f"{n}: {r['lane_load']:.0%} u{r['underruns']} s{r['stall_s']:.0f} "
                f"{r['ttfa_p50_ms']:.0f}/{r['ttfa_p90_ms']:.0f}"))
            print(f"{label:26} | {row}", flush=True)
    finally:
        sim.HUB_TURN = plain


def ramp(model: sim.Model, args: argparse.Namespace, factory: Any,
         cell: Any) -> str:
    """Scenario 3 with ``factory`` as the policy at 1..``args.sessions`` sessions: one
    ``cell(n, result)`` per session count, joined into a table row."""
    sim.POLICIES["variant"] = factory
    return " | ".join(cell(n, sim.scenario_ramp(model, args.seed, args.duration, "variant", n))
                      for n in range(1, args.sessions + 1))


def placements(model: sim.Model, args: argparse.Namespace) -> None:
    """``sched+ane`` with each rule for counting a lane's active turns (``Scheduler``)."""
    print("sessions: gpu lane load, underruns / stall s / TTFA p50/p90 ms, share on ane")
    for active in ("queued", "sent", "played"):
        row = ramp(model, args, lambda s, active=active, **kw: sim.Scheduler(
            s, ane=True, active=active, **kw), lambda n, r: (
            f"{n}: {r['lane_load']:.0%} {r['underruns']} / {r['stall_s']:.0f} / "
            f"{r['ttfa_p50_ms']:.0f}/{r['ttfa_p90_ms']:.0f} {r['ane_share']:.0%}"))
        print(f"{active:7} | {row}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--slack", default="0,0.3,0.6,1")
    ap.add_argument("--lead", default="1,2")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--holds", action="store_true", help="the prebuffer / ranking variants")
    ap.add_argument("--placements", action="store_true",
                    help="sched+ane: how active turns are counted when placing one")
    args = ap.parse_args(argv)
    model = sim.Model.from_calibration(json.loads(sim.CALIBRATION.read_text()))
    if args.placements:
        placements(model, args)
        return 0
    if args.holds:
        holds(model, args)
        return 0
    print("sessions: lane load, underruns, TTFA p90 ms")
    for slack in (float(x) for x in args.slack.split(",")):
        for lead in (float(x) for x in args.lead.split(",")):
            row = ramp(model, args, variant(slack, lead), lambda n, r: (
                f"{n}: {r['lane_load']:.0%} u{r['underruns']} {r['ttfa_p90_ms']:.0f}"))
            print(f"slack {slack:3.1f} lead {lead:4.1f} | {row}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
