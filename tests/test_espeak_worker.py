"""libespeak-ng in its worker process: a crash, a kill or a hang of the library costs the
sentence it was speaking; the next one speaks with a new worker. The library is real, and
so are its crashes: the parent's guard (``espeak_text``) is set aside for the text that
must reach the worker unguarded."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading

import pytest

from engines import espeak
from engines.base import EngineError, SynthesisRequest
from tests.hang_guard import HANG_S
from tests.wsclient import read_turn, recv_event, send

CRASHING = "a." * 300
"""Letters joined by dots past libespeak-ng's stack buffer: SIGSEGV with the wheel's 1.52
(a child ran it alone: "a." 200 times aborted, "stack smashing detected", 300 times
SIGSEGV; the brief's "A.B.C." 40 letters long did not crash it)."""


def _unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``CRASHING`` reach the library as it is; every other text keeps its guard."""
    guarded = espeak.espeak_text
    monkeypatch.setattr(
        espeak, "espeak_text", lambda text, **kw: text if text == CRASHING else guarded(text, **kw)
    )


def _spoken(engine: espeak.EspeakEngine, text: str) -> bytes:
    stream = engine.open(SynthesisRequest(text=text))
    chunks = []
    while (chunk := stream.step()) is not None:
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_crash_of_the_library_fails_its_sentence_and_the_next_speaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unguarded(monkeypatch)
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        before = _spoken(engine, "The next sentence speaks.")
        first = engine.worker_pid
        with pytest.raises(EngineError) as err:
            _spoken(engine, CRASHING)
        assert err.value.code == "engine_failed"
        assert err.value.message.startswith("espeak worker died (signal SIG"), err.value.message
        assert _spoken(engine, "The next sentence speaks.") == before
        assert engine.worker_pid not in (None, first)
    finally:
        engine.close()


def _signalled_at_its_first_buffer(engine: espeak.EspeakEngine, text: str,
                                   signum: int) -> tuple[EngineError, int]:
    """The error of a synthesis of ``text`` whose worker gets ``signum`` once its first
    buffer of audio is in (again at each later one already in the pipe: no harm), and the
    worker's pid."""
    stream = engine.open(SynthesisRequest(text=text))
    push, pid = stream._push, engine.worker_pid
    assert pid is not None

    def push_then_signal(samples) -> None:  # noqa: ANN001
        push(samples)
        os.kill(pid, signum)

    stream._push = push_then_signal  # type: ignore[method-assign]
    with pytest.raises(EngineError) as err:
        stream.step()
    return err.value, pid


def test_a_worker_killed_mid_synthesis_fails_that_sentence_only() -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        error, pid = _signalled_at_its_first_buffer(
            engine, "A long text to be cut short. " * 40, signal.SIGKILL)
        assert error.code == "engine_failed"
        assert error.message.startswith("espeak worker died (signal SIGKILL) speaking ")
        assert _spoken(engine, "Spoken by a new worker.")
        assert engine.worker_pid != pid
    finally:
        engine.close()


def test_closing_a_stream_whose_worker_hangs_returns_and_the_next_speaks() -> None:
    """A worker stopped (SIGSTOP: a hang, as a C loop that never ends would be) while it
    speaks: ``close()`` from another thread returns without waiting for it, the step ends
    (the worker, silent after the abort for ``ABORT_GRACE_S``, is killed) with no error,
    as a closed stream's, and the next sentence speaks with a new worker."""
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        stream = engine.open(SynthesisRequest(text="A long text to hang in. " * 40))
        push, pid = stream._push, engine.worker_pid
        assert pid is not None
        closed = threading.Event()

        def push_then_hang(samples) -> None:  # noqa: ANN001
            push(samples)
            if not closed.is_set():
                os.kill(pid, signal.SIGSTOP)
                closer = threading.Thread(target=lambda: (stream.close(), closed.set()))
                closer.start()
                closer.join(HANG_S)
                assert closed.is_set()

        stream._push = push_then_hang  # type: ignore[method-assign]
        assert stream.step() is None
        assert closed.is_set()
        assert _spoken(engine, "Spoken by a new worker.")
        assert engine.worker_pid != pid
    finally:
        engine.close()


def test_close_ends_the_worker_and_an_engine_never_closed_ends_it_when_collected() -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    worker = engine._lib
    assert isinstance(worker, espeak._Worker)
    engine.close()
    assert worker.proc.returncode == 0  # it left on its own, at EOF: no zombie
    assert worker.proc.stdin.closed and worker.proc.stdout.closed  # type: ignore[union-attr]

    forgotten = espeak.EspeakEngine()
    forgotten.load()
    worker = forgotten._lib
    assert isinstance(worker, espeak._Worker)
    del forgotten
    gc.collect()
    assert worker.proc.returncode == 0
    assert worker.proc.stdout.closed  # type: ignore[union-attr]


def test_the_worker_started_for_a_library_that_cannot_load_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import espeakng_loader

    monkeypatch.setattr(
        espeakng_loader, "get_library_path", lambda: "/nonexistent/libespeak-ng.so.1"
    )
    engine = espeak.EspeakEngine()
    with pytest.raises(EngineError) as err:
        engine.load()
    assert err.value.code == "engine_failed"
    assert err.value.message.startswith("cannot load libespeak-ng: ")
    assert "/nonexistent/libespeak-ng.so.1" in err.value.message
    engine.close()


async def test_a_worker_crash_fails_one_sessions_turn_and_spares_the_other(
    start_gateway,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two sessions on one gateway: session B's long turn is speaking (its first frame
    came) when session A's turn reaches text that crashes libespeak-ng. A gets an
    ``error`` (engine_failed) for its turn, B's turn completes, and A's next turn speaks."""
    from websockets.asyncio.client import connect

    _unguarded(monkeypatch)
    gw = await start_gateway(session={"max_lead_ms": 36_000_000})
    url = f"ws://127.0.0.1:{gw.port}/v1/voice"

    async def scenario() -> None:
        async with connect(url, max_size=None) as a, connect(url, max_size=None) as b:
            await recv_event(a, "session.created")
            await recv_event(b, "session.created")
            await send(b, type="say", text="Session B keeps speaking. " * 20)
            b_turn = (await recv_event(b, "turn.started"))["turn_id"]
            while isinstance(await b.recv(), str):
                pass  # until B's first audio frame
            await send(a, type="say", text=CRASHING)
            crashed = await read_turn(a)
            (error,) = [e["error"] for e in crashed.of("error")]
            assert error["code"] == "engine_failed", error
            assert "espeak worker died (signal SIG" in error["message"], error
            assert crashed.done["status"] != "completed"
            spared = await read_turn(b, b_turn)
            assert spared.done["status"] == "completed" and not spared.of("error")
            await send(a, type="say", text="Session A speaks again.")
            again = await read_turn(a)
            assert again.done["status"] == "completed" and again.frames

    await asyncio.wait_for(scenario(), HANG_S)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_workers_replaced_and_closed_leave_no_fd_and_no_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker killed while idle is replaced before the next sentence, which speaks (no
    failure: none was in flight); one that dies between the check and the request fails
    that request precisely (the race, made certain here by taking it for alive). Every
    worker's pipes are closed and every worker reaped by the engine's close."""
    before = _fds()
    engine = espeak.EspeakEngine()
    engine.load()
    workers = [engine._lib]
    first = engine.worker_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert isinstance(workers[0], espeak._Worker) and workers[0].proc.wait(HANG_S) == -9
    assert _spoken(engine, "An idle worker that died is replaced.")
    assert engine.worker_pid != first
    workers.append(engine._lib)
    assert workers[0].proc.stdout.closed  # type: ignore[union-attr]

    os.kill(engine.worker_pid, signal.SIGKILL)  # type: ignore[arg-type]
    workers[1].proc.wait(HANG_S)  # type: ignore[union-attr]
    monkeypatch.setattr(espeak._Worker, "alive", property(lambda self: not self._dead))
    with pytest.raises(EngineError) as err:
        _spoken(engine, "Its request finds the pipe broken.")
    assert err.value.message.startswith("espeak worker died (signal SIGKILL) speaking ")
    monkeypatch.undo()
    assert _spoken(engine, "And the next one speaks.")
    workers.append(engine._lib)
    engine.close()
    for worker in workers:
        assert isinstance(worker, espeak._Worker) and worker.proc.returncode is not None
    assert _fds() == before


def test_a_closed_engine_still_lists_its_voices_and_starts_no_worker() -> None:
    engine = espeak.EspeakEngine()
    engine.load()
    worker = engine._lib
    voices = engine.voices()
    engine.close()
    assert engine.voices() == voices and engine.deterministic in (True, False)
    assert engine._lib is worker and engine.worker_pid == worker.pid  # type: ignore[union-attr]


@pytest.mark.skipif(not os.path.isfile("/bin/false"), reason="needs /bin/false")
def test_a_worker_that_cannot_start_fails_the_load_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a Python that exits at once, standing for an interpreter that cannot run the worker)"""
    before = _fds()
    monkeypatch.setattr(espeak.sys, "executable", "/bin/false")
    engine = espeak.EspeakEngine()
    with pytest.raises(EngineError) as err:
        engine.load()
    assert (err.value.code, err.value.message) == (
        "engine_failed",
        "cannot start the espeak worker: espeak worker died (exit code 1) as it started",
    )
    assert engine._lib is None and _fds() == before


def test_a_worker_that_hangs_while_its_stream_is_open_fails_that_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker stopped mid-synthesis (SIGSTOP: a hang) with nobody closing its stream: the
    step fails ``engine_failed`` once it has been silent for ``SILENT_S`` (lowered here to
    keep the test short), instead of holding the lane's thread for good, and the next
    sentence speaks with a new worker."""
    monkeypatch.setattr(espeak, "SILENT_S", 2.0)
    engine = espeak.EspeakEngine()
    engine.load()
    try:
        error, pid = _signalled_at_its_first_buffer(
            engine, "A long text to hang in. " * 40, signal.SIGSTOP)
        assert (error.code, error.message) == (
            "engine_failed",
            "espeak worker silent for 2 s (hung): killed",
        )
        assert _spoken(engine, "Spoken by a new worker.")
        assert engine.worker_pid != pid
    finally:
        engine.close()
