"""bench/capacity.py: the loop-lag arithmetic it reports, and one tiny real run of it."""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import psutil
import pytest

from bench import capacity
from tests.hang_guard import HANG_S

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("before", "after", "expected"), [
    (None, {0.1: 5.0}, {}),                      # a peer: no probe
    ({0.001: 3.0, 0.04: 3.0, float("inf"): 3.0},
     {0.001: 3.0, 0.04: 3.0, float("inf"): 3.0}, {}),   # no wake-up in the window
    ({}, {0.001: 90.0, 0.002: 99.0, 0.04: 100.0, 0.08: 100.0, float("inf"): 100.0},
     {"loop_wakeups": 100, "loop_late_40ms": 0, "loop_lag_p99_le_ms": 2.0,
      "loop_lag_max_le_ms": 40.0}),
    ({0.001: 10.0, 0.04: 10.0, 0.08: 10.0, float("inf"): 10.0},   # only the window counts
     {0.001: 10.0, 0.04: 105.0, 0.08: 109.0, float("inf"): 110.0},
     {"loop_wakeups": 100, "loop_late_40ms": 5, "loop_lag_p99_le_ms": 80.0,
      "loop_lag_max_le_ms": float("inf")}),
])
def test_loop_lag_summary(before, after, expected):
    def wrap(buckets):
        return None if buckets is None else {"loop": buckets, "gc2": {}}

    assert capacity.loop_lag_summary(wrap(before), wrap(after)) == expected


@pytest.mark.parametrize(("before", "after", "expected"), [
    ({}, {}, {}),                                                  # no gc metric (a peer)
    ({0.01: 1.0, 0.32: 1.0, float("inf"): 1.0},
     {0.01: 1.0, 0.32: 1.0, float("inf"): 1.0},
     {"gc_full": 0, "gc_full_max_le_ms": None}),                    # none in the window
    ({0.01: 1.0, 0.16: 1.0, 0.32: 1.0, float("inf"): 1.0},          # only the window counts
     {0.01: 1.0, 0.16: 2.0, 0.32: 3.0, float("inf"): 3.0},
     {"gc_full": 2, "gc_full_max_le_ms": 320.0}),
])
def test_gc_summary(before, after, expected):
    assert capacity.gc_summary({"loop": {}, "gc2": before}, {"loop": {}, "gc2": after}) \
        == expected


@pytest.mark.slow
@pytest.mark.parametrize("marks_ms", [0, 100])
def test_a_small_streaming_step_runs_and_passes(tmp_path, marks_ms):
    """The real bench, end to end: the gateway in its own process, a client process, /proc
    CPU and RSS, the loop-lag scrape. Pass is not asserted on speed, only that 5 sessions
    streamed and every figure the tables print is there; with playback marks, that the
    gateway took every mark (a malformed one would be an ``error`` event). The server's log
    is left only by a run that failed, which says where (every run left one in /tmp)."""
    out = tmp_path / "cap.json"
    run = subprocess.Popen([sys.executable, str(ROOT / "bench" / "capacity.py"), "stream",
                            "--targets", "gateway", "--ramp", "5", "--seconds", "1.5",
                            "--warmup", "0.5", "--marks-ms", str(marks_ms), "--json", str(out)],
                           cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = run.communicate(timeout=240)
    finally:
        if run.returncode is None:
            run.kill()
            run.wait()
    (row,) = json.loads(out.read_text())["results"]["gateway"]
    assert run.returncode == (0 if row["pass"] else 1), stderr
    log = Path(f"/tmp/capacity-gateway-{run.pid}.log")
    assert log.exists() is (not row["pass"])  # (a step too slow for this machine fails)
    assert (f"gateway server log: {log}" in stderr) is (not row["pass"])
    log.unlink(missing_ok=True)
    assert row["connected"] == row["streaming"] == 5 and row["errors"] == 0
    assert row["frames"] > 0 and row["cpu_s_per_1000_frames"] is not None
    assert row["loop_wakeups"] > 0 and "realtime_share" in row


@pytest.mark.slow
def test_a_bench_stalled_past_its_window_still_reads_the_servers_figures(monkeypatch):
    """On a loaded machine the bench's own process may stall past its window's start: its
    first /metrics read then came after the window's end, the second right after it, with
    no loop wake-up between them, and the row had no loop figures at all (KeyError
    'loop_wakeups' at a load average of ~10). The stall is made here by holding the first
    read past the whole window (a stalled process does nothing else): the server's figures
    then cover a window as long from that read, under the same load (the clients left at
    the end of theirs: the server sent no frame in its window, and its CPU read idle), and
    the row says how late it was."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    seconds = 1.0
    real, reads, frames = capacity.gateway_buckets, [], []

    def stalled(server):
        if not reads:
            time.sleep(0.5 + seconds + 0.5)  # warm-up, the window, and more: a stall
        reads.append(time.monotonic())
        with urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        frames.append(next(s.value for f in text_string_to_metric_families(text)
                           for s in f.samples if s.name == "gateway_frames_total"))
        return real(server)

    monkeypatch.setattr(capacity, "gateway_buckets", stalled)
    server = capacity.Server("gateway", log=False)
    try:
        row = capacity.run_load(server, 2, clients=1, say=capacity.long_text(20),
                                jitter_s=0.2, idle=False, warmup_s=0.5, seconds=seconds)
    finally:
        server.close()
    assert row.get("loop_wakeups", 0) > 0
    assert reads[1] - reads[0] >= seconds  # (not back to back)
    assert frames[1] - frames[0] >= 25  # (2 sessions of 25 frames a second, for 1 s)
    assert row["server_window_late_s"] >= seconds


def test_a_peer_without_its_venv_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", str(tmp_path / "fastapi/bin/python"))
    with pytest.raises(SystemExit, match="--setup-peers"):
        capacity.Server("fastapi")


def test_a_server_that_dies_after_its_port_stops_the_bench(monkeypatch, tmp_path):
    """A peer missing a module printed its port, then died on import: the ramp used to
    print rows of zero sessions. The bench must stop with the exit code instead."""
    script = tmp_path / "dies.py"
    script.write_text("import sys\nprint('PORT 1', flush=True)\nsys.exit(3)\n")
    monkeypatch.setitem(capacity.SCRIPTS, "fastapi", script)
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", sys.executable)
    server = capacity.Server("fastapi", log=False)
    server.proc.wait(10)
    with pytest.raises(SystemExit, match="exited with 3"):
        server.check_alive()
    server.close()



def _resource_warnings(block) -> list[str]:
    """The ResourceWarnings seen while ``block`` runs and once its garbage is collected."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        block()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_closed_server_leaves_no_pipe_open(monkeypatch, tmp_path):
    """``close`` reaped the server but left its stdout pipe to the garbage collector: a
    ResourceWarning (unclosed file) per server in every bench and soak run."""
    script = tmp_path / "serves.py"
    script.write_text("import time\nprint('PORT 1', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setitem(capacity.SCRIPTS, "fastapi", script)
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", sys.executable)

    def run() -> None:
        server = capacity.Server("fastapi", log=False)
        assert server.close() == -signal.SIGTERM
        assert server.proc.stdout.closed

    assert _resource_warnings(run) == []


def test_a_server_that_never_serves_is_reaped_and_its_pipe_closed(monkeypatch, tmp_path):
    """A server whose first line was not its port was killed but never waited for: a
    zombie until the bench exited, and ResourceWarnings for the process and its pipe."""
    script = tmp_path / "fails.py"
    script.write_text("import time\nprint('Traceback', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setitem(capacity.SCRIPTS, "fastapi", script)
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", sys.executable)

    def run() -> None:
        with pytest.raises(RuntimeError, match="did not start"):
            capacity.Server("fastapi", log=False)

    assert _resource_warnings(run) == []

async def test_a_frame_that_stalls_the_player_is_as_late_as_it_came(monkeypatch):
    """Lateness is taken before the stall moves the schedule back: a frame 500 ms behind
    with a 200 ms jitter buffer is 500 ms late (it read 200 ms, the buffer, however late
    it came, so no lateness could exceed --jitter-ms)."""
    clock = iter([10.0, 10.04, 10.58, 12.0])
    monkeypatch.setattr(capacity, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    stats = capacity.Stats()
    stats.t_start, stats.t_end = 0.0, 100.0
    listener = capacity.Listener("fastapi", "", stats, jitter_s=0.2)
    for _ in range(4):
        listener.audio(1920)  # 40 ms of 24 kHz PCM16
    assert stats.underruns == 2
    assert [round(x) for x in stats.lateness][:2] == [0, 500]
    assert stats.lateness[2] > 1000  # 1.9 s behind its schedule: not capped at 200


@pytest.mark.parametrize(("rate", "passes"), [(1.0, True), (0.96, False)])
async def test_real_time_is_judged_between_peaks_not_by_frames_cut_at_the_edges(
        monkeypatch, rate, passes):
    """The gateway sends 400 ms at a time. A window whose edges cut through those refills
    counted 9 of 10 in its frames, and failed a gateway keeping up (98.4 % of real time at
    4 s and 5 sessions, measured); between the peaks of audio the listener holds, real
    time reads real time, and a server 4 % slow still fails though it never underruns."""
    now = [8.0]
    monkeypatch.setattr(capacity, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    stats = capacity.Stats()
    stats.t_start, stats.t_end, stats.edge_s = 10.01, 13.99, 1.0
    listener = capacity.Listener("fastapi", "", stats, jitter_s=0.2)
    for _ in range(25):  # the first second at once, then a refill when 600 ms are left
        listener.audio(1920)
    while now[0] < 15.0:
        now[0] += 0.4 / rate
        for _ in range(10):
            listener.audio(1920)
    assert stats.underruns == 0
    if rate == 1.0:
        assert stats.frames == 90  # (by frames: 90 % of real time)
    delivered, span = listener.delivered()
    assert delivered / span == pytest.approx(rate, abs=0.005)
    assert (delivered / span >= capacity.MIN_REALTIME_SHARE) is passes


@pytest.mark.slow
def test_a_failing_step_fails_the_run_and_its_log_is_this_runs(monkeypatch, tmp_path, capfd):
    """A failing step exited 0, as a run that passed (CI or a script reading the status
    saw a pass); and every run wrote its server's log to /tmp/capacity-gateway.log, so one
    run side by side with another wrote over its log. The failed run keeps its log and
    says where; it said "interrupted (Ctrl-C)" too, and so did its --json."""
    monkeypatch.setattr(capacity, "long_text", lambda seconds: "Hello there.")  # ends early
    out = tmp_path / "cap.json"
    monkeypatch.setattr(sys, "argv", ["capacity.py", "stream", "--ramp", "3", "--seconds",
                                      "1", "--warmup", "0.5", "--json", str(out)])
    assert capacity.main() == 1
    result = json.loads(out.read_text())
    (row,) = result["results"]["gateway"]
    assert row["ended_early"] == 3 and not row["pass"]
    assert "interrupted" not in result["meta"]
    log = Path(f"/tmp/capacity-gateway-{os.getpid()}.log")
    assert log.exists()
    log.unlink()
    stderr = capfd.readouterr().err
    assert f"gateway server log: {log}" in stderr and "interrupted" not in stderr


@pytest.mark.parametrize(("rows", "broken"), [
    ([(True, 0, 0), (False, 0, 0)], False),  # the limit found: the last step underran
    ([(True, 0, 0), (False, 2, 0)], True),  # errors: broken, whatever the load
    ([(True, 0, 0), (False, 0, 1)], True),  # a turn ended early
    ([(False, 0, 0)], True),  # not even the first step passed
    ([(True, 0, 0), (True, 0, 0)], False),
])
def test_a_ramp_fails_when_broken_not_when_it_finds_its_limit(rows, broken):
    """A ramp runs until a step fails: that step failing on pace is its answer (exit 0);
    errors or turns ended early, or no step passing, are a run that failed (exit 1)."""
    result = {"gateway": [{"pass": p, "errors": e, "ended_early": x} for p, e, x in rows]}
    assert capacity.failed("stream", result) is broken
    assert capacity.failed("stream", {"gateway": result["gateway"], "pipecat": [
        {"pass": True, "errors": 0, "ended_early": 0}]}) is broken


def test_a_window_longer_than_one_say_is_refused_before_the_run():
    """Each session streams one ``say``, cut at the gateway's 4,000 characters (~285 s of
    synthetic speech): ``--seconds 290`` ran every step to its end and failed it, every
    session having ended before the window did, the row saying nothing of why."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "capacity.py"), "stream",
                          "--ramp", "50", "--seconds", "290"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2, run.stdout
    assert "--seconds 290.0 + --warmup 3.0 need more audio than one say holds " \
           "(4,000 characters, 286 s): at 50 sessions, --seconds 262 at most" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("say", "shown"), [
    ("Hello there.", "ended"),  # over before the window: every turn ended early
    ("x" * (capacity.MAX_SAY_CHARS + 1), "errors"),  # refused: an error event each
])
def test_a_step_whose_turns_fail_says_so_in_its_row(monkeypatch, capsys, say, shown):
    """The printed row had no column for ``error`` events nor for turns that ended before
    the window did: a profile run whose every turn failed printed ``yes``, and a failing
    stream step a bare ``NO``."""
    monkeypatch.setattr(capacity, "long_text", lambda seconds: say)
    args = types.SimpleNamespace(targets=["gateway"], ramp=[3], seconds=1.0, warmup=0.5,
                                 jitter_ms=200.0, marks_ms=0.0, clients=1, no_freeze=False)
    monkeypatch.setattr(capacity, "hotspots", lambda raw: "")  # (py-spy's share: not ours)
    for bench in (capacity.bench_stream, capacity.bench_profile):
        result = bench(args)
        r = result["gateway"][0] if bench is capacity.bench_stream else result["run"]
        assert r["ended_early" if shown == "ended" else "errors"] == 3 and not r["pass"]
        lines = capsys.readouterr().out.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("target"))
        names = lines[header].replace("cpu s/1k fr", "cpu").replace("RSS MiB", "RSS").split()
        cells = dict(zip(names, lines[header + 1].split(), strict=True))
        assert cells[{"ended": "ended", "errors": "err"}[shown]] == "3"
        assert cells["ok"] == "NO"
        log = Path(f"/tmp/capacity-gateway-{os.getpid()}.log")  # (kept: the run failed)
        assert log.exists()
        log.unlink()


AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
"""``python -c AS_FROM_A_TERMINAL prog args``: ``python prog args`` in this process (the
same pid), SIGINT at its default and unblocked, as a terminal starts it, whatever this
pytest's own: a disposition of SIG_IGN and a blocked mask are inherited through exec (a
pytest started in a script's background ignores SIGINT)."""


def _alive(process: psutil.Process) -> bool:
    """Running (not a zombie) and not another process with a reused pid."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def _stop_hung(proc: subprocess.Popen, children: dict[int, psutil.Process]) -> str:
    """Where the bench and its children (``children``: the processes seen while it ran)
    wait, by py-spy's dumps (the dev extra's), then each killed, the bench reaped: the dumps
    and what the bench wrote. The server runs in a session of its own and the clients ignore
    SIGINT: a bench killed on a hang left its server serving on, orphaned, and its clients
    and resource tracker holding its pipes open."""
    said = []
    for process in children.values():
        if not _alive(process):
            continue
        status = Path(f"/proc/{process.pid}/status")
        masks = [line for line in status.read_text().splitlines()
                 if line.startswith(("State", "SigBlk", "SigIgn"))] if status.exists() else []
        said.append(f"-- {process.pid} {' '.join(process.cmdline())[:160]} {masks}")
        if capacity.PY_SPY.exists():
            dump = subprocess.run([str(capacity.PY_SPY), "dump", "--pid", str(process.pid)],
                                  capture_output=True, text=True, timeout=60)
            said.append(dump.stdout + dump.stderr)
    for process in children.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()  # (psutil: not a process that took over a reused pid)
    stdout = stderr = "(read already)"
    if proc.returncode is None:
        try:
            stdout, stderr = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            stdout = stderr = "(its pipes still open: a descendant not seen holds them)"
            proc.wait()
    return "\n".join([*said, "-- its stdout:", stdout or "", "-- its stderr:", stderr or "",
                      f"-- its server's stderr: /tmp/capacity-gateway-{proc.pid}.log"])


@pytest.mark.slow
def test_ctrl_c_ends_the_step_and_leaves_the_summary_and_nothing_running(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group: the bench, its server, its client
    processes) ended a ramp in tracebacks from every process, with no summary and no
    --json: the steps already measured were lost but for their rows on the screen. Now the
    step in progress ends with its server and clients, the summary and the JSON keep what
    was measured (here: nothing yet), and the exit status is 130."""
    out = tmp_path / "cap.json"
    # (the bench as a terminal starts it: one that inherited SIGINT ignored from a pytest
    # started in a script's background never saw the Ctrl-C, and this test hung)
    proc = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL,
                             str(ROOT / "bench" / "capacity.py"), "stream",
                             "--ramp", "3", "--seconds", "60", "--warmup", "0.5",
                             "--json", str(out)], cwd=ROOT, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    # (the bench and every child of it seen, killed at the end if still there)
    seen = {proc.pid: psutil.Process(proc.pid)}

    def children() -> dict[int, str]:
        found = {}
        for child in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                found[child.pid] = " ".join(child.cmdline())
                seen.setdefault(child.pid, child)
        return found

    try:
        assert proc.stdout.readline().startswith("target")
        deadline = time.monotonic() + HANG_S
        while not any("spawn_main" in c for c in children().values()):  # a client streams
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        running = children()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:  # (a hang guard: it ends in a second or two)
            with contextlib.suppress(psutil.NoSuchProcess):
                children()
            pytest.fail(f"hung: the bench had not ended {HANG_S:g} s after the Ctrl-C\n"
                        + _stop_hung(proc, seen))
    finally:
        if proc.returncode is None or any(_alive(child) for child in seen.values()):
            _stop_hung(proc, seen)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted (Ctrl-C)" in stderr and "3  interrupted (Ctrl-C): not measured" in stdout
    assert "gateway  max passing N = 0" in stdout
    result = json.loads(out.read_text())
    assert result["meta"]["interrupted"] and result["results"] == {"gateway": []}
    assert any("capacity_server" in c for c in running.values())
    assert not Path(f"/tmp/capacity-gateway-{proc.pid}.log").exists()  # (stopped, not failed)
    for pid in running:  # the server and the client: gone with the bench
        with contextlib.suppress(psutil.NoSuchProcess):
            cmdline = " ".join(psutil.Process(pid).cmdline())
            assert "capacity_server" not in cmdline and "spawn_main" not in cmdline


def _client_deaf_to_sigterm(target, port, n, say, jitter_s, idle, window, queue,
                            marks_s=0.0) -> None:
    """FAKE client process (stands in for ``capacity.client_main``): writes its pid to the
    file ``say`` names, says it is ready with no session, then neither ends on SIGTERM nor
    ever on its own, as a client whose SIGTERM handler cannot run would."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(say).write_text(str(os.getpid()))
    queue.put(("ready", 0, 0, 0.0))
    signal.pause()  # (no signal it does not ignore comes but the SIGKILL)


def test_ctrl_c_ends_a_client_that_does_not_end_on_sigterm(monkeypatch, tmp_path, capfd):
    """Ctrl-C left the client processes to multiprocessing's exit hook, which SIGTERMs
    them and then waits for them without a bound: one that did not end on SIGTERM kept the
    bench running for ever after the Ctrl-C. ``run_load`` now ends its clients on its way
    out, each SIGTERMed, then killed after ``CLIENT_GRACE_S`` (said on stderr), and reaped.
    The Ctrl-C comes as the window starts (the server's first read)."""
    script = tmp_path / "serves.py"  # (run_load only reads the server's /proc figures)
    script.write_text("import time\nprint('PORT 1', flush=True)\ntime.sleep(600)\n")
    monkeypatch.setitem(capacity.SCRIPTS, "fastapi", script)
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", sys.executable)
    monkeypatch.setattr(capacity, "client_main", _client_deaf_to_sigterm)
    monkeypatch.setattr(capacity, "CLIENT_GRACE_S", 0.5, raising=False)  # (any: it never ends)

    def ctrl_c(server):
        raise KeyboardInterrupt

    monkeypatch.setattr(capacity, "gateway_buckets", ctrl_c)
    pid_file = tmp_path / "client.pid"
    server = capacity.Server("fastapi", log=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            capacity.run_load(server, 1, clients=1, say=str(pid_file), jitter_s=0.2,
                              idle=False, warmup_s=0.0, seconds=1.0)
        pid = int(pid_file.read_text())
        assert not psutil.pid_exists(pid)  # (ended and reaped: not even a zombie)
        assert f"client process {pid} had not ended 0.5 s after SIGTERM: killed (SIGKILL)" \
            in capfd.readouterr().err
    finally:
        server.close()
        for child in multiprocessing.active_children():  # (without the fix: still there)
            child.kill()
            child.join()


@pytest.mark.slow
def test_a_profile_py_spy_could_not_take_says_so(monkeypatch, tmp_path):
    """``profile`` on the hub: py-spy attaches to another process on macOS only as root,
    and without sudo exits at once, saying so on stderr, which the bench threw away. The
    bench then read a profile that was not there (FileNotFoundError) or, worse, the one an
    earlier run left at the same path, as this run's. It now says py-spy's words."""
    fake = tmp_path / "py-spy"  # FAKE py-spy: fails as the real one does on macOS unless root
    fake.write_text("#!/bin/sh\necho 'Error: This program requires root on OSX.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(capacity, "PY_SPY", fake)
    raw = tmp_path / "profile.txt"
    raw.write_text("an_earlier_run (old.py:1) 100\n")
    server = capacity.Server("gateway", log=False)
    try:
        with pytest.raises(SystemExit, match=r"py-spy could not profile the gateway server "
                                             r"\(exit 1\): Error: This program requires root"):
            capacity.run_load(server, 2, clients=1, say=capacity.long_text(20), jitter_s=0.2,
                              idle=False, warmup_s=0.5, seconds=1.0, profile=str(raw))
    finally:
        server.close()
    assert not raw.exists()  # (the earlier run's: gone, not read as this one's)


def _client_that_exits_at_once(target, port, n, say, jitter_s, idle, window, queue,
                               marks_s=0.0) -> None:
    """FAKE client process (stands in for ``capacity.client_main``): ends with status 3
    before it says anything, as a client whose import failed does."""
    sys.exit(3)


def _client_that_exits_once_ready(target, port, n, say, jitter_s, idle, window, queue,
                                  marks_s=0.0) -> None:
    """FAKE client process: says it is ready with no session, then ends with status 4
    without its figures, as a client that crashed in the window does."""
    queue.put(("ready", 0, 0, 0.0))
    sys.exit(4)


@pytest.mark.parametrize(("client", "said"), [
    (_client_that_exits_at_once, "exited with 3 before it said it was ready"),
    (_client_that_exits_once_ready, "exited with 4 before it sent its figures"),
])
def test_a_client_process_that_dies_stops_the_step_naming_it(monkeypatch, tmp_path, client,
                                                             said):
    """The bench waited on its queue alone for the clients' ready (600 s) and figures
    (120 s): a client process that had died (an import error, killed, out of memory) was
    noticed only when that ran out, in a traceback of ``queue.Empty``. It now stops the run
    as a server that died does (SystemExit naming the process and its exit code). The
    bench runs in a thread here only so that a hang fails the test rather than the run."""
    import threading

    script = tmp_path / "serves.py"  # (run_load only reads the server's /proc figures)
    script.write_text("import time\nprint('PORT 1', flush=True)\ntime.sleep(600)\n")
    monkeypatch.setitem(capacity.SCRIPTS, "fastapi", script)
    monkeypatch.setitem(capacity.PYTHONS, "fastapi", sys.executable)
    monkeypatch.setattr(capacity, "client_main", client)
    server = capacity.Server("fastapi", log=False)
    ended: list[BaseException] = []

    def bench() -> None:
        try:
            capacity.run_load(server, 2, clients=2, say="", jitter_s=0.2, idle=True,
                              warmup_s=0.0, seconds=0.5)
        except BaseException as exc:  # noqa: BLE001 (what the run ended with is the result)
            ended.append(exc)

    running = threading.Thread(target=bench, daemon=True)
    try:
        running.start()
        running.join(HANG_S)
        assert not running.is_alive(), f"hung: the bench had not ended {HANG_S:g} s later"
    finally:
        server.close()
    (exc,) = ended
    assert isinstance(exc, SystemExit), exc
    # (each client that has ended when the bench looks is named: both, or the first alone
    # when the second had not ended yet)
    assert re.fullmatch(rf"client process \d+ {said}(; client process \d+ {said})?",
                        str(exc)), exc
    assert multiprocessing.active_children() == []  # (reaped)


# (stands in for bench/capacity_server.py: it drops a socket open, then serves)
LEAKS_A_SOCKET = ("import socket, time\nsocket.socket()\nprint('PORT 1', flush=True)\n"
                  "time.sleep(600)\n")


@pytest.mark.parametrize("log", [True, False], ids=["log file", "log on ours"])
def test_a_gateway_that_leaks_fails_the_run_naming_the_leak(monkeypatch, tmp_path, capfd, log):
    """The bench's gateway (and the soak's: ``log=False``) printed its leaks to a log that
    was removed once the run passed, or to ours, which nobody read: it passed. It runs with
    ResourceWarnings shown, and what it printed of a leak is the server's ``leaks``, on
    stderr, and fails the run (``LEAKED``); its log is kept."""
    script = tmp_path / "leaks.py"
    script.write_text(LEAKS_A_SOCKET)
    monkeypatch.setitem(capacity.SCRIPTS, "gateway", script)
    monkeypatch.setattr(capacity, "LEAKED", [])
    server = capacity.Server("gateway", log=log)
    try:
        with server:
            pass
        (leak,) = server.leaks
        assert "ResourceWarning: unclosed <socket.socket" in leak
        assert capacity.LEAKED == [leak] and server.failed
        assert f"the gateway server leaked (1):\n{leak}" in capfd.readouterr().err
        if log:
            assert server.logfile is not None and Path(server.logfile).exists()  # (kept)
    finally:
        if server.logfile:
            Path(server.logfile).unlink(missing_ok=True)


def test_the_gateway_of_a_run_that_passes_leaked_nothing(monkeypatch):
    monkeypatch.setattr(capacity, "LEAKED", [])
    with capacity.Server("gateway", log=False) as server:
        pass
    assert server.leaks == [] and capacity.LEAKED == [] and not server.failed
