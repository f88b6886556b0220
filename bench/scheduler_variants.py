"""Variants of the live lane's deadline rule in the calibrated simulator (bench/scheduler.py),
ramp scenario (sessions with LLM replies): kept to reproduce bench/SCHEDULER.md, section 4.

    python -m bench.scheduler_variants [--duration 600] [--slack 0,0.3,0.6,1] [--lead 1,2]

``slack``: "keep playing listeners fed first": a new turn's first chunk is due ``slack``
seconds after its submission instead of at once, so a listener that is playing and holds
less than ``slack`` of audio goes first. ``lead``: ``max_lead`` (just in time).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench import scheduler as sim
from gateway.core.scheduler import Job, Priority


def variant(slack: float, lead: float) -> Any:
    class FeedFirstLane(sim.SimLane):
        def __init__(self, s: sim.Sim, name: str, max_lead: float):
            super().__init__(s, name, lead)
            self.sched.deadline_of = self._feed_first

        @staticmethod
        def _feed_first(job: Job, now: float) -> float:
            sj: sim.SimJob = job.payload
            if sj.priority is not Priority.INTERACTIVE:
                return job.deadline
            if sj.turn.play_end is None:
                return job.deadline + slack
            return max(now, sj.turn.play_end)

    class FeedFirst(sim.Scheduler):
        def __init__(self, s: sim.Sim, **kw: Any):
            super().__init__(s, **kw)
            self.gpu = FeedFirstLane(s, "gpu", lead)

    return FeedFirst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--slack", default="0,0.3,0.6,1")
    ap.add_argument("--lead", default="1,2")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    model = sim.Model.from_calibration(json.loads(sim.CALIBRATION.read_text()))
    print("sessions: lane load, underruns, TTFA p90 ms")
    for slack in (float(x) for x in args.slack.split(",")):
        for lead in (float(x) for x in args.lead.split(",")):
            sim.POLICIES["variant"] = variant(slack, lead)
            cells = []
            for n in range(1, args.sessions + 1):
                r = sim.scenario_ramp(model, args.seed, args.duration, "variant", n)
                cells.append(f"{n}: {r['lane_load']:.0%} u{r['underruns']} "
                             f"{r['ttfa_p90_ms']:.0f}")
            print(f"slack {slack:3.1f} lead {lead:4.1f} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
