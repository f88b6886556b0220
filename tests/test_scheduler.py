"""LaneScheduler rules, one table row per rule, with a fake clock (``now`` is a number)."""

from __future__ import annotations

import math
import random

import pytest

from gateway.core.scheduler import (
    Job,
    LanePolicy,
    LaneScheduler,
    Priority,
    Rank,
    default_reserve,
    step_ms,
)

IA, B, W = Priority.INTERACTIVE, Priority.BACKGROUND, Priority.WARMUP


class Deadlines(dict):
    """The listener model of a test: owner -> deadline; missing: the job's own deadline."""

    def __call__(self, job: Job, now: float) -> float:
        return self.get(job.owner, job.deadline)


def make(jobs: list[tuple[str, Priority, float]], **kw) -> tuple[LaneScheduler, dict[str, Job]]:
    """A scheduler whose deadline_of reads a mutable table ``deadlines[owner]`` (the
    listener model of a test), falling back to the job's own deadline."""
    sched = LaneScheduler(deadline_of=Deadlines(), **kw)
    by_name: dict[str, Job] = {}
    for i, (owner, prio, deadline) in enumerate(jobs):
        job = Job(owner=owner, priority=prio, deadline=deadline, payload=f"{owner}{i}")
        sched.submit(job)
        by_name.setdefault(owner, job)
    return sched, by_name


@pytest.mark.parametrize(("rule", "jobs", "now", "expected"), [
    ("priority beats deadline", [("bg", B, 0.0), ("hub", IA, 9.0)], 0.0, "hub"),
    ("warm-up comes last", [("warm", W, 0.0), ("bg", B, 5.0)], 0.0, "bg"),
    ("earliest deadline within a class",
     [("a", IA, 3.0), ("b", IA, 1.0), ("c", IA, 2.0)], 0.0, "b"),
    ("arrival breaks a tie", [("a", IA, 1.0), ("b", IA, 1.0)], 0.0, "a"),
    ("nothing queued", [], 0.0, None),
])
def test_choice(rule: str, jobs, now: float, expected: str | None) -> None:
    sched, _ = make(jobs)
    job = sched.next_job(now)
    assert (job.owner if job else None) == expected, rule


def test_equal_deadlines_run_in_arrival_order() -> None:
    """Rule 2's last tie-break holds for a crowd, not just a pair: eight turns due at the
    same instant (a burst of sessions) get the lane in the order they were submitted."""
    owners = [f"s{i}" for i in range(8)]
    sched, _ = make([(owner, IA, 1.0) for owner in owners])
    order = []
    while (job := sched.next_job(0.0)) is not None:
        order.append(job.owner)
        sched.finish(job)
    assert order == owners


def test_without_a_listener_model_the_jobs_own_deadlines_rule() -> None:
    """No ``deadline_of`` (an app rendering files): rules 2 and 3 go by ``Job.deadline``."""
    sched = LaneScheduler(max_lead=1.0)
    sched.submit(Job(owner="later", priority=IA, deadline=3.0))
    sched.submit(Job(owner="sooner", priority=IA, deadline=0.5))
    job = sched.next_job(0.0)
    assert job is not None and job.owner == "sooner"
    sched.finish(job)
    assert sched.next_job(0.0) is None and sched.next_eligible_at == 2.0


def test_deadline_of_is_asked_at_the_decision_time() -> None:
    """``deadline_of(job, now)`` gets the ``now`` of the decision (a listener model reads
    its playback clock from it), for ready and waiting heads alike."""
    asked: list[float] = []

    def deadline_of(job: Job, now: float) -> float:
        asked.append(now)
        return job.deadline

    sched = LaneScheduler(deadline_of=deadline_of, max_lead=1.0)
    sched.submit(Job(owner="due", priority=IA, deadline=0.5))
    sched.submit(Job(owner="ahead", priority=IA, deadline=5.0))
    for now in (0.25, 0.5):
        job = sched.next_job(now)
        assert job is not None and job.owner == "due"
    sched.finish(job)
    assert sched.next_job(0.75) is None and sched.next_eligible_at == 4.0
    assert asked and set(asked) <= {0.25, 0.5, 0.75} and 0.75 in asked


def test_one_owner_runs_in_order_even_against_its_own_deadlines() -> None:
    sched, _ = make([("t", IA, 5.0), ("t", IA, 0.0), ("u", IA, 3.0)])
    first = sched.next_job(0.0)
    assert first is not None and first.owner == "u"  # only t's head (deadline 5) competes
    sched.finish(first)
    head = sched.next_job(0.0)
    assert head is not None and head.payload == "t0"
    sched.finish(head)
    assert sched.next_job(0.0).payload == "t1"  # type: ignore[union-attr]


def test_dynamic_deadline_is_asked_again() -> None:
    sched, _ = make([("a", IA, 0.0), ("b", IA, 1.0)])
    assert sched.next_job(0.0).owner == "a"  # type: ignore[union-attr]
    sched.deadline_of["a"] = 2.0  # type: ignore[index]  # a's step gave its listener audio
    assert sched.next_job(0.1).owner == "b"  # type: ignore[union-attr]


def test_a_head_whose_deadline_moved_earlier_is_ranked_by_it() -> None:
    """The head at the top is asked again at every decision: a deadline that moved earlier
    there (its listener holds less than estimated) keeps it ahead of a newcomer due later."""
    sched, _ = make([("a", IA, 10.0)])
    assert sched.next_job(0.0).owner == "a"  # type: ignore[union-attr]
    sched.deadline_of["a"] = 1.0  # type: ignore[index]
    assert sched.next_job(0.0).owner == "a"  # type: ignore[union-attr]
    sched.submit(Job(owner="b", priority=IA, deadline=2.0))
    assert sched.next_job(0.0).owner == "a"  # type: ignore[union-attr]


def test_earlier_deadline_needs_touch() -> None:
    sched, _ = make([("a", IA, 1.0), ("b", IA, 2.0)])
    assert sched.next_job(0.0).owner == "a"  # type: ignore[union-attr]
    sched.deadline_of["b"] = 0.5  # type: ignore[index]  # a playback report: b holds less
    sched.touch("b")
    assert sched.next_job(0.0).owner == "b"  # type: ignore[union-attr]


def test_a_touched_head_is_handed_out_once() -> None:
    """``touch`` files the owner's head again: the old filing must die with it, or the job
    comes back from it after ``finish`` (a sentence synthesized twice)."""
    sched, jobs = make([("a", IA, 1.0), ("b", IA, 2.0)])
    sched.touch("a")
    assert sched.next_job(0.0) is jobs["a"]
    sched.finish(jobs["a"])
    assert sched.next_job(0.0) is jobs["b"]
    sched.finish(jobs["b"])
    assert sched.next_job(0.0) is None and len(sched) == 0


@pytest.mark.parametrize(("rule", "jobs", "now", "expected", "eligible_at"), [
    ("within max_lead runs", [("a", IA, 0.4)], 0.0, "a", None),
    ("exactly max_lead runs", [("a", IA, 1.0)], 0.5, "a", None),
    ("too far ahead yields", [("a", IA, 2.0)], 0.0, None, 1.5),
    ("earliest wake of all classes", [("a", IA, 3.0), ("bg", B, 2.0)], 0.0, None, 1.5),
    ("background takes the lane a session yields",
     [("a", IA, 3.0), ("bg", B, 0.0)], 0.0, "bg", None),
    ("first audio is due now", [("a", IA, 0.0)], 0.0, "a", None),
])
def test_just_in_time(rule, jobs, now, expected, eligible_at) -> None:
    sched, _ = make(jobs, max_lead=0.5)
    job = sched.next_job(now)
    assert (job.owner if job else None) == expected, rule
    assert sched.next_eligible_at == eligible_at, rule


def test_just_in_time_wakes_when_the_listener_catches_up() -> None:
    sched, _ = make([("a", IA, 2.0)], max_lead=0.5)
    assert sched.next_job(0.0) is None
    assert sched.next_job(sched.next_eligible_at).owner == "a"  # type: ignore[arg-type,union-attr]


def test_a_waiting_job_whose_listener_gained_audio_wakes_later() -> None:
    """A waiting head's deadline that moved later (its listener holds more) moves
    ``next_eligible_at`` with it: the lane is not woken for a job still too far ahead."""
    sched, _ = make([("a", IA, 5.0)], max_lead=1.0)
    assert sched.next_job(0.0) is None and sched.next_eligible_at == 4.0
    sched.deadline_of["a"] = 8.0  # type: ignore[index]
    assert sched.next_job(0.5) is None and sched.next_eligible_at == 7.0
    assert sched.next_job(7.0).owner == "a"  # type: ignore[union-attr]


@pytest.mark.parametrize(("rule", "own", "priority", "now", "expected", "eligible_at"), [
    # the lane's lead is 1 s; a session may ask for more or less (its max_lead_ms)
    ("a longer lead of its own runs further ahead", 5.0, IA, 0.0, "a", None),
    ("the lane's lead holds it back", None, IA, 0.0, None, 2.0),
    ("a shorter lead of its own holds it back longer", 0.5, IA, 0.0, None, 2.5),
    ("... and it runs once that lead is reached", 0.5, IA, 2.5, "a", None),
    ("only interactive jobs carry one", 5.0, B, 0.0, None, 2.0),
])
def test_a_job_may_carry_its_own_lead(rule, own, priority, now, expected, eligible_at) -> None:
    sched = LaneScheduler(deadline_of=Deadlines(), max_lead=1.0)
    sched.submit(Job(owner="a", priority=priority, deadline=3.0, max_lead=own))
    if priority is not IA:
        sched.submit(Job(owner="hub", priority=IA, deadline=100.0))  # shared: paced
    job = sched.next_job(now)
    assert (job.owner if job else None) == expected, rule
    assert sched.next_eligible_at == eligible_at, rule


def test_waiting_jobs_with_their_own_leads_become_eligible_in_order() -> None:
    # the waiting heap goes by when a job becomes eligible, not by its deadline
    sched = LaneScheduler(deadline_of=Deadlines(), max_lead=1.0)
    sched.submit(Job(owner="late", priority=IA, deadline=10.0, max_lead=9.0))  # from 1.0
    sched.submit(Job(owner="early", priority=IA, deadline=5.0, max_lead=0.5))  # from 4.5
    sched.submit(Job(owner="lane", priority=IA, deadline=4.0))  # from 3.0
    order = []
    now = 0.0
    while len(order) < 3:
        job = sched.next_job(now)
        if job is None:
            now = sched.next_eligible_at  # type: ignore[assignment]
            continue
        order.append((job.owner, now))
        sched.finish(job)
    assert order == [("late", 1.0), ("lane", 3.0), ("early", 4.5)]


def test_a_waiting_job_with_its_own_lead_is_never_juggled_at_the_boundary() -> None:
    """At ``deadline - now`` within a rounding error of ``lead + tolerance``, the test that
    takes a head out of the waiting heap and the one that files it there must agree: once
    they were ``(d - lead) - now`` and ``d - now - lead``, which round differently here,
    and the lane re-filed the same head for ever."""
    now, lead, deadline = 3506.071928518442, 0.3, 3506.391928519442
    sched = LaneScheduler(deadline_of=Deadlines(), max_lead=1.0, tolerance=0.02)
    sched.submit(Job(owner="a", priority=IA, deadline=deadline, max_lead=lead))
    assert sched.next_job(now - 1.0) is None  # filed as waiting
    job = sched.next_job(now)  # returns (it did not)
    assert (job is None) == (sched.next_eligible_at is not None)


@pytest.mark.parametrize(("rule", "tolerance", "now", "expected", "eligible_at"), [
    # deadline 1.0 + 1 µs, max_lead 0.5: eligible from 0.5 + 1 µs. A lane woken at 0.5 by a
    # clock that moves in 1 ms steps (uvloop) would find it early and ask again, spinning.
    ("exact: a microsecond early is not eligible", 0.0, 0.5, None, 0.5 + 1e-6),
    ("tolerance: a microsecond early is eligible", 0.001, 0.5, "a", None),
    ("tolerance: most of a clock tick early is eligible", 0.001, 0.4991, "a", None),
    ("tolerance: further than a tick still yields", 0.001, 0.498, None, 0.5 + 1e-6),
])
def test_just_in_time_tolerance(rule, tolerance, now, expected, eligible_at) -> None:
    sched, _ = make([("a", IA, 1.0 + 1e-6)], max_lead=0.5)
    sched.tolerance = tolerance
    job = sched.next_job(now)
    assert (job.owner if job else None) == expected, rule
    if eligible_at is None:
        assert sched.next_eligible_at is None, rule
    else:
        assert sched.next_eligible_at == pytest.approx(eligible_at, abs=1e-12), rule


@pytest.mark.parametrize(("rule", "cancel", "expected_next", "expected_len"), [
    ("queued jobs go at once", "a", "b", 1),
    ("unknown owner is a no-op", "zzz", "a", 3),
])
def test_cancel(rule, cancel, expected_next, expected_len) -> None:
    sched, _ = make([("a", IA, 0.0), ("a", IA, 0.0), ("b", IA, 1.0)])
    dropped = sched.cancel(cancel)
    assert all(j.cancelled for j in dropped), rule
    assert len(sched) == expected_len, rule
    assert sched.next_job(0.0).owner == expected_next, rule  # type: ignore[union-attr]
    assert cancel not in sched.owners(), rule


def test_cancel_of_the_running_job_marks_it_for_the_step_boundary() -> None:
    sched, _ = make([("a", IA, 0.0), ("b", IA, 1.0)])
    running = sched.next_job(0.0)
    assert running is not None
    running.running = True
    assert sched.cancel("a") == [running] and running.cancelled
    sched.finish(running)  # the lane drops it after its step: a no-op for the queue
    assert len(sched) == 1 and sched.next_job(0.0).owner == "b"  # type: ignore[union-attr]


def test_a_held_owner_is_no_candidate_until_its_step_returns() -> None:
    """Rule 5: on a lane running several steps at once, the job whose step runs is held:
    the next decision hands out another owner's, never a second step of the same owner
    (touched, or its job finished meanwhile); ``release`` makes its head a candidate."""
    sched, _ = make([("a", IA, 0.0), ("a", IA, 0.5), ("b", IA, 1.0)])
    first = sched.next_job(0.0)
    assert first is not None and first.owner == "a"
    sched.hold(first)
    sched.touch("a")  # (a playback mark while its step runs)
    other = sched.next_job(0.0)
    assert other is not None and other.owner == "b"
    sched.hold(other)
    assert sched.next_job(0.0) is None
    sched.finish(first)  # its last step: the owner's next job waits for the release
    assert sched.next_job(0.0) is None
    sched.release(first)
    second = sched.next_job(0.0)
    assert second is not None and second.owner == "a" and second is not first
    sched.release(other)  # a step that did not finish its job: it is a candidate again
    assert sched.cancel("a") == [second]
    assert sched.next_job(0.0) is other
    sched.hold(other)
    assert sched.cancel("b") == [other]  # cancelled while its step runs
    sched.release(other)  # the step returns for an owner with nothing left
    assert sched.next_job(0.0) is None and len(sched) == 0


def test_finish_then_resubmit_same_owner() -> None:
    sched, jobs = make([("a", IA, 0.0)])
    sched.finish(jobs["a"])
    assert len(sched) == 0 and sched.owners() == [] and sched.next_job(0.0) is None
    again = Job(owner="a", priority=IA, deadline=0.0)
    sched.submit(again)
    assert sched.next_job(0.0) is again


def reference_rank(rank: Rank, job: Job, due: float, now: float) -> tuple[float, float]:
    """Rules 2 and 2b written out plainly (``due``: the deadline, in the past when overdue)."""
    if rank is Rank.STREAM_AGE and job.priority is IA and (job.steps or job.since is not None):
        if due - now >= 0.4:  # protect_lead: holds enough, waits behind the short ones
            return (2, due)
        return (1, job.deadline if job.since is None else job.since)
    return (0, due)


@pytest.mark.parametrize("rank", list(Rank))
def test_matches_a_brute_force_reference(rank: Rank) -> None:
    """Random submissions, finishes, cancels, steps and deadline moves (later only, as
    listeners gain audio): the heaps give the same answer as scanning every head."""
    rng = random.Random(7)
    deadlines: dict[int, float] = {}
    sched = LaneScheduler(deadline_of=lambda j, now: deadlines[j.owner], max_lead=1.0,
                          rank=rank)
    queues: dict[int, list[Job]] = {}
    now = 0.0
    for _ in range(3000):
        now += rng.random() * 0.05
        op = rng.random()
        if op < 0.35:
            owner = rng.randrange(40)
            since = rng.choice([None, rng.random() * now])
            job = Job(owner=owner, priority=Priority(rng.randrange(3)), deadline=now,
                      since=since)
            deadlines.setdefault(owner, now + rng.random() * 2)
            sched.submit(job)
            queues.setdefault(owner, []).append(job)
        elif op < 0.45 and queues:
            owner = rng.choice(list(queues))
            assert sched.cancel(owner) == queues.pop(owner)
        got = sched.next_job(now)
        heads = [(q[0].priority, reference_rank(rank, q[0], deadlines[o], now), q[0].seq,
                  deadlines[o]) for o, q in queues.items()]
        # background is held to max_lead only while interactive work is queued (rule 3)
        shared = any(j.priority is IA for q in queues.values() for j in q)
        paced = [h for h in heads if shared or h[0] is IA]
        eligible = [h for h in heads if h[3] - now <= 1.0 or h not in paced]
        if not eligible:
            assert got is None
            later = [h[3] - 1.0 for h in paced]
            assert sched.next_eligible_at == pytest.approx(min(later)) if later else \
                sched.next_eligible_at is None
            continue
        best = min(eligible, key=lambda h: h[:3])
        assert got is not None
        # overdue heads too: the most overdue first (deadlines do not slide with the clock)
        assert (got.priority, reference_rank(rank, got, deadlines[got.owner], now)) == best[:2]
        got.steps += 1
        if rng.random() < 0.5:  # the step produced the last chunk
            sched.finish(got)
            queues[got.owner].pop(0)
            if not queues[got.owner]:
                del queues[got.owner]
                del deadlines[got.owner]
        else:  # the step gave its listener audio: the deadline moves later
            deadlines[got.owner] = max(now, deadlines[got.owner]) + rng.random() * 0.4
        assert len(sched) == sum(len(q) for q in queues.values())
        assert sched._dead == dead_entries(sched)  # (they bound the heaps: compaction)


def dead_entries(sched: LaneScheduler) -> int:
    """Entries dead in the heaps: ``_dead`` must count them exactly, or the heaps are
    compacted too often, or never (a lane never idle then holds every one of them)."""
    return sum(not entry.live for heaps in (sched._heaps, sched._comfortable, sched._waiting,
                                            sched._parked, sched._parked_comfortable)
               for heap in heaps for entry in heap)


# ---- the FIFO policy (the old sidecar) ----------------------------------------------------


def test_fifo_runs_the_first_owner_to_the_end_whatever_the_priority() -> None:
    sched, _ = make([("bg", B, 9.0), ("bg", B, 9.0), ("hub", IA, 0.0)],
                    policy=LanePolicy.FIFO, max_lead=1.0)
    order = []
    while (job := sched.next_job(0.0)) is not None:
        order.append(job.payload)
        sched.finish(job)
    assert order == ["bg0", "bg1", "hub2"]  # max_lead and priority ignored
    assert sched.next_eligible_at is None


def test_fifo_holder_keeps_the_lane_for_a_job_submitted_from_on_done() -> None:
    sched, jobs = make([("bg", B, 0.0), ("hub", IA, 0.0)], policy=LanePolicy.FIFO)
    first = sched.next_job(0.0)
    assert first is jobs["bg"]
    sched.finish(first)  # the lane finishes the job, then the sink submits the next segment
    nxt = Job(owner="bg", priority=B, deadline=0.0, payload="bg-next")
    sched.submit(nxt)
    assert sched.next_job(0.0) is nxt
    sched.finish(nxt)
    assert sched.next_job(0.0) is jobs["hub"]  # bg had nothing when the lane asked
    late = Job(owner="bg", priority=B, deadline=0.0)
    sched.submit(late)
    assert sched.next_job(0.0) is jobs["hub"]  # bg lost its turn: behind hub now


def test_fifo_after_idle_and_cancel_goes_by_arrival() -> None:
    sched, jobs = make([("a", IA, 0.0)], policy=LanePolicy.FIFO)
    sched.finish(sched.next_job(0.0))
    assert sched.next_job(0.0) is None
    b = Job(owner="b", priority=B, deadline=0.0)
    a = Job(owner="a", priority=IA, deadline=0.0)
    sched.submit(b)
    sched.submit(a)
    assert sched.next_job(0.0) is b  # a held the lane last, but b arrived first
    assert sched.cancel("b") == [b] and b.cancelled
    assert sched.next_job(0.0) is a
    sched.touch("a")  # harmless under FIFO
    assert sched.next_job(0.0) is a and len(sched) == 1


def test_fifo_counts_the_stream_it_keeps_open() -> None:
    """A FIFO lane opens one stream at a time and says so: ``open_streams`` (/health,
    /metrics) read 0 while its generation ran, as if nothing held the device's memory."""
    sched, jobs = make([("a", IA, 0.0), ("b", B, 0.0)], policy=LanePolicy.FIFO)
    assert sched.open_streams == 0
    assert sched.next_job(0.0) is jobs["a"] and sched.open_streams == 1
    assert sched.next_job(0.0) is jobs["a"] and sched.open_streams == 1  # its next step
    sched.finish(jobs["a"])
    assert sched.open_streams == 0
    assert sched.next_job(0.0) is jobs["b"] and sched.open_streams == 1
    assert sched.cancel("b") == [jobs["b"]] and sched.open_streams == 0


def test_overdue_heads_cost_a_few_questions_per_decision() -> None:
    """1,000 starved listeners (deadlines in the past, fixed: they ran dry then). Each
    decision serves the most overdue, whose deadline then moves past the others'. The
    scheduler must not ask every head again at every decision as the clock moves."""
    asked = 0
    deadlines = {i: -1.0 + i / 1000 for i in range(1000)}

    def deadline_of(job: Job, now: float) -> float:
        nonlocal asked
        asked += 1
        return deadlines[job.owner]

    sched = LaneScheduler(deadline_of=deadline_of, max_lead=1.0)
    for i in range(1000):
        sched.submit(Job(owner=i, priority=IA, deadline=0.0))
    asked = 0
    now, served = 0.0, []
    for _ in range(2000):
        now += 0.0005
        job = sched.next_job(now)
        assert job is not None
        served.append(job.owner)
        deadlines[job.owner] += 1.0  # its step gave the listener a second of audio
    assert served == list(range(1000)) * 2  # most overdue first
    assert asked < 5 * 2000


@pytest.mark.parametrize(("rule", "priority", "expected"), [
    ("voice keeps the engine's own step", IA, None),
    ("background work takes one codec frame per step", B, 80.0),
    ("warm-up too", W, 80.0),
])
def test_step_size_per_class(rule, priority, expected) -> None:
    assert step_ms(priority) == expected, rule


# ---- rule 2b: playing listeners, oldest stream first ---------------------------------------


def stream(owner: str, submitted: float, due: float, *, steps: int = 0,
           since: float | None = None, priority: Priority = IA) -> tuple[Job, float]:
    """A head job: submitted at ``submitted`` (its first-audio deadline), ``steps`` run so
    far, its listener due at ``due``."""
    return Job(owner=owner, priority=priority, deadline=submitted, steps=steps,
               since=since), due


@pytest.mark.parametrize(("rule", "heads", "now", "age", "edf"), [
    ("first audio of a new stream goes first (due now)",
     [stream("old", 0.0, 1.5, steps=3), stream("new", 1.0, 1.0)], 1.0, "new", "new"),
    ("playing, short of protect_lead: the oldest stream first, whatever its deadline",
     [stream("old", 0.0, 1.5, steps=3), stream("young", 1.0, 1.3, steps=1)], 1.2, "old",
     "young"),
    ("a playing stream holding protect_lead waits behind one short of it",
     [stream("old", 0.0, 1.8, steps=3), stream("young", 1.0, 1.5, steps=1)], 1.2, "young",
     "young"),
    ("holding protect_lead or more: earliest deadline among them",
     [stream("old", 0.0, 2.1, steps=3), stream("young", 1.0, 1.7, steps=1)], 1.2, "young",
     "young"),
    ("holding exactly protect_lead is not short of it",
     [stream("old", 0.0, 1.6, steps=3), stream("young", 1.0, 1.5, steps=1)], 1.2, "young",
     "young"),
    ("a later segment ranks by its stream's start",
     [stream("seg2", 5.0, 5.3, since=0.0), stream("young", 1.0, 5.2, steps=2)], 5.0, "seg2",
     "young"),
    ("an old stream max_lead ahead yields to a younger one",
     [stream("old", 0.0, 3.5, steps=9), stream("young", 1.0, 2.2, steps=1)], 2.0, "young",
     "young"),
    ("background stays earliest deadline first",
     [stream("bg1", 0.0, 1.4, steps=5, priority=B), stream("bg2", 1.0, 1.1, steps=1,
                                                           priority=B)], 1.0, "bg2", "bg2"),
])
def test_playing_listeners_oldest_stream_first(rule, heads, now, age, edf) -> None:
    for rank, expected in ((Rank.STREAM_AGE, age), (Rank.DEADLINE, edf)):
        dues = Deadlines()
        sched = LaneScheduler(deadline_of=dues, max_lead=1.0, rank=rank)
        for job, due in heads:
            dues[job.owner] = due
            sched.submit(job)
        job = sched.next_job(now)
        assert (job.owner if job else None) == expected, (rule, rank)


def test_a_stream_turns_playing_after_its_first_step() -> None:
    """Before its first step a job is first audio (by deadline); after it, it ranks by its
    stream's start: behind an older playing stream (both short of ``protect_lead``) even
    with an earlier deadline."""
    dues = Deadlines(old=0.8, new=0.0)
    sched = LaneScheduler(deadline_of=dues, max_lead=1.0)
    sched.submit(Job(owner="old", priority=IA, deadline=0.0, steps=2))
    new = Job(owner="new", priority=IA, deadline=0.5)
    sched.submit(new)
    assert sched.next_job(0.5) is new  # its first audio
    new.steps += 1
    dues["new"] = 0.7  # its listener now holds less than old's
    assert sched.next_job(0.5).owner == "old"  # type: ignore[union-attr]


# ---- rule 3 for background work: paced only while the lane is shared ----------------------


@pytest.mark.parametrize(("rule", "jobs", "llm", "always", "expected", "eligible_at"), [
    ("alone, a background job far ahead runs flat out", [("bg", B, 5.0)], 0, False, "bg",
     None),
    ("an LLM decoding: it is paced", [("bg", B, 5.0)], 1, False, None, 4.0),
    ("interactive work queued (itself just in time): paced",
     [("bg", B, 5.0), ("hub", IA, 3.0)], 0, False, None, 2.0),
    ("pace_background_always: paced alone too", [("bg", B, 5.0)], 0, True, None, 4.0),
    ("warm-up follows background", [("warm", W, 5.0)], 0, False, "warm", None),
    # a voice session waiting for a resume asks for nothing (Session.deadline: inf) for up
    # to its resume window: its queued turn does not share the lane
    ("only a session waiting for a resume queued: flat out",
     [("bg", B, 5.0), ("detached", IA, math.inf)], 0, False, "bg", None),
    ("a session waiting for a resume, and a listening one: paced",
     [("bg", B, 5.0), ("detached", IA, math.inf), ("hub", IA, 3.0)], 0, False, None, 2.0),
])
def test_background_is_paced_only_while_the_lane_is_shared(rule, jobs, llm, always, expected,
                                                          eligible_at) -> None:
    sched, _ = make(jobs, max_lead=1.0, pace_background_always=always)
    sched.llm_decoding = llm
    job = sched.next_job(0.0)
    assert (job.owner if job else None) == expected, rule
    assert sched.next_eligible_at == eligible_at, rule


def test_background_held_back_runs_once_the_interactive_turn_is_done() -> None:
    sched, jobs = make([("hub", IA, 3.0), ("bg", B, 5.0)], max_lead=1.0)
    assert sched.next_job(0.0) is None  # both ahead of their listeners
    sched.finish(jobs["hub"])
    assert sched.next_job(0.0) is jobs["bg"]  # alone again: flat out


def test_a_comfortable_stream_becomes_protected_as_its_listener_plays() -> None:
    """Above ``protect_lead`` the old stream waits behind a younger one short of it; as time
    passes its lead drops below, and it is first again (no touch needed)."""
    dues = Deadlines(old=1.0, young=0.5)
    sched = LaneScheduler(deadline_of=dues, max_lead=1.0, protect_lead=0.4)
    sched.submit(Job(owner="old", priority=IA, deadline=0.0, steps=4))
    sched.submit(Job(owner="young", priority=IA, deadline=0.2, steps=1))
    assert sched.next_job(0.3).owner == "young"  # type: ignore[union-attr]  # old holds 0.7
    dues["young"] = 0.75  # young ran a step
    assert sched.next_job(0.65).owner == "old"  # type: ignore[union-attr]  # old holds 0.35


@pytest.mark.timeout(20)  # the bug was a livelock: fail, do not hang the suite
@pytest.mark.parametrize("now", [0.6, 0.6 - 1e-10, 0.6 + 1e-10, 0.6 - 2e-9, 0.6 + 2e-9])
def test_a_listener_exactly_at_protect_lead_is_decided_not_juggled(now) -> None:
    """At ``deadline - now == protect_lead`` (within float error) the test that takes a head
    out of the comfortable heap and the one that files it there must not both hold: they
    did once, and the lane re-filed the same head forever (the loop froze at 400 sessions)."""
    sched, jobs = make([("a", IA, 1.0)], protect_lead=0.4)
    jobs["a"].steps = 1  # playing
    assert sched.next_job(0.0) is jobs["a"]  # 1 s ahead: comfortable, and alone
    assert sched.next_job(now) is jobs["a"]


def test_a_lane_that_never_drains_holds_neither_dead_entries_nor_their_jobs() -> None:
    """Jobs finished or cancelled while another stays at the top (a lane never idle): their
    entries die where they lie. They used to keep their jobs, and through them closed
    sessions, until the heap drained; now they let go at once and are compacted away."""
    import gc
    import weakref

    class Payload:  # stands for a session's sink
        pass

    sched = LaneScheduler(deadline_of=Deadlines())
    sched.submit(Job(owner="hub", priority=IA, deadline=0.0, payload="hub"))
    freed = []
    gc.disable()  # reference counting alone must free them
    try:
        for i in range(1000):
            payload = Payload()
            freed.append(weakref.ref(payload))
            job = Job(owner=f"s{i}", priority=IA, deadline=10.0 + i, payload=payload)
            sched.submit(job)
            del payload
            assert sched.next_job(0.0).owner == "hub"  # type: ignore[union-attr]
            if i % 2:  # (its entry is filed under the hub's now)
                sched.cancel(f"s{i}")
            else:
                sched.finish(job)
            del job
        assert all(ref() is None for ref in freed)
        assert sum(map(len, (*sched._heaps, *sched._comfortable, *sched._waiting))) <= 66
    finally:
        gc.enable()


def test_head_is_an_owners_first_job_running_or_not_and_none_once_it_has_none() -> None:
    """``head``: what a lane that turned unhealthy looks at to fail an owner's queued jobs
    one by one (rule 1: the first is the one that runs)."""
    sched, jobs = make([("a", IA, 0.0), ("a", IA, 0.0), ("b", B, 0.0)])
    assert sched.head("a") is jobs["a"] and sched.head("b") is jobs["b"]
    assert sched.head("nobody") is None
    first = sched.next_job(0.0)
    assert first is jobs["a"] and sched.head("a") is first  # running: still its head
    sched.finish(first)
    second = sched.head("a")
    assert second is not None and second is not first and second.payload == "a1"
    sched.finish(second)
    assert sched.head("a") is None


def test_a_released_owner_is_held_no_more() -> None:
    """Rule 5: ``release`` ends the hold; the owner's later steps, run one at a time, hand
    its next job on at ``finish`` as any owner's do."""
    sched, _ = make([("a", IA, 0.0)] * 3)
    first = sched.next_job(0.0)
    assert first is not None
    sched.hold(first)
    sched.finish(first)
    sched.release(first)
    second = sched.next_job(0.0)
    assert second is not None and second.payload == "a1"
    sched.finish(second)  # no hold this time: the next job is a candidate at once
    third = sched.next_job(0.0)
    assert third is not None and third.payload == "a2"



def stepped(sched: LaneScheduler, job: Job | None, deadline: float) -> Job:
    """What a lane and a session do after ``job``'s step: count it, and its listener now
    holds audio until ``deadline``."""
    assert job is not None
    job.steps += 1
    sched.deadline_of[job.owner] = deadline  # type: ignore[index]
    return job


def test_no_more_streams_open_than_max_open_and_the_others_wait_in_order() -> None:
    """Rule 6: an owner whose stream is open keeps its steps; one not started yet waits
    while ``max_open`` are open (an in-process model's stream holds its caches: every
    speaking session held one at once), then opens in rule 2's order."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 1.0), ("c", IA, 2.0), ("d", IA, 3.0)],
                       max_open=2)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert stepped(sched, sched.next_job(0.0), 11.0) is jobs["b"]
    # c and d are due before a and b need audio, but only a and b step
    assert sched.next_job(0.0) is jobs["a"]
    assert (sched.open_streams, sched.streams_waiting) == (2, 2) and not jobs["c"].opened
    sched.finish(jobs["b"])  # b's sentence ended: c, due first, opens its stream
    assert stepped(sched, sched.next_job(0.0), 12.0) is jobs["c"]
    assert sched.next_job(0.0) is jobs["a"]
    assert (sched.open_streams, sched.streams_waiting) == (2, 1)
    assert sched.cancel("a") == [jobs["a"]]  # a barge-in frees its place too: d opens
    assert sched.next_job(0.0) is jobs["d"]
    assert (sched.open_streams, sched.streams_waiting) == (2, 0)
    sched.finish(jobs["c"])
    sched.finish(jobs["d"])
    assert sched.open_streams == 0 and sched.next_job(0.0) is None and len(sched) == 0


def test_an_owner_waiting_for_a_stream_may_be_cancelled_or_touched() -> None:
    """Rule 6 with rules 1 and 4: a waiting owner touched stays waiting, one cancelled is
    gone, and an owner's next sentence, after its stream ended, waits its turn too."""
    sched, jobs = make([("a", IA, 0.0), ("a", IA, 0.0), ("b", IA, 1.0), ("c", IA, 2.0)],
                       max_open=1)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 2
    sched.touch("b")
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 2
    assert sched.cancel("b") == [jobs["b"]] and sched.streams_waiting == 1
    sched.finish(jobs["a"])  # c is due before a's listener runs out of audio: c opens
    assert sched.next_job(0.0) is jobs["c"] and sched.open_streams == 1
    sched.finish(jobs["c"])
    second = sched.next_job(0.0)
    assert second is not None and second.payload == "a1" and sched.open_streams == 1


def test_without_max_open_every_owner_opens_at_once() -> None:
    sched, _ = make([(f"s{i}", IA, float(i)) for i in range(50)])
    owners = set()
    for _ in range(50):
        owners.add(stepped(sched, sched.next_job(0.0), 100.0).owner)
    assert len(owners) == 50 and sched.open_streams == 50 and sched.streams_waiting == 0


def test_a_stale_finish_and_a_touch_keep_an_owners_head_first() -> None:
    """A stale ``finish`` (a job queued behind the one running) and a ``touch`` for an owner
    with no jobs are no-ops; a ``touch`` of the owner files its head again, not a later
    job: the running job stays its owner's head."""
    sched, _ = make([("a", IA, 0.0), ("a", IA, 0.5)])
    first = sched.next_job(0.0)
    assert first is not None
    later = sched._queues["a"][1]
    sched.finish(later)
    assert len(sched) == 2 and sched.head("a") is first and sched.next_job(0.0) is first
    sched.touch("nobody")
    assert sched.owners() == ["a"] and sched.next_job(0.0) is first
    sched.touch("a")  # (a playback mark): the head is asked again, still the head
    assert sched.next_job(0.0) is first and not first.cancelled and not later.cancelled


def test_an_owner_cancelled_and_resubmitted_while_its_step_ran_is_handed_out_once() -> None:
    """Rule 5: the step of a held job returns after its owner was cancelled and sent a new
    job (a barge-in during a step): ``release`` must not file the new job a second time,
    or it is handed out again after it finished."""
    sched, jobs = make([("a", IA, 0.0)])
    sched.hold(jobs["a"])
    assert sched.cancel("a") == [jobs["a"]]
    again = Job(owner="a", priority=IA, deadline=0.0)
    sched.submit(again)
    sched.release(jobs["a"])
    assert sched.next_job(0.0) is again
    sched.finish(again)
    assert sched.next_job(0.0) is None and len(sched) == 0


def test_a_decision_that_hands_out_a_job_clears_next_eligible_at() -> None:
    sched, _ = make([("a", IA, 2.0)], max_lead=0.5)
    assert sched.next_job(0.0) is None and sched.next_eligible_at == 1.5
    assert sched.next_job(1.5) is not None and sched.next_eligible_at is None


def test_the_wake_up_skips_a_cancelled_head_under_one_whose_listener_gained_audio() -> None:
    """Three heads wait (rule 3). The first one's listener gains audio, so it is filed
    again, later; the one now on top was cancelled: the lane wakes for the third."""
    sched, _ = make([("a", IA, 5.0), ("b", IA, 6.0), ("c", IA, 7.0)], max_lead=1.0)
    assert sched.next_job(0.0) is None and sched.next_eligible_at == 4.0
    sched.cancel("b")
    sched.deadline_of["a"] = 10.0  # type: ignore[index]
    assert sched.next_job(0.5) is None and sched.next_eligible_at == 6.0
    assert sched._dead == dead_entries(sched) == 0  # (b's entry, dropped there, is gone)
    assert sched.next_job(6.0).owner == "c"  # type: ignore[union-attr]


def test_heaps_compacted_under_a_busy_lane_keep_their_order() -> None:
    """Dead entries compacted away (see the test above) leave the heaps valid heaps: the
    jobs left run earliest deadline first."""
    rng = random.Random(7)
    sched = LaneScheduler(deadline_of=Deadlines())
    sched.submit(Job(owner="hub", priority=IA, deadline=-1.0))
    deadlines = [rng.uniform(0.0, 100.0) for _ in range(200)]
    for i, deadline in enumerate(deadlines):
        sched.submit(Job(owner=f"s{i}", priority=IA, deadline=deadline))
    assert sched.next_job(0.0).owner == "hub"  # type: ignore[union-attr]
    for i in range(0, 200, 2):  # 100 dead entries: more than the 64 tolerated, compacted
        sched.cancel(f"s{i}")
    sched.finish(sched.next_job(0.0))  # type: ignore[arg-type]
    assert sum(map(len, sched._heaps)) == len(sched) == 100  # (the hub's made 101 dead)
    assert sched._dead == 0
    order = []
    while (job := sched.next_job(0.0)) is not None:
        order.append(job.deadline)
        sched.finish(job)
    assert order == sorted(deadlines[1::2])


def test_a_waiting_owners_head_failed_before_its_turn_waits_no_more() -> None:
    """Rule 6 with a lane that fails its queued jobs (``Lane._fail_queued`` finishes each
    head not running): the owner's failed head no longer waits for a stream, so
    ``streams_waiting`` (/health, /metrics) counts only the heads that do."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 1.0)], max_open=1)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 1
    sched.finish(jobs["b"])
    assert sched.streams_waiting == 0 and len(sched) == 1
    sched.submit(Job(owner="b", priority=IA, deadline=2.0, payload="b2"))
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 1
    sched.finish(jobs["a"])
    job = sched.next_job(0.0)
    assert job is not None and job.payload == "b2" and sched.open_streams == 1
    assert sched.streams_waiting == 0


@pytest.mark.parametrize("released_first", [False, True])
def test_an_owner_waiting_for_a_stream_while_its_old_step_runs_is_handed_out_once(
        released_first: bool) -> None:
    """Rules 5 and 6: a barge-in during a held step (cancel, then the new turn's job) and
    the new job waits for a stream (the old step's stays open until it returns, b's
    is the other). When a stream ends it stays no candidate until its owner's old step
    returned, and is filed once, whichever comes first: filed twice, it was handed out
    again after it finished."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 1.0)], max_open=2)
    assert sched.next_job(0.0) is jobs["a"]
    sched.hold(jobs["a"])
    assert sched.cancel("a") == [jobs["a"]]
    again = Job(owner="a", priority=IA, deadline=5.0)
    sched.submit(again)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["b"]
    assert sched.next_job(0.0) is jobs["b"] and sched.streams_waiting == 1
    if released_first:
        sched.release(jobs["a"])
    sched.finish(jobs["b"])
    if not released_first:
        assert sched.next_job(0.0) is None  # a's old step still runs (rule 5)
        sched.release(jobs["a"])
    assert sched.next_job(0.0) is again and sched.open_streams == 1
    sched.finish(again)
    assert sched.next_job(0.0) is None and len(sched) == 0 and sched.open_streams == 0


@pytest.mark.parametrize(("rule", "open_priority"), [
    ("a speaking session", IA),
    ("an HTTP request, paced while an interactive job is queued", B),
])
def test_while_a_job_waits_for_a_stream_the_open_ones_are_not_held_back(
        rule: str, open_priority: Priority) -> None:
    """Rules 3 and 6: the only open stream's listener holds audio (just in time: not
    eligible) while a new turn's first audio, due now, waits for a stream to end. The open
    one runs ahead to its end instead of the lane idling until its listener needs audio
    (the new turn waited a whole sentence in real time: 9 s here)."""
    sched, jobs = make([("a", open_priority, 0.0)], max_open=1, max_lead=1.0)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    new = Job(owner="b", priority=IA, deadline=0.0)
    sched.submit(new)
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 1, rule
    sched.finish(jobs["a"])
    assert sched.next_job(0.0) is new and sched.streams_waiting == 0
    stepped(sched, new, 10.0)  # alone again: just in time holds it (rule 3)
    assert sched.next_job(0.0) is None and sched.next_eligible_at == 9.0


def test_a_stream_cancelled_during_its_step_stays_open_until_the_step_returns() -> None:
    """Rules 4, 5 and 6 on a lane running several steps at once: a barge-in cancels an owner
    whose step is in flight. Its engine stream stays open until that step returns (the lane
    closes it then), so the bound still counts it: a waiting owner that opened a stream at
    the cancel put ``max_open + 1`` streams (and their caches) on the device at once."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 1.0)], max_open=1)
    assert sched.next_job(0.0) is jobs["a"]
    sched.hold(jobs["a"])  # a's step runs
    assert sched.next_job(0.0) is None and sched.streams_waiting == 1
    assert sched.cancel("a") == [jobs["a"]]
    assert sched.open_streams == 1 and sched.next_job(0.0) is None
    sched.release(jobs["a"])  # the step returned: the lane closes a's stream
    assert sched.open_streams == 0 and not jobs["a"].opened
    assert sched.next_job(0.0) is jobs["b"] and sched.open_streams == 1


def test_a_stream_cancelled_between_its_steps_closes_at_once() -> None:
    """Rule 4 with rule 6: a stream cancelled while no step of it runs is closed at the
    cancel, held or not before: the waiting owner opens one at once."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 1.0)], max_open=1)
    assert sched.next_job(0.0) is jobs["a"]
    sched.hold(jobs["a"])
    sched.release(jobs["a"])  # its step returned, the stream stays open for the next
    assert sched.cancel("a") == [jobs["a"]] and sched.open_streams == 0
    assert sched.next_job(0.0) is jobs["b"]


def test_a_stream_that_ends_asks_a_few_waiting_owners_not_all() -> None:
    """Rule 6 at its bound with many owners waiting (a lane of 16 streams and 1,000
    sentences queued): a stream that ends files the best waiting owner again, not every
    one. Re-filing them all asked ``deadline_of`` once per waiting owner per stream that
    ended (~90 calls per decision at 1,000: bench/SCHEDULER.md). The streams still go in
    rule 2's order."""
    asked = 0
    deadlines = {i: float(i) for i in range(200)}

    def deadline_of(job: Job, now: float) -> float:
        nonlocal asked
        asked += 1
        return deadlines[job.owner]

    sched = LaneScheduler(deadline_of=deadline_of, max_open=2)
    for i in range(200):
        sched.submit(Job(owner=i, priority=IA, deadline=0.0))
    opened = []
    for _ in range(400):
        job = sched.next_job(0.0)
        assert job is not None
        if not job.steps:
            opened.append(job.owner)
        job.steps += 1
        deadlines[job.owner] += 0.3
        if job.steps == 2:
            sched.finish(job)  # its sentence ended: a waiting owner opens a stream
        if len(opened) == 2:
            asked = 0  # (the first decision asked every new head once)
    assert opened == list(range(200))  # earliest deadline first
    assert sched.streams_waiting == 0 and len(sched) == 0
    assert asked < 5 * 400


def test_background_jobs_leave_the_reserved_streams_to_interactive_ones() -> None:
    """Rule 6b: background requests (other apps' 20-40 s utterances) held every open
    stream, and a voice turn waited for a whole utterance to end (bench/SCHEDULER.md,
    ``sched-open1``: TTFA p50 8.6 s). With one of 3 streams kept, they open at most 2; a
    turn opens the third at once, and a stream that ends inside the reserve goes to an
    interactive owner, never to a background one, however long it waited."""
    sched, jobs = make([("x", B, 0.0), ("y", B, 1.0), ("z", B, 2.0)], max_open=3, reserve=1)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["x"]
    assert stepped(sched, sched.next_job(0.0), 11.0) is jobs["y"]
    assert sched.next_job(0.0) is jobs["x"]  # z waits although a stream is free
    assert (sched.open_streams, sched.streams_waiting) == (2, 1) and not jobs["z"].opened
    hub = Job(owner="hub", priority=IA, deadline=0.5)
    sched.submit(hub)
    assert stepped(sched, sched.next_job(0.5), 1.0) is hub  # the reserved stream, at once
    second = Job(owner="hub2", priority=IA, deadline=0.5)
    sched.submit(second)
    assert sched.next_job(0.5) is hub and sched.streams_waiting == 2  # all 3 taken
    sched.finish(jobs["x"])  # a background stream ends: the waiting turn takes it, not z
    assert stepped(sched, sched.next_job(0.5), 1.5) is second and not jobs["z"].opened
    sched.finish(second)  # 2 open (y, hub): the one free is the reserve's, z waits on
    assert sched.next_job(0.5) is hub and not jobs["z"].opened
    assert sched.streams_waiting == 1
    sched.finish(hub)  # now 1 open: z opens
    assert sched.next_job(0.5) is jobs["z"] and sched.open_streams == 2


def test_a_stream_that_ends_inside_the_reserve_files_no_background_owner() -> None:
    """Rule 6b in ``_unpark``: a free stream that only interactive jobs may take files no
    background owner waiting for one (it would find none and wait again at every decision),
    and one that ends outside it files one, as rule 6 does."""
    sched, jobs = make([("x", B, 0.0), ("y", B, 1.0)], max_open=2, reserve=1)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["x"]
    assert sched.next_job(0.0) is jobs["x"] and sched.streams_waiting == 1
    hub = Job(owner="hub", priority=IA, deadline=0.0)
    sched.submit(hub)
    assert stepped(sched, sched.next_job(0.0), 10.0) is hub
    sched.finish(jobs["x"])  # the free stream is the reserve's: y is not filed
    assert sched.next_job(0.0) is hub and sched.streams_waiting == 1
    assert not sched._promised and "y" in sched._blocked
    sched.finish(hub)  # none open: y is filed and opens
    assert sched.next_job(0.0) is jobs["y"] and sched.streams_waiting == 0


@pytest.mark.parametrize(("max_open", "reserved"), [
    (None, 0), (1, 0), (2, 1), (8, 1), (15, 1), (16, 2), (17, 2), (32, 4)])
def test_the_default_reserve_is_an_eighth_and_none_with_one_stream(
        max_open: int | None, reserved: int) -> None:
    """qwen3's 16 streams keep 2; a lane of one stream keeps none (background requests
    would get none at all)."""
    assert default_reserve(max_open) == reserved


def test_a_reserve_of_every_stream_leaves_background_jobs_one() -> None:
    """A ``reserve`` of ``max_open`` or more counts as ``max_open - 1``: background
    requests would otherwise never open a stream and wait for ever."""
    sched, jobs = make([("x", W, 0.0), ("y", W, 1.0)], max_open=2, reserve=5)
    assert sched.reserved == 1
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["x"]
    assert sched.next_job(0.0) is jobs["x"] and sched.streams_waiting == 1
    assert LaneScheduler(reserve=3).reserved == 0  # no bound: nothing to keep


@pytest.mark.timeout(20)  # a re-filing loop that puts a head back where it took it from
def test_later_segments_waiting_for_a_stream_go_by_rule_2b() -> None:
    """Rules 2b and 6: a turn's later segment (``since``: its stream started before) needs
    a stream of its own, and waits for one ranked as a playing listener. When a stream
    ends, one short of ``protect_lead`` goes before one holding more, even a younger one;
    and one that held enough when it started waiting, but ran short meanwhile, is the
    oldest stream short of audio then: first."""
    dues = Deadlines(short=0.1, comfy=0.9, young=0.7)
    sched = LaneScheduler(deadline_of=dues, max_open=1)
    sched.submit(Job(owner="o", priority=IA, deadline=0.0))
    playing = stepped(sched, sched.next_job(0.0), 10.0)  # the one stream is open
    comfy = Job(owner="comfy", priority=IA, deadline=0.0, since=0.2)
    short = Job(owner="short", priority=IA, deadline=0.0, since=0.5)
    young = Job(owner="young", priority=IA, deadline=0.0, since=0.8)
    for job in (comfy, short):
        sched.submit(job)
    assert sched.next_job(0.0) is playing and sched.streams_waiting == 2
    sched.finish(playing)
    assert sched.next_job(0.0) is short  # comfy holds 0.9 s: it waits behind
    stepped(sched, short, 10.0)
    sched.submit(young)  # holds 0.7 s now: comfortable too
    assert sched.next_job(0.0) is short and sched.streams_waiting == 2
    sched.finish(short)  # at 0.6 both ran short (0.3 s and 0.1 s left): comfy is older
    assert sched.next_job(0.6) is comfy
    sched.finish(comfy)
    assert sched.next_job(0.6) is young and sched.streams_waiting == 0


@pytest.mark.parametrize(("rule", "held", "expected", "eligible_at"), [
    ("a background step in flight does not share the lane: flat out", B, "bg", None),
    ("an interactive step in flight does: paced", IA, None, 4.0),
])
def test_a_step_in_flight_shares_the_lane_as_its_class_does(rule, held, expected,
                                                            eligible_at) -> None:
    """Rule 3 with rule 5: beside a voice session waiting for a resume (nobody listens), a
    held background step leaves the lane unshared, a held interactive step shares it."""
    sched, jobs = make([("step", held, 0.0), ("detached", IA, math.inf), ("bg", B, 5.0)],
                       max_lead=1.0)
    assert sched.next_job(0.0) is jobs["step"]
    sched.hold(jobs["step"])
    job = sched.next_job(0.0)
    assert (job.owner if job else None) == expected, rule
    assert sched.next_eligible_at == eligible_at, rule


@pytest.mark.parametrize("gone", ["failed", "cancelled"])
def test_an_owner_filed_for_a_free_stream_that_goes_frees_it_for_the_next(gone: str) -> None:
    """Rule 6: a stream that ends files one waiting owner for it (``_unpark``). When that
    owner goes before it opened the stream (its head failed by an unhealthy lane, or a
    barge-in), the stream is free again: the next waiting owner is filed and opens it, not
    kept waiting until another stream ends."""
    sched, jobs = make([("a", IA, 0.0), ("c", IA, 0.5), ("b", IA, 5.0), ("d", IA, 6.0)],
                       max_open=2, rank=Rank.DEADLINE)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["c"]
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 2  # b and d
    sched.finish(jobs["a"])
    sched.deadline_of["c"] = 2.0  # type: ignore[index]  # a playback report: c holds less
    sched.touch("c")
    # b is filed for the stream a left; c, due sooner, steps first
    assert sched.next_job(0.0) is jobs["c"] and sched.streams_waiting == 1
    if gone == "failed":
        sched.finish(jobs["b"])
    else:
        assert sched.cancel("b") == [jobs["b"]]
    sched.deadline_of["c"] = 10.0  # type: ignore[index]  # c's listener holds enough
    assert sched.next_job(0.0) is jobs["d"] and sched.open_streams == 2
    assert sched.streams_waiting == 0


def test_an_owner_not_filed_that_takes_a_kept_stream_takes_its_promise() -> None:
    """Rule 6: a stream that ends is kept for the one waiting owner it files (``_unpark``).
    When another owner's first job opens it first (a new turn, due sooner), that owner
    took the stream kept for the filed one: nothing is kept any more, and the next stream
    that ends goes to the best owner waiting then (d, due sooner than the filed b), not
    kept for b while d waits."""
    sched, jobs = make([("a", IA, 0.0), ("x", IA, 1.0), ("b", IA, 5.0)], max_open=2,
                       rank=Rank.DEADLINE)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert stepped(sched, sched.next_job(0.0), 6.0) is jobs["x"]
    assert sched.next_job(0.0) is jobs["x"] and sched.streams_waiting == 1  # b
    sched.finish(jobs["a"])
    sched.deadline_of["x"] = 2.0  # type: ignore[index]  # a playback report: x holds less
    sched.touch("x")
    assert stepped(sched, sched.next_job(0.0), 7.0) is jobs["x"]  # b filed for a's stream
    assert sched.streams_waiting == 0 and sched._promised == {"b"}
    c, d = Job(owner="c", priority=IA, deadline=0.0), Job(owner="d", priority=IA, deadline=4.0)
    sched.submit(c)
    assert stepped(sched, sched.next_job(0.0), 4.5) is c  # it took the stream kept for b
    assert sched.open_streams == 2 and not sched._promised
    sched.submit(d)
    assert sched.next_job(0.0) is c and sched.streams_waiting == 1  # d, before b's turn
    sched.finish(jobs["x"])
    assert sched.next_job(0.0) is d and sched.open_streams == 2


def test_an_owner_not_filed_that_takes_a_free_stream_leaves_the_kept_one() -> None:
    """Rule 6: a new turn that opens a stream free and kept for nobody leaves the one kept
    for a filed owner kept: the owners waiting are filed one per free stream, no more."""
    sched, jobs = make([("a", IA, 0.0), ("x", IA, 1.0), ("y", IA, 1.5), ("b", IA, 5.0)],
                       max_open=3, rank=Rank.DEADLINE)
    for owner in ("a", "x", "y"):
        assert stepped(sched, sched.next_job(0.0), 6.0) is jobs[owner]
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 1  # b
    sched.finish(jobs["a"])
    sched.finish(jobs["y"])  # two streams free: b is filed for one
    sched.deadline_of["x"] = 2.0  # type: ignore[index]  # a playback report: x holds less
    sched.touch("x")
    assert sched.next_job(0.0) is jobs["x"] and sched._promised == {"b"}
    c = Job(owner="c", priority=IA, deadline=0.0)
    sched.submit(c)
    assert sched.next_job(0.0) is c and sched.open_streams == 2
    assert sched._promised == {"b"}  # the third stream is still b's


def test_each_owner_filed_for_a_stream_keeps_its_own() -> None:
    """Rule 6: two streams end, two waiting owners are filed, each kept a stream. The one
    that opens takes its own; a new turn that opens the other takes the other's: one
    owner's stream each, never a kept one left for an owner that opened already."""
    sched, jobs = make([("a", IA, 0.0), ("x", IA, 1.0), ("y", IA, 1.5)], max_open=3,
                       rank=Rank.DEADLINE)
    for owner in ("a", "x", "y"):
        assert stepped(sched, sched.next_job(0.0), 6.0) is jobs[owner]
    # (int owners: a set pops them in a fixed order, whatever the hash seed)
    first, second = Job(owner=1, priority=IA, deadline=5.5), Job(owner=2, priority=IA,
                                                                 deadline=5.0)
    sched.submit(first)
    sched.submit(second)
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 2
    sched.finish(jobs["a"])
    sched.finish(jobs["y"])
    assert sched.next_job(0.0) is second and sched._promised == {1}  # its own, 2's
    c = Job(owner="c", priority=IA, deadline=0.0)
    sched.submit(c)
    assert sched.next_job(0.0) is c and sched.open_streams == 3 and not sched._promised


def test_the_decision_that_finds_a_job_waiting_for_a_stream_lifts_rule_3_for_itself() -> None:
    """Rules 2, 3 and 6: a new turn's first audio finds both streams open and waits for one
    to end, so rule 3 holds the open ones back no more, from that decision on. That
    decision still held the interactive stream back (its listener holds 10 s) and ran the
    background one's step instead; the next decision, with the same jobs, ran the
    interactive one: rule 3 was lifted one decision late, and priority inverted for one
    step."""
    sched, jobs = make([("a", IA, 0.0), ("c", B, 0.0)], max_open=2, max_lead=1.0)
    assert stepped(sched, sched.next_job(0.0), 10.0) is jobs["a"]
    assert stepped(sched, sched.next_job(0.0), 0.5) is jobs["c"]  # (paced: a is queued)
    assert sched.next_job(0.0) is jobs["c"]  # a's listener has enough: just in time
    sched.submit(new := Job(owner="b", priority=IA, deadline=0.0))
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 1
    assert sched.next_job(0.0) is jobs["a"]  # (the same answer asked again)
    sched.finish(jobs["a"])
    assert sched.next_job(0.0) is new and sched.streams_waiting == 0


def test_a_stream_kept_for_a_waiting_owner_and_taken_by_another_voids_one_promise() -> None:
    """Rule 6: two streams end and the two best waiting owners are filed for them (each
    keeps one, ``_promised``); a new turn's first audio, due sooner, takes one of them. One
    promise is void, not both: the other stream is still kept for the other owner, and the
    owner waiting behind them stays waiting. Voiding both filed it too, for no free
    stream: asked its deadline for nothing and, a moment, counted as waiting for none
    (``streams_waiting`` 0: /health, and the lane's log said none waits, then again that
    some do)."""
    sched, jobs = make([("a", IA, 0.0), ("b", IA, 0.0), ("c", IA, 0.0)], max_open=3)
    for _ in "abc":
        stepped(sched, sched.next_job(0.0), 10.0)
    for owner, due in (("x", 1.0), ("y", 2.0), ("w", 3.0)):
        sched.submit(Job(owner=owner, priority=IA, deadline=due))
    assert sched.next_job(0.0) is jobs["a"] and sched.streams_waiting == 3
    sched.finish(jobs["a"])
    sched.finish(jobs["b"])
    sched.submit(Job(owner="z", priority=IA, deadline=0.5))
    assert stepped(sched, sched.next_job(0.0), 10.0).owner == "z"
    assert sched.streams_waiting == 1  # w (x and y: one stream kept for the better)
    assert stepped(sched, sched.next_job(0.0), 10.0).owner == "x"
    assert sched.streams_waiting == 1  # w still (y parks when it finds no stream free)
    assert sched.next_job(0.0) is jobs["c"] and sched.streams_waiting == 2  # y and w
