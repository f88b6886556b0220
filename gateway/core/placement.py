"""Which lane a job goes to, and how long its steps will take there. Sans-I/O.

LLM awareness: a GPU lane's step times depend on whether this gateway's LLM streams are
decoding on the same device (measured on the hub: TTS 0.44 -> 0.97 s of work per second of
audio, first audio 107 -> 216 ms). When a job's voice is also available on a lane that does
not share the GPU (an ANE engine), the job goes there while that lane can still keep every
listener it serves fed in real time, so the LLM keeps the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaneProfile:
    """Measured cost of one engine on one lane (calibration.json)."""

    name: str
    first_s: float
    """Time to first audio of a job when the lane is free."""
    rtf: float
    """Seconds of lane time per second of audio."""
    shares_gpu: bool = False
    first_s_llm: float | None = None
    """Same, while an LLM decodes on the same device (None: no contention measured)."""
    rtf_llm: float | None = None

    def predict(self, llm_decoding: bool) -> tuple[float, float]:
        """(first audio, rtf) under the current LLM activity."""
        if llm_decoding and self.shares_gpu:
            return (self.first_s_llm or self.first_s, self.rtf_llm or self.rtf)
        return self.first_s, self.rtf


@dataclass(frozen=True, slots=True)
class LaneLoad:
    profile: LaneProfile
    active: int
    """Interactive jobs the lane currently serves (each needs ``rtf`` of its time)."""


def place(options: Sequence[LaneLoad], llm_decoding: bool) -> str:
    """The lane for a new interactive job among those that have its voice.

    A lane is *feasible* when it can serve its current listeners plus this one in real time
    (``(active + 1) * rtf <= 1``). Among feasible lanes, prefer one that leaves the GPU to a
    decoding LLM, then the earliest predicted first audio. With no feasible lane, the one
    with the least predicted load.
    """
    if not options:
        raise ValueError("no lane has this voice")

    def load(o: LaneLoad) -> float:
        return (o.active + 1) * o.profile.predict(llm_decoding)[1]

    feasible = [o for o in options if load(o) <= 1.0]
    if not feasible:
        return min(options, key=load).profile.name
    best = min(feasible, key=lambda o: (llm_decoding and o.profile.shares_gpu,
                                        o.profile.predict(llm_decoding)[0]))
    return best.profile.name
