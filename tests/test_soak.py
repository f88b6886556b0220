"""bench/soak.py end to end, briefly: a real gateway process, aborts + resumes, cancels,
stalled readers and session churn; nothing lost, nothing failed, nothing left open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import soak
from tests.hang_guard import unless_hung


def test_the_llm_process_closes_its_output_pipe_once_killed_or_stopped():
    """The soak's LLM server (bench/fault_llm.py, real) is killed and started again; each
    process's stdout pipe was left to the garbage collector (an unclosed-file
    ResourceWarning per process)."""
    llm = soak.LlmProcess(None, 0.0, 1)
    first = llm.proc
    llm.kill()
    llm.start()
    second = llm.proc
    llm.stop()
    llm.counted()
    assert first is not None and second is not None
    assert first.stdout is not None and second.stdout is not None
    assert first.stdout.closed and second.stdout.closed

@pytest.mark.slow
def test_a_short_soak_loses_nothing(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = soak.main(["--sessions", "6", "--minutes", "0.25", "--sample-s", "2",
                    "--renew-every", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert sum(result["turns"].values()) > 0 and result["frames"] > 0
    assert result["cpu"]["s_per_1k_turns"] > 0 and result["cpu"]["s_per_1k_frames"] > 0
    assert result["seq_gaps"] == result["seq_repeats"] == result["violations"] == 0
    assert "failed" not in result["turns"] and "lost" not in result["turns"]
    assert result["fds"]["idle_after"] == result["fds"]["start"]  # every socket closed
    assert result["tasks"]["idle_after"] == result["tasks"]["start"]  # and every task ended
    assert result["gateway"]["sessions_after"] == 0 and result["gateway"]["exit_code"] == 0
    assert "frames lost / duplicated" in capsys.readouterr().out


@pytest.mark.slow
def test_a_short_soak_with_the_server_side_failing_says_each_failure_once(tmp_path, capsys):
    """``--faults``: the LLM server killed and started again, cutting replies, the engine
    failing steps. Each failed turn had one error of its cause, the others completed or
    were cancelled, nothing was lost or repeated, and after the load the gateway said the
    LLM and the engine back (health ok, each failing spell logged once each way)."""
    out = tmp_path / "soak.json"
    rc = soak.main(["--sessions", "6", "--minutes", "0.25", "--sample-s", "2",
                    "--renew-every", "3", "--faults", "--llm-kill-every", "3",
                    "--llm-cut-rate", "0.2", "--engine-fail-rate", "0.02",
                    "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    faults = result["faults"]
    assert set(result["turns"]) <= {"completed", "cancelled", "failed"}
    assert sum(faults["turn_errors"].values()) == result["turns"]["failed"] > 0
    assert set(faults["turn_errors"]) <= soak.FAULT_CODES and faults["llm_kills"] > 0
    assert result["seq_gaps"] == result["seq_repeats"] == result["violations"] == 0
    assert faults["recovery"]["ok"] and faults["recovery"]["status"] == "ok"
    spells = faults["spells"]
    assert spells["llm_failing"] == spells["llm_back"] > 0
    matched = faults["matched"]  # each error tied to the fault that made it, and back
    assert matched["unexplained"] == 0, matched["unexplained_examples"]
    assert sum(matched["errors_by_cause"].values()) == result["turns"]["failed"]
    assert result["fds"]["idle_after"] == result["fds"]["start"]
    assert result["tasks"]["idle_after"] == result["tasks"]["start"]


@pytest.mark.slow
def test_a_short_soak_with_two_lanes_trips_the_second_ones_breaker_and_loses_nothing(
        tmp_path, capsys):
    """``--engine-lanes``: turns placed between two lanes (``[tts] also``), the second
    engine failing often: its failures move their turns to the primary lane (no error),
    its breaker opens and closes again after its reset (never before), and nothing is lost
    or repeated."""
    out = tmp_path / "soak.json"
    rc = soak.main(["--sessions", "6", "--minutes", "0.25", "--sample-s", "2",
                    "--faults", "--engine-lanes", "--also-fail-rate", "0.3",
                    "--llm-kill-every", "1000", "--llm-cut-rate", "0",
                    "--engine-fail-rate", "0", "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    faults = result["faults"]
    assert faults["breaker"]["opens"] > 0 and faults["breaker"]["closed_early"] == 0
    # ane comes first (LANES_PROFILES), so turns went there, but none while it was open
    assert faults["breaker"]["placed_while_closed"] > 0
    assert faults["breaker"]["placed_while_open"] == 0
    ane = faults["matched"]["engines"]["synthetic-ane"]
    assert ane["injected"] == ane["taken_over"] > 0 and ane["errors"] == 0
    assert result["turns"].get("failed", 0) == 0 and result["turns"]["completed"] > 0
    assert result["seq_gaps"] == result["seq_repeats"] == result["violations"] == 0
    assert faults["recovery"]["ok"]


def test_a_soak_that_completed_no_turn_does_not_pass(tmp_path, capsys):
    """``--minutes 0``: no turn was made, nothing was lost, and the soak said ok."""
    out = tmp_path / "soak.json"
    rc = soak.main(["--sessions", "2", "--minutes", "0", "--sample-s", "1",
                    "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["turns"].get("completed", 0) == 0
    assert rc == 1 and result["ok"] is False, capsys.readouterr().out


def hello_session(gw: Any, seed: int, stats: soak.SoakStats) -> soak.SoakSession:
    """Soak session 0 on the in-process gateway ``gw``, saying "Hello"; ``seed`` picks its
    turns' kinds and times."""
    return soak.SoakSession(f"ws://127.0.0.1:{gw.port}/v1/voice", 0, seed, ["Hello"], stats,
                            turn_timeout_s=60)


async def turns_then_our_close(session: soak.SoakSession, turns: int) -> None:
    """``turns`` turns of the connected ``session``, then its socket closed by us, as run()
    closes it (not a loss)."""
    try:
        for _ in range(turns):
            await unless_hung(session._turn())
    finally:
        ws, session.ws = session.ws, None
        await ws.close()


async def test_a_gateway_killed_mid_turn_is_a_lost_turn_not_a_hang():
    """The gateway process dies while a soak session hears a reply (a crash, the OOM
    killer: what a soak is run to find). The session waited out the turn timeout (120 s)
    for a turn.done that could not come, then its next send raised out of asyncio.gather:
    a traceback, and the whole soak's figures gone. Now the turn is lost at once."""
    gateway = soak.GatewayProcess(max_lead_ms=1000)
    try:
        stats = soak.SoakStats()
        # seed 80: session 0 starts after 0.18 s and its first turn is a "normal" one
        session = soak.SoakSession(gateway.url, 0, 80, soak.load_transcripts(None), stats,
                                   turn_timeout_s=60)
        running = asyncio.ensure_future(session.run(asyncio.get_running_loop().time() + 60))
        await unless_hung(session.frame_arrived.wait())
        gateway.proc.kill()
        await unless_hung(running)
    finally:
        gateway.stop()
    assert [t.status for t in session.account.turns] == ["lost"]
    assert session.account.errors == ["closed 1006"]
    assert stats.statuses == {"lost": 1} and stats.actions == {"normal": 1}


async def test_a_gateway_gone_between_turns_ends_the_session_with_a_report(start_gateway):
    """The gateway goes away while a soak session thinks between turns: its next send met
    a closed socket and the ConnectionClosed ended the whole soak in a traceback."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    stats = soak.SoakStats()
    stopping: list[asyncio.Task] = []
    gw.metrics.listeners.append(  # the first turn is done: the gateway stops
        lambda _: stopping.append(asyncio.ensure_future(gw.aclose())) if not stopping else None)
    session = hello_session(gw, 80, stats)
    await unless_hung(session.run(asyncio.get_running_loop().time() + 60))
    await stopping[0]
    assert session.account.turns[0].status in ("completed", "lost")
    assert sum(stats.statuses.values()) == len(session.account.turns)
    assert any(e.startswith("closed ") for e in session.account.errors)


@pytest.mark.slow
async def test_a_gateway_that_dies_under_the_soak_gets_a_report_not_a_traceback(tmp_path):
    """The soak's own gateway process dies (SIGKILL: a crash, the OOM killer). The soak
    ended in a traceback from its probes of the dead process, its figures gone; now every
    session is lost at once and the table says the gateway died (exit status 1)."""
    out = tmp_path / "soak.json"
    async with soak_under_load("--minutes", "1", "--json", str(out)) as proc:
        (gateway,) = psutil.Process(proc.pid).children()  # bench/capacity_server.py
        gateway.kill()  # (SIGKILL)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, stderr.decode()
    assert "Traceback" not in stderr.decode(), stderr.decode()
    assert "-9: died under the load" in stdout.decode()
    result = json.loads(out.read_text())
    assert result["gateway"]["died"] and not result["ok"]
    assert "closed 1006" in result["errors"]


LONG_REPLY = ("The first sentence of a reply long enough to be heard for a while. A second "
              "one follows it, and then a third sentence, so that the audio lasts seconds.")


async def test_a_refused_turn_goes_on_at_once(start_gateway):
    """A transcript the gateway refuses (``rate_limited``: no turn starts, no turn.done
    comes) held the session for the whole turn timeout (120 s) and was then counted as a
    ``timeout`` besides. Now the refusal ends the turn at once, counted as what it was (and
    a soak with one does not pass)."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                             server={"turns_per_minute": 1})
    stats = soak.SoakStats()
    # seed 13: a "normal" turn, then an "abort" one (refused: no frames to abort after)
    session = hello_session(gw, 13, stats)
    await session._connect(resume=False)
    await turns_then_our_close(session, 2)
    assert [t.status for t in session.account.turns] == ["completed",
                                                         "rejected: rate_limited"]
    assert session.account.errors == ["rate_limited"]  # (not a "timeout" too)
    assert stats.statuses == {"completed": 1, "rejected: rate_limited": 1}
    assert stats.resumes == 0  # the refused turn was not aborted


async def test_a_failed_resume_loses_its_turn_at_once_and_the_session_goes_on(start_gateway):
    """The gateway refuses a resume (``resume_failed``: here a token it does not know): the
    aborted turn's reply is gone with its session, yet the soak waited out the turn timeout
    for its turn.done; and the fresh session's frames, whose seq starts again at 0, counted
    as duplicates of the old session's."""
    gw = await start_gateway([{"transcript": "Hello", "reply": LONG_REPLY}])
    stats = soak.SoakStats()
    # seed 7: an "abort" turn after 2 frames, then a "normal" one
    session = hello_session(gw, 7, stats)
    await session._connect(resume=False)
    session.resume_token = "not-the-token"
    await turns_then_our_close(session, 2)
    assert stats.resumes == 0 and stats.resume_failed == 1
    assert [t.status for t in session.account.turns] == ["lost", "completed"]
    assert session.account.errors == ["resume_failed"]
    assert session.account.seq_gaps == session.account.seq_repeats == 0
    assert session.account.violations == []


@pytest.mark.slow
async def test_ctrl_c_stops_the_soak_with_its_table(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group, the gateway's process included)
    ended the soak in a traceback, its table and --json gone, minutes of figures with them.
    Now the sessions close, the gateway (which the Ctrl-C does not reach) is probed as after
    a full run, and the table says the run was interrupted (exit status 130)."""
    out = tmp_path / "soak.json"
    async with soak_under_load("--minutes", "5", "--json", str(out),
                               start_new_session=True) as proc:  # (as a terminal's job)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode(), stderr.decode()
    assert "(interrupted: Ctrl-C)" in stdout.decode()
    result = json.loads(out.read_text())
    assert result["interrupted"] and result["turns"].get("completed", 0) > 0
    assert "lost" not in result["turns"] and result["errors"] == {}  # (closed by us)
    assert result["gateway"]["sessions_after"] == 0 and result["gateway"]["exit_code"] == 0
    assert result["tasks"]["idle_after"] == result["tasks"]["start"]


async def test_the_soak_says_and_hears_the_replay_set_it_is_given(tmp_path, monkeypatch):
    """The soak could only use the shipped replay set: another one (the hub's, a shared
    one) could not be soaked. ``--replies``: the sessions say its transcripts and the
    gateway's replay LLM answers with its replies. A path relative to where the soak runs
    is the gateway's too (it runs in the repository: it looked for the file there, and
    died before serving)."""
    monkeypatch.chdir(tmp_path)
    replies = "replay.jsonl"
    (tmp_path / replies).write_text(
        json.dumps({"transcript": "Knock knock.", "reply": "Who is there?"}) + "\n")
    gateway = soak.GatewayProcess(max_lead_ms=1000, replies=replies)
    try:
        stats = soak.SoakStats()
        # seed 2: a "normal" turn
        session = soak.SoakSession(gateway.url, 0, 2, soak.load_transcripts(replies), stats,
                                   turn_timeout_s=60)
        said: list[str] = []
        heard = session.account.event
        session.account.event = lambda event, now: (  # type: ignore[method-assign]
            said.append(event["text"]) if event["type"] == "sentence" else None,
            heard(event, now))
        await session._connect(resume=False)
        await turns_then_our_close(session, 1)
    finally:
        gateway.stop()
    assert session.transcripts == ["Knock knock."]
    assert said == ["Who is there?"] and stats.statuses == {"completed": 1}


def test_a_replay_set_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "replay.jsonl"
    bad.write_text('{"transcript": "Hello"}\n')
    for path, message in ((bad, "replay.jsonl:1: not a {transcript, reply} object"),
                          (tmp_path / "none.jsonl", "cannot be read")):
        with pytest.raises(SystemExit) as stopped:
            soak.main(["--replies", str(path)])
        assert stopped.value.code == 2 and message in capsys.readouterr().err


@contextlib.asynccontextmanager
async def soak_under_load(*args: str, **popen: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    """bench/soak.py with 4 sessions and ``args``, once a progress line has a turn
    completed (the load is on: a turn cancelled or aborted ends sooner, and under a loaded
    machine was the only one done when the Ctrl-C test stopped the soak); killed on the
    way out if it is still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent / ".." / "bench" / "soak.py"),
        "--sessions", "4", "--sample-s", "1", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **popen)
    assert proc.stderr is not None
    try:
        while True:
            line = (await unless_hung(proc.stderr.readline())).decode()
            assert line
            if "'completed': " in line:  # (the statuses: {'completed': 1, ...})
                break
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_the_faults_report_ties_each_error_to_its_fault_and_each_fault_to_its_error():
    """``match_faults``: an error is tied to a cut request of its turn, a kill or a hang
    over its turn, or an injected engine failure it names; one without (or one naming a
    failure another error named already) is unexplained, and so is a cut request whose turn
    neither failed nor was cancelled, and an injected failure no error named."""
    stats = soak.SoakStats(llm_down=[[10.0, 12.0], [20.0, 25.0]], llm_hung=[False, True])
    ended = soak.TurnEnd
    stats.ended = [
        ended("s0t1", "failed", "normal", 1.0, [("llm_failed", 2.0, "cut")], []),
        ended("s0t2", "failed", "normal", 9.0, [("llm_failed", 10.5, "broke")], []),
        ended("s0t3", "failed", "normal", 11.0, [("llm_unavailable", 11.1, "down")], []),
        ended("s0t4", "failed", "normal", 21.0, [("llm_unavailable", 24.0, "stall")], []),
        ended("s0t5", "failed", "normal", 30.0, [("llm_failed", 31.0, "broke")], []),
        ended("s0t6", "failed", "normal", 30.0, [(
            "engine_failed", 31.0, "synthetic engine: injected failure #1 at step 2 (…)")], []),
        ended("s0t7", "failed", "normal", 30.0, [(
            "engine_failed", 31.0, "synthetic engine: injected failure #1 at step 1 (…)")], []),
        ended("s0t8", "cancelled", "cancel", 40.0, [], []),
        ended("s0t9", "completed", "normal", 40.0, [], []),
        ended("s0t10", "completed", "normal", 40.0, [], []),
    ]
    outcomes = {"s0t1": ["cut"], "s0t8": ["cut"], "s0t9": ["cut"], "s0t10": ["cut", "reply"]}
    m = soak.match_faults(stats, outcomes, {"synthetic": 3}, {})
    assert m["errors_by_cause"] == {
        "llm_failed <- cut": 1, "llm_failed <- kill": 1, "llm_unavailable <- down": 1,
        "llm_unavailable <- hang": 1, "llm_failed <- nothing": 1,
        "engine_failed <- injected": 1, "engine_failed <- nothing": 1}
    assert m["cuts"] == {"llm_failed": 1, "cancelled first": 1, "no error: completed": 1,
                         "retried, answered whole: completed": 1}
    assert m["engines"] == {"synthetic": {"injected": 3, "errors": 1, "taken_over": 0,
                                          "after_an_llm_error": 2}}
    assert m["errors_per_kill"] == [2]
    assert m["unexplained"] == 4 and m["unexplained_examples"] == [
        "s0t5 failed: llm_failed (broke) without a fault",
        "s0t7 failed: engine_failed (synthetic engine: injected failure #1 at step 1 (…)) "
        "without a fault",
        "s0t9 completed: its request was cut, no error",
        "synthetic: 3 failures injected, 1 errors, 0 taken over, 0 turns an LLM error "
        "failed while they spoke"]


def test_the_breaker_watch_says_a_spell_closed_early_only_when_it_surely_did():
    """``breaker_spells``: a spell is early when even the longest it could have lasted
    (from the last poll that saw it closed to the answer that saw it closed again) is
    shorter than the reset (5 s); a slow answer makes no spell look shorter."""
    poll = soak.BreakerPoll
    polls = [poll(0.0, 0.1, False, 0, 0, 0), poll(0.3, 2.4, True, 3, 0, 1),
             poll(2.6, 2.7, True, 3, 0, 1),
             poll(5.5, 5.6, False, 3, 0, 1),  # open 2.4-5.6 as answered, at most 0.0-5.6
             poll(6.0, 6.1, True, 6, 0, 2),
             poll(6.3, 6.4, False, 6, 0, 2)]  # at most 5.5-6.4: early
    b = soak.breaker_spells(polls, t0=0.0)
    assert b["opens"] == 2 and b["still_open"] == 0 and b["closed_early"] == 1
    assert b["open_s"] == [3.2, 0.3] and b["rerouted"] == 6
    assert soak.breaker_spells([poll(0.0, 0.1, True, 0, 0, 1)], 0.0)["still_open"] == 1


def test_the_breaker_watch_counts_turns_placed_on_the_lane_while_it_was_surely_open():
    """``breaker_spells`` on made-up polls (no gateway): a turn placed on the lane between
    two looks that found it tripped with the same count of openings went to an open lane
    (README: none may), and fails the soak; between looks across a new opening (it closed
    and a turn tried it, as it may, before it opened again), or with it closed, it is
    fine."""
    poll = soak.BreakerPoll
    polls = [poll(0.0, 0.1, False, 0, 5, 0),
             poll(0.3, 0.4, False, 0, 7, 0),  # closed: 2 placed
             poll(0.6, 0.7, True, 3, 7, 1),  # (opened in between)
             poll(0.9, 1.0, True, 3, 7, 1),
             poll(1.2, 1.4, True, 3, 8, 1),  # open all along: 1 placed there
             poll(5.0, 5.1, True, 4, 9, 2)]  # closed, tried, opened again: fine
    b = soak.breaker_spells(polls, t0=0.0)
    assert (b["placed"], b["trips"], b["placed_while_closed"]) == (9, 2, 2)
    assert b["placed_while_open"] == 1 and b["open_s_checked"] == 0.4
    f = {"spells": {"llm_failing": 0, "llm_back": 0, "engine_failing": 0,
                    "engine_back": 0, "errors_logged": 0},
         "turn_errors": {}, "matched": {"engines": {"synthetic-ane": {"taken_over": 1}},
                                        "unexplained": 0},
         "recovery": {"ok": True}, "fallback": None,
         "breaker": {**b, "closed_early": 0}}
    assert not soak.faults_ok(f)
    f["breaker"]["placed_while_open"] = 0
    assert soak.faults_ok(f)
