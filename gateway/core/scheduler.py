"""Which synthesis job a lane runs next. Sans-I/O: ``now`` is passed in.

A lane runs one engine *step* at a time. Between steps it asks ``next_job(now)``; the rules,
in order:

1. **One owner, in order.** Jobs of one owner (a turn) run in submission order: only the
   head of each owner's queue is a candidate, so a later sentence never overtakes an
   earlier one.
2. **Priority class first** (interactive > background > warm-up), then **earliest
   deadline**, then arrival. Deadlines are dynamic: the scheduler asks
   ``deadline_of(job, now)`` (for a voice session: when its listener runs out of audio; a
   new turn's first audio is due now).
2b. **Playing listeners short of audio, oldest stream first** (``Rank.STREAM_AGE``, the
   default). Within the interactive class a stream's first audio still goes by deadline
   (it is due now, so it runs first). A stream that plays and holds less than
   ``protect_lead`` of audio ranks by when it started (``Job.since``; the first job's own
   submission deadline when not given), oldest first; one that holds more ranks after
   those, by deadline. While the LLM decodes, a TTS step runs at RTF ~0.97: the lane feeds
   about one real-time stream, and earliest-deadline-first spread that shortage over every
   playing listener (thousands of short underruns from three sessions up). Protecting the
   oldest streams concentrates it on the newest; the ``protect_lead`` bound stops an old
   stream from taking the lane to build lead it does not need while a young one runs dry.
   ``Rank.DEADLINE`` is plain earliest deadline (bench/SCHEDULER.md compares them).
3. **Just in time.** With ``max_lead`` set, a job whose deadline is more than ``max_lead``
   seconds away is not eligible: its listener has enough audio, and synthesizing further
   ahead only takes the device from everyone else (the LLM included). An interactive job
   may carry its own (``Job.max_lead``: its session's ``max_lead_ms``). When nothing is
   eligible, ``next_job`` returns None and ``next_eligible_at`` says when to ask again
   (new submissions also change the answer). Background and warm-up jobs are held to it
   only while the lane is *shared*: an interactive job is queued or an LLM decodes
   (``llm_decoding``, set by the I/O layer). Alone they run flat out (an app rendering a
   file gets ~2x real time instead of real time), unless ``pace_background_always``. An
   interactive job whose deadline is infinite (nobody listens: a voice session waiting for
   a resume) does not share the lane.
4. **Cancellation** removes an owner's queued jobs at once; a job whose step is in flight
   is marked cancelled and the lane drops it at the step boundary (its stream counts as
   open until then, rule 6).
5. **Steps at once.** A lane that runs several steps at once (a remote engine's,
   ``parallel_steps``) holds the job it starts (``hold``): its owner is no candidate until
   ``release`` (its step returned), so no other step of that owner runs meanwhile (rule 1).
   A lane that runs one step at a time needs neither.
6. **Open streams.** A job's engine stream is open from its first step until it finishes
   or is cancelled, and an in-process model's holds memory all that while (Qwen3-TTS: its
   KV caches and codec-decoder state, tens of MB each at the real model's size,
   bench/qwen3_memory.py). With ``max_open`` set, a job not started yet is no
   candidate while that many are open: it waits, in the order rules 2-3 give, until one
   of them ends (``streams_waiting`` counts the owners waiting so). Meanwhile rule 3 holds
   nothing back: the open streams run ahead to their end, or a new turn's first audio,
   due now, waited for a sentence to end in real time while the lane idled. Without the
   bound, every speaking session and HTTP request held a stream at once, however few the
   lane could feed. ``fifo`` needs no bound: it runs one owner at a time (its one open
   stream is counted all the same, ``open_streams``).
6b. **Streams kept for interactive work.** ``reserve`` of the ``max_open`` streams are
   interactive jobs' only: a background or warm-up job not started yet is no candidate
   while ``max_open - reserve`` or more streams are open (of any class), so those classes
   never hold more than ``max_open - reserve``, and a stream that ends inside the reserve
   is offered to interactive owners only. Without it, background requests (20-40 s
   utterances from other apps) could hold every stream, and a voice turn then waited for
   a whole utterance to end, each sentence again (bench/SCHEDULER.md, ``sched-open1``:
   TTFA p50 8.6 s). An interactive turn still waits when interactive jobs hold the
   reserve and the rest is taken, but then for a sentence, not an utterance.
   ``default_reserve`` gives ``max_open // 8``, at least 1 (qwen3's 16: 2), and none with
   ``max_open`` 1: the only stream kept for interactive work would leave background
   requests none at all. A ``reserve`` of ``max_open`` or more counts as ``max_open - 1``.

**Step sizes.** A step in flight cannot be interrupted, so the step size of the work already
on a lane bounds how long newly arrived interactive work waits for it. ``step_ms(priority)``
is the audio per step a job of each class asks its engine for (``SynthesisRequest.step_ms``):
background and warm-up jobs take the smallest step a streaming engine offers (80 ms, one
Qwen3-TTS codec frame at 12.5 Hz), so a voice session's first audio waits at most ~40 ms of
lane time behind them instead of ~140 ms; interactive jobs keep the engine's own step (320 ms
for Qwen3-TTS): they only wait for each other, and every step carries a fixed overhead (one
codec-decoder call and a host sync), so small steps for everything would cost capacity
(bench/SCHEDULER.md: the assumption and its sensitivity).

Policy ``fifo`` (``LanePolicy.FIFO``, the old TTS sidecar, kept as a baseline and a fallback)
replaces rules 2 and 3: the owner that arrived first runs all its jobs to the end before any
other owner starts, including a job it submits before the lane asks for the next one (an
HTTP request's next segment, submitted from ``on_done``); priority, deadlines and
``max_lead`` are ignored. Rules 1 and 4 hold.

Cost: each priority class keeps three heaps of owner heads: *ready* keyed by rank (rule
2/2b) under the last known deadline, *comfortable* (playing, at least ``protect_lead``
ahead, rule 2b) keyed by deadline, *waiting* (too far ahead, rule 3) keyed by when they
become eligible (deadline less lead), then deadline. Deadlines only move later while a job
waits (its listener gains audio), and never with the clock alone: an overdue deadline stays
in the past (``deadline_of`` must not return ``max(now, ...)``, or every overdue head would
be stale at every decision: at 1,000 sessions that re-filed every head per step and the lane
never caught up). A rank only moves later (a stream's first step makes it "playing"), so a
stale key is never later than the true one and it suffices to refresh the top of a heap
until it is fresh; overdue heads go most overdue first. A head moves between the heaps a
bounded number of times per step it gets, so a decision costs a few ``deadline_of`` calls
and O(log n), not one call per queued owner. A deadline that moves *earlier* (a playback
report saying the client holds less than estimated) must be announced with ``touch(owner)``.
Owners waiting for a stream (rule 6) leave those heaps for two *parked* heaps per class
(ready and comfortable, under the key they had); a stream that ends files the best of them
again (one per free stream, the top refreshed as above), not all of them: at 16 streams
and 1,000 waiting owners that was ~90 ``deadline_of`` calls per decision (bench/SCHEDULER.md).
Rule 6b adds one comparison there: a free stream inside the reserve files only interactive
owners, and a background head finding ``max_open - reserve`` open parks as at the bound.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


class LanePolicy(enum.StrEnum):
    SCHEDULER = "scheduler"
    """One step at a time: priority, then deadline, just in time (rules 1-4)."""
    FIFO = "fifo"
    """Whole generations, first come first served (the old sidecar)."""


class Rank(enum.StrEnum):
    STREAM_AGE = "stream_age"
    """Interactive: first audio by deadline, then playing streams oldest first (rule 2b)."""
    DEADLINE = "deadline"
    """Earliest deadline first in every class."""


class Priority(enum.IntEnum):
    INTERACTIVE = 0  # live voice sessions
    BACKGROUND = 1  # HTTP speech requests, `say` from other apps
    WARMUP = 2


STEP_MS: dict[Priority, float | None] = {
    Priority.INTERACTIVE: None,  # the engine's own step (Qwen3-TTS: 320 ms)
    Priority.BACKGROUND: 80.0,
    Priority.WARMUP: 80.0,
}
"""Audio per engine step for each class, in ms (None: the engine's default); see the module
docstring, "Step sizes"."""


def default_reserve(max_open: int | None) -> int:
    """Rule 6b's default ``reserve`` for a lane keeping at most ``max_open`` streams open:
    an eighth, at least 1 (qwen3's 16: 2); none with one stream or no bound (with one, a
    stream kept for interactive work would leave background requests none)."""
    if max_open is None or max_open < 2:
        return 0
    return max(1, max_open // 8)


def step_ms(priority: Priority) -> float | None:
    """The step size a job of ``priority`` asks its engine for (``SynthesisRequest.step_ms``)."""
    return STEP_MS[priority]


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
    """Steps this job has run that made audio (the lane counts them)."""
    since: float | None = None
    """When the job's stream started (a turn's first segment), for rule 2b. Set it on every
    job of a stream after the first; None: the stream starts with this job (then its
    ``deadline`` at submission stands for the start)."""
    max_lead: float | None = None
    """Seconds: this interactive job's own ``max_lead`` for rule 3 (its session's setting;
    None: the lane's). Ignored for other classes."""
    opened: bool = False
    """``next_job`` handed it out: its stream is open (rule 6) until it leaves the queue."""


DeadlineOf = Callable[[Job, float], float]

_Heaps = tuple[tuple[list["_Entry"], ...], tuple[list["_Entry"], ...], tuple[list["_Entry"], ...]]
"""Ready, comfortable and waiting heaps, one of each per priority class."""

_EPSILON = 1e-9
"""Seconds: ``deadline - now <= lead`` and ``deadline - lead <= now`` round differently; a
timer set for ``next_eligible_at`` must find the job eligible when it fires."""

_UNKNOWN = (-1, -math.inf)
"""Ready-heap key of a head whose deadline has not been asked yet: refreshed first."""

# Enum members read as class attributes cost ~75 ns each on CPython 3.11, and iterating an
# enum class ~0.6 µs: a decision read them several times per engine step (bench/CAPACITY.md).
_PRIORITIES = tuple(Priority)
_INTERACTIVE = Priority.INTERACTIVE
_STREAM_AGE = Rank.STREAM_AGE
_FIFO = LanePolicy.FIFO


class _Entry(list):
    """A heap entry: ``[key, seq]`` for an owner's head job, under its last known rank
    (ready heap, a tuple ``(tier, time)``) or deadline (comfortable and waiting heaps,
    ``(time,)``); ``seq`` breaks ties by arrival.

    A list, so that heapq compares entries in C (list, then tuple, then int comparison)
    instead of calling a Python ``__lt__``: the heaps make ~10 comparisons per decision
    and a decision runs for every engine step."""

    __slots__ = ("job", "live")
    job: Job
    live: bool

    @property
    def key(self) -> tuple[float, ...]:
        return self[0]

    @key.setter
    def key(self, value: tuple[float, ...]) -> None:
        self[0] = value


def _entry(key: tuple[float, ...], job: Job) -> _Entry:
    """A live entry for ``job`` under ``key`` (list's own constructor: no Python
    ``__init__`` call, half the cost, and two are made per engine step)."""
    entry = _Entry((key, job.seq))
    entry.job = job
    entry.live = True
    return entry


_COMPACT_AFTER = 64
"""Dead heap entries tolerated before ``_drop_entry`` may compact the heaps."""

JIT_GRANULARITY_S = 0.02
"""The ``tolerance`` a lane runs with: a job within 20 ms of eligible (just in time) is
eligible now, so one wake-up of the lane runs every job due in the next 20 ms instead of
one wake-up per job. That is far below a step (80-320 ms), so the order of the lane's work
does not change (bench/scheduler.py: same figures), and above uvloop's 1 ms clock
resolution, which a lane woken at ``next_eligible_at`` must tolerate. At 400 zero-cost
streaming sessions it cut the gateway's CPU per frame by a fifth (bench/capacity.py, 3
alternating runs: 0.0221 -> 0.0177 ms)."""


@dataclass(slots=True)
class LaneScheduler:
    deadline_of: DeadlineOf | None = None
    max_lead: float | None = None
    """Seconds: a job whose deadline is further away than this yields the lane (None: never)."""
    tolerance: float = 0.0
    """Seconds: a job this close to eligible is eligible now. At least the resolution of
    the clock that drives the lane (uvloop's ``loop.time()`` moves in 1 ms steps): a lane
    woken at ``next_eligible_at`` may read a clock that has not moved past it, or find the
    job a float rounding error early, and would re-arm for the same instant until the clock
    ticks, spinning the event loop (measured: 12 empty decisions per step at 400 sessions).
    Lanes use ``JIT_GRANULARITY_S``."""
    policy: LanePolicy = LanePolicy.SCHEDULER
    """Set before the first ``submit``; ``fifo`` keeps no heaps."""
    rank: Rank = Rank.STREAM_AGE
    protect_lead: float = 0.4
    """Seconds (rule 2b): a playing listener holding less audio than this is fed oldest stream
    first; one holding more waits behind them, earliest deadline first. About one 320 ms
    step plus the jitter of the next one (bench/SCHEDULER.md: 0.2-0.7 s measured)."""
    pace_background_always: bool = False
    """True: ``max_lead`` holds background and warm-up jobs even when they are alone."""
    llm_decoding: int = 0
    """LLM streams decoding on this lane's device now (the I/O layer keeps it up to date;
    background work is paced while it is non-zero: rule 3)."""
    next_eligible_at: float | None = None
    """Set by ``next_job`` when it returns None although jobs wait: when the earliest of them
    becomes eligible (None when nothing waits)."""
    _queues: dict[Hashable, deque[Job]] = field(default_factory=dict)
    _entries: dict[Hashable, _Entry] = field(default_factory=dict)
    _heaps: tuple[list[_Entry], ...] = field(
        default_factory=lambda: tuple([] for _ in Priority))
    _comfortable: tuple[list[_Entry], ...] = field(
        default_factory=lambda: tuple([] for _ in Priority))
    _waiting: tuple[list[_Entry], ...] = field(
        default_factory=lambda: tuple([] for _ in Priority))
    max_open: int | None = None
    """Rule 6: at most this many jobs' streams open at once (None: no limit)."""
    reserve: int = 0
    """Rule 6b: of ``max_open``, streams only interactive jobs may open (at most
    ``max_open - 1`` count; ``default_reserve`` is the lanes' default)."""
    _open: int = 0
    _blocked: dict[Hashable, _Entry] = field(default_factory=dict)
    """Owners whose head waits for a stream to end (rule 6): their entries, off the heaps
    meanwhile and in the parked heaps below instead, under the key they had there."""
    _parked: tuple[list[_Entry], ...] = field(
        default_factory=lambda: tuple([] for _ in Priority))
    _parked_comfortable: tuple[list[_Entry], ...] = field(
        default_factory=lambda: tuple([] for _ in Priority))
    _promised: set[Hashable] = field(default_factory=set)
    """Owners taken off the parked heaps for a free stream and not started yet: each of
    them holds one free stream in reserve, so a stream that ends files one waiting owner
    again, not all (``_unpark``)."""
    _size: int = 0
    _dead: int = 0
    """Dropped entries still in a heap (each is popped when it reaches the top; a heap
    whose top never drains is compacted instead, see ``_drop_entry``)."""
    _interactive: int = 0
    _held: set[Hashable] = field(default_factory=set)
    """Owners whose job's step is in flight on a lane running several at once (rule 5)."""
    _holder: Hashable = None
    _counter: itertools.count = field(default_factory=itertools.count)

    # ---- queue -------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        job.seq = next(self._counter)
        queue = self._queues.get(job.owner)
        if queue is None:
            self._queues[job.owner] = deque([job])
            self._push_head(job)
        else:
            queue.append(job)
        self._size += 1
        self._interactive += job.priority is _INTERACTIVE

    def __len__(self) -> int:
        return self._size

    @property
    def open_streams(self) -> int:
        """Jobs handed out and not finished or cancelled yet: their streams are open."""
        return self._open

    @property
    def streams_waiting(self) -> int:
        """Owners whose next job waits for an open stream to end (rule 6; a background
        one also while only reserved streams are free, rule 6b)."""
        return len(self._blocked)

    @property
    def reserved(self) -> int:
        """Streams kept for interactive jobs (rule 6b): ``reserve``, at most
        ``max_open - 1``; 0 without a bound."""
        if self.max_open is None:
            return 0
        return max(0, min(self.reserve, self.max_open - 1))

    def _streams_for(self, priority: Priority) -> int:
        """Rule 6b: how many streams may be open when a job of ``priority`` opens one
        (``max_open`` set)."""
        bound: int = self.max_open  # type: ignore[assignment]
        return bound if priority is _INTERACTIVE else bound - self.reserved

    def owners(self) -> list[Hashable]:
        return list(self._queues)

    def head(self, owner: Hashable) -> Job | None:
        """``owner``'s first job (the one running, if any), or None when it has none."""
        queue = self._queues.get(owner)
        return queue[0] if queue else None

    def finish(self, job: Job) -> None:
        """The job produced its last step (or failed): remove it; the owner's next job
        becomes a candidate."""
        queue = self._queues.get(job.owner)
        if not queue or queue[0] is not job:
            return
        queue.popleft()
        self._size -= 1
        self._interactive -= job.priority is _INTERACTIVE
        self._drop_entry(job.owner)  # (a waiting head may fail: ``Lane._fail_queued``)
        self._promised.discard(job.owner)
        self._closed(job)
        if not queue:
            del self._queues[job.owner]
        elif job.owner not in self._held:  # (a held owner's next job waits for release)
            self._push_head(queue[0])

    def cancel(self, owner: Hashable) -> list[Job]:
        """Drop every job of ``owner``; returns them (the lane closes their streams). A
        held job's stream stays open until its step returns (``release``): the lane closes
        it only then, and a stream opened meanwhile exceeded ``max_open`` (rule 6)."""
        queue = self._queues.pop(owner, None)
        if not queue:
            return []
        self._drop_entry(owner)
        self._promised.discard(owner)
        self._size -= len(queue)
        self._interactive -= sum(job.priority is Priority.INTERACTIVE for job in queue)
        running = queue[0] if owner in self._held else None
        for job in queue:
            job.cancelled = True
            if job is not running:  # (a step in flight keeps its stream: ``release``)
                self._closed(job)
        return list(queue)

    def touch(self, owner: Hashable) -> None:
        """``owner``'s deadline may have moved earlier: ask ``deadline_of`` again."""
        queue = self._queues.get(owner)
        if not queue or owner in self._held:
            return
        parked = owner in self._blocked
        self._drop_entry(owner)
        if parked:  # ranked afresh among those waiting for a stream (rule 6)
            entry = _entry(_UNKNOWN, queue[0])
            self._blocked[owner] = entry
            heapq.heappush(self._parked[queue[0].priority], entry)
        else:
            self._push_head(queue[0])

    def hold(self, job: Job) -> None:
        """``job`` (returned by ``next_job``) starts a step while others may run (rule 5):
        its owner is no candidate until ``release``."""
        self._held.add(job.owner)
        self._drop_entry(job.owner)

    def release(self, job: Job) -> None:
        """``job``'s step returned: its owner's head (``job``, unless it was finished or
        cancelled meanwhile) is a candidate again. A cancelled ``job``'s stream closes now."""
        self._held.discard(job.owner)
        if job.cancelled:
            self._closed(job)
        queue = self._queues.get(job.owner)
        if queue and job.owner not in self._entries and job.owner not in self._blocked:
            self._push_head(queue[0])

    # ---- decision ----------------------------------------------------------------------

    def next_job(self, now: float) -> Job | None:
        """The job whose next step should run now, or None when nothing is eligible (then
        ``next_eligible_at`` says when a waiting job becomes eligible)."""
        if self.policy is _FIFO:
            # Owners are kept in arrival order (a dict). The owner of the last job handed out
            # holds the lane while it has work, even if its queue emptied in between (a
            # sink submits the next segment from ``on_done``, after ``finish``).
            self.next_eligible_at = None
            queue = self._queues.get(self._holder)
            if queue is None:
                if not self._queues:
                    self._holder = None
                    return None
                self._holder, queue = next(iter(self._queues.items()))
            head = queue[0]
            if not head.opened:  # (counted, not bounded: rule 6)
                head.opened = True
                self._open += 1
            return head
        if self._blocked and self._open + len(self._promised) < (self.max_open or 0):
            self._unpark(now)  # (a stream ended)
        waited = bool(self._blocked)
        job = self._decide(now)
        if self._blocked and not waited:
            # A head waits for a stream now: rule 6 lifts rule 3, for this decision too
            # (its answer, None or a lower class's job, held back the open ones). Nothing
            # opened after that head parked (no class may open more than its own), so its
            # answer is only taken back.
            job = self._decide(now)
        return job

    def _decide(self, now: float) -> Job | None:
        wake = math.inf
        shared = self._interactive > 0 or self.llm_decoding > 0
        heaps = (self._heaps, self._comfortable, self._waiting)
        for priority in _PRIORITIES:
            ready, comfortable, waiting = (self._heaps[priority], self._comfortable[priority],
                                           self._waiting[priority])
            lead = None if self._blocked else self.max_lead  # (rule 6: open ones to their end)
            if priority is not _INTERACTIVE and not (shared or self.pace_background_always):
                lead = None  # alone on the lane: flat out (rule 3)
            # Heads that may have become eligible (waiting) or short of audio (comfortable)
            # are filed again. Stale keys are early, so this never misses one.
            # The tests below are the exact negations of the ones ``_place`` files by (same
            # expressions), so a head taken out is never filed straight back: no livelock.
            # (A waiting head is ordered by when it becomes eligible, but tested with its
            # deadline and lead exactly as ``_place`` does: ``(d - lead) - now`` and
            # ``d - now > lead`` round differently, and a head taken out by one and filed
            # back by the other was re-filed for ever: the event loop froze.)
            while waiting and (lead is None or not waiting[0].live or not self._too_far(
                    waiting[0].key[-1], now, self._lead(waiting[0].job, lead))):
                self._refile(heapq.heappop(waiting), now, lead, heaps, self._entries)
            while comfortable and (not comfortable[0].live
                                   or not self._comfortable_at(comfortable[0].key[0], now)):
                self._refile(heapq.heappop(comfortable), now, lead, heaps, self._entries)
            for heap in (ready, comfortable):
                while (entry := self._fresh_top(heap, now, lead, heaps, self._entries)) is not None:
                    job = entry.job
                    if not job.opened:
                        if self.max_open is not None and \
                                self._open >= self._streams_for(priority):
                            self._park(heap, priority)  # rule 6: until a stream ends
                            continue
                        job.opened = True
                        self._open += 1
                        if self._promised:
                            self._reserve_taken(job.owner)
                    self.next_eligible_at = None
                    return job
            while waiting and lead is not None:  # when the first waiting one becomes eligible
                entry = waiting[0]
                if not entry.live:
                    heapq.heappop(waiting)
                    self._dead -= 1
                    continue
                job = entry.job
                deadline = self._deadline(job, now)
                if deadline > entry.key[-1]:
                    self._replace_top(waiting, self._waiting_key(job, deadline, lead),
                                      self._entries)
                    continue
                wake = min(wake, deadline - self._lead(job, lead))
                break
            if priority is _INTERACTIVE and shared and not self.llm_decoding:
                shared = self._listened_to()
        self.next_eligible_at = None if wake == math.inf else wake
        return None

    def _listened_to(self) -> bool:
        """Rule 3's "shared", once the interactive heads had nothing to run: some wait for
        their listener (just in time) or run (held). Not when every one waits for a
        listener who is gone (a voice session waiting for a resume: its deadline is
        infinite for up to its resume window, and its turn held background work to real
        time all that while). The waiting heap's top is fresh and live here (the loop above
        refreshed it), and a stale key is never later than the true one: an infinite top
        means every waiting head's deadline is, so the heap holds the gone listeners' turns
        only (few: it is read whole then)."""
        if any(self._queues[owner][0].priority is _INTERACTIVE
               for owner in self._held if owner in self._queues):
            return True
        waiting = self._waiting[_INTERACTIVE]
        if waiting and waiting[0].key[-1] != math.inf:
            return True
        gone = sum(job.priority is _INTERACTIVE for entry in waiting if entry.live
                   for job in self._queues[entry.job.owner])
        return self._interactive > gone  # (an owner's later interactive job: it shares)

    def _deadline(self, job: Job, now: float) -> float:
        return self.deadline_of(job, now) if self.deadline_of else job.deadline

    def _place(self, job: Job, now: float, deadline: float, lead: float | None,
               heaps: _Heaps) -> tuple[list[_Entry], tuple[float, ...]]:
        """Rules 2, 2b and 3: the heap of ``heaps`` (ready, comfortable, waiting; the parked
        ones for an owner waiting for a stream) a head belongs in now, and its key there."""
        if lead is not None and self._too_far(deadline, now, self._lead(job, lead)):
            return heaps[2][job.priority], self._waiting_key(job, deadline, lead)
        if (self.rank is _STREAM_AGE and job.priority is _INTERACTIVE
                and (job.steps or job.since is not None)):
            if self._comfortable_at(deadline, now):
                return heaps[1][job.priority], (deadline,)
            return heaps[0][job.priority], (1, job.deadline if job.since is None
                                            else job.since)
        return heaps[0][job.priority], (0, deadline)

    @staticmethod
    def _lead(job: Job, lead: float) -> float:
        """Rule 3's lead for ``job``: its own (an interactive job's session setting), else
        the lane's ``lead``."""
        own = job.max_lead
        return lead if own is None or job.priority is not _INTERACTIVE else own

    def _waiting_key(self, job: Job, deadline: float, lead: float) -> tuple[float, float]:
        """A waiting head's key: when it becomes eligible (``deadline`` less its lead, the
        heap's order), then ``deadline`` itself."""
        return (deadline - self._lead(job, lead), deadline)

    def _too_far(self, deadline: float, now: float, lead: float) -> bool:
        """Rule 3: more than ``lead`` ahead (within the clock's resolution: not)."""
        return deadline - now > lead + _EPSILON + self.tolerance

    def _comfortable_at(self, deadline: float, now: float) -> bool:
        """Rule 2b: a playing listener holding at least ``protect_lead`` of audio."""
        return deadline - now >= self.protect_lead - _EPSILON

    @staticmethod
    def _push(heap: list[_Entry], key: tuple[float, ...], job: Job,
              entries: dict[Hashable, _Entry]) -> None:
        entry = _entry(key, job)
        heapq.heappush(heap, entry)
        entries[job.owner] = entry

    @staticmethod
    def _replace_top(heap: list[_Entry], key: tuple[float, ...],
                     entries: dict[Hashable, _Entry]) -> None:
        """The top entry's key moved later: replace it by a fresh entry under ``key``."""
        entry = heap[0]
        entry.live = False
        fresh = _entry(key, entry.job)
        entries[entry.job.owner] = fresh
        heapq.heapreplace(heap, fresh)

    def _fresh_top(self, heap: list[_Entry], now: float, lead: float | None, heaps: _Heaps,
                   entries: dict[Hashable, _Entry]) -> _Entry | None:
        """The top of ``heap`` (one of ``heaps``, whose owners' entries are ``entries``)
        once it is live, its deadline asked and it still belongs there: dead entries are
        dropped, and a head whose key moved is filed again until the top is fresh."""
        while heap:
            entry = heap[0]
            if not entry.live:
                heapq.heappop(heap)
                self._dead -= 1
                continue
            job = entry.job
            target, key = self._place(job, now, self._deadline(job, now), lead, heaps)
            if target is not heap:
                # Too far ahead now (rule 3), or its lead crossed ``protect_lead``.
                entry.live = False
                heapq.heappop(heap)
                self._push(target, key, job, entries)
                continue
            if key > entry.key:
                # Stale: it waited under an earlier rank. Re-file it and look again.
                self._replace_top(heap, key, entries)
                continue
            if key < entry.key:
                entry.key = key  # earlier, and at the top: the heap stays valid
            return entry
        return None

    def _refile(self, entry: _Entry, now: float, lead: float | None, heaps: _Heaps,
                entries: dict[Hashable, _Entry]) -> None:
        """File a waiting or comfortable head again under the deadline it was filed with,
        without asking ``deadline_of``: that key is never later than the true one, and the
        head is asked anyway before it runs (at the top of its heap). Asking here too cost
        a third of the calls: every step's job passes through here once."""
        if entry.live:
            entry.live = False
            job = entry.job
            self._push(*self._place(job, now, entry.key[-1], lead, heaps), job, entries)
        else:
            self._dead -= 1

    def _park(self, heap: list[_Entry], priority: Priority) -> None:
        """Rule 6: move the top of ``heap`` (fresh; the ready or comfortable heap of
        ``priority``) to its parked counterpart under the same key, until a stream ends
        (``_unpark``)."""
        parked = (self._parked if heap is self._heaps[priority]
                  else self._parked_comfortable)[priority]
        entry = heapq.heappop(heap)
        owner = entry.job.owner
        del self._entries[owner]
        self._promised.discard(owner)  # (a new head took the stream kept for it)
        heapq.heappush(parked, entry)
        self._blocked[owner] = entry

    def _unpark(self, now: float) -> None:
        """Rule 6: streams are free that no head filed already waits to take: file the
        best owners waiting for one again, one per free stream, in the order rules 2 and
        2b give (rule 3 is lifted while any waits, as in ``_decide``); a class only while
        fewer than its limit are open or kept (rule 6b). Only the top of the
        parked heaps is asked its deadline: re-filing every waiting owner at every stream
        that ended cost ~90 ``deadline_of`` calls per decision at 1,000 waiting owners
        (bench/SCHEDULER.md)."""
        parked = (self._parked, self._parked_comfortable, self._parked)  # (no lead: no waiting)
        for priority in _PRIORITIES:
            limit = self._streams_for(priority)  # (rule 6b: lower for the lower classes)
            if self._open + len(self._promised) >= limit:
                return
            ready, comfortable = self._parked[priority], self._parked_comfortable[priority]
            while comfortable and (not comfortable[0].live
                                   or not self._comfortable_at(comfortable[0].key[0], now)):
                self._refile(heapq.heappop(comfortable), now, None, parked, self._blocked)
            for heap, filed in ((ready, self._heaps[priority]),
                                (comfortable, self._comfortable[priority])):
                while (entry := self._fresh_top(heap, now, None, parked,
                                                 self._blocked)) is not None:
                    heapq.heappop(heap)
                    owner = entry.job.owner
                    del self._blocked[owner]
                    if owner in self._held:
                        continue  # its old step still runs: filed at ``release`` (rule 5)
                    heapq.heappush(filed, entry)
                    self._entries[owner] = entry
                    self._promised.add(owner)
                    if not self._blocked or self._open + len(self._promised) >= limit:
                        return  # (the lower classes' limits are no higher: rule 6b)

    def _reserve_taken(self, owner: Hashable) -> None:
        """``owner``'s job opened a stream while others were kept free for re-filed owners
        (``_promised``): its own, or one of theirs; one of them then takes its chance as
        any filed head (it waits again if it finds none free)."""
        if owner in self._promised:
            self._promised.discard(owner)
        elif self._open + len(self._promised) > (self.max_open or 0):
            self._promised.pop()

    def _closed(self, job: Job) -> None:
        """``job`` left the queue: if its stream was open, it is free (the next decision
        files a head waiting for one again, ``_unpark``)."""
        if job.opened:
            job.opened = False
            self._open -= 1

    def _push_head(self, job: Job) -> None:
        if self.policy is _FIFO:
            return
        entry = _entry(_UNKNOWN, job)
        self._entries[job.owner] = entry
        heapq.heappush(self._heaps[job.priority], entry)

    def _drop_entry(self, owner: Hashable) -> None:
        """Mark ``owner``'s entry dead where it lies in its heap (taking it out would cost a
        heap rebuild). It lets go of its job at once: a dead entry under a top that never
        drains (a lane that is never idle) held its finished job, and through it a closed
        session and its 1 MiB buffer, for as long as the lane stayed busy (probe B's soak:
        14 MB a minute). Once dead entries outnumber the jobs queued, the heaps are rebuilt
        without them: amortized O(1) per drop, and memory bounded by the queue."""
        entry = self._entries.pop(owner, None) or self._blocked.pop(owner, None)
        if entry is None:
            return
        entry.live = False
        del entry.job
        self._dead += 1
        if self._dead > _COMPACT_AFTER and self._dead > self._size:
            for heap in (*self._heaps, *self._comfortable, *self._waiting, *self._parked,
                         *self._parked_comfortable):
                heap[:] = [e for e in heap if e.live]
                heapq.heapify(heap)
            self._dead = 0
