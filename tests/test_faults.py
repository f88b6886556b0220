"""Faults the gateway survives, on the real server: engines that raise, hang or lose their
thread, an LLM process killed mid-stream, clients that vanish mid-turn, SIGTERM during
turns. In each, a well-behaved session runs alongside and must not notice (gapless seq,
turn completed), except where the fault takes the shared lane itself (then its turn fails
fast with a clear error instead of hanging)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from engines.base import EngineError, SynthesisRequest
from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.lanes import Lane
from gateway.io.server import Gateway
from tests.fixtures_mlx import NO_STEP_DEADLINE
from tests.hang_guard import HANG_S, hang_guard, unless_hung
from tests.servers import (
    Drop,
    Hang,
    ServeProcess,
    Text,
    TinyLlamaServer,
    assert_no_leaks,
    leak_checked_env,
    reply_script,
)
from tests.wsclient import TurnResult, read_turn, read_until_closed, recv_event, send

NO_PACING = {"max_lead_ms": 30_000}  # the whole reply is released at once
WELL = "A well behaved session speaks. It says a few sentences. Nothing goes wrong here."


class FaultyEngine(SyntheticEngine):
    """TEST DOUBLE: the synthetic engine (zero cost), except for texts holding a marker:
    ``RAISE`` raises ``fault`` at its second step; ``HANG`` blocks its second step until
    ``release`` is set. ``hangs(fn, *args)`` says whether a lane's call is one it hangs in
    (for ``deadline_on_hangs``); a stream's ``hangs_next()``, whether its next step is."""

    def __init__(self, fault: BaseException | None = None) -> None:
        super().__init__(rtf=0, ttfa_ms=0, lane="cpu")
        self.blocks = True  # it can hang like a real model: keep it on the lane thread
        self.fault = fault or EngineError("engine_failed", "scripted engine failure")
        self.release = threading.Event()
        self.hung = threading.Event()

    def opening_hangs(self, request: SynthesisRequest) -> bool:
        return False

    def hangs(self, fn: Any, *args: Any) -> bool:
        if fn == self.open:
            return self.opening_hangs(args[0])
        return bool(getattr(args[0], "hangs_next", lambda: False)())

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        if "RAISE" not in request.text and "HANG" not in request.text:
            return stream
        engine, step, steps = self, stream.step, [0]

        def faulty_step() -> bytes | None:
            steps[0] += 1
            if steps[0] == 2:
                if "RAISE" in request.text:
                    raise engine.fault
                engine.hung.set()
                engine.release.wait()
            return step()

        stream.step = faulty_step  # type: ignore[method-assign]
        stream.hangs_next = lambda: "HANG" in request.text and steps[0] == 1  # type: ignore[attr-defined]
        return stream


def deadline_on_hangs(lane: Lane, seconds: float) -> None:
    """The lane's step deadline is ``seconds`` for the calls its engine (a FaultyEngine) is
    scripted to hang in, and none that counts (``NO_STEP_DEADLINE``) for the others: a
    short deadline on every call failed a normal step that a starved machine (2 cores
    shared with other runs) left waiting for ``seconds``, taken for a hung engine. (The
    lane reads its deadline as it hands a call to its thread.)"""
    engine, call_limited = lane.engine, lane._call_limited

    async def limited(fn: Any, *args: Any) -> Any:
        lane.step_timeout_s = seconds if engine.hangs(fn, *args) else NO_STEP_DEADLINE
        return await call_limited(fn, *args)

    lane._call_limited = limited  # type: ignore[method-assign]


def a_bug_in(monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
             when: Callable[..., bool], words: str = "a scripted bug in the session", *,
             after: bool = False) -> None:
    """TEST DOUBLE: ``owner.name`` raises ``TypeError(words)`` (a scripted gateway bug) on a
    call ``when`` picks (it is given the call's arguments, ``self`` first): before doing its
    work, or ``after`` it. Every other call is the method's own."""
    original = getattr(owner, name)

    def buggy(self: Any, *args: Any, **kwargs: Any) -> Any:
        bug = when(self, *args, **kwargs)
        if bug and not after:
            raise TypeError(words)
        result = original(self, *args, **kwargs)
        if bug:
            raise TypeError(words)
        return result

    monkeypatch.setattr(owner, name, buggy)


def says_bug(self: Any, job: Any, *_: Any, **__: Any) -> bool:
    """For ``a_bug_in``: the call is about a job whose text says BUG."""
    return "BUG" in job.payload.request.text


async def start(engine=None, llm_url: str | None = None, **server) -> Gateway:
    gw = Gateway(load_config(server={"port": 0, **server}, llm={"tokens_per_s": 0,
                             **({"url": llm_url, "max_tokens": 4000} if llm_url else {})},
                             session=NO_PACING), engine=engine)
    await gw.start()
    return gw


def url(gw: Gateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/voice"


async def say(ws, text: str) -> TurnResult:
    await send(ws, type="say", text=text)
    return await read_turn(ws)


def gapless(*turns: TurnResult) -> bool:
    seqs = [f.seq for t in turns for f in t.frames]
    return seqs == list(range(len(seqs)))


async def two_failed_turns_degrade(gw: Gateway, ws, text: str) -> None:
    """Two turns saying ``text`` both fail, and /health says degraded, ``engine_failed``
    (two: what the log says once of a failing engine is not said again per turn)."""
    for _ in range(2):
        turn = await say(ws, text)
        assert turn.done["status"] == "failed"
    health = gw.health()
    assert health["status"] == "degraded"
    assert health["engine"]["failing"] == "engine_failed"


async def well_behaved(gw: Gateway, started: asyncio.Event | None = None) -> TurnResult:
    async with connect(url(gw)) as ws:
        await recv_event(ws, "session.created")
        if started is not None:
            await started.wait()
        result = await say(ws, WELL)
    assert result.done["status"] == "completed", result.events
    assert gapless(result) and result.frames[-1].turn_end
    return result


# ---- the engine -------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [EngineError("engine_failed", "the model fell over"),
                                   RuntimeError("a bug in the engine"),
                                   # a library ending its thread (sys.exit) on the lane's: it
                                   # reached the loop and stopped the whole gateway
                                   SystemExit("the engine's thread exits")])
async def test_engine_raising_mid_sentence_fails_that_turn_only(fault):
    gw = await start(FaultyEngine(fault))
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            other = asyncio.create_task(well_behaved(gw))
            bad = await say(ws, "This part is fine. But RAISE breaks this sentence midway. "
                                "This one is never said.")
            (error,) = bad.of("error")
            assert error["error"]["code"] == "engine_failed"
            assert error["turn_id"] == bad.turn_id
            assert bad.done["status"] == "failed"
            # the failing sentence went out in part; the one after it was never reached
            assert [s["index"] for s in bad.of("sentence")] == [0, 1]
            assert [s["index"] for s in bad.of("sentence.done")] == [0]
            assert bad.done["metrics"]["sentences"] == 2
            await other
            again = await say(ws, "The lane still works.")  # the lane went on
            assert again.done["status"] == "completed"
            assert gapless(bad, again)
        assert gw.lane.unhealthy is None and gw.health()["status"] == "ok"
    finally:
        await gw.aclose()


async def test_an_engine_that_starts_failing_is_logged_once_and_so_is_its_return(
        start_gateway, caplog):
    """README (Running it, Logs): a WARNING for an engine that fails, not a line per turn.
    The http engine's server is down (a second gateway, not started yet, on the port it
    names): two turns fail and the log says so once; the server comes up and the next turn
    is whole, which the log says too. Failed turns used to leave no line at all. (The
    probe of the server at start says it is down before any turn: a line of its own; the
    whole job says the server is back too.)"""
    from tests.servers import _free_port

    port = _free_port()
    speech = f"http://127.0.0.1:{port}/v1/audio/speech"
    gw = await start_gateway(tts={"engine": "http", "url": f"http://127.0.0.1:{port}/v1"},
                             session=NO_PACING)
    caplog.set_level(logging.INFO, logger="gateway")
    await gw.telemetry.tts_probes["remote"]._task  # the probe at start
    async with connect(url(gw)) as ws:
        await recv_event(ws, "session.created")
        await two_failed_turns_degrade(gw, ws, "Nobody is there to say this.")
        probed, warning = [r for r in caplog.records if r.levelname == "WARNING"]
        assert probed.getMessage().startswith(
            f"the TTS server of lane remote at {speech} does not answer (ConnectError: ")
        assert warning.getMessage().startswith(
            f"lane remote: http fails (engine_failed): TTS server {speech}: ConnectError(")
        caplog.clear()
        await start_gateway(server={"http_port": port})
        up = await say(ws, "Now it is said.")
        assert up.done["status"] == "completed"
        health = gw.health()
        assert health["status"] == "ok" and health["engine"]["failing"] is None
    assert sorted((r.levelname, r.getMessage()) for r in caplog.records
                  if r.name in ("gateway.io.lanes", "gateway.io.telemetry")) == [
        ("INFO", "lane remote: http spoke a whole job again"),
        ("INFO", f"the TTS server of lane remote at {speech} answers again (spoke a job)")]


async def test_a_session_closed_by_its_own_error_event_leaves_nothing_on_the_lane():
    """The engine fails the turn's first sentence and the `error` event is the message that
    passes the unread-output bound (a client that stopped reading): the session closed
    there, and the rest of the effects, the turn's cancel on the lane among them, were
    skipped, so the dead session's seven other sentences were still synthesized (I/O
    review)."""

    class FailsAfterHanging(FaultyEngine):  # TEST DOUBLE
        def open(self, request: SynthesisRequest):
            stream = super().open(request)
            if "HANG" in request.text:
                hanging = stream.step

                def step() -> bytes | None:
                    chunk = hanging()  # the second step hangs until released
                    if engine.release.is_set():
                        raise EngineError("engine_failed", "scripted engine failure")
                    return chunk

                stream.step = step  # type: ignore[method-assign]
            return stream

    engine = FailsAfterHanging()
    gw = await start(engine)
    try:
        async with connect(url(gw)) as ws:
            created = await recv_event(ws, "session.created")
            runner = gw.runners[created["session_id"]]
            await send(ws, type="say", text="A HANG here first. " + " ".join(
                f"Then sentence {n} of eight." for n in range(2, 9)))
            await asyncio.to_thread(engine.hung.wait)
            assert gw.lane.queue_depth == 8  # the first running, the rest waiting
            runner.outbox.max_bytes = 0  # the next message passes the bound
            engine.release.set()
            await gw.wait_no_sessions()
        assert gw.metrics.errors["slow_consumer"] == 1
        assert gw.lane.queue_depth == 0 and gw.lane.stats.jobs_cancelled == 7
    finally:
        await gw.aclose()


async def test_a_bug_consuming_the_audio_fails_that_turn_only(monkeypatch):
    """A session whose handling of a chunk raises (a gateway bug: a lone surrogate once got
    this far) used to kill the lane task: every later turn of every session hung while
    /health said ok. Now that turn fails with internal_error and the lane goes on."""
    from gateway.io.connection import SessionRunner

    a_bug_in(monkeypatch, SessionRunner, "on_audio", says_bug)
    gw = await start(FaultyEngine())
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            bad = await say(ws, "This one is fine. But BUG breaks this one.")
            (error,) = bad.of("error")
            assert error["error"] == {"code": "internal_error",
                                      "message": "TypeError: a scripted bug in the session"}
            assert bad.done["status"] == "failed"
            await well_behaved(gw)
            again = await say(ws, "The lane still works.")
            assert again.done["status"] == "completed" and gapless(bad, again)
        assert gw.lane.unhealthy is None and gw.health()["status"] == "ok"
    finally:
        await gw.aclose()


async def test_a_bug_after_a_sentence_was_made_still_ends_its_turn(monkeypatch):
    """A bug handling a segment's end (``on_done``, after the session has the segment whole)
    reaches the session as that segment failing (``internal_error``), a failure after its
    success: the lane has taken the turn's other jobs off without a word. Ignored by the
    session for a segment already made, the turn waited for ever for the rest of its
    sentences (``Session.synthesis_failed``)."""
    from gateway.io.connection import SessionRunner

    a_bug_in(monkeypatch, SessionRunner, "on_done", says_bug,
             "a scripted bug after the sentence", after=True)
    gw = await start(FaultyEngine())
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="A BUG ends this one. And this one never comes. "
                                            "Nor does this one.")
            bad = await unless_hung(read_turn(ws))
            (error,) = bad.of("error")
            assert error["error"] == {"code": "internal_error",
                                      "message": "TypeError: a scripted bug after the sentence"}
            assert bad.done["status"] == "failed" and bad.done["metrics"]["sentences"] == 1
            again = await say(ws, "The session goes on.")
            assert again.done["status"] == "completed" and gapless(bad, again)
        assert gw.lane.queue_depth == 0
    finally:
        await gw.aclose()


async def test_every_job_a_consumers_bug_fails_is_counted(monkeypatch):
    """A bug consuming a job's audio fails its owner's jobs: the one whose audio broke and
    those queued behind it. The lane counted one failure for all of them (``/health``'s
    ``jobs.failed``), while its observer saw each end ``failed``."""
    from gateway.io.connection import SessionRunner

    a_bug_in(monkeypatch, SessionRunner, "on_audio", says_bug)
    gw = await start(FaultyEngine())
    ended = []
    job_ended = gw.telemetry.job_ended
    monkeypatch.setattr(gw.telemetry, "job_ended", lambda lane, job, outcome: (
        ended.append(outcome), job_ended(lane, job, outcome)))
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            bad = await say(ws, "This one is fine. But BUG breaks this one. And this one "
                                "never comes. Nor does this one.")
            assert bad.done["status"] == "failed"
        assert ended.count("failed") == 3
        assert gw.lane.stats.jobs_failed == 3
        assert gw.health()["lanes"][gw.lane.name]["jobs"]["failed"] == 3
    finally:
        await gw.aclose()


async def test_a_bug_handling_a_message_ends_that_session_only(monkeypatch, caplog):
    """A message whose handling raises (a gateway bug) closes its socket 1011 "internal
    error" and ends the session (its state may hold what broke it: a resume would break
    again), counted in errors; other sessions go on."""
    from gateway.core import codec
    from gateway.io.connection import SessionRunner

    a_bug_in(monkeypatch, SessionRunner, "receive", lambda self, message, now: (
        isinstance(message, codec.ClientSay) and "BUG" in message.text))
    gw = await start(FaultyEngine())
    try:
        async with connect(url(gw)) as ws:
            created = await recv_event(ws, "session.created")
            await send(ws, type="say", text="BUG")
            await read_until_closed(ws)
            assert (ws.close_code, ws.close_reason) == (1011, "internal error")
        await well_behaved(gw)
        assert created["session_id"] not in gw.runners  # ended, not waiting for a resume
        assert gw.metrics.errors["internal_error"] == 1
        assert [r.message for r in caplog.records if r.levelname == "ERROR"] == [
            f"session {created['session_id']}: internal error; the session ends"]
    finally:
        await gw.aclose()


@pytest.mark.parametrize("core_call", ["tick", "llm_delta"])
async def test_a_bug_in_the_pacing_timer_or_the_llm_task_ends_that_session_only(
        core_call, monkeypatch, caplog):
    """Where no message is being handled, a bug had other outcomes than the one above: in
    the pacing timer the session stopped sending audio for good, silently; in the LLM task
    it read as the LLM failing (llm_failed, and /health degraded) while the turn hung (I/O
    review). Both now end the session as a bug does anywhere."""
    from gateway.core.session import Session

    target: list[str] = []
    a_bug_in(monkeypatch, Session, core_call, lambda self, *_: self.id in target,
             f"a scripted bug in Session.{core_call}")
    gw = await start(FaultyEngine())
    try:
        async with connect(url(gw)) as ws:
            created = await recv_event(ws, "session.created")
            await send(ws, type="session.update", session={"max_lead_ms": 100})  # paced
            await recv_event(ws, "session.updated")
            target.append(created["session_id"])
            await send(ws, type="transcript", text="Tell me something long, please.")
            await read_until_closed(ws)
            assert (ws.close_code, ws.close_reason) == (1011, "internal error")
        await well_behaved(gw)
        assert created["session_id"] not in gw.runners
        assert gw.metrics.errors["internal_error"] == 1 and "llm_failed" not in gw.metrics.errors
        assert gw.llm_failing is None and gw.health()["status"] == "ok"
        assert [r.message for r in caplog.records if r.levelname == "ERROR"] == [
            f"session {created['session_id']}: internal error; the session ends"]
    finally:
        await gw.aclose()


async def test_a_lane_that_stops_says_so_and_fails_what_waits(monkeypatch):
    gw = await start(FaultyEngine())
    try:
        from gateway.core.scheduler import LaneScheduler

        def broken(self, now):
            raise RuntimeError("a scripted scheduler bug")

        monkeypatch.setattr(LaneScheduler, "next_job", broken)
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            result = await say(ws, "Nobody can speak this.")
            assert result.of("error")[0]["error"]["code"] == "engine_unavailable"
            assert result.done["status"] == "failed"
            again = await say(ws, "Nor this.")  # fails at once, no hang
            assert again.of("error")[0]["error"]["code"] == "engine_unavailable"
        health = gw.health()
        assert health["status"] == "unhealthy"
        assert "a scripted scheduler bug" in health["engine"]["unhealthy"]
    finally:
        await gw.aclose()


class UnloadableEngine(SyntheticEngine):
    """TEST DOUBLE: a voice whose model is missing: ``load`` raises as qwen3's does."""

    name = "qwen3"

    def voices(self) -> list[str]:
        return ["serena"]

    def load(self) -> None:
        raise EngineError("engine_failed", "no model at /models/qwen3")


async def test_a_primary_that_did_not_load_is_reported_degraded_not_ok(caplog):
    # behind a fallback the gateway serves anyway, but says so: it said "ok", loaded,
    # and a session could pick a voice nobody could speak. Nor is the primary's voice,
    # configured, what a session or request without one is said to speak: the fallback
    # speaks its own ("voice": "serena" in session.created, "voice serena" in the log)
    from engines.fallback import FallbackEngine

    engine = FallbackEngine(UnloadableEngine(rtf=0, ttfa_ms=0, lane="cpu"),
                            SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, session=NO_PACING,
                             tts={"voice": "serena"}), engine=engine)
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            health = await client.get(f"http://127.0.0.1:{gw.port}/health")
            voices = (await client.get(f"http://127.0.0.1:{gw.http_port}/v1/audio/voices")
                      ).json()
            caplog.set_level(logging.INFO, logger="gateway.io.http_api")
            speech = await client.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                       json={"input": "Hi.", "response_format": "pcm"})
        assert health.status_code == 200  # it serves
        body = health.json()
        assert body["status"] == "degraded"
        assert body["engine"]["degraded"] == "qwen3 failed to load: no model at /models/qwen3"
        assert body["engine"]["fallback"]["breaker_state"] == "open"
        assert voices["default"] == engine.fallback.default_voice  # what does speak
        assert speech.status_code == 200 and any(
            r.getMessage().startswith(f"speech completed (pcm, chunked, voice "
                                      f"{voices['default']})") for r in caplog.records)
        async with connect(url(gw)) as ws:
            created = await recv_event(ws, "session.created")
            assert created["session"]["voice"] is None
            assert created["default_voice"] == voices["default"]
            await send(ws, type="session.update", session={"voice": "ryan"})
            assert (await recv_event(ws))["error"]["code"] == "unknown_voice"
            # the server's own settings can still be sent back as they are
            await send(ws, type="session.update", session=created["session"])
            assert (await recv_event(ws))["type"] == "session.updated"
            result = await say(ws, WELL)
        assert result.done["status"] == "completed"
        assert result.done["metrics"]["engines"] == ["synthetic"]
    finally:
        await gw.aclose()


async def test_hung_engine_times_out_marks_the_lane_unhealthy_and_fails_fast():
    engine = FaultyEngine()
    gw = await start(engine)
    deadline_on_hangs(gw.lane, 0.5)
    try:
        async with connect(url(gw)) as ws, connect(url(gw)) as other:
            await recv_event(ws, "session.created")
            await recv_event(other, "session.created")
            await send(ws, type="say", text="It starts well. Then HANG stops it cold.")
            # the other session's turn queues behind the stuck step...
            await asyncio.to_thread(engine.hung.wait, 10)
            await send(other, type="say", text=WELL)
            bad = await read_turn(ws)
            assert [e["error"]["code"] for e in bad.of("error")] == ["engine_timeout"]
            assert bad.done["status"] == "failed"
            # ...and fails fast with a clear error instead of waiting forever
            queued = await read_turn(other)
            assert [e["error"]["code"] for e in queued.of("error")] == ["engine_unavailable"]
            assert "engine_timeout" in queued.of("error")[0]["error"]["message"]
            assert queued.done["status"] == "failed"
            async with httpx.AsyncClient(timeout=HANG_S) as http:
                for port in (gw.port, gw.http_port):
                    health = await http.get(f"http://127.0.0.1:{port}/health")
                    assert health.status_code == 503
                    assert health.json()["status"] == "unhealthy"
                    assert "engine_timeout" in health.json()["engine"]["unhealthy"]
                speech = await http.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                         json={"input": "Hello."})
                assert speech.status_code == 503
                assert speech.json()["error"]["code"] == "engine_unavailable"
                assert speech.headers["retry-after"] == "1"
            # a new turn while stuck fails at once too
            fast = await say(other, "Still stuck?")
            assert fast.of("error")[0]["error"]["code"] == "engine_unavailable"
            # the stuck call returns: the lane is healthy again and serves, degraded (as
            # after any failure: docs/http-api.md, /health) until a job comes whole; it
            # said ok at once, a lane whose engine had hung for its whole step deadline
            engine.release.set()
            await unless_hung(gw.lane.wait_healthy())
            health = gw.health()
            assert health["status"] == "degraded"
            assert health["engine"]["failing"] == "engine_timeout"
            after = await say(other, WELL)
            assert after.done["status"] == "completed" and gw.health()["status"] == "ok"
            assert gapless(queued, fast, after) and gapless(bad)
    finally:
        engine.release.set()
        await gw.aclose()


async def test_health_shows_a_lane_busy_with_its_stuck_call_and_for_how_long():
    """After a step deadline the step has ended (``engine_timeout``) but the call still
    holds the lane thread. /health said ``busy: false`` for that lane the whole time:
    an operator saw an idle lane that failed every turn."""
    engine = FaultyEngine()
    gw = await start(engine)
    deadline_on_hangs(gw.lane, 0.5)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="It starts well. Then HANG stops it cold.")
            bad = await read_turn(ws)
            assert [e["error"]["code"] for e in bad.of("error")] == ["engine_timeout"]
            async with httpx.AsyncClient(timeout=HANG_S,
                                         base_url=f"http://127.0.0.1:{gw.port}") as http:
                first = (await http.get("/health")).json()["lanes"]["cpu"]
                metrics = (await http.get("/metrics")).text
                later = (await http.get("/health")).json()["lanes"]["cpu"]
            assert first["busy"] is True and first["stuck_calls"] == 1
            assert first["unhealthy"] is not None
            assert 0 < first["stuck_s"] <= later["stuck_s"]  # (counts on while stuck)
            assert 'gateway_lane_stuck_seconds{lane="cpu"} 0.0' not in metrics
            assert 'gateway_lane_stuck_seconds{lane="cpu"}' in metrics
            engine.release.set()
            await unless_hung(gw.lane.wait_healthy())
            async with httpx.AsyncClient(timeout=HANG_S,
                                         base_url=f"http://127.0.0.1:{gw.port}") as http:
                after = (await http.get("/health")).json()["lanes"]["cpu"]
                metrics = (await http.get("/metrics")).text
            assert after["busy"] is False and after["stuck_calls"] == 0
            assert after["stuck_s"] is None
            assert 'gateway_lane_stuck_seconds{lane="cpu"} 0.0' in metrics
    finally:
        engine.release.set()
        await gw.aclose()


class StuckAtOnce(FaultyEngine):
    """TEST DOUBLE: FaultyEngine whose steps may run at once (``parallel_steps``, as the
    http engine's). A text ``HANG <name>.`` holds its second step until ``gates[name]``
    is set (``held[name]``: it is held now)."""

    parallel_steps = 4

    def __init__(self) -> None:
        super().__init__()
        self.gates = {name: threading.Event() for name in "ABC"}
        self.held = {name: threading.Event() for name in "ABC"}

    def open(self, request: SynthesisRequest):
        stream = SyntheticEngine.open(self, request)  # (not FaultyEngine's own HANG)
        name = request.text.removeprefix("HANG ").rstrip(".")
        if not request.text.startswith("HANG ") or name not in self.gates:
            return stream
        step, steps = stream.step, [0]

        def held() -> bytes | None:
            steps[0] += 1
            if steps[0] == 2:
                self.held[name].set()
                self.gates[name].wait()
            return step()

        stream.step = held  # type: ignore[method-assign]
        stream.hangs_next = lambda: steps[0] == 1  # type: ignore[attr-defined]
        return stream


async def test_a_lane_with_steps_at_once_is_healthy_again_only_when_no_call_is_stuck(
        monkeypatch):
    """With steps at once, several calls can be stuck past the step deadline. The first
    of them to return made the lane healthy while the others still hung: /health said
    ok and new turns were placed on the lane, each to wait out the whole step deadline
    (30 s of silence, then engine_timeout) instead of failing at once."""
    engine = StuckAtOnce()
    gw = await start(engine)
    lane = gw.lane
    deadline_on_hangs(lane, 0.5)
    assert lane.parallel_steps == StuckAtOnce.parallel_steps
    returned = asyncio.Event()
    stuck_call_returned = lane._stuck_call_returned

    def observed(began: float) -> None:  # (orders the test after the lane heard of a return)
        stuck_call_returned(began)
        returned.set()

    monkeypatch.setattr(lane, "_stuck_call_returned", observed)
    try:
        async with connect(url(gw)) as a, connect(url(gw)) as b, connect(url(gw)) as c:
            for ws in (a, b, c):
                await recv_event(ws, "session.created")
            await send(a, type="say", text="HANG A.")
            await send(b, type="say", text="HANG B.")
            for name in "AB":
                await asyncio.to_thread(engine.held[name].wait, 10)
            for ws in (a, b):
                stuck = await read_turn(ws)
                assert [e["error"]["code"] for e in stuck.of("error")] == ["engine_timeout"]
            engine.gates["A"].set()
            await returned.wait()
            # B's call still hangs: the lane is not healthy, and a new turn fails at once
            assert lane.unhealthy is not None and gw.health()["status"] == "unhealthy"
            fast = await say(c, "HANG C.")
            assert [e["error"]["code"] for e in fast.of("error")] == ["engine_unavailable"]
            returned.clear()
            engine.gates["B"].set()
            await returned.wait()
            assert lane.unhealthy is None and gw.health()["status"] == "degraded"
            after = await say(c, WELL)
            assert after.done["status"] == "completed" and gw.health()["status"] == "ok"
    finally:
        for gate in engine.gates.values():
            gate.set()
        await gw.aclose()


class GetsStuck(FaultyEngine):
    """TEST DOUBLE: ``HANG`` in a text holds its second step until ``gate`` is set; once
    ``stuck`` is set, every later call blocks until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.stuck = False

    def open(self, request: SynthesisRequest):
        if self.stuck:
            self.release.wait()
        stream = SyntheticEngine.open(self, request)  # (not FaultyEngine's own HANG)
        step, steps = stream.step, [0]

        def gated() -> bytes | None:
            steps[0] += 1
            if self.stuck:
                self.release.wait()
            elif steps[0] == 2 and "HANG" in request.text:
                self.hung.set()
                self.gate.wait()
            return step()

        stream.step = gated  # type: ignore[method-assign]
        return stream


async def test_a_bug_hearing_of_a_stuck_lane_does_not_stop_the_lane_for_good(monkeypatch):
    """A session whose handling of ``engine_unavailable`` raised (a gateway bug, as the one
    consuming audio above) while the lane was stuck stopped the lane task: the lane stayed
    unhealthy for good ("the lane stopped"), every later turn failing, although the stuck
    call returned. Now that turn fails with internal_error and the lane recovers."""
    from gateway.io.connection import SessionRunner

    a_bug_in(monkeypatch, SessionRunner, "on_failed",
             lambda self, job, code, message: code == "engine_unavailable")
    engine = GetsStuck()
    gw = await start(engine)
    gw.lane.step_timeout_s = None  # (the gated call: no limit)
    try:
        async with connect(url(gw)) as ws, connect(url(gw)) as other:
            await recv_event(ws, "session.created")
            await recv_event(other, "session.created")
            await send(ws, type="say", text="It starts well. Then HANG holds it.")
            first = await recv_event(ws, "turn.started")
            await asyncio.to_thread(engine.hung.wait)
            await send(other, type="say", text=WELL)
            second = await recv_event(other, "turn.started")  # queued behind the step
            # the next call gets stuck and times out; the other turn's jobs wait for a lane
            # that cannot run them
            gw.lane.step_timeout_s = 0.05
            engine.stuck = True
            engine.gate.set()
            reads = [asyncio.create_task(read_turn(ws, first["turn_id"])),
                     asyncio.create_task(read_turn(other, second["turn_id"]))]
            await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            # (both turns were failed in one step of the lane task)
            assert "engine_timeout" in (gw.lane.unhealthy or ""), gw.lane.unhealthy
            results = [await read for read in reads]
            assert sorted(e["error"]["code"] for r in results for e in r.of("error")) == [
                "engine_timeout", "internal_error"]
            assert all(r.done["status"] == "failed" for r in results)
            gw.lane.step_timeout_s = None
            engine.stuck = False
            engine.release.set()
            await unless_hung(gw.lane.wait_healthy())
            after = await say(other, WELL)
            assert after.done["status"] == "completed"
    finally:
        engine.gate.set()
        engine.release.set()
        await gw.aclose()


class HangsOpening(FaultyEngine):
    """TEST DOUBLE: ``STALL`` in a text blocks its ``open`` until ``release`` is set."""

    def opening_hangs(self, request: SynthesisRequest) -> bool:
        return "STALL" in request.text

    def open(self, request: SynthesisRequest):
        if "STALL" in request.text:
            self.hung.set()
            self.release.wait()
        return super().open(request)


@pytest.mark.parametrize("text", ["It starts well. Then HANG stops it cold.",
                                  "STALL before a word."], ids=["step", "open"])
async def test_a_stream_a_timed_out_call_holds_is_closed_once_the_call_returns(text):
    """The engine's stream stays with its stuck thread after ``engine_timeout``; when the
    call returns at last, the stream is closed there. It was left open for good: the
    engine kept it among its streams (a model's, with its caches) after every timeout."""
    engine = HangsOpening()
    gw = await start(engine)
    deadline_on_hangs(gw.lane, 0.5)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            bad = await say(ws, text)
            assert [e["error"]["code"] for e in bad.of("error")] == ["engine_timeout"]
            engine.release.set()
            await unless_hung(gw.lane.wait_healthy())
            # a turn after it runs on the lane thread after the stuck call and the close
            after = await say(ws, "Fine now.")
            assert after.done["status"] == "completed"
        assert not engine._streams
    finally:
        engine.release.set()
        await gw.aclose()


class OpensSlowly(FaultyEngine):
    """TEST DOUBLE: ``SLOW`` in a text holds its ``open`` until ``gate`` is set (a model's
    prefill); ``stepped`` lists the texts whose stream was stepped."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.stepped: list[str] = []

    def open(self, request: SynthesisRequest):
        if "SLOW" in request.text:
            self.hung.set()
            self.gate.wait()
        stream = super().open(request)
        step = stream.step

        def recording() -> bytes | None:
            self.stepped.append(request.text)
            return step()

        stream.step = recording  # type: ignore[method-assign]
        return stream


async def test_a_turn_cancelled_while_its_stream_opens_takes_no_step():
    """Barge-in while the engine opens the turn's stream: the lane went on to run that
    stream's first step (a whole step of lane time: ~140 ms for Qwen3-TTS, ~300 ms with
    the LLM decoding) for audio nobody would hear, ahead of the new turn's first audio."""
    engine = OpensSlowly()
    gw = await start(engine)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="SLOW to open this one. And then more.")
            await asyncio.to_thread(engine.hung.wait)  # its open holds the lane thread
            await send(ws, type="cancel")
            cut = await read_turn(ws)
            assert cut.done["status"] == "cancelled"
            engine.gate.set()
            after = await say(ws, "The next turn.")  # after the cancelled open, on one thread
            assert after.done["status"] == "completed"
        assert engine.stepped == ["The next turn."] * len(engine.stepped)
        assert gw.lane.stats.jobs_cancelled == 2 and not engine._streams
    finally:
        engine.gate.set()
        await gw.aclose()


class HangsThenRaises(FaultyEngine):
    """TEST DOUBLE: every stream's second step waits for ``release``, then raises."""

    def open(self, request: SynthesisRequest):
        stream = SyntheticEngine.open(self, request)
        step, steps = stream.step, [0]

        def hangs_then_raises() -> bytes | None:
            steps[0] += 1
            if steps[0] == 2:
                self.hung.set()
                self.release.wait()
                raise self.fault
            return step()

        stream.step = hangs_then_raises  # type: ignore[method-assign]
        return stream


async def test_a_job_cancelled_while_its_step_fails_is_counted_once():
    """A barge-in while a step is running, and that step then fails: the job was counted
    (and observed) cancelled, then failed too, so the lane's figures held one job twice."""
    engine = HangsThenRaises()
    gw = await start(engine)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="This sentence is long enough to take steps.")
            await asyncio.to_thread(engine.hung.wait)
            await send(ws, type="cancel")
            assert (await read_turn(ws)).done["status"] == "cancelled"
            engine.release.set()
            engine.hung.clear()
            # the failed step is booked before the lane takes its next job: this one
            await send(ws, type="say", text="Again, and then it fails.")
            await asyncio.to_thread(engine.hung.wait)
            failed = await read_turn(ws)
        assert failed.done["status"] == "failed"
        assert (gw.lane.stats.jobs_cancelled, gw.lane.stats.jobs_failed) == (1, 1)
    finally:
        engine.release.set()
        await gw.aclose()


async def test_dead_lane_executor_fails_jobs_with_a_clear_error():
    gw = await start(FaultyEngine())
    try:
        gw.lane._executor.shutdown(wait=True)  # the lane's worker thread is gone
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            result = await say(ws, "Nobody can speak this.")
            (error,) = result.of("error")
            assert error["error"]["code"] == "engine_unavailable"
            assert "executor" in error["error"]["message"]
            assert result.done["status"] == "failed"
            again = await say(ws, "Nor this.")  # fails at once, no hang
            assert again.of("error")[0]["error"]["code"] == "engine_unavailable"
        health = gw.health()
        assert health["status"] == "unhealthy" and "executor" in health["engine"]["unhealthy"]
    finally:
        await gw.aclose()


# ---- the LLM ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_llm_process_killed_mid_stream(tiny_llama_dir, tmp_path):
    server = TinyLlamaServer(tiny_llama_dir, tmp_path / "hf-cache")
    (tmp_path / "hf-cache").mkdir()
    await asyncio.to_thread(server.start)
    gw = await start(FaultyEngine(), llm_url=server.url)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            other = asyncio.create_task(well_behaved(gw))
            await send(ws, type="transcript", text="Talk for a long time.")
            result = TurnResult()
            result.events.append(await recv_event(ws, "turn.started"))
            result.turn_id = result.events[0]["turn_id"]
            result.events.append(await recv_event(ws, "text.delta"))  # it is streaming
            assert server._proc is not None
            server._proc.kill()  # SIGKILL: no goodbye on the socket
            await asyncio.to_thread(server._proc.wait)
            rest = await read_turn(ws, result.turn_id)
            codes = [e["error"]["code"] for e in rest.of("error")]
            assert codes and codes[0] in ("llm_failed", "llm_unavailable"), rest.events
            assert rest.done["status"] == "failed"
            await other
    finally:
        await gw.aclose()
        server.stop()


@pytest.mark.parametrize("barge_in", ["cancel", "transcript"])
async def test_a_turn_the_llm_failed_ends_failed_when_cancelled_while_it_plays_out(
        scripted_llm_server, barge_in):
    """protocol.md, Errors: a turn error does not end the turn, ``turn.done`` (``failed``)
    does. The LLM's stream breaks; the complete sentences are still being said (the
    engine holds the second one) when the client cancels, or barges in with a new
    transcript: the turn ended ``cancelled`` after its ``llm_failed``, a turn with an
    error that did not fail (the soak with --faults: 13 of 2,306 failed turns), and the
    gateway counted it cancelled."""
    scripted_llm_server.script(
        [Text("A first sentence to speak. "), Text("HANG comes in the second one. "),
         Text("A third is cut"), Drop()],
        reply_script(["Fine."]))
    engine = FaultyEngine()
    gw = await start(engine, llm_url=scripted_llm_server.url)
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="Talk to me.")
            error = await recv_event(ws, "error")
            assert error["error"]["code"] == "llm_failed"
            await asyncio.to_thread(engine.hung.wait, 10)  # the second sentence is held
            if barge_in == "cancel":
                await send(ws, type="cancel")
            else:
                await send(ws, type="transcript", text="Never mind.")
            done = await recv_event(ws, "turn.done")
            engine.release.set()
            assert done["turn_id"] == error["turn_id"] and done["status"] == "failed"
            if barge_in == "transcript":
                again = await read_turn(ws)
                assert again.done["status"] == "completed" and not again.of("error")
        assert gw.health()["turns"] == ({"failed": 1} if barge_in == "cancel" else
                                        {"failed": 1, "completed": 1})
    finally:
        engine.release.set()
        await gw.aclose()


@pytest.mark.slow
def test_tiny_llama_server_moves_to_another_port_when_its_own_is_taken(
        tiny_llama_dir, tmp_path):
    """The harness picks a free port, but another process may bind it before
    mlx_lm.server does (the suite starts servers in parallel with other work): it then
    exits with "Address already in use", and the harness tries a new port instead of
    failing the test."""
    import socket

    (tmp_path / "hf-cache").mkdir()
    server = TinyLlamaServer(tiny_llama_dir, tmp_path / "hf-cache")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server.port = taken
        server.start()
        try:
            assert server.port != taken
            assert httpx.get(f"{server.url}/models", timeout=10).status_code == 200
        finally:
            server.stop()


# ---- the client -------------------------------------------------------------------------


async def _hanging_turn(gw: Gateway, llm, ws) -> dict:
    """Its session.created, once the turn's audio is being made and its LLM still streams."""
    created = await recv_event(ws, "session.created")
    await send(ws, type="transcript", text="Say a lot.")
    await recv_event(ws, "sentence")  # audio is being made, the LLM still streams
    await unless_hung(llm.request_arrived.wait())
    return created


async def test_client_closing_mid_turn_closes_the_llm_stream_and_frees_the_lane(
        scripted_llm_server):
    scripted_llm_server.script([Text("A first sentence to speak. "), Text("And more "), Hang()])
    gw = await start(FaultyEngine(), llm_url=scripted_llm_server.url)
    try:
        other = asyncio.create_task(well_behaved(gw))
        async with connect(url(gw)) as ws:
            await _hanging_turn(gw, scripted_llm_server, ws)
        # a clean close ends the session at once: stream closed, jobs cancelled
        await unless_hung(scripted_llm_server.chats[0].disconnected.wait())
        await other
        await unless_hung(gw.wait_no_sessions())
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            health = (await http.get(f"http://127.0.0.1:{gw.http_port}/health")).json()
        assert health["lanes"][gw.lane.name]["queue_depth"] == 0
        assert health["sessions"] == 0 and health["active_turns"] == 0
    finally:
        await gw.aclose()


async def test_client_aborting_mid_turn_keeps_the_session_until_the_window_ends(
        scripted_llm_server, caplog):
    scripted_llm_server.script([Text("A first sentence to speak. "), Text("And more "), Hang()])
    gw = await start(FaultyEngine(), llm_url=scripted_llm_server.url, resume_window_s=0.3)
    caplog.set_level(logging.INFO, logger="gateway.io.connection")
    try:
        other = asyncio.create_task(well_behaved(gw))
        ws = await connect(url(gw))
        created = await _hanging_turn(gw, scripted_llm_server, ws)
        ws.transport.abort()  # no close handshake: the session waits for a resume
        await ws.wait_closed()
        request = scripted_llm_server.chats[0]
        await unless_hung(request.disconnected.wait())
        # the stream closed once the window had let the session go, not as the socket did
        # (ordered by the log, not by a clock: the two waits alone held neither)
        ended = f"session {created['session_id']} ended: "
        assert [r.message for r in caplog.records if r.message.startswith(ended)] == [
            ended + "no resume came in time"]
        await unless_hung(gw.wait_no_sessions())
        await other
        assert gw.lane.queue_depth == 0
        assert gw.health()["active_turns"] == 0
    finally:
        await gw.aclose()


# ---- the process ------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_as_soon_as_it_says_serving_still_shuts_down_cleanly(sig):
    # the handlers were installed after the "serving" line: a supervisor's SIGTERM sent on
    # seeing it killed the process outright (10 of 10 runs). SIGHUP killed it (exit 129)
    # with no close to its clients.
    with ServeProcess("--port", "0", "--http-port", "0") as gw:
        gw.serving()
        gw.signal(sig)
        code, output = gw.finish()
    assert code == 0, output
    assert "shutting down: closing 0 session(s)" in output and "stopped" in output


@pytest.mark.slow
def test_a_gateway_started_with_nohup_keeps_serving_when_its_terminal_closes():
    """``nohup voice-gateway serve &`` stopped at logout: nohup leaves SIGHUP ignored, and
    the gateway's SIGHUP handler (a clean stop, for a terminal closed without nohup)
    replaced that. An ignored SIGHUP now stays ignored: the gateway goes on serving, and
    SIGTERM still stops it cleanly."""
    command = ["nohup", sys.executable, "-m", "gateway.cli", "serve", "--port", "0",
               "--http-port", "0", "--tts", "synthetic", "--synthetic-rtf", "0",
               "--synthetic-ttfa-ms", "0"]
    with ServeProcess(command=command) as gw:
        gw.serving()
        gw.signal(signal.SIGHUP)

        async def talk() -> str:
            async with connect(gw.voice_url) as ws:
                await recv_event(ws, "session.created")
                await send(ws, type="say", text="Still here.")
                return (await read_turn(ws)).done["status"]

        assert asyncio.run(talk()) == "completed"  # (stopped: failed, or refused)
        gw.signal(signal.SIGTERM)
        code, output = gw.finish()
    assert code == 0, output
    assert output.count("shutting down: closing") == 1, output


def test_sigterm_during_turns_closes_sessions_1001_and_exits_0(tmp_path):
    with ServeProcess("--port", "0", "--tts", "synthetic", "--max-lead-ms", "1000") as gw:
        port = gw.port

        async def talk() -> list[int | None]:
            sockets = [await connect(f"ws://127.0.0.1:{port}/v1/voice") for _ in range(3)]
            for ws in sockets:
                await recv_event(ws, "session.created")
                await send(ws, type="say", text=WELL * 3)
                await recv_event(ws, "sentence")  # mid-turn
            gw.signal(signal.SIGTERM)
            codes = []
            for ws in sockets:
                await read_until_closed(ws)
                codes.append(ws.close_code)
            return codes

        assert asyncio.run(talk()) == [1001, 1001, 1001]
        code, output = gw.finish()
    assert code == 0, output
    assert "Traceback" not in output, output
    # nothing left running: the port is closed
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


STUCK_THEN_EXIT = """
import asyncio
from tests.test_faults import FaultyEngine, deadline_on_hangs, start, url, say
from websockets.asyncio.client import connect
from tests.wsclient import recv_event

async def main():
    gw = await start(FaultyEngine())
    deadline_on_hangs(gw.lane, 0.3)
    async with connect(url(gw)) as ws:
        await recv_event(ws, "session.created")
        result = await say(ws, "It starts. Then HANG forever.")
        assert result.done["status"] == "failed" and gw.lane.unhealthy
    await gw.aclose()

asyncio.run(main())
print("exiting with a stuck lane thread", flush=True)
"""


@pytest.mark.slow
def test_a_stuck_engine_thread_does_not_keep_the_process_alive():
    done = subprocess.run([sys.executable, "-c", STUCK_THEN_EXIT], capture_output=True,
                          text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)),
                          env=leak_checked_env())
    assert done.returncode == 0, done.stderr
    assert "exiting with a stuck lane thread" in done.stdout
    assert_no_leaks(done.stderr, "the gateway")


async def test_ended_sessions_are_freed():
    """No reference to a closed or expired session survives (the soak's RSS plateau is
    buffers and the allocator, not sessions kept alive)."""
    import gc
    import weakref

    gw = await start(FaultyEngine(), resume_window_s=0.05)
    refs: list[weakref.ref] = []
    new_runner = gw.new_runner

    def tracked():
        runner = new_runner()
        refs.append(weakref.ref(runner))
        return runner

    gw.new_runner = tracked  # type: ignore[method-assign]
    try:
        for i in range(6):
            ws = await connect(url(gw))
            await recv_event(ws, "session.created")
            assert (await say(ws, "A short turn. Then one more.")).done["status"] == "completed"
            if i % 2:
                await ws.close()
            else:
                ws.transport.abort()  # kept for the resume window, then closed
        await unless_hung(gw.wait_no_sessions())
        gc.collect()
        assert len(refs) == 6 and [r for r in refs if r() is not None] == []
    finally:
        await gw.aclose()


class SlowLoadingEngine(SyntheticEngine):
    """TEST DOUBLE: a free synthetic engine whose ``load`` waits for the test's go-ahead (a
    real model takes seconds to a minute)."""

    def __init__(self) -> None:
        super().__init__(rtf=0, ttfa_ms=0, lane="cpu")
        self.loading = threading.Event()
        self.release = threading.Event()

    def load(self) -> None:
        self.loading.set()
        self.release.wait(60)
        super().load()


async def test_a_stop_during_the_model_load_does_not_wait_for_it(capsys):
    from gateway.io.server import serve_until_signalled

    engine = SlowLoadingEngine()
    config = load_config(server={"port": 0, "http_port": 0}, llm={"tokens_per_s": 0})
    gw = Gateway(config, engine=engine)
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_until_signalled(config, stop=stop, gateway=gw))
    try:
        await asyncio.to_thread(engine.loading.wait, 30)
        http_port = gw.http_port  # (the HTTP API answers 503 while the engine loads)
        stop.set()
        async with hang_guard("the stop, the load still blocked"):  # nothing waits for it
            await serving
        assert "stopped while starting" in capsys.readouterr().out
        assert not gw.ready
        async with httpx.AsyncClient(timeout=5) as client:
            with pytest.raises(httpx.ConnectError):  # what the start opened is closed
                await client.get(f"http://127.0.0.1:{http_port}/health")
    finally:
        engine.release.set()


async def test_an_engine_bug_on_every_job_is_logged_once_and_health_says_degraded(caplog):
    """An engine that raises something else than an ``EngineError`` (a bug, a library's own
    error) on every job: each job fails ``engine_failed`` like any other failure, so
    /health says degraded (``engine.failing``) and the log says so once, with the
    traceback, not a traceback per sentence while /health said ok."""
    gw = await start(FaultyEngine(RuntimeError("a bug in the engine")))
    caplog.set_level(logging.INFO, logger="gateway.io.lanes")
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            await two_failed_turns_degrade(gw, ws, "RAISE breaks this sentence midway, every time.")
            (error,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert error.levelname == "ERROR" and error.exc_info is not None
            caplog.clear()
            again = await say(ws, "The lane still works.")
            assert again.done["status"] == "completed"
        assert gw.health()["status"] == "ok" and gw.health()["engine"]["failing"] is None
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("INFO", "lane cpu: synthetic spoke a whole job again")]
    finally:
        await gw.aclose()


class _BuggyLlm:
    """TEST DOUBLE: an LLM backend with a bug: its stream raises a ``KeyError`` (not an
    ``EngineError``) before any text."""

    name = "buggy"

    async def stream(self, request):
        raise KeyError("choices")
        yield  # (an async generator)

    async def aclose(self) -> None:
        pass


async def test_an_llm_backend_bug_on_every_turn_is_logged_once(caplog):
    """README (Logs): the LLM failing turns is a WARNING once, not a line per turn. A bug in
    the backend failed each turn ``llm_failed`` with an ERROR traceback per turn besides;
    the traceback is logged once, when the failing starts, with the WARNING."""
    gw = Gateway(load_config(server={"port": 0}, session=NO_PACING), llm=_BuggyLlm())
    await gw.start()
    caplog.set_level(logging.INFO, logger="gateway")
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            for _ in range(3):
                await send(ws, type="transcript", text="Hello?")
                done = await recv_event(ws, "turn.done")
                assert done["status"] == "failed"
        assert gw.health()["llm"]["failing"]["turns"] == 3
    finally:
        await gw.aclose()
    loud = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [("ERROR", "LLM backend failed"),
                    ("WARNING", "the LLM fails turns (llm_failed): KeyError: 'choices'")]


async def test_a_stalled_engine_is_an_error_once_and_its_return_an_info(caplog):
    """README (Logs): an engine that stalls is said once, and its return as an INFO, as an
    engine that fails and speaks again is. The return was a WARNING: an alert on WARNING
    and above fired again as the lane came back."""
    engine = FaultyEngine()
    gw = await start(engine)
    deadline_on_hangs(gw.lane, 0.3)
    caplog.set_level(logging.INFO, logger="gateway.io.lanes")
    try:
        async with connect(url(gw)) as ws:
            await recv_event(ws, "session.created")
            bad = await say(ws, "HANG stops it cold.")
            assert bad.done["status"] == "failed"
            assert gw.health()["status"] == "unhealthy"
            engine.release.set()
            await unless_hung(gw.lane.wait_healthy())
            assert gw.health()["status"] == "degraded"
            assert (await say(ws, WELL)).done["status"] == "completed"
            assert gw.health()["status"] == "ok"
    finally:
        engine.release.set()
        await gw.aclose()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "lane cpu: engine_timeout: an engine call (_timed_step) of synthetic ran "
                  "more than 0.3 s and still holds the lane thread"),
        ("INFO", "lane cpu: the stuck engine call returned; the lane is healthy again"),
        ("INFO", "lane cpu: synthetic spoke a whole job again")]
