"""The load generator's listener accounting (pure, fake times) and one real run against the
gateway (replay LLM + espeak on 127.0.0.1:0)."""

from __future__ import annotations

import asyncio
import re

import pytest

from examples.loadgen import (
    HEADER,
    SessionAccount,
    load_transcripts,
    percentile,
    run_load,
)
from tests.hang_guard import unless_hung
from tests.servers import record_received

MS = 24  # samples per millisecond


def frame(seq: int, turn_id: int = 1, sentence: int = 0, ms: int = 40, flags: int = 0) -> bytes:
    return HEADER.pack(1, flags, sentence, turn_id, seq) + b"\x01\x00" * (ms * MS)


def started(account: SessionAccount, turn_id: int = 1, now: float = 0.0) -> None:
    account.sent(now)
    account.event({"type": "turn.started", "turn_id": turn_id, "source": "transcript"}, now)


def test_frames_ahead_of_playback_are_early_and_playback_runs_in_real_time():
    a = SessionAccount()
    started(a, now=10.0)
    a.event({"type": "sentence", "turn_id": 1, "index": 0}, 10.2)
    for seq in range(5):  # a burst: 200 ms of audio at once
        a.frame(frame(seq), 10.25)
    (turn,) = a.turns
    assert turn.ttfa_s == pytest.approx(0.25)
    assert turn.lateness_s == pytest.approx([0, -0.04, -0.08, -0.12, -0.16])
    assert a.played_ms(10.25) == pytest.approx(0, abs=1e-6)
    assert a.played_ms(10.35) == pytest.approx(100)
    assert a.played_ms(11.0) == pytest.approx(200)  # never more than was received
    assert a.playback_end == pytest.approx(10.45)
    assert turn.underruns == turn.sentence_gaps == 0 and turn.audio_s == pytest.approx(0.2)


def test_starved_mid_sentence_is_an_underrun_between_sentences_a_gap():
    a = SessionAccount()
    started(a)
    a.frame(frame(0, sentence=0), 1.0)  # plays 1.00–1.04
    a.frame(frame(1, sentence=0), 1.10)  # needed at 1.04: 60 ms late, same sentence
    a.frame(frame(2, sentence=1, flags=1), 1.30)  # needed at 1.14: 160 ms late, new sentence
    a.frame(frame(3, sentence=1), 1.31)  # early again
    (turn,) = a.turns
    assert turn.lateness_s == pytest.approx([0, 0.06, 0.16, -0.03])
    assert turn.underruns == 1 and turn.sentence_gaps == 1
    assert turn.starved_s == pytest.approx(0.22)
    assert a.played_ms(1.34) == pytest.approx(120)  # resumed at 1.30 with 80 ms in hand


def test_the_report_sets_the_gateways_underruns_beside_the_listeners():
    """protocol.md's ``underruns`` (turn.done) counts every time the listener ran dry, a
    sentence gap as much as a stutter; the report printed the listener's stutters alone
    under that name and left the gateway's count out, so the two could not be compared."""
    from examples.loadgen import Report

    a = SessionAccount()
    started(a)
    a.frame(frame(0, sentence=0), 1.0)
    a.frame(frame(1, sentence=0), 1.10)  # ran dry mid-sentence
    a.frame(frame(2, sentence=1, flags=3), 1.30)  # and between sentences
    a.event({"type": "turn.done", "turn_id": 1, "status": "completed",
             "metrics": {"ttfa_ms": 10.0, "underruns": 2}}, 1.31)
    report = Report(1, 1, 2.0, [a], 0.0)
    s = report.summary()
    assert (s["underruns"], s["sentence_gaps"], s["server_underruns"]) == (1, 1, 2)
    assert "underruns 1 mid-sentence + 1 between sentences (the gateway's model: 2)" in \
        report.table()


def test_prebuffer_delays_playback_start():
    a = SessionAccount(prebuffer_s=0.15)
    started(a)
    a.frame(frame(0), 1.0)
    a.frame(frame(1), 1.18)  # needed at 1.19
    assert a.turns[0].lateness_s == pytest.approx([-0.15, -0.01])
    assert a.turns[0].underruns == 0


def test_seq_gaps_repeats_and_wraparound():
    a = SessionAccount()
    started(a)
    for seq in (0, 1, 4, 4, 2, 5):
        a.frame(frame(seq), 1.0)
    assert a.seq_gaps == 2 and a.seq_repeats == 2
    b = SessionAccount()
    started(b)
    b._next_seq = 2**32 - 1
    b.frame(frame(2**32 - 1), 1.0)
    b.frame(frame(0), 1.0)
    assert b.seq_gaps == 0 and b.seq_repeats == 0


def test_first_seq_of_a_session_must_be_zero():
    a = SessionAccount()
    started(a)
    a.frame(frame(3), 1.0)
    assert a.seq_gaps == 3


def test_turn_done_errors_and_frames_after_done_are_violations():
    a = SessionAccount()
    started(a)
    a.frame(frame(0, flags=3), 1.0)
    a.event({"type": "error", "turn_id": 1, "error": {"code": "engine_failed", "message": "x"}},
            1.1)
    a.event({"type": "turn.done", "turn_id": 1, "status": "failed",
             "metrics": {"ttfa_ms": 12.5}}, 1.2)
    a.frame(frame(1), 1.3)
    a.frame(frame(2, turn_id=9), 1.3)
    a.frame(b"\x02" + bytes(11), 1.3)
    (turn,) = a.turns
    assert turn.status == "failed" and turn.server_metrics == {"ttfa_ms": 12.5}
    assert turn.done_s == pytest.approx(1.2) and turn.frames == 1
    assert a.errors == ["engine_failed"]
    assert len(a.violations) == 3
    assert "after its turn.done" in a.violations[0] and "not the current turn" in a.violations[1]


def test_a_new_turn_restarts_the_player_and_empty_end_frames_play_nothing():
    a = SessionAccount()
    started(a, 1, now=0.0)
    a.frame(frame(0), 0.5)
    a.frame(HEADER.pack(1, 3, 0, 1, 1), 0.6)  # zero samples: end marker
    a.event({"type": "turn.done", "turn_id": 1, "status": "completed", "metrics": {}}, 0.6)
    started(a, 2, now=5.0)
    a.frame(frame(2, turn_id=2), 5.3)
    first, second = a.turns
    assert first.frames == 2 and len(first.lateness_s) == 1
    assert second.ttfa_s == pytest.approx(0.3) and second.lateness_s == [0]
    assert a.played_ms(5.32) == pytest.approx(20)
    assert not a.violations and a.seq_gaps == 0


def test_a_refusal_is_the_transcripts_when_it_names_it_not_when_it_comes_after_it():
    """protocol.md, Errors: an ``error`` names the message it answers (``error.event_id``).
    The account took any error without a turn, while a transcript waited for its turn, for
    that transcript's refusal: a mark's refusal coming then (sent before the transcript)
    ended the turn as rejected and the runner went on without waiting for its reply, which
    came. An error naming nothing (a frame the gateway could not read) still is."""
    a = SessionAccount()
    a.sent(0.0, "l3")
    mark = {"code": "invalid_field", "message": "played_ms", "event_id": "l2"}
    a.event({"type": "error", "error": mark}, 0.01)
    assert not a.rejected and a.errors == ["invalid_field"]
    a.event({"type": "turn.started", "turn_id": 1, "source": "transcript"}, 0.02)
    a.event({"type": "turn.done", "turn_id": 1, "status": "completed", "metrics": {}}, 0.5)
    assert a.turns[0].status == "completed"
    a.sent(1.0, "l5")
    a.event({"type": "error", "error": {"code": "text_too_long", "message": "x",
                                        "event_id": "l5"}}, 1.01)
    assert a.rejected and a.turns[1].status == "rejected: text_too_long"
    a.sent(2.0, "l6")
    a.event({"type": "error", "error": {"code": "message_too_large", "message": "x"}}, 2.01)
    assert a.turns[2].status == "rejected: message_too_large"


def test_each_turn_keeps_its_own_error_for_the_json_report():
    """The report counted error codes for the whole run: which turn failed, why (the
    message) and for which transcript (event_id) was not kept. Each turn keeps its own
    error object now, as the gateway sent it: its failure (the first, the turn's one), or
    its transcript's refusal; an error of another message (a mark's) is no turn's."""
    from examples.loadgen import Report

    a = SessionAccount()
    a.sent(0.0, "l1")
    a.event({"type": "error", "error": {"code": "invalid_field", "message": "m",
                                        "event_id": "l0"}}, 0.01)
    a.event({"type": "turn.started", "turn_id": 1, "source": "transcript"}, 0.02)
    failed = {"code": "llm_failed", "message": "the stream broke", "event_id": "l1"}
    a.event({"type": "error", "turn_id": 1, "error": failed}, 0.1)
    a.event({"type": "error", "turn_id": 1, "error": {"code": "shutting_down",
                                                      "message": "x"}}, 0.2)
    a.event({"type": "turn.done", "turn_id": 1, "status": "failed", "metrics": {}}, 0.3)
    a.sent(1.0, "l2")
    refused = {"code": "rate_limited", "message": "61 turns", "event_id": "l2"}
    a.event({"type": "error", "error": refused}, 1.01)
    a.sent(2.0, "l3")
    a.event({"type": "turn.started", "turn_id": 2, "source": "transcript"}, 2.01)
    a.event({"type": "turn.done", "turn_id": 2, "status": "completed", "metrics": {}}, 2.5)
    turns = Report(1, 3, 3.0, [a], 0.0).to_json()["turns"]
    assert [(t["status"], t["error"]) for t in turns] == [
        ("failed", failed), ("rejected: rate_limited", refused), ("completed", None)]
    assert a.errors == ["invalid_field", "llm_failed", "shutting_down", "rate_limited"]


@pytest.mark.slow
async def test_each_message_is_named(short_gateway, monkeypatch):
    """Every transcript and playback mark goes with its own ``event_id``, never twice in a
    session (a transcript refused names it: test_a_refused_transcript_is_reported_at_once_...)."""
    from gateway.core.codec import ClientPlayback, ClientTranscript

    received = record_received(monkeypatch)
    report = await unless_hung(run_load(
        f"ws://127.0.0.1:{short_gateway.port}/v1/voice", sessions=1, turns=2,
        transcripts=["Hello"]))
    assert report.summary()["turns"] == {"requested": 2, "completed": 2}
    named = [m.event_id for m in received if isinstance(m, ClientTranscript | ClientPlayback)]
    assert any(isinstance(m, ClientPlayback) for m in received)
    assert all(named) and len(set(named)) == len(named), named


def test_lost_turn_and_percentiles():
    a = SessionAccount()
    started(a)
    a.lost("closed 1011")
    assert a.turns[0].status == "lost" and a.errors == ["closed 1011"]
    assert percentile([], 50) is None
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4


def test_transcripts_from_jsonl_or_text(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"transcript": "Hi there", "reply": "Hello."}\n\n')
    text = tmp_path / "t.txt"
    text.write_text("first one\nsecond one\n")
    assert load_transcripts(jsonl) == ["Hi there"]
    assert load_transcripts(text) == ["first one", "second one"]
    assert len(load_transcripts(None)) > 5  # the project's replay set
    bom = tmp_path / "bom.jsonl"
    bom.write_text('\ufeff{"transcript": "Hi there"}\n', encoding="utf-8")
    assert load_transcripts(bom) == ["Hi there"]


@pytest.fixture
async def short_gateway(start_gateway):
    return await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."},
                                {"transcript": "Time", "reply": "It is noon. Lunch is soon."}])


@pytest.mark.slow
async def test_three_sessions_two_turns_against_the_real_gateway(short_gateway):
    report = await run_load(f"ws://127.0.0.1:{short_gateway.port}/v1/voice", sessions=3,
                            turns=2, transcripts=["Hello", "Time"], arrival_s=0.05, seed=7)
    s = report.summary()
    assert s["turns"] == {"requested": 6, "completed": 6}
    assert s["seq_gaps"] == 0 and s["seq_repeats"] == 0
    assert s["errors"] == [] and s["violations"] == []
    assert report.ok
    for account in report.accounts:
        assert [t.turn_id for t in account.turns] == [1, 2]
        for turn in account.turns:
            metrics = turn.server_metrics
            assert turn.ttfa_s is not None
            assert metrics["ttft_ms"] <= metrics["first_sentence_ms"] <= metrics["ttfa_ms"]
            assert turn.audio_s * 1000 == pytest.approx(turn.server_metrics["audio_ms"], abs=1)
    assert s["ttfa_ms"]["n"] == s["server_first_sentence_ms"]["n"] == 6
    assert "TTFA (client) ms" in report.table() and "1st segment (srv) ms" in report.table()
    assert report.to_json()["summary"]["frames"] == s["frames"] > 0


async def test_a_refused_transcript_is_reported_at_once_not_after_the_turn_timeout(
        short_gateway):
    # text_too_long comes back at once, naming the transcript, and no turn starts: the
    # speaker goes on to its next turn instead of waiting 60 s for a turn.done that never
    # comes
    report = await unless_hung(run_load(
        f"ws://127.0.0.1:{short_gateway.port}/v1/voice", sessions=1, turns=2,
        transcripts=["x" * 4001], seed=1))
    (account,) = report.accounts
    assert [t.status for t in account.turns] == ["rejected: text_too_long"] * 2
    assert account.errors == ["text_too_long"] * 2 and not report.ok
    assert [(t["error"]["code"], t["error"]["event_id"]) for t in report.to_json()["turns"]] \
        == [("text_too_long", "l1"), ("text_too_long", "l2")]


async def test_a_gateway_gone_between_turns_is_a_report_not_a_crash(start_gateway):
    """The gateway stops while the speakers think between turns: their next send meets a
    closed socket. The load generator used to die with an ExceptionGroup traceback, no table
    and no JSON; now the session is lost, its turns never sent are counted, and the report
    comes out."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    heard = asyncio.Event()
    gw.metrics.listeners.append(  # each speaker heard its first reply
        lambda _: heard.set() if gw.metrics.turns["completed"] >= 2 else None)
    load = asyncio.ensure_future(run_load(
        f"ws://127.0.0.1:{gw.port}/v1/voice", sessions=2, turns=3, transcripts=["Hello"],
        arrival_s=1.0, seed=3))
    await unless_hung(heard.wait())
    await gw.aclose()
    report = await unless_hung(load)
    s = report.summary()
    assert s["turns"]["requested"] == 6 and 2 <= s["turns"]["completed"] < 6
    assert sum(n for k, n in s["turns"].items() if k != "requested") == 6  # all accounted
    assert s["turns"]["unsent"] >= 1 and not report.ok, s["turns"]
    assert "closed" in " ".join(s["errors"])


@pytest.mark.slow
async def test_ctrl_c_ends_the_run_with_the_report_of_what_was_measured(start_gateway):
    """A load run stopped with Ctrl-C died in a KeyboardInterrupt traceback: minutes of
    measurements gone, no table, no JSON. Now the sessions close, the turn being heard counts
    as interrupted and those never sent as unsent, and the report comes out (status 130)."""
    import signal
    import sys
    from pathlib import Path

    gw = await start_gateway([{"transcript": "Hello", "reply": " ".join(
        f"This is sentence number {i} of a long answer." for i in range(1, 20))}])
    out = Path(__file__).parent / ".." / "examples" / "loadgen.py"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(out), "--url", f"ws://127.0.0.1:{gw.port}/v1/voice",
        "--sessions", "2", "--turns", "3", "--transcripts", str(gw.config.llm.replies),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    progress = []
    try:
        while True:  # the progress lines (one a second, not on a terminal)
            line = (await unless_hung(proc.stderr.readline())).decode()
            assert line, progress
            progress.append(line)
            if (frames := re.search(r"frames (\d+)", line)) and int(frames[1]) > 0:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = await unless_hung(proc.communicate())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode()
    table = stdout.decode()
    assert "interrupted" in table and "TTFA (client) ms" in table
    assert re.search(r"turns \{'requested': 6, 'interrupted': 2, 'unsent': 4\}", table), table
    await unless_hung(gw.wait_no_sessions())  # closed, not left to time out


@pytest.mark.slow
async def test_a_turn_the_closed_socket_never_took_is_unsent_not_lost(start_gateway):
    """The gateway stops while the speaker hears its first reply out: its next transcript
    meets a closed socket and never leaves. It was counted 'lost' (a turn the gateway took
    and never ended) beside one 'unsent', where neither turn was ever sent."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."}],
                             session={"max_lead_ms": 10_000})  # (all of it sent at once)
    stopping: list[asyncio.Task] = []
    gw.metrics.listeners.append(  # the first reply is all sent: the gateway stops
        lambda _: stopping.append(asyncio.ensure_future(gw.aclose())) if not stopping else None)
    report = await unless_hung(run_load(
        f"ws://127.0.0.1:{gw.port}/v1/voice", sessions=1, turns=3, transcripts=["Hello"]))
    await stopping[0]
    s = report.summary()
    assert s["turns"] == {"requested": 3, "completed": 1, "unsent": 2}, s["turns"]
    assert [t.status for t in report.accounts[0].turns] == ["completed"]
    assert s["errors"] == ["closed 1001"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--url", "http://127.0.0.1:8780/v1/voice"], "--url must be the gateway's "
     "ws:// or wss:// URL, not 'http://127.0.0.1:8780/v1/voice'"),
    (["--transcripts", "/nonexistent/said.txt"],
     "--transcripts: [Errno 2] No such file or directory: '/nonexistent/said.txt'"),
    # a directory ran the whole load, then died of IsADirectoryError: its figures lost
    (["--json", "/"], "--json: '/' is a directory: name the file to write in it"),
    # each ran the load: a negative (or NaN) think time as none, a negative prebuffer as
    # frames played before they came (counted late), a timeout of 0 every turn lost
    (["--arrival", "-1"], "--arrival must be 0 or more seconds, not -1"),
    (["--arrival", "nan"], "--arrival must be 0 or more seconds, not nan"),
    (["--prebuffer-ms", "-5"], "--prebuffer-ms must be 0 or more, not -5"),
    (["--turn-timeout", "0"], "--turn-timeout must be more than 0 seconds, not 0"),
])
def test_a_mistyped_url_or_file_is_a_usage_error_not_a_traceback(argv, message, capsys):
    """An http:// URL ended in a TaskGroup traceback of InvalidURI, a missing
    --transcripts file in one of FileNotFoundError."""
    from examples.loadgen import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_output_file_that_cannot_be_written_is_refused_before_the_load(tmp_path, capsys,
                                                                         refused_port):
    """``--json results/run.json`` with no results/ ran the whole load, printed its table,
    then died of FileNotFoundError: the figures the file was for were lost."""
    from examples.loadgen import main

    out = tmp_path / "results" / "run.json"
    with pytest.raises(SystemExit) as exited:
        main(["--url", f"ws://127.0.0.1:{refused_port}/v1/voice", "--sessions", "1",
              "--turns", "1", "--json", str(out)])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert f"--json: there is no directory '{out.parent}' to write it in" in captured.err
    assert "loadgen" not in captured.out  # refused before the load, not after
