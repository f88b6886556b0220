"""LaneScheduler rule 6 (open streams) and 6b (streams kept for interactive jobs) as a state
machine: Hypothesis submits, hands out, holds, releases, finishes, cancels and touches jobs
of a few owners on a fake clock (``now`` is a number) and checks the bound after every step
against a model of the lane (the jobs it was handed and has not finished or cancelled)."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gateway.core.scheduler import Job, LaneScheduler, Priority

OWNERS = ("a", "b", "c", "d", "e")


class Deadlines(dict):
    """The listener model (a fake): owner -> deadline; missing: the job's own deadline."""

    def __call__(self, job: Job, now: float) -> float:
        return self.get(job.owner, job.deadline)


class OpenStreams(RuleBasedStateMachine):
    @initialize(max_open=st.integers(1, 4), reserve=st.integers(0, 2),
                max_lead=st.sampled_from([None, 2.0]))
    def start(self, max_open: int, reserve: int, max_lead: float | None) -> None:
        self.deadlines = Deadlines()
        self.sched = LaneScheduler(deadline_of=self.deadlines, max_open=max_open,
                                   reserve=reserve, max_lead=max_lead)
        self.max_open = max_open
        self.background_max = max_open - min(reserve, max_open - 1)
        """Rule 6b: the most streams background and warm-up jobs may hold at once."""
        self.now = 0.0
        self.handed: set[int] = set()
        """``seq`` of the jobs handed out and neither finished nor cancelled: open streams
        (not ``id``: Hypothesis replays a run and must draw the same job from it)."""
        self.jobs: dict[int, Job] = {}
        self.held: dict[Hashable, Job] = {}

    @rule(owner=st.sampled_from(OWNERS), priority=st.sampled_from(list(Priority)),
          due=st.floats(0.0, 6.0))
    def submit(self, owner: str, priority: Priority, due: float) -> None:
        if owner in self.held and self.held[owner].cancelled:
            return  # (a new turn is a new owner: none submits beside a cancelled step)
        self.sched.submit(Job(owner=owner, priority=priority, deadline=self.now + due))

    @rule(hold=st.booleans())
    def next_job(self, hold: bool) -> None:
        sched = self.sched
        job = sched.next_job(self.now)
        if sched.max_lead is None or sched.streams_waiting:
            # every head eligible (rule 3 lifted while one waits for a stream): only rule 6
            # or a hold stop one
            runnable = [owner for owner in sched.owners() if owner not in self.held
                        and (self.free(sched.head(owner).priority)  # type: ignore[union-attr]
                             or sched.head(owner).opened)]  # type: ignore[union-attr]
            assert (job is None) == (not runnable), (runnable, job)
            # and priority first (rule 2), from the decision that finds a head waiting for
            # a stream on (it ran a lower class's step, rule 3 lifted one decision late)
            assert job is None or job.priority == min(
                sched.head(owner).priority for owner in runnable), (  # type: ignore[union-attr]
                runnable, job)
        if sched.streams_waiting:
            # a stream ended files one owner waiting for it again, not all (``_unpark``):
            # every free stream has a head not started filed (a candidate) to take it; a
            # reserved one (rule 6b), an interactive head: no interactive owner waits while
            # a stream is free
            blocked = [entry.job.priority for entry in sched._blocked.values()]
            filed = [entry.job.priority for entry in sched._entries.values()
                     if entry.live and not entry.job.opened]
            if Priority.INTERACTIVE in blocked:
                assert sched.open_streams + filed.count(Priority.INTERACTIVE) >= self.max_open
                # and each of them is kept for an owner filed for it (``_promised``): none
                # idles, nor is promised twice
                assert sched.open_streams + len(sched._promised) == self.max_open
            assert sched.open_streams + len(filed) >= self.background_max
        if job is None:
            return
        assert job.owner not in self.held and sched.head(job.owner) is job  # rules 1, 5
        self.handed.add(job.seq)
        self.jobs[job.seq] = job
        job.steps += 1
        # its listener now holds some audio (deadlines only move later untouched)
        self.deadlines[job.owner] = max(self.deadlines.get(job.owner, job.deadline),
                                        self.now) + 0.3
        if hold:
            sched.hold(job)
            self.held[job.owner] = job

    def free(self, priority: Priority) -> bool:
        """A job of ``priority`` not started yet may open a stream now (rules 6, 6b)."""
        bound = self.max_open if priority is Priority.INTERACTIVE else self.background_max
        return self.sched.open_streams < bound

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(self.held)))
        job = self.held.pop(owner)
        self.sched.release(job)
        if job.cancelled:  # its step returned: the lane closes its stream now
            self.handed.discard(job.seq)

    @precondition(lambda self: any(not self.jobs[i].cancelled for i in self.handed))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        job = self.jobs[data.draw(st.sampled_from(
            sorted(i for i in self.handed if not self.jobs[i].cancelled)))]
        self.sched.finish(job)
        self.handed.discard(job.seq)
        if self.held.get(job.owner) is job:  # its step ended: the lane releases it
            self.sched.release(self.held.pop(job.owner))
        self.deadlines.pop(job.owner, None)  # its next sentence starts a new stream

    @rule(owner=st.sampled_from(OWNERS))
    def fail_queued(self, owner: str) -> None:
        """An unhealthy lane fails a head not handed out (``Lane._fail_queued``)."""
        head = self.sched.head(owner)
        if head is not None and head.seq not in self.handed:
            self.sched.finish(head)

    @rule(owner=st.sampled_from(OWNERS))
    def cancel(self, owner: str) -> None:
        for job in self.sched.cancel(owner):
            if self.held.get(owner) is not job:  # (a step in flight: open until ``release``)
                self.handed.discard(job.seq)
        self.deadlines.pop(owner, None)

    @rule(owner=st.sampled_from(OWNERS), earlier=st.floats(0.0, 1.0))
    def touch(self, owner: str, earlier: float) -> None:
        """A playback report: the listener holds less audio than estimated."""
        if owner in self.deadlines:
            self.deadlines[owner] -= earlier
        self.sched.touch(owner)

    @rule(seconds=st.floats(0.0, 1.0))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def open_streams_are_the_jobs_handed_out_and_not_ended(self) -> None:
        assert self.sched.open_streams == len(self.handed)
        assert self.sched.open_streams <= self.sched.max_open  # type: ignore[operator]
        assert all(self.jobs[i].opened for i in self.handed)

    @invariant()
    def background_never_holds_the_reserved_streams(self) -> None:
        """Rule 6b: background and warm-up jobs hold at most ``max_open - reserve``."""
        lower = sum(self.jobs[i].priority is not Priority.INTERACTIVE for i in self.handed)
        assert lower <= self.background_max

    @invariant()
    def no_owner_is_lost(self) -> None:
        """Every owner with jobs is a candidate (its head filed in a heap), held, or waits
        for a stream (rule 6) with its head."""
        sched = self.sched
        for owner in sched.owners():
            head = sched.head(owner)
            entry = sched._entries.get(owner)
            filed = entry is not None and entry.live and entry.job is head
            parked = sched._blocked.get(owner)
            waits = parked is not None and parked.live and parked.job is head
            assert filed or owner in self.held or waits, owner
            assert not (filed and parked), owner  # filed once (rule 1)
        # and only those wait: ``streams_waiting`` (/health) counts owners with a head
        assert all(sched.head(owner) is entry.job for owner, entry in sched._blocked.items())
        # each in the parked heap of its class, live once
        parked = [entry for heaps in (sched._parked, sched._parked_comfortable)
                  for heap in heaps for entry in heap if entry.live]
        assert sorted(map(id, parked)) == sorted(map(id, sched._blocked.values()))

    @invariant()
    def streams_kept_are_for_owners_filed_for_them(self) -> None:
        """Rule 6: each free stream kept (``_promised``) is one an owner filed for it has
        not opened yet: a candidate, neither waiting nor held, its head not started. A
        stream kept for nobody idles while owners wait (the next stream that ends files
        one fewer); one kept twice files more owners than streams are free."""
        sched = self.sched
        for owner in sched._promised:
            entry = sched._entries.get(owner)
            assert entry is not None and entry.live and entry.job is sched.head(owner), owner
            assert not entry.job.opened and owner not in sched._blocked, owner
            assert owner not in self.held, owner
        assert sched.open_streams + len(sched._promised) <= self.max_open

    @invariant()
    def dead_entries_are_counted(self) -> None:
        """``_dead`` counts the dead entries in the heaps exactly: it decides when they
        are compacted (too often: a rebuild per drop; never: they pile up)."""
        sched = self.sched
        assert sched._dead == sum(not entry.live for heaps in (
            sched._heaps, sched._comfortable, sched._waiting, sched._parked,
            sched._parked_comfortable) for heap in heaps for entry in heap)


TestOpenStreams = OpenStreams.TestCase
TestOpenStreams.settings = settings(max_examples=150, stateful_step_count=40)
