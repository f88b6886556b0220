"""Which synthesis job a lane runs next. Sans-I/O: ``now`` is passed in.

A lane runs one engine *step* at a time. Between steps it asks ``next_job(now)``: the
eligible job with the best (priority class, deadline, arrival) wins. Jobs of one owner (a
turn) run in submission order: only the head of each owner's queue is eligible, so a later
sentence never overtakes an earlier one. Deadlines are dynamic: the scheduler asks
``deadline_of(job, now)`` (for a voice session: when its listener runs out of audio).

Cancellation removes an owner's queued jobs at once; a job whose step is in flight is
marked cancelled and the lane drops it at the step boundary.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


class Priority(enum.IntEnum):
    INTERACTIVE = 0  # live voice sessions
    BACKGROUND = 1  # HTTP speech requests, `say` from other apps
    WARMUP = 2


@dataclass(slots=True, eq=False)
class Job:
    owner: Hashable
    """Jobs of one owner run in order (a turn: ``(session_id, turn_id)``)."""
    priority: Priority
    deadline: float
    """Initial deadline; ``deadline_of`` may refine it while the job waits."""
    payload: Any = None
    seq: int = 0
    cancelled: bool = False
    running: bool = False
    state: Any = None
    """What the lane keeps between steps (the engine stream)."""
    steps: int = 0


DeadlineOf = Callable[[Job, float], float]


@dataclass(slots=True)
class LaneScheduler:
    deadline_of: DeadlineOf | None = None
    _queues: dict[Hashable, deque[Job]] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count)

    def submit(self, job: Job) -> None:
        job.seq = next(self._counter)
        self._queues.setdefault(job.owner, deque()).append(job)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def owners(self) -> list[Hashable]:
        return list(self._queues)

    def next_job(self, now: float) -> Job | None:
        """The job whose next step should run now, or None when nothing waits."""
        best: Job | None = None
        best_key: tuple[int, float, int] | None = None
        for queue in self._queues.values():
            job = queue[0]
            deadline = self.deadline_of(job, now) if self.deadline_of else job.deadline
            key = (job.priority, deadline, job.seq)
            if best_key is None or key < best_key:
                best, best_key = job, key
        return best

    def finish(self, job: Job) -> None:
        """The job produced its last step (or failed): remove it."""
        queue = self._queues.get(job.owner)
        if queue and queue[0] is job:
            queue.popleft()
            if not queue:
                del self._queues[job.owner]

    def cancel(self, owner: Hashable) -> list[Job]:
        """Drop every job of ``owner``; returns them (the lane closes their streams)."""
        queue = self._queues.pop(owner, None)
        if not queue:
            return []
        for job in queue:
            job.cancelled = True
        return list(queue)
