"""Telemetry pieces that do not need a gateway: the windowed maximum, the lane histograms,
the loop-lag probe, the garbage collector's pauses and the LLM probe's reading."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import logging
import time
import tracemalloc

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gateway.io.telemetry import (
    GcPauses,
    LaneHistogram,
    LlmProbe,
    LoopLagMonitor,
    WindowMax,
)
from tests.hang_guard import hang_guard, unless_hung
from tests.servers import EncodedSseServer, resetting_port


@pytest.mark.parametrize(("events", "now", "expected"), [
    ([], 0.0, 0.0),
    ([(0.0, 5.0)], 0.0, 5.0),
    ([(0.0, 5.0), (1.0, 3.0)], 1.0, 5.0),          # older but larger stays the max
    ([(0.0, 5.0), (1.0, 3.0)], 60.5, 3.0),         # ... until it leaves the window
    ([(0.0, 5.0), (1.0, 3.0)], 61.0, 0.0),         # everything left the window
    ([(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)], 2.0, 3.0),
    ([(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)], 61.5, 2.0),
    ([(0.0, 2.0), (0.0, 2.0)], 59.9, 2.0),         # equal values: the newer is kept
])
def test_window_max(events, now, expected):
    window = WindowMax(window_s=60)
    for at, value in events:
        window.add(at, value)
    assert window.max(now) == expected


def test_window_max_keeps_only_candidates():
    window = WindowMax(window_s=60)
    for i in range(1000):
        window.add(i * 0.01, float(i))  # rising: each value evicts all before it
    assert len(window._values) == 1 and window.max(10.0) == 999.0


def test_lane_histogram_counts_like_prometheus():
    """Same buckets, same values: the same cumulative counts and sum as prometheus_client's
    own Histogram (``le``: a value equal to a bound counts in that bound's bucket)."""
    bounds = (0.01, 0.1, 1.0)
    values = [0.0, 0.01, 0.0100001, 0.05, 0.1, 0.7, 1.0, 3.0, 1e9]
    ours = LaneHistogram(bounds)
    theirs = Histogram("h", "h", buckets=bounds, registry=CollectorRegistry())
    for v in values:
        ours.observe(v)
        theirs.observe(v)
    expected = [(s.labels["le"], s.value) for s in next(iter(theirs.collect())).samples
                if s.name == "h_bucket"]
    assert [(le, float(n)) for le, n in ours.cumulative()] == expected
    assert [n for _, n in ours.cumulative()] == [2, 5, 7, 9]
    assert ours.count == len(values) and ours.sum == pytest.approx(sum(values))


class _Observed:
    """Test double around a real Histogram: wakes the test after each observation."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.samples: list[float] = []
        self.changed = asyncio.Event()

    def observe(self, value: float) -> None:
        self.histogram.observe(value)
        self.samples.append(value)
        self.changed.set()

    async def next(self) -> float:
        self.changed.clear()
        await self.changed.wait()
        return self.samples[-1]


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a callback that never yields, like a slow engine call on the loop


async def test_loop_lag_monitor_sees_a_blocked_loop():
    registry = CollectorRegistry()
    observed = _Observed(Histogram("lag", "test", buckets=(0.01, 0.1, 1.0), registry=registry))
    monitor = LoopLagMonitor(observed, interval_s=0.01)
    monitor.start()
    try:
        for _ in range(3):
            await observed.next()
        asyncio.get_running_loop().call_soon(_hold_the_loop, 0.3)
        lags = [await observed.next() for _ in range(2)]
        assert max(lags) >= 0.25  # the wake-up due during the hold came ~300 ms late
        # the largest lag seen, whatever the machine did before the hold (a bound on the
        # lags before it timed the machine: any 250 ms stall of a busy host failed it)
        assert monitor.health()["lag_max_ms_1m"] == round(max(observed.samples) * 1000, 1)
        assert registry.get_sample_value("lag_bucket", {"le": "0.1"}) < \
            registry.get_sample_value("lag_count")
    finally:
        await monitor.aclose()
    assert monitor._task is None


async def test_cancel_and_wait_swallows_the_tasks_cancellation_not_the_callers():
    from gateway.io.aio import cancel_and_wait

    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(forever())
    await started.wait()
    await cancel_and_wait(task)
    assert task.cancelled()
    await cancel_and_wait(task)  # done already: a no-op
    await cancel_and_wait(None)

    # the caller itself is cancelled while it waits: once inner has been told to stop (by
    # the waiter, which then awaits it) and before inner has finished, which it does only
    # when let go (one sleep(0) put the waiter there, by the loop's order of steps)
    told, let_go = asyncio.Event(), asyncio.Event()

    async def stops_when_let_go() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            told.set()
            await let_go.wait()
            raise

    inner = asyncio.ensure_future(stops_when_let_go())
    waiter = asyncio.ensure_future(cancel_and_wait(inner))
    await told.wait()
    waiter.cancel()
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert inner.cancelled()


async def test_unless_stopped_gives_the_work_or_none_and_leaves_nothing_running():
    from gateway.io.aio import unless_stopped

    cleaned: list[str] = []

    async def waits(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    async def answer() -> int:
        return 42

    async def now() -> None:
        return None

    async def fails() -> None:
        raise ValueError("boom")

    done = await unless_stopped(answer(), waits("stop"))  # the work first: the stop ends
    assert done is not None and done.result() == 42 and cleaned == ["stop"]
    assert await unless_stopped(waits("work"), now()) is None  # the stop first: work ends,
    assert cleaned == ["stop", "work"]  # its cleanup run before the answer
    done = await unless_stopped(fails(), now())  # a tie: the work wins, its error kept
    assert done is not None and isinstance(done.exception(), ValueError)
    # what the stop raises is dropped, not left unread for the loop to log
    assert await unless_stopped(waits("work again"), fails()) is None


@pytest.mark.parametrize("steps", range(6))
async def test_unless_stopped_never_swallows_the_callers_cancellation(steps):
    """Wherever the caller's cancellation lands, the caller ends cancelled (the HTTP
    API's own race suppressed CancelledError around its cleanup: I/O review)."""
    from gateway.io.aio import unless_stopped

    async def answer() -> str:
        return "result"

    after: list[str] = []

    async def caller() -> None:
        await unless_stopped(answer(), asyncio.Event().wait())
        after.append("returned")
        await asyncio.sleep(0)
        after.append("went on after the cancel")

    task = asyncio.ensure_future(caller())
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "went on after the cancel" not in after


def test_gc_pauses_books_each_collection_under_its_generation_until_stopped():
    import gc

    pauses = GcPauses()
    pauses.start()
    pauses.start()  # idempotent: one callback, each collection booked once
    try:
        keep = [[i] for i in range(200_000)]  # something for a full collection to walk
        gc.collect(2)
        gc.collect(0)
        del keep
        full, young = pauses.histograms[2], pauses.histograms[0]
        assert full.count >= 1 and young.count >= 1 and full.sum > 0
        assert pauses.health()["gc_pause_max_ms_1m"] >= full.sum / full.count * 1000 - 0.1
    finally:
        pauses.stop()
    pauses.stop()  # idempotent too
    counted = pauses.histograms[2].count
    gc.collect(2)
    assert pauses.histograms[2].count == counted
    assert pauses._callback not in gc.callbacks


async def test_the_loop_tasks_figure_comes_back_to_idle_once_sessions_have_ended(
        start_gateway):
    """``/health`` → ``loop.tasks`` and ``gateway_loop_tasks``: what a task left behind by
    each session would show (bench/soak.py watches it over thousands of sessions). Real
    gateway, espeak, sessions that speak and then close or drop their socket."""
    from websockets.asyncio.client import connect

    from tests.wsclient import read_turn, send

    gw = await start_gateway([{"transcript": "Hi?", "reply": "Hello there. How are you?"}],
                             server={"resume_window_s": 0})
    idle = gw.health()["loop"]["tasks"]
    idle_tasks = asyncio.all_tasks()
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"
    async with connect(url) as a, connect(url) as b:
        for ws in (a, b):
            await send(ws, type="say", text="A sentence to speak, then another one.")
            await read_turn(ws)
        during = gw.health()["loop"]["tasks"]
        b.transport.abort()  # a drop: the session goes (no resume window)
    await gw.wait_no_sessions()
    # then every task the sessions started ends (websockets' handlers take more steps, and
    # may wait for their socket: one sleep(0) was a guess at how many); one that never
    # does is a task left behind
    while started := asyncio.all_tasks() - idle_tasks - {asyncio.current_task()}:
        async with hang_guard(f"the end of the tasks the sessions started: {started}"):
            await asyncio.wait(started)
    assert during > idle
    assert gw.health()["loop"]["tasks"] == idle
    assert f"gateway_loop_tasks {float(idle)}" in gw.telemetry.exposition().decode()


@pytest.mark.parametrize("encoding", [b"gzip, gzip", b"identity"])
async def test_the_llm_probe_reads_a_bounded_piece_of_any_answer(encoding):
    """The probe read the whole ``/models`` answer, and decoded it whole: 64 MiB gzip'd
    twice (httpx decodes both layers), or as it is, grew the gateway by more than their
    decoded size at every probe (traced: 149 MB, 134 MB). It asks for no compression and
    reads at most its bound, undecoded (1.3 MB: its client's own), and still tells the
    server answers."""
    body = b"x" * (64 << 20)
    if encoding == b"gzip, gzip":
        body = gzip.compress(gzip.compress(body))
    server = EncodedSseServer(encoding, body)
    probe = LlmProbe(server.url)
    tracemalloc.start()
    try:
        await probe.probe()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await probe.aclose()
        server.close()
    assert probe.reachable is True and probe.detail == "HTTP 200"
    assert peak < 4 << 20, f"{peak:,} bytes"  # (1.3 MB; main: 149 MB, 134 MB)
    assert b"\r\naccept-encoding: identity\r\n" in server.request.lower()


async def test_the_llm_probe_reads_no_more_of_an_endless_answer_than_its_bound():
    """A ``/models`` answer that never ends (a broken proxy, a server that streams it) held
    the probe for ever had it read the answer whole, as ``client.get`` did: /health then
    answered with the result from before it, and no probe ran again. It reads at most its
    bound, and lets the connection go. (With the answers above, finite, a probe without the
    bound read them through and passed.)"""
    server = EncodedSseServer(b"identity", itertools.repeat(b"x" * 65536))
    probe = LlmProbe(server.url)
    try:
        await unless_hung(probe.probe())  # (a safety net: without the bound, never)
        left = await asyncio.to_thread(server.left.wait, 30)
    finally:
        await probe.aclose()
        server.close()
    assert probe.reachable is True and probe.detail == "HTTP 200"
    assert left  # the connection let go


def test_the_llm_probe_of_a_server_that_resets_the_connection_as_it_is_made_says_so(caplog):
    """Under uvloop (the gateway's loop) a connection the LLM server resets as it is made
    (a server killed then) made anyio raise ``AttributeError: 'NoneType' object has no
    attribute 'getpeername'`` out of the probe: its task died, /health kept the answer from
    before, nothing was said until asyncio logged "Task exception was never retrieved" at
    ERROR. The server does not answer: the probe says so, as for a refused connection."""
    uvloop = pytest.importorskip("uvloop")

    async def probe_once() -> LlmProbe:
        with resetting_port(asyncio.get_running_loop()) as port:
            probe = LlmProbe(f"http://127.0.0.1:{port}/v1")
            try:
                await probe.probe()
            finally:
                await probe.aclose()
        return probe

    with caplog.at_level(logging.WARNING, logger="gateway"):
        probe = uvloop.run(probe_once())
    assert probe.reachable is False
    assert probe.detail == "ConnectError: the connection was lost as it was made"
    (said,) = [r.getMessage() for r in caplog.records]
    assert "does not answer (ConnectError: the connection was lost as it was made)" in said
