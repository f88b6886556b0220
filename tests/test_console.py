"""The browser console in real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright) against the real gateway: it connects, a typed transcript is spoken through
the AudioWorklet, Stop cancels the turn and silences it. Also the static routes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gateway.io.static import STATIC_DIR
from tests.hang_guard import HANG_S, hang_guard, unless_hung
from tests.wsclient import frames_written, raw_answer

CHROMIUM = "/usr/bin/chromium"
PING_EVERY_MS = int(re.search(r"^const PING_EVERY_MS = (\d+);$",
                              (STATIC_DIR / "console.js").read_text(), re.M)[1])
"""How often the page pings (console.js)."""
PROBE_MS = int(re.search(r"^const PROBE_MS = (\d+);", (STATIC_DIR / "console.js").read_text(),
                         re.M)[1])
"""How long the page waits for an answer to the ping it sends when the network is back."""
TOKEN_CHECK_MS = int(re.search(r"^const TOKEN_CHECK_MS = (\d+);",
                               (STATIC_DIR / "console.js").read_text(), re.M)[1])
"""How often a page asking for a token sees whether the gateway still wants one."""

LONG = " ".join(f"This is sentence number {i} of a long answer." for i in range(1, 30))


def keep_screenshot(shot: Path) -> None:
    """Copy to $OUT/console.png when OUT is set (CI keeps it as an artefact)."""
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["OUT"]) / "console.png")


@pytest.fixture
async def gateway(start_gateway):
    return await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."},
                                {"transcript": "Tell me everything", "reply": LONG}])


async def test_static_routes_have_types_and_refuse_escapes(gateway):
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        page = await client.get(f"{base}/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.content == (STATIC_DIR / "index.html").read_bytes()
        for name, kind in (("console.js", "text/javascript"), ("worklet.js", "text/javascript"),
                           ("console.css", "text/css")):
            r = await client.get(f"{base}/static/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
        for bad in ("/static/nope.js", "/static/..%2Fio%2Fstatic.py", "/static/../io/static.py",
                    "/static/.hidden.js", "/static/"):
            missing = await client.get(f"{base}{bad}")
            # the voice port's own 404, as for any path (it was plain text 'not found')
            assert missing.status_code == 404, bad
            assert missing.json()["error"]["code"] == "not_found", bad
        assert (await client.get(f"{base}/health")).json()["status"] == "ok"


BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--autoplay-policy=no-user-gesture-required",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"]
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (Debian: apt-get install -y chromium)")


@asynccontextmanager
async def console(url: str, *, clock: bool = False, paused: bool = False,
                  args: Sequence[str] = (), init: str | None = None,
                  on_page: Callable[[Any], None] | None = None
                  ) -> AsyncIterator[tuple[Any, list[str]]]:
    """Headless Chromium (Playwright) on the console at ``url``: yields the page and the
    page's uncaught JavaScript errors; the browser is closed on the way out. ``clock``: the
    page's timers run on Playwright's clock (``page.clock``), which the test may move on;
    it runs on by itself too, as the wall clock does. ``paused``: that clock, stopped before
    the page loads: the page's time moves only when the test moves it (a test waiting for
    the page's n-th retry saw the (n+1)-th come by itself first, its backoff spent while a
    loaded machine kept the test from looking). ``args``: more Chromium flags; ``init``: a
    script run before the page's own; ``on_page``: called with the page before it loads
    (to listen to its events)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=[*BROWSER_ARGS, *args])
        try:
            page = await browser.new_page()
            # waits for the page's state are hang guards, not assertions on speed: a starved
            # machine's Chromium may take tens of seconds where an idle one takes one
            page.set_default_timeout(HANG_S * 1000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            if clock or paused:
                start = time.time()
                await page.clock.install(time=start)
                if paused:  # (ahead of the start: a past time is refused, whatever the load)
                    await page.clock.pause_at(start + 3600)
            if init:
                await page.add_init_script(init)
            if on_page:
                on_page(page)
            await page.goto(url)
            yield page, errors
        finally:
            await browser.close()


async def talk(page: Any, text: str) -> None:
    """Type ``text`` as the user's transcript and send it."""
    await page.fill("#transcript", text)
    await page.click("#send")


async def talk_sent(page: Any, text: str) -> None:
    """``talk``, and wait until the page has sent it (it empties the box once sent)."""
    await talk(page, text)
    await page.wait_for_function("document.querySelector('#transcript').value === ''")


def reading_paused(gateway: Any) -> Any:
    """The gateway's only connection, its reading paused: what the page sends now stays
    unread (until ``conn.ws.transport.resume_reading()``, or lost with ``abort()``)."""
    (conn,) = gateway.connections
    conn.ws.transport.pause_reading()
    return conn


async def resumed_and_answering(page: Any, session_id: str) -> None:
    """The page resumes (once) its session ``session_id``, which answers a "Hello"."""
    state = "window.consoleState"
    await page.wait_for_function(f"{state}.resumes === 1")
    assert await page.evaluate(f"{state}.sessionId") == session_id
    await talk(page, "Hello")
    await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")


async def talk_when_ready(page: Any, text: str) -> None:
    """``talk`` once the page is connected and its audio ready."""
    await page.wait_for_function(
        "window.consoleState.connected && window.consoleState.audioReady")
    await talk(page, text)


async def talk_until_playing(page: Any, text: str) -> None:
    """``talk_when_ready``, and wait until the reply plays (12,000 samples of it played)."""
    await talk_when_ready(page, text)
    await page.wait_for_function("window.consoleState.samplesPlayed > 12000")


async def silence_passes(page: Any, until: str) -> None:
    """Move the page's clock (``console(clock=True)``) a ping interval at a time until the
    JavaScript expression ``until`` holds: the page gives a socket up after 12 s without an
    answer to a ping (console.js, SILENT_FOR_MS), which the test need not wait out. The
    ping timer fires once per jump; no jump once ``until`` holds (the resume window runs on
    the same clock)."""
    for _ in range(6):
        if await page.evaluate(until):
            return
        await page.clock.fast_forward(PING_EVERY_MS)
    assert await page.evaluate(until)


async def first_turn_heard(page: Any) -> dict[str, Any]:
    """The first turn's state once it has completed and the page has played it all (its
    ``heardUnderruns`` counted)."""
    await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
    await page.wait_for_function("window.consoleState.turns[0].heardUnderruns !== undefined")
    return (await page.evaluate("window.consoleState"))["turns"][0]


async def heard_out(page: Any) -> None:
    """Wait until the worklet has played everything it was sent."""
    await page.wait_for_function(
        "s => s.samplesPlayed >= s.samplesReceived && !s.playing",
        arg=await page.evaluate_handle("window.consoleState"))


@pytest.mark.slow
@needs_chromium
async def test_console_speaks_a_transcript_and_stop_cancels(gateway, tmp_path):
    async with console(f"http://127.0.0.1:{gateway.port}/", init=KEEP_CONTEXT) as (
            page, page_errors):
        await page.wait_for_function(
            "window.consoleState.connected && window.consoleState.audioReady")

        # a short turn: spoken to the end through the worklet
        await talk(page, "Hello")
        await page.wait_for_function(
            "window.consoleState.lastTurn && window.consoleState.lastTurn.status === "
            "'completed'")
        await heard_out(page)  # the worklet plays out everything it was sent
        state = await page.evaluate("window.consoleState")
        assert state["framesReceived"] > 10
        assert state["samplesPlayed"] == state["samplesReceived"] > 24_000 // 2
        assert await page.inner_text("#reply") == "Hi. Nice to hear you."
        assert await page.locator("#sentences li").count() >= 1
        assert await page.locator("#timeline .turn").count() == 1

        # a long turn, stopped while it plays
        await talk(page, "Tell me everything")
        played_before = state["samplesPlayed"]
        await page.wait_for_function(
            f"window.consoleState.samplesPlayed > {played_before} + 12000")
        await page.click("#stop")
        await page.wait_for_function(
            "window.consoleState.lastTurn.status === 'cancelled'")
        await page.wait_for_function(
            "!window.consoleState.playing && window.consoleState.bufferedSamples === 0")
        stopped = await page.evaluate("window.consoleState")
        # audio stays stopped: nothing more played (nor said) in a second of the player's
        assert await reports_in_an_audio_second(page) == 0
        after = await page.evaluate("window.consoleState")
        assert after["samplesPlayed"] == stopped["samplesPlayed"]
        assert stopped["samplesPlayed"] < played_before + len(LONG) * 24_000 // 15
        assert [t["status"] for t in after["turns"]] == ["completed", "cancelled"]
        # the browser's own underruns: counted once each turn played out or was cut
        assert all(isinstance(t["heardUnderruns"], int) for t in after["turns"])
        assert await page.locator("#timeline .heard", has_text="…").count() == 0
        assert after["errors"] == [] and page_errors == []

        shot = tmp_path / "console.png"
        await page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        keep_screenshot(shot)


@pytest.mark.slow
@needs_chromium
async def test_console_shows_the_underruns_this_browser_heard(start_gateway):
    """The timeline showed only the server's model of the listener's underruns; a voice
    slower than real time (1.6 s of work per audio second) starves the browser's player,
    whatever the machine's speed, and the row says how often once the turn has played."""
    from engines.synthetic import SyntheticEngine

    slow = SyntheticEngine(rtf=1.6, ttfa_ms=50, step_ms=320, lane="cpu")
    gw = await start_gateway([{"transcript": "Go", "reply": "One two three four five six."}],
                             engine=slow)
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, page_errors):
        await talk_when_ready(page, "Go")
        turn = await first_turn_heard(page)
        row = page.locator("#timeline .turn .heard")
        assert turn["heardUnderruns"] >= 1
        assert await row.inner_text() == f"· heard {turn['heardUnderruns']}"
        assert page_errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_counts_no_underrun_after_the_last_words(start_gateway):
    """A reply whose last part has nothing to say (a code block) goes on silently after its
    last audio: the player runs dry, but no gap is heard (no audio follows), and the server
    counts none. The browser counted one."""
    code = "\n```\n" + "".join(f"x = {i}\n" for i in range(60)) + "```"
    gw = await start_gateway([{"transcript": "Go", "reply": "Hi." + code}], tokens_per_s=60.0)
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, page_errors):
        await talk_when_ready(page, "Go")
        turn = await first_turn_heard(page)
        # the turn went on for seconds after its audio ran out (nothing to wait for here)
        assert turn["metrics"]["duration_ms"] > 2 * turn["metrics"]["audio_ms"]
        assert turn["metrics"]["underruns"] == 0 and turn["heardUnderruns"] == 0
        assert page_errors == []


# Test instrument in the page: the waveform's strokes drawn, and the colour of the last.
COUNT_STROKES = """window.strokes = 0;
const stroke = CanvasRenderingContext2D.prototype.stroke;
CanvasRenderingContext2D.prototype.stroke = function (...args) {
  window.strokes += 1;
  window.lastStroke = this.strokeStyle;
  return stroke.apply(this, args);
};"""

# The page draws nothing for 60 animation frames in a row (wait_for_function polls on
# each animation frame).
STILL_FOR_60_FRAMES = """() => {
  if (window.strokes !== window.seen) [window.seen, window.still] = [window.strokes, 0];
  return ++window.still > 60;
}"""


@pytest.mark.slow
@needs_chromium
async def test_console_draws_the_waveform_only_while_there_is_sound(gateway):
    """The waveform was drawn on every animation frame, sound or none: an idle page took
    ~10% of a core (Chromium's TaskDuration, 535 ms in 5 s), a phone's battery with it. It
    is drawn while the player plays, and until the analyser's window is quiet: the last
    frame drawn is the flat line, in the idle colour."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", init=COUNT_STROKES) as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        await page.wait_for_function(STILL_FOR_60_FRAMES)
        assert await page.evaluate("window.strokes") <= 1  # (the flat line, once)
        idle = await page.evaluate("window.strokes")
        await talk(page, "Hello")
        await page.wait_for_function(f"window.strokes > {idle} + 10")
        await heard_out(page)
        await page.wait_for_function(STILL_FOR_60_FRAMES)
        assert await page.evaluate("window.lastStroke") == "#37474f"
        assert errors == []


# Test instrument in the page: its AudioContext, as ``window.audioCtx``.
KEEP_CONTEXT = """(() => {
  const Context = window.AudioContext;
  window.AudioContext = class extends Context {
    constructor(options) { super(options); window.audioCtx = this; }
  };
})()"""


async def reports_in_an_audio_second(page: Any) -> int:
    """The worklet's reports to the page while its context plays one second (by the audio
    clock: KEEP_CONTEXT)."""
    n, t0 = await page.evaluate("[window.consoleState.workletReports, audioCtx.currentTime]")
    await page.wait_for_function(f"audioCtx.currentTime >= {t0} + 1")
    return await page.evaluate("window.consoleState.workletReports") - n


@pytest.mark.slow
@needs_chromium
async def test_console_player_reports_only_while_something_plays_or_changes(gateway):
    """The worklet posted its counts every 53 ms (10 render quanta) for as long as the page
    was open: an idle page took 19 messages a second across threads, each a callback on
    the page's main thread, to say nothing had changed. It reports while its counts change
    (playing, buffering), and once more when they stop: none on an idle page."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", init=KEEP_CONTEXT) as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        await page.wait_for_function("audioCtx.state === 'running'")
        assert await reports_in_an_audio_second(page) == 0
        await talk(page, "Hello")
        await first_turn_heard(page)  # (the reports said when its last sample played)
        await heard_out(page)
        st = await page.evaluate(state)
        assert st["workletReports"] > 10 and st["samplesPlayed"] == st["samplesReceived"]
        assert await reports_in_an_audio_second(page) == 0
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_on_a_gateway_with_tokens_takes_or_asks_for_one(start_gateway):
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                             server={"tokens": ["s3cret"]})
    base = f"http://127.0.0.1:{gw.port}/"
    # from the page's address: used, and taken out of the address bar
    async with console(base + "?token=s3cret") as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        assert "s3cret" not in page.url and not await page.is_visible("#token")
        await talk(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
    # without one: refused, so it asks, and connects once it is typed in
    async with console(base) as (page, errors):
        await page.wait_for_function("window.consoleState.needsToken")
        assert not await page.evaluate("window.consoleState.connected")
        assert await page.is_visible("#token")
        assert "needs a token" in (await page.evaluate("window.consoleState.errors"))[0]
        await page.fill("#token", "s3cret")
        await page.press("#token", "Enter")
        await page.wait_for_function("window.consoleState.connected")
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_asking_for_a_token_goes_in_once_the_gateway_wants_none(start_gateway):
    """A gateway started by mistake with a token, then again without: the page that had
    asked for the token went on saying the gateway needed one, for good (until one was
    typed in, whatever it was, or the page reloaded). It sees that none is wanted now."""
    gw = await start_gateway(server={"tokens": ["s3cret"]})
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", clock=True) as (page, errors):
        await page.wait_for_function(f"{state}.needsToken")
        await page.clock.fast_forward(TOKEN_CHECK_MS)  # still wanted: it goes on asking
        assert await page.evaluate(f"{state}.needsToken && {state}.reconnects === 1")
        port = gw.port
        await gw.aclose()
        await start_gateway(server={"port": port, "http_port": 0})  # no tokens
        await page.clock.fast_forward(TOKEN_CHECK_MS)
        await page.wait_for_function(f"{state}.connected")
        assert not await page.is_visible("#token")
        assert await page.evaluate("document.activeElement.id") == "transcript"
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_token_on_enter_not_when_its_field_loses_the_focus(
        start_gateway):
    """The token went on the field's change, which fires when it loses the focus too: a
    person clicking away with half of it typed sent that half (refused: 'the gateway
    refused this token', and the half was kept in place of what was typed). Enter sends it."""
    gw = await start_gateway(server={"tokens": ["s3cret"]})
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.needsToken")
        await page.keyboard.type("s3c")
        await page.click("#voice")  # away, to look something up
        await page.keyboard.press("Tab")  # and on with the keyboard
        assert await page.input_value("#token") == "s3c"
        assert await page.evaluate("sessionStorage.getItem('voiceToken')") is None
        state_now = await page.evaluate(state)
        assert state_now["needsToken"] and state_now["reconnects"] == 1
        await page.focus("#token")
        await page.keyboard.type("ret")
        await page.keyboard.press("Enter")
        await page.wait_for_function(f"{state}.connected")
        assert await page.evaluate(f"{state}.errors.length") == 1  # (needs a token)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_takes_a_token_a_subprotocol_cannot_carry(start_gateway):
    """A token made by ``openssl rand -base64`` has "/", "+" and "=": a subprotocol entry
    may hold none of "/" and "=" (the WebSocket constructor throws a SyntaxError), so the
    console died, from the page's ?token= before it ever connected, and on a typed one
    without a word. Such a token rides in the socket's URL (``?token=``) instead."""
    token = "k7/Q+e1 x=="
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                             server={"tokens": [token]})
    base = f"http://127.0.0.1:{gw.port}/"
    async with console(base + "?token=" + quote(token, safe="")) as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        await talk(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        assert errors == []
    async with console(base) as (page, errors):  # typed in when asked
        await page.wait_for_function("window.consoleState.needsToken")
        await page.fill("#token", token)
        await page.press("#token", "Enter")
        await page.wait_for_function("window.consoleState.connected")
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_waits_on_a_full_gateway_instead_of_asking_for_its_good_token(
        start_gateway):
    """A full gateway refuses the socket (HTTP 503) as a bad token does (401), and the
    browser does not say which: the console said "the gateway refused this token", asked
    for it and stopped trying. It says the gateway is full, and gets in once it is not."""
    from websockets.asyncio.client import connect

    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                             server={"tokens": ["s3cret"], "max_sessions": 1})
    other = await connect(f"ws://127.0.0.1:{gw.port}/v1/voice?token=s3cret")
    await other.recv()  # session.created: the gateway is full
    async with console(f"http://127.0.0.1:{gw.port}/?token=s3cret") as (page, errors):
        await page.wait_for_function(
            "document.querySelector('#status').textContent.includes('the gateway is full')")
        state = await page.evaluate("window.consoleState")
        assert not state["needsToken"] and state["errors"] == []
        assert not await page.is_visible("#token")
        await other.close()  # (1000: its session ends at once)
        await page.wait_for_function("window.consoleState.connected")
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_resumes_a_dropped_socket_and_hears_the_whole_reply(start_gateway):
    """Two drops in one turn, each resumed: one after the turn's first events and before
    its audio (the resume re-sends them, and the turn.done of the turn before: skipped,
    not shown twice), one while its audio plays (frames replayed: heard once, in full)."""
    reply = " ".join(f"This is sentence number {i} of the answer." for i in (1, 2, 3))
    # synthetic: a tone, and time to drop the socket before a turn's first audio
    gateway = await start_gateway(
        [{"transcript": "Hello", "reply": "Hi."}, {"transcript": "Tell me more", "reply": reply}],
        tts={"engine": "synthetic", "options": {"ttfa_ms": 1500, "rtf": 0.05}})

    def drop() -> None:  # the network drops: no close handshake
        for conn in list(gateway.connections):
            conn.ws.transport.abort()

    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await talk_when_ready(page, "Hello")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        await heard_out(page)  # heard to the end (a new turn would cut it)
        session_id = await page.evaluate(f"{state}.sessionId")
        frames = await page.evaluate(f"{state}.framesReceived")
        await talk(page, "Tell me more")
        await page.wait_for_function(  # turn.started and text, no audio yet
            f"{state}.eventsSinceFrame >= 3 && {state}.framesReceived === {frames}")
        drop()
        await page.wait_for_function(f"{state}.resumes === 1")
        await page.wait_for_function(f"{state}.samplesPlayed > {state}.samplesReceived / 3")
        drop()
        await page.wait_for_function(f"{state}.resumes === 2")
        assert await page.evaluate(f"{state}.sessionId") == session_id
        await page.wait_for_function(
            f"{state}.lastTurn?.status === 'completed' && {state}.turns.length > 1")
        await heard_out(page)
        st = await page.evaluate(state)
        # every frame once: the turns' audio in full, nothing twice
        heard_ms = sum(t["metrics"]["audio_ms"] for t in st["turns"])
        assert abs(st["samplesPlayed"] / 24 - heard_ms) < 2
        assert st["samplesPlayed"] == st["samplesReceived"]
        # events re-sent by the resumes were skipped: each turn once, the reply once
        assert [t["status"] for t in st["turns"]] == ["completed", "completed"]
        assert await page.inner_text("#reply") == reply
        assert await page.locator("#sentences li").count() == 3
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_plays_out_a_failed_turn(start_gateway):
    """protocol.md: a failed turn still speaks its complete sentences; only a cancel
    flushes. The console used to drop the last ~400 ms it had already received."""
    reply = "Good morning to you. " + "And then it goes on and on. " * 10
    gw = await start_gateway([{"transcript": "Morning", "reply": reply}],
                             session={"max_reply_chars": 100})
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_when_ready(page, "Morning")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'failed'")
        await heard_out(page)
        state = await page.evaluate("window.consoleState")
        assert state["samplesPlayed"] == state["samplesReceived"] > 24_000


@pytest.mark.slow
@needs_chromium
async def test_console_plays_out_the_turn_a_stopping_gateway_ended(start_gateway):
    """protocol.md, shutting_down: the turn ends failed, what was sent may be played out,
    then the socket closes with 1001. The console flushed it at the close (~1 s unheard)
    and its row said 'heard …' for good."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me")
        await gw.aclose()
        await page.wait_for_function(f"!{state}.connected")
        await page.wait_for_function(f"{state}.samplesPlayed === {state}.samplesReceived")
        await page.wait_for_function(f"{state}.turns[0].heardUnderruns !== undefined")
        st = await page.evaluate(state)
        assert st["lastTurn"]["status"] == "failed"
        assert abs(st["samplesPlayed"] / 24 - st["lastTurn"]["metrics"]["audio_ms"]) < 2
        assert st["errors"][-1] == "the gateway stopped; reconnecting for a new session"
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_settings_emptied_go_back_to_the_servers_defaults(gateway):
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        (runner,) = gateway.runners.values()
        default = runner.session.settings
        # the empty field says which voice it stands for
        assert await page.get_attribute("#voice", "placeholder") == "en-us (default)"
        await page.fill("#voice", "en-gb")
        await page.fill("#instructions", "Answer in one word.")
        await page.click("#apply")
        await page.wait_for_function("document.querySelector('#voice').value === 'en-gb'")
        assert runner.session.settings.voice == "en-gb"
        assert runner.session.settings.instructions == "Answer in one word."
        await page.fill("#voice", "")
        await page.fill("#instructions", "")
        await page.click("#apply")
        await page.wait_for_function(
            f"document.querySelector('#instructions').value === {default.instructions!r}")
        assert runner.session.settings == default  # null: the server's defaults again
        assert errors == []



@pytest.mark.slow
@needs_chromium
async def test_console_a_new_session_keeps_the_settings_the_user_set(gateway):
    """A session the gateway ended (restarted: a developer's usual loop) gave way to a new
    one with the defaults, and the fields showed them: the voice picked and the instructions
    typed were gone, and the next reply spoke as the user had not asked, with nothing said.
    The new session gets the settings the user changed."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        (runner,) = gateway.runners.values()
        default = runner.session.settings
        await page.fill("#voice", "en-gb")
        await page.fill("#instructions", "Answer like a pirate.")
        await page.select_option("#frame-ms", "80")
        await page.fill("#first-max-words", "6")
        await page.click("#apply")
        await page.wait_for_function(f"{state}.settings.voice === 'en-gb'")
        old = await page.evaluate(f"{state}.sessionId")
        (conn,) = gateway.connections
        await conn.ws.close()  # the session ends: the page opens a new one
        await page.wait_for_function(
            f"{state}.connected && {state}.sessionId !== {old!r} && "
            f"{state}.settings.voice === 'en-gb'")
        (runner,) = gateway.runners.values()
        assert runner.session.settings == dataclasses.replace(
            default, voice="en-gb", instructions="Answer like a pirate.", frame_ms=80,
            segmenter=dataclasses.replace(default.segmenter, first_max_words=6))
        assert [await page.input_value(f) for f in ("#voice", "#instructions", "#frame-ms",
                                                    "#first-max-words")] \
            == ["en-gb", "Answer like a pirate.", "80", "6"]
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_a_new_gateway_without_the_voice_keeps_the_other_settings(
        start_gateway):
    """The gateway restarted onto another engine: the page gave the new session the last
    one's settings in one session.update, taken whole or not at all, so the voice the new
    engine lacks had the instructions refused with it, and nothing said they were gone:
    the replies spoke as the user had not asked. The refused voice is said and left out;
    the rest goes again without it."""
    gw = await start_gateway()
    state = "window.consoleState"
    pirate = "Answer like a pirate."
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        await page.fill("#voice", "en-gb")
        await page.fill("#instructions", pirate)
        await page.fill("#first-max-words", "6")
        await page.click("#apply")
        await page.wait_for_function(f"{state}.settings.voice === 'en-gb'")
        old, port = await page.evaluate(f"{state}.sessionId"), gw.port
        await gw.aclose()
        gw = await start_gateway(server={"port": port, "http_port": 0},
                                 tts={"engine": "synthetic"})
        await page.wait_for_function(
            f"{state}.connected && {state}.sessionId !== {old!r} && "
            f"{state}.errors.some(e => e.startsWith('unknown_voice'))")
        await page.wait_for_function(f"{state}.settings.instructions === {pirate!r}")
        (runner,) = gw.runners.values()
        assert runner.session.settings.instructions == pirate
        assert runner.session.settings.segmenter.first_max_words == 6
        assert runner.session.settings.voice != "en-gb"
        (refused,) = [e for e in await page.evaluate(f"{state}.errors")
                      if e.startswith("unknown_voice")]
        assert refused.endswith("; the last session's other settings were sent again "
                                "without it")
        assert [await page.input_value(f) for f in ("#voice", "#instructions",
                                                    "#first-max-words")] == ["", pirate, "6"]
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sets_the_first_segments_word_limits(gateway):
    """The segmenter's first-segment settings (first_max_words is opt-in, to be heard before
    it is chosen) are set in the page as the others are: shown as session.created says, a
    refused value said why and put back, an accepted one used by the next turn."""
    state = "window.consoleState"
    fields = ("#first-min-words", "#first-phrase-words", "#first-max-words")
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        (runner,) = gateway.runners.values()
        default = runner.session.settings.segmenter
        assert [await page.input_value(f) for f in fields] == [
            str(default.first_min_words), str(default.first_phrase_words),
            str(default.first_max_words)]
        await page.fill("#first-max-words", "51")
        await page.click("#apply")
        await page.wait_for_function(f"{state}.errors.length")
        assert (await page.evaluate(f"{state}.errors")) == [
            "invalid_field: field 'first_max_words' must be between 0 and 50 (the settings)"]
        assert await page.input_value("#first-max-words") == str(default.first_max_words)
        assert runner.session.settings.segmenter == default
        await page.fill("#first-max-words", "3")
        await page.press("#first-max-words", "Enter")
        await page.wait_for_function(f"{state}.settings.segmenter.first_max_words === 3")
        assert runner.session.settings.segmenter == dataclasses.replace(default,
                                                                        first_max_words=3)
        await talk_when_ready(page, "Tell me everything")
        await page.wait_for_function("document.querySelector('#sentences li')")
        # "This is sentence number 1 of a long answer." cut after its third word
        assert await page.evaluate(
            "document.querySelector('#sentences li').firstChild.textContent") \
            == "This is sentence"
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_enter_in_a_setting_applies_it(gateway):
    """Keyboard only: a voice typed and Enter did nothing, while the field went on showing
    it, so the next reply spoke with the voice it did not show. Enter applies the settings,
    as Apply does."""
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        (runner,) = gateway.runners.values()
        await page.focus("#voice")
        await page.keyboard.type("en-gb")
        await page.keyboard.press("Enter")
        await page.wait_for_function("window.consoleState.settings.voice === 'en-gb'")
        assert runner.session.settings.voice == "en-gb"
        # the frame's list too: a form submits on Enter from its text fields only, and a
        # frame picked with the arrows and Enter did nothing (the field showed 60, the
        # session spoke in 40 ms frames)
        await page.focus("#frame-ms")
        await page.keyboard.press("ArrowDown")
        await page.keyboard.press("Enter")
        await page.wait_for_function("window.consoleState.settings.frame_ms === 60")
        assert runner.session.settings.frame_ms == 60
        assert errors == []



@pytest.mark.slow
@needs_chromium
async def test_console_a_refused_voice_leaves_the_other_settings_typed(gateway):
    """A session.update is taken whole or not at all: a voice misspelt beside instructions
    just written was refused, and every field was put back to the settings in use, the
    instructions typed with them (up to 16,000 characters, gone). The refused voice is put
    back; what was typed in the others stays, to go with the voice corrected."""
    state = "window.consoleState"
    pirate = "Answer as a pirate would."
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        (runner,) = gateway.runners.values()
        before = runner.session.settings
        await page.fill("#instructions", pirate)
        await page.fill("#first-min-words", "2")
        await page.fill("#voice", "en-gbb")
        await page.press("#voice", "Enter")
        await page.wait_for_function(f"{state}.errors.length")
        assert (await page.evaluate(f"{state}.errors"))[0].startswith("unknown_voice:")
        assert runner.session.settings == before
        assert await page.input_value("#voice") == ""  # (the voice in use: the default)
        assert await page.input_value("#instructions") == pirate
        assert await page.input_value("#first-min-words") == "2"
        await page.fill("#voice", "en-gb")
        await page.press("#voice", "Enter")
        await page.wait_for_function(f"{state}.settings.voice === 'en-gb'")
        settings = runner.session.settings
        assert settings.instructions == pirate and settings.segmenter.first_min_words == 2
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_a_tap_resumes_audio_the_browser_suspended(gateway):
    """Safari lets only a user's gesture resume an AudioContext, and suspends it when the
    page is left (a call, the phone locked); the console resumed it only when a transcript
    was sent, so a reply playing when the user came back, or asked for by the mic (its
    result is no gesture), stayed silent. Any tap or key on the page resumes it now. The
    test suspends the page's context itself, standing in for the system."""
    keep_context = """(() => {
      const Native = window.AudioContext;
      window.AudioContext = class extends Native {
        constructor(...args) { super(...args); window.audioContext = this; }
      };
    })()"""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", init=keep_context) as (page, errors):
        await talk_when_ready(page, "Tell me everything")
        await page.wait_for_function(f"{state}.samplesPlayed > 2400")
        await page.evaluate("window.audioContext.suspend()")
        await page.click("#reply")  # a tap on the page, no transcript
        await page.wait_for_function("window.audioContext.state === 'running'")
        played = (await page.evaluate(state))["samplesPlayed"]
        await page.wait_for_function(f"{state}.samplesPlayed > {played} + 4800")  # plays on
        await page.evaluate("window.audioContext.suspend()")
        await page.press("#voice", "Shift")  # a key, in any field
        await page.wait_for_function("window.audioContext.state === 'running'")
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_transcript_while_the_browser_holds_its_audio(start_gateway):
    """A browser lets an AudioContext start only after a gesture on the page (Chromium's
    default policy, as Safari); the console awaited its context's resume() before sending a
    transcript, and that promise waits for a gesture: a transcript sent with none (nothing
    tapped yet; Safari: a gesture is needed anew after the page was left) stayed unsent,
    for good. It goes at once now; the reply waits in the player, and plays at the first
    tap. The page sends it by itself, since everything the test runs in the page counts as
    a gesture (Playwright's evaluate)."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}])
    send_unasked = """(() => {
      const Native = window.AudioContext;
      window.AudioContext = class extends Native {
        constructor(...args) { super(...args); window.playing = this; }
      };
      const ready = setInterval(() => {
        const s = window.consoleState;
        if (!s?.connected || !s.audioReady) return;
        clearInterval(ready);
        window.sentWith = {audio: window.playing.state,
                           gesture: navigator.userActivation.hasBeenActive};
        document.querySelector("#transcript").value = "Hello";
        document.querySelector("#talk").requestSubmit();
      }, 20);
    })()"""
    transcript_sent = asyncio.Event()

    def on_page(page: Any) -> None:
        page.on("websocket", lambda ws: ws.on("framesent", lambda frame: (
            transcript_sent.set() if '"transcript"' in str(frame) else None)))

    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", init=send_unasked, on_page=on_page,
                       args=["--autoplay-policy=document-user-activation-required"]
                       ) as (page, errors):
        await unless_hung(transcript_sent.wait())
        assert await page.evaluate("window.sentWith") == {"audio": "suspended",
                                                          "gesture": False}
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        assert await page.evaluate(f"{state}.samplesPlayed") == 0  # held, not lost
        await page.click("#reply")  # the first tap
        await page.wait_for_function(f"{state}.samplesPlayed === {state}.samplesReceived && "
                                     f"{state}.samplesPlayed > 0")
        assert errors == []


SHORT = " ".join(f"This is sentence number {i} of a short answer." for i in range(1, 5))


@pytest.mark.slow
@needs_chromium
async def test_console_a_refused_transcript_leaves_the_reply_playing_whole(start_gateway):
    """A transcript the server refuses (rate_limited) or the page does (over 4,000
    characters) is no barge-in: the reply plays on, whole. The console used to flush its
    player when it sent, losing ~1 s and running dry for the rest of the turn. The one the
    server refused goes back in the box (it was emptied when it went, and the text lost)."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": SHORT}],
                             server={"turns_per_minute": 1})
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me")
        await talk(page, "x" * 4001)
        assert await page.input_value("#transcript") == "x" * 4001  # kept, to be shortened
        await talk(page, "Hello again")
        await page.wait_for_function(f"{state}.errors.some(e => e.startsWith('rate_limited'))")
        # refused, it is back in the box to send again (it was emptied when it went: gone)
        assert await page.input_value("#transcript") == "Hello again"
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        await heard_out(page)
        st = await page.evaluate(state)
        assert st["samplesPlayed"] == st["samplesReceived"]
        assert abs(st["samplesPlayed"] / 24 - st["lastTurn"]["metrics"]["audio_ms"]) < 2
        assert st["underruns"] == 0
        assert st["errors"][0] == "the transcript is 4001 characters; the limit is 4000"
        assert st["errors"][1].endswith("; the transcript is back in the box")
        assert gw.metrics.errors["text_too_long"] == 0  # never sent
        assert errors == []


def test_console_counts_white_space_as_the_gateway_does():
    """The console's white space (GATEWAY_SPACE, console.js) is exactly what the gateway
    strips from a transcript (str.strip(): str.isspace()), every code point checked; the
    class is written in escapes that JavaScript and Python's re read alike."""
    source = (STATIC_DIR / "console.js").read_text()
    statement = re.search(r"^const GATEWAY_SPACE = (.*?);$", source, re.M | re.S)[1]
    space = re.compile("[" + "".join(re.findall(r"String\.raw`([^`]*)`", statement)) + "]")
    assert [c for c in range(0x110000) if bool(space.fullmatch(chr(c))) != chr(c).isspace()] \
        == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_transcript_unless_the_gateway_counts_it_white_space(
        start_gateway):
    """The console kept back a transcript of only white space by JavaScript's trim(), which
    the gateway refuses by Python's str.strip() (invalid_field): the two differ. U+001C to
    U+001F and U+0085 are white space only to Python: such a transcript was sent, to be
    refused. The gateway also refuses a text of invisible format characters only (U+FEFF,
    zero-width spaces, direction marks: ``codec.blank``), which the console kept back only
    where trim() took them (U+FEFF). The console strips what the gateway would now, keeps
    back what it would refuse as empty, and sends the rest."""
    from gateway.core.codec import ClientTranscript

    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        received = messages_received(gw)
        for blank in ("\x1c", "\x1d", "\x1e", "\x1f", "\x85", " \x85\u3000\x1f\t", "\ufeff",
                      "\u200b\u200e", " \u2067\u2069\u00ad "):
            await talk(page, blank)  # not sent (they would go before the next)
        await talk(page, "\ufeffHi")
        await page.wait_for_function(f"{state}.lastTurn?.turnId === 1")
        await talk(page, "\x85 Hello\x1c")
        await page.wait_for_function(f"{state}.lastTurn?.turnId === 2")
        said = [m.text for m in received if isinstance(m, ClientTranscript)]
        assert said == ["\ufeffHi", "Hello"]
        assert gw.metrics.errors["invalid_field"] == 0
        assert await page.evaluate(f"{state}.errors") == []
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_stop_pressed_while_offline_reaches_the_gateway_after_the_resume(
        start_gateway):
    """Stop silences the turn for good: the frames the resume replays (sent while the page
    was offline) came before the cancel's turn.done, and were played."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", clock=True) as (page, errors):
        await talk_until_playing(page, "Tell me")
        await page.context.set_offline(True)  # and the socket drops: no reconnect gets out
        # counted from here: frames written while the page went offline may still reach it
        # (a loaded machine: none was left to replay, CI at stop 33)
        lost = frames_written(gw, 4)  # 160 ms: more than the player's 100 ms pre-buffer
        await unless_hung(lost.wait())
        for conn in list(gw.connections):
            conn.ws.transport.abort()
        await silence_passes(page, f"!{state}.connected")  # (offline, it hears no close)
        await page.click("#stop")
        assert "Stop is sent when the session resumes" in \
            (await page.evaluate(f"{state}.errors"))[-1]
        await page.wait_for_function(f"!{state}.playing && {state}.bufferedSamples === 0")
        stopped = await page.evaluate(state)
        await page.context.set_offline(False)
        await page.wait_for_function(f"{state}.resumes === 1")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        assert gw.metrics.turns["cancelled"] == 1
        after = await page.evaluate(state)
        assert after["framesReceived"] > stopped["framesReceived"]  # the replay came
        assert after["samplesReceived"] == stopped["samplesReceived"]  # none of it played
        assert after["samplesPlayed"] == stopped["samplesPlayed"]
        assert isinstance(after["lastTurn"]["heardUnderruns"], int)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_stop_lost_with_its_socket_again_after_the_resume(start_gateway):
    """protocol.md, Resume: a message sent just before a drop may be lost with the socket;
    a cancel is idempotent, send it again. The turn went on to the end, all in the history."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me")
        conn = reading_paused(gw)  # what the page sends now stays unread ...
        await page.click("#stop")  # (sent before click() returns)
        conn.ws.transport.abort()  # ... and is lost with the socket
        await page.wait_for_function(f"{state}.resumes === 1")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        assert gw.metrics.turns["cancelled"] == 1
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_transcript_lost_with_its_socket_again_after_the_resume(
        gateway):
    """protocol.md, Resume: a transcript whose turn.started has not come is lost when
    session.resumed's turn_id is the latest turn seen start: send it again. The console
    resumed, and the transcript it had cleared from its box was never answered."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        conn = reading_paused(gateway)  # what the page sends now stays unread ...
        await talk_sent(page, "Hello")
        conn.ws.transport.abort()  # ... and is lost with the socket (sent: the box is empty)
        await page.wait_for_function(f"{state}.resumes === 1")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        assert await page.inner_text("#reply") == "Hi. Nice to hear you."
        assert [t["turnId"] for t in await page.evaluate(f"{state}.turns")] == [1]
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_stop_after_the_turn_ended_cuts_its_tail(gateway):
    """A turn ends up to max_lead_ms before it has played: Stop then silenced it, but its
    row said 'heard …' until the next turn (the worklet never played its last sample)."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await talk_when_ready(page, "Hello")
        # Stop is pressed in the check that sees the turn ended with audio left, not a
        # round trip later: on a loaded machine page.click's own checks outlasted the ~1 s
        # of audio left, and the tail had played out before Stop came (seen once)
        await page.wait_for_function(f"""(() => {{
            if ({state}.lastTurn?.status !== 'completed' || {state}.bufferedSamples <= 2400)
              return false;
            document.getElementById('stop').click();
            return true;
          }})()""")
        await page.wait_for_function(f"{state}.turns[0].heardUnderruns !== undefined")
        assert await page.inner_text("#timeline .heard") == "· heard 0"
        await page.wait_for_function(f"!{state}.playing && {state}.bufferedSamples === 0")
        st = await page.evaluate(state)
        assert st["samplesPlayed"] < st["samplesReceived"]  # cut, not played out
        assert st["errors"] == [] and errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_gives_up_a_silent_socket_and_resumes_on_a_new_one(start_gateway):
    """The network goes quiet without closing anything: the page hears nothing, not even
    its pings answered, gives the socket up and resumes the session on a new one."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    state = "window.consoleState"
    given_up = f"{state}.errors.some(e => e.startsWith('no answer'))"
    async with console(f"http://127.0.0.1:{gw.port}/", clock=True) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        session_id = await page.evaluate(f"{state}.sessionId")
        await page.context.set_offline(True)
        await silence_passes(page, given_up)
        await page.context.set_offline(False)
        await resumed_and_answering(page, session_id)


@pytest.mark.slow
@needs_chromium
async def test_console_shows_the_servers_text_as_text(start_gateway):
    """The turn's row was built with innerHTML from turn.done's fields: an engine name (or a
    status) with markup ran as the page's own script. Every field is now text."""
    from engines.synthetic import SyntheticEngine

    named = SyntheticEngine(rtf=0, ttfa_ms=0, name='<img src=x onerror="window.pwned=1">')
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}], engine=named)
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        await talk(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        assert await page.evaluate("window.pwned") is None
        assert await page.locator("#timeline img").count() == 0
        assert named.name in await page.inner_text("#timeline .turn .label")
        assert await page.locator("#timeline [data-status=completed]").count() == 1
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_says_a_segment_with_nothing_to_say_was_not_spoken(start_gateway):
    """A code block (or a run of emoji) is a segment with nothing to say: its `sentence`
    has `spoken` "" and `engine` null (protocol.md). The list showed "null · spoken: “”"."""
    reply = "Here it is.\n```\nx = 1\n```\nDone."
    gw = await start_gateway([{"transcript": "Code", "reply": reply}])
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_when_ready(page, "Code")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        notes = await page.locator("#sentences li .engine").all_inner_texts()
        assert notes == ["espeak", "not spoken: nothing to say", "espeak"]
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_keeps_a_live_socket_when_its_timers_are_throttled(gateway):
    """A hidden tab's timers may wake once a minute (Chrome's intensive throttling): the
    page took the minute since its last message for silence, gave up a live socket and
    resumed, once a minute, each time saying the gateway did not answer."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", clock=True) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        for _ in range(3):
            pongs = await page.evaluate(f"{state}.pongs")
            await page.clock.fast_forward(60_000)  # each due timer fires once, as throttled
            await page.wait_for_function(f"{state}.pongs > {pongs}")
        st = await page.evaluate(state)
        assert st["errors"] == [] and st["reconnects"] == 0 and st["resumes"] == 0
        assert errors == []


async def raw_answer_parts(port: int, request: bytes) -> tuple[bytes, bytes]:
    """The head and the body of the voice port's answer to ``request``."""
    head, _, body = (await raw_answer(port, request)).partition(b"\r\n\r\n")
    return head, body


async def test_the_voice_port_answers_get_head_and_nothing_else(gateway):
    # websockets answers any method as GET: HEAD got the whole page after its headers (a
    # proxy keeping the connection would take those bytes for the next answer), and
    # POST, PUT, DELETE... got the page, /metrics or /health as if they were GETs
    head, body = await raw_answer_parts(gateway.port,
                                        b"HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == b""
    length = int(re.search(rb"Content-Length: (\d+)", head)[1])
    assert length == len((STATIC_DIR / "index.html").read_bytes())  # as GET would say
    for method in (b"POST", b"PUT", b"DELETE", b"OPTIONS"):
        for path in (b"/", b"/health", b"/v1/voice"):
            head, body = await raw_answer_parts(
                gateway.port, method + b" " + path + b" HTTP/1.1"
                b"\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 405 "), (method, path, head)
            allowed = b"GET" if path == b"/v1/voice" else b"GET, HEAD"
            assert b"\r\nAllow: " + allowed + b"\r\n" in head
            error = json.loads(body)["error"]
            assert error["code"] == "method_not_allowed"
            assert f"voice port ({allowed.decode()});" in error["message"]
    # a WebSocket opens with a GET: the 405 said HEAD was allowed here too (its Allow),
    # and so did the one to a request with a body (which websockets cannot read)
    head, _ = await raw_answer_parts(gateway.port,
                                     b"HEAD /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: GET\r\n" in head
    for path, allowed in ((b"/v1/voice?token=x", b"GET"), (b"/health", b"GET, HEAD")):
        head, _ = await raw_answer_parts(gateway.port, b"POST " + path + b" HTTP/1.1\r\nHost: "
                                         b"127.0.0.1\r\nContent-Length: 2\r\n\r\n{}")
        assert head.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: " + allowed + b"\r\n" in head


@pytest.mark.slow
@needs_chromium
async def test_console_by_a_name_without_tokens_says_why_it_is_refused(gateway):
    """Without tokens the gateway answers only at an IP address, localhost or a name it is
    told (a name could be an attacker's, pointed at the hub: DNS rebinding). Opened by a
    name, the page retried for ever, saying only "socket closed with 1006; reconnecting".
    The gateway now refuses the page itself, saying why and what to set instead."""
    url = f"http://gateway.test:{gateway.port}/"
    async with console(url, args=["--host-resolver-rules=MAP gateway.test 127.0.0.1"]) as (
            page, errors):
        why = await page.inner_text("body")
        assert "forbidden_host" in why and "--allowed-host gateway.test" in why
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_talks_without_sound_where_the_page_cannot_play(start_gateway):
    """Served over plain http from a name other than localhost (a hub on the LAN, --token
    without --tls-cert) the page is no secure context and has no AudioWorklet: every
    transcript failed with "TypeError: Cannot read properties of undefined (reading
    'addModule')" and was never sent. It goes now, the reply shows, and the page says why
    there is no sound. (With a token: without one, a page by a name is not taken for the
    gateway's own, as a page of a name pointed at it by DNS rebinding would look the same.)"""
    gateway = await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."}],
                                  server={"tokens": ["s3cret"]})
    # the gateway, by a name that is not loopback
    url = f"http://gateway.test:{gateway.port}/?token=s3cret"
    async with console(url, args=["--host-resolver-rules=MAP gateway.test 127.0.0.1"]) as (
            page, errors):
        await page.wait_for_function("window.consoleState.connected")
        assert not await page.evaluate("window.isSecureContext")
        await talk(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        assert await page.inner_text("#reply") == "Hi. Nice to hear you."
        state = await page.evaluate("window.consoleState")
        assert state["framesReceived"] > 0 and state["samplesReceived"] == 0
        (error,) = state["errors"]
        assert "no sound" in error and "https://" in error and "localhost" in error
        # nothing is heard here: the turn's row does not wait for a count ("heard …")
        assert await page.inner_text("#timeline .heard") == "· heard –"
        assert state["turns"][0]["heardUnderruns"] is None
        assert errors == []


# Test instrument in the page: what its live regions announce (window.announced, with the
# region's id), as a screen reader does: the text each change to a region adds.
LISTEN_TO_LIVE_REGIONS = """window.announced = [];
addEventListener("DOMContentLoaded", () => {
  new MutationObserver((changes) => {
    for (const c of changes) {
      const region = (c.target.nodeType === 1 ? c.target : c.target.parentElement)
        .closest('[aria-live]:not([aria-live="off"]), [role=status], [role=alert], [role=log]');
      if (!region) continue;
      const added = c.type === "characterData" ? [c.target] : [...c.addedNodes];
      for (const node of added) {
        if (node.textContent.trim()) window.announced.push([region.id, node.textContent]);
      }
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
});"""

SENTENCES = ["Hi there.", "The kitchen light is on now.", "Anything else?"]


@pytest.mark.slow
@needs_chromium
async def test_console_announces_each_sentence_of_a_reply_it_cannot_play(start_gateway):
    """The reply's text went into a plain element, which a screen reader does not read out
    unasked: a person using one on a page with no sound (plain http on a LAN, no
    AudioWorklet) never heard the reply. Each sentence is announced once, politely, as the
    segmenter cuts it (not each token); where the page plays the reply, its voice says it,
    and a screen reader saying it over that voice would only mask it."""
    gateway = await start_gateway([{"transcript": "Hello", "reply": " ".join(SENTENCES)}],
                                  server={"tokens": ["s3cret"]}, tokens_per_s=40.0)
    url = f"http://gateway.test:{gateway.port}/?token=s3cret"
    args = ["--host-resolver-rules=MAP gateway.test 127.0.0.1"]
    async with console(url, args=args, init=LISTEN_TO_LIVE_REGIONS) as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        await talk(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        said = [text for region, text in await page.evaluate("window.announced")
                if region not in ("status", "errors")]
        assert [text.strip() for text in said] == SENTENCES
        assert errors == []
    async with console(f"http://127.0.0.1:{gateway.port}/?token=s3cret",
                       init=LISTEN_TO_LIVE_REGIONS) as (page, errors):
        await talk_when_ready(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        assert await page.inner_text("#reply") == " ".join(SENTENCES)
        assert [region for region, _ in await page.evaluate("window.announced")
                if region not in ("status", "errors")] == []
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_fields_on_a_phone_are_large_enough_not_to_zoom(gateway):
    """iOS Safari zooms the page into a text field whose font is under 16 px when it takes
    focus, and stays zoomed: on a phone every tap into the transcript box pushed the reply
    and the buttons off screen. The fields were 13.3 px (Chromium's default); on a narrow
    screen they are 16 px."""
    async with on_a_phone(gateway.port, 375) as page:
        await page.wait_for_function("window.consoleState.connected")
        sizes = await page.evaluate("""[...document.querySelectorAll(
            "input, textarea, select")].map((el) => [el.id, getComputedStyle(el).fontSize])""")
        assert sizes and all(size == "16px" for _, size in sizes), sizes
        # and the page still fits the phone's width
        assert await page.evaluate("document.documentElement.scrollWidth") <= 375


@pytest.mark.slow
@needs_chromium
async def test_console_controls_on_a_phone_are_large_enough_to_tap(gateway):
    """On a phone, Stop (the button to cut a reply, in a hurry), Speak and Apply were 21 px
    tall, and the frame's list too: under even WCAG's minimum target (24 px), a finger
    meant for Stop hit Speak. Every button and list is 44 px at least (WCAG 2.5.5, Apple's
    guidelines) on a narrow screen."""
    async with on_a_phone(gateway.port, 375) as page:
        await page.wait_for_function("window.consoleState.connected")
        sizes = await page.evaluate("""[...document.querySelectorAll("button, select")]
            .filter((el) => el.offsetParent !== null)
            .map((el) => [el.id, el.getBoundingClientRect().width,
                          el.getBoundingClientRect().height])""")
        assert {"stop", "send", "apply", "frame-ms"} <= {name for name, _, _ in sizes}
        assert all(w >= 44 and h >= 44 for _, w, h in sizes), sizes
        assert await page.evaluate("document.documentElement.scrollWidth") <= 375


@asynccontextmanager
async def on_a_phone(port: int, width: int, height: int = 700) -> AsyncIterator[Any]:
    """The console of the gateway on ``port`` in a page ``width`` px wide (a phone's)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=BROWSER_ARGS)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            await page.goto(f"http://127.0.0.1:{port}/")
            yield page
        finally:
            await browser.close()


CUT_PLACEHOLDERS = """() => {
  // each field shown whose placeholder is wider than the room for text in it
  const g = document.createElement("canvas").getContext("2d");
  const cut = [];
  for (const el of document.querySelectorAll("input[placeholder], textarea[placeholder]")) {
    if (!el.checkVisibility()) continue;
    const style = getComputedStyle(el, "::placeholder");
    g.font = style.font;
    const room = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const width = g.measureText(el.placeholder).width;
    if (width > room) cut.push(`${el.id}: ${Math.round(width)} > ${room}`);
  }
  return cut;
}"""


@pytest.mark.slow
@needs_chromium
async def test_console_on_a_phone_shows_each_fields_placeholder_whole(start_gateway):
    """On a 360x740 phone the token field, as wide as a desktop's (20 characters), showed
    "the gateway's token, then E": what to do once it is typed was cut off. Every field's
    placeholder fits its field, on a phone and on a desktop."""
    gw = await start_gateway(server={"tokens": ["s3cret"]})
    async with on_a_phone(gw.port, 360, 740) as page:
        await page.wait_for_function("window.consoleState.needsToken")
        assert await page.is_visible("#token")
        assert await page.evaluate(CUT_PLACEHOLDERS) == []
        assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.needsToken")
        assert await page.evaluate(CUT_PLACEHOLDERS) == []
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_on_a_phone_wraps_a_word_longer_than_the_screen(start_gateway):
    """A reply with a long URL (and an error naming a long word) made the page 865 px wide
    on a 390 px phone: the header stayed at the screen's width, every panel ran off it, and
    reading a line meant scrolling sideways. The text wraps within the screen."""
    url = "https://example.com/" + "/".join(["a-very-long-path"] * 12) + "/index.html"
    gw = await start_gateway([{"transcript": "Link", "reply": f"See {url} for details."}])
    async with on_a_phone(gw.port, 390) as page:
        await talk_when_ready(page, "Link")
        await page.fill("#voice", "x" * 200)
        await page.click("#apply")
        await page.wait_for_function("window.consoleState.lastTurn?.status")
        await page.wait_for_function(
            "window.consoleState.errors.some(e => e.startsWith('unknown_voice'))")
        assert url in await page.inner_text("#reply")
        assert url in await page.inner_text("#sentences")
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390


IN_VIEW = """(text) => [...document.body.querySelectorAll("*")].some((el) => {
  // an element showing ``text`` as its own, wholly inside the viewport as the page is scrolled
  const own = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent);
  if (!own.join("").includes(text) || !el.checkVisibility()) return false;
  const r = el.getBoundingClientRect();
  return r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth;
})"""


@pytest.mark.slow
@needs_chromium
async def test_console_on_a_phone_shows_an_error_where_the_person_is_looking(start_gateway):
    """On a 360x740 phone the Errors panel starts ~830 px down: a refused voice, a
    transcript refused for the rate, a transcript not sent for want of a socket were never
    seen without scrolling (a screen reader alone announced them). The newest error shows
    by the controls just used; the Errors panel keeps them all."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}],
                             server={"turns_per_minute": 1})
    state = "window.consoleState"
    async with on_a_phone(gw.port, 360, 740) as page:
        await page.wait_for_function(f"{state}.connected")
        assert await page.evaluate("document.querySelector('#errors').getBoundingClientRect()"
                                   ".top") > 740  # (what the test is about)
        await page.fill("#voice", "en-gbb")
        await page.click("#apply")
        await page.wait_for_function(f"{state}.errors.length === 1")
        refused = (await page.evaluate(f"{state}.errors"))[0]
        assert refused.startswith("unknown_voice:")
        assert await page.evaluate(IN_VIEW, refused)

        await talk_when_ready(page, "Hello")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        await talk(page, "Hello")
        await page.wait_for_function(f"{state}.errors.length === 2")
        limited = (await page.evaluate(f"{state}.errors"))[1]
        assert limited.startswith("rate_limited:")
        assert await page.evaluate(IN_VIEW, limited)
        assert not await page.evaluate(IN_VIEW, refused)  # the newest, not a stale one

        await gw.aclose()
        await page.wait_for_function(f"!{state}.connected")
        await talk(page, "Hello")
        await page.wait_for_function(
            f"{state}.errors.at(-1) === 'not connected: the transcript was not sent'")
        assert await page.evaluate(IN_VIEW, "not connected: the transcript was not sent")
        # the Errors panel still lists every one, the newest first
        assert (await page.inner_text("#errors li")).endswith(
            "not connected: the transcript was not sent")
        assert await page.evaluate("document.documentElement.scrollWidth") <= 360


CONTRAST = """() => {
  // WCAG 2 contrast of each text (and each placeholder) with the background behind it
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map((v) => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  }).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const behind = (el) => {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const ratio = (fg, bg) => {
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05);
  };
  const low = [];
  for (const el of document.body.querySelectorAll("*")) {
    if (!el.checkVisibility()) continue;
    const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (text) {
      const r = ratio(rgb(getComputedStyle(el).color), behind(el));
      if (r < 4.5) low.push(`${el.tagName}.${el.className}: ${r.toFixed(2)}`);
    }
    if (el.placeholder) {
      const r = ratio(rgb(getComputedStyle(el, "::placeholder").color), behind(el));
      if (r < 4.5) low.push(`${el.id} placeholder: ${r.toFixed(2)}`);
    }
  }
  return low;
}"""


@pytest.mark.slow
@needs_chromium
async def test_console_text_has_the_contrast_to_be_read(gateway):
    """WCAG AA (4.5:1 for text this size): the engine beside each sentence and the new
    session's mark (#889 on white: 3.5) and a cancelled turn's status (4.2) were below it.
    (Placeholders, which say what an empty field stands for, are checked too.)"""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await talk_when_ready(page, "Tell me everything")
        await page.wait_for_function(f"{state}.samplesPlayed > 2400")
        await page.click("#stop")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        (conn,) = gateway.connections
        await conn.ws.close()  # a session the gateway ended: the page opens a new one
        await page.wait_for_function("document.querySelector('.session-mark')")
        await page.wait_for_function(f"{state}.connected")
        assert await page.locator("#sentences .engine").count() >= 1
        assert await page.evaluate(CONTRAST) == []
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_settings_change_lost_with_its_socket_again_after_the_resume(
        gateway):
    """A session.update sent just before a drop may be lost with the socket (protocol.md,
    Resume: nothing is replayed to the server); session.resumed's settings say whether it
    was applied. The console resumed with the old settings in use and the new ones in its
    fields, as though they were."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        conn = reading_paused(gateway)  # what the page sends now stays unread ...
        await page.fill("#instructions", "Answer in one word.")
        await page.select_option("#frame-ms", "80")
        await page.click("#apply")  # (sent before click() returns)
        conn.ws.transport.abort()  # ... and is lost with the socket
        await page.wait_for_function(f"{state}.resumes === 1")
        (runner,) = gateway.runners.values()
        await page.wait_for_function(
            f"{state}.settings?.instructions === 'Answer in one word.' && "
            f"{state}.settings.frame_ms === 80")
        assert runner.session.settings.instructions == "Answer in one word."
        assert runner.session.settings.frame_ms == 80
        assert await page.input_value("#instructions") == "Answer in one word."
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_keeps_the_settings_being_edited_through_a_resume(gateway):
    """The page showed session.resumed's settings in its fields: what the user was typing
    there (not applied yet) was overwritten by a drop and resume."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        await page.fill("#voice", "a voice being typed")
        await page.fill("#instructions", "Instructions being typed")
        (conn,) = gateway.connections
        conn.ws.transport.abort()
        await page.wait_for_function(f"{state}.resumes === 1")
        assert await page.input_value("#voice") == "a voice being typed"
        assert await page.input_value("#instructions") == "Instructions being typed"
        assert await page.input_value("#frame-ms") == "40"  # (not edited: the session's)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_escape_in_a_settings_field_does_not_stop_the_reply(gateway):
    """Escape stops the reply (the Stop button says so), but it did in every field: a user
    clearing the token or a setting with it cut the reply. In the transcript box, beside
    Stop, it still stops."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await talk_when_ready(page, "Tell me everything")
        await page.wait_for_function(f"{state}.samplesPlayed > 2400")
        await page.evaluate("document.querySelector('#token-row').hidden = false")
        for field in ("#token", "#voice", "#instructions", "#frame-ms"):
            await page.press(field, "Escape")
        played = (await page.evaluate(state))["samplesPlayed"]
        await page.wait_for_function(f"{state}.samplesPlayed > {played} + 4800")  # plays on
        assert gateway.metrics.turns["cancelled"] == 0
        await page.press("#transcript", "Escape")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        assert errors == []


# The test stands between the worklet and the page: the page's player node is kept as
# window.player, and hold() queues what the worklet says until release() hands it on, in
# order, as a page busy for a while (or a status on its way) would get it (window.flushed: the
# last flush whose answer it handed on).
STAND_BETWEEN = """(() => {
  const Native = window.AudioWorkletNode;
  window.AudioWorkletNode = class extends Native {
    constructor(...args) { super(...args); window.player = this; }
  };
  window.held = null;
  window.hold = () => {
    const port = window.player.port, page = port.onmessage;
    window.held = [];
    port.onmessage = (e) => window.held.push(e);
    window.release = () => {
      const pass = (e) => { window.flushed = e.data.flushed ?? window.flushed; page(e); };
      port.onmessage = pass;
      window.held.forEach(pass);
    };
  };
})()"""


@pytest.mark.slow
@needs_chromium
async def test_console_marks_of_a_turn_that_cut_another_count_only_its_own_audio(
        start_gateway):
    """The new turn's count started from the worklet's last report (every ~50 ms), not
    from where the player was when it was flushed: what the cut reply played since that
    report was counted as heard of the new turn. Here the new turn has no audio at all
    (a code block), so whatever the page says was heard of it must be 0."""
    code = "```\n" + "".join(f"x = {i}\n" for i in range(40)) + "```"
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG},
                              {"transcript": "Show me", "reply": code}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", init=STAND_BETWEEN) as (page, errors):
        marks: list[dict[str, Any]] = []
        marked = asyncio.Event()  # a mark of turn 2 went out

        def sent(payload: str | bytes) -> None:
            if isinstance(payload, str) and '"playback"' in payload:
                marks.append(json.loads(payload))
                if marks[-1]["turn_id"] == 2:
                    marked.set()

        page.on("websocket", lambda ws: ws.on("framesent", sent))
        await talk_until_playing(page, "Tell me")
        await page.evaluate("window.hold()")
        # the reply plays on, further than the page knows
        await page.wait_for_function(
            f"window.held.some(e => e.data.played > {state}.samplesPlayed)")
        await talk(page, "Show me")  # barge-in
        await page.wait_for_function(f"{state}.turnId === 2")
        await page.evaluate("window.release()")
        # the answer to the flush of turn 2's start (the third: turn 1's, its cancel's)
        await page.wait_for_function("window.flushed === 3")
        await page.click("#stop")  # its mark goes, whether or not the turn has ended
        await page.wait_for_function(f"{state}.lastTurn?.turnId === 2")
        assert (await page.evaluate(f"{state}.lastTurn.metrics.audio_ms")) == 0
        # the Stop's mark, once sent (the event): the turn's end can come first (its reply,
        # a code block, is short), and reading the marks then found none (a loaded machine)
        await unless_hung(marked.wait())
        mine = [m["played_ms"] for m in marks if m["turn_id"] == 2]
        assert all(ms == 0 for ms in mine), mine
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_counts_the_underruns_of_a_cut_turn_at_the_cut(start_gateway):
    """A turn cut (Stop, here) had its 'heard' count taken from the worklet's last status,
    up to 50 ms old: a gap the player had counted since (audio come after it ran dry) was
    left out. The flush that cuts it answers with the exact count: that is the count now."""
    from engines.synthetic import SyntheticEngine

    slow = SyntheticEngine(rtf=1.6, ttfa_ms=50, step_ms=320, lane="cpu")  # starves the player
    gw = await start_gateway([{"transcript": "Go", "reply": LONG}], engine=slow)
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", init=STAND_BETWEEN) as (page, errors):
        await talk_when_ready(page, "Go")
        await page.wait_for_function(f"{state}.samplesPlayed > 0")
        await page.evaluate("window.hold()")
        # the player counts a gap the page has not been told of
        await page.wait_for_function(
            f"window.held.some(e => e.data.underruns > {state}.underruns)")
        await page.click("#stop")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        await page.wait_for_function("window.held.some(e => e.data.flushed !== undefined)")
        await page.evaluate("window.release()")
        await page.wait_for_function(f"{state}.lastTurn.heardUnderruns !== undefined")
        at_cut = await page.evaluate(
            "window.held.find(e => e.data.flushed !== undefined).data.underruns")
        assert at_cut >= 1
        assert await page.evaluate(f"{state}.lastTurn.heardUnderruns") == at_cut
        assert await page.inner_text("#timeline .heard") == f"· heard {at_cut}"
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_a_cut_turn_whose_player_is_gone_gets_its_count(gateway):
    """A turn cut (Stop on its tail) waits for the flush's answer to count what was heard;
    with the player gone before it answered (its AudioContext closed), the turn stayed in
    the page for good, its row saying 'heard …', and every transcript after failed ("Cannot
    resume a closed AudioContext") and was not sent. The row takes the last counts the
    player gave, and the next reply plays on a new player."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/",
                       init=KEEP_CONTEXT + ";" + STAND_BETWEEN) as (page, errors):
        await talk_when_ready(page, "Hello")
        # its tail playing: the page stops hearing the player, and Stop cuts the turn
        await page.wait_for_function(f"""(() => {{
            if ({state}.lastTurn?.status !== 'completed' || {state}.bufferedSamples <= 2400)
              return false;
            window.hold();
            document.getElementById('stop').click();
            return true;
          }})()""")
        assert await page.inner_text("#timeline .heard") == "· heard …"
        await page.evaluate("audioCtx.close()")  # the flush's answer will never come
        await page.wait_for_function(f"{state}.turns[0].heardUnderruns !== undefined")
        assert await page.inner_text("#timeline .heard") == "· heard 0"
        await talk(page, "Hello")
        # played out on a new player (its count of gaps heard: once its last sample played)
        await page.wait_for_function(f"{state}.turns[1]?.heardUnderruns !== undefined")
        assert await page.evaluate(f"{state}.turns[1].status") == "completed"
        assert await page.evaluate(f"{state}.samplesPlayed") > 24_000 // 2
        assert await page.evaluate(f"{state}.errors") == [] and errors == []


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("texts", [["Tell me everything"], ["Hello", "Tell me everything"]],
                         ids=["one", "two"])
async def test_console_stop_right_after_transcripts_stops_their_replies(gateway, texts):
    """Stop pressed after a transcript went and before its turn.started came (a slow
    network's round trip) did nothing to the reply asked for: it played in full. Stop now
    cancels it too, and none of it is played. With two on their way, Stop cancelled only
    the first's turn (which the second cut anyway) and the second's reply then played
    although the user pressed Stop after sending it: every one is cancelled."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        conn = reading_paused(gateway)  # the transcripts are on their way ...
        for text in texts:
            await talk_sent(page, text)
        await page.click("#stop")  # ... when Stop is pressed
        conn.ws.transport.resume_reading()
        await page.wait_for_function(  # (played: it goes on for a minute)
            f"{state}.turns.some((t) => t.turnId === {len(texts)}) || "
            f"{state}.samplesReceived > 0")
        st = await page.evaluate(state)
        assert [t["status"] for t in st["turns"]] == ["cancelled"] * len(texts)
        assert st["samplesReceived"] == 0 and st["samplesPlayed"] == 0
        assert gateway.metrics.turns["cancelled"] == len(texts)
        assert st["errors"] == [] and errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_does_not_send_again_a_transcript_stopped_before_it_was_lost(gateway):
    """A transcript lost with its socket is sent again after the resume, unless Stop was
    pressed since: the reply nobody wants any more is not asked for again."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        conn = reading_paused(gateway)  # what the page sends now stays unread ...
        await talk_sent(page, "Tell me everything")
        await page.click("#stop")
        conn.ws.transport.abort()  # ... and is lost with the socket
        await page.wait_for_function(f"{state}.resumes === 1")
        await talk(page, "Hello")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        assert [t["turnId"] for t in await page.evaluate(f"{state}.turns")] == [1]
        assert await page.inner_text("#reply") == "Hi. Nice to hear you."
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_sends_a_barge_in_lost_with_its_socket_again_with_its_mark(gateway):
    """protocol.md: a barge-in's transcript goes after a playback mark of what was heard.
    A barge-in lost with its socket was sent again after the resume without one, so the
    history of the cut reply was the last mark before the drop (the reply played on,
    offline, for up to a second and more)."""
    state = "window.consoleState"
    sockets: list[list[dict[str, Any]]] = []

    def opened(ws: Any) -> None:
        sent: list[dict[str, Any]] = []
        sockets.append(sent)
        ws.on("framesent", lambda m: sent.append(json.loads(m)) if isinstance(m, str) else None)

    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        page.on("websocket", opened)
        await page.reload()  # (the first socket opened before the listener)
        await talk_until_playing(page, "Tell me everything")
        conn = reading_paused(gateway)  # what the page sends now stays unread ...
        await talk_sent(page, "Hello")
        conn.ws.transport.abort()  # ... and is lost with the socket
        await page.wait_for_function(f"{state}.lastTurn?.turnId === 2")
        first, again = sockets[-2], sockets[-1]

        def mark_before_the_transcript(sent: list[dict[str, Any]]) -> dict[str, Any]:
            sent = [m for m in sent if m["type"] in ("playback", "transcript")]
            at = [m.get("text") for m in sent].index("Hello")
            assert at > 0 and sent[at - 1]["type"] == "playback", sent
            return sent[at - 1]

        lost = mark_before_the_transcript(first)  # (marks of turn 1 may follow it)
        mark = mark_before_the_transcript(again)
        assert lost["turn_id"] == mark["turn_id"] == 1
        assert mark["played_ms"] >= lost["played_ms"]
        assert errors == []


def sessions_after_the_end_of(gateway: Any, session_id: str, monkeypatch: Any) -> None:
    """From now on the gateway serves a new socket (``session.created``, then the page's
    ``session.resume``) only once the session ``session_id`` has ended: a test whose
    gateway keeps no session for a resume (``resume_window_s`` 0) then sees the resume
    fail by this event, not because the page's reconnect (its 500 ms backoff) came after
    the gateway's end of the session in practice (a gateway stalled that long resumed it)."""
    from gateway.io.connection import VoiceConnection

    gone, forget, run = asyncio.Event(), gateway.forget, VoiceConnection.run

    def forgetting(runner: Any) -> None:
        forget(runner)
        if runner.session.id == session_id:
            gone.set()

    async def running(self: Any) -> None:
        await gone.wait()
        await run(self)

    gateway.forget = forgetting
    monkeypatch.setattr(VoiceConnection, "run", running)


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("texts", [["Hello"], ["Hello", "Thanks"]], ids=["one", "two"])
async def test_console_gives_back_every_transcript_its_lost_session_never_answered(
        start_gateway, texts, monkeypatch):
    """A transcript sent as the socket dropped, its session then gone (not resumable: here
    the gateway keeps none): the page opened a new session, and the transcript, cleared
    from its box when it went, was never answered nor shown again. It is back in the box,
    and the page says why. Of two, only the last one came back: both do, in their order."""
    gw = await start_gateway([{"transcript": " ".join(texts), "reply": "Hi."}],
                             server={"resume_window_s": 0})
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        first = await page.evaluate(f"{state}.sessionId")
        sessions_after_the_end_of(gw, first, monkeypatch)
        conn = reading_paused(gw)  # what the page sends now stays unread ...
        for text in texts:
            await talk_sent(page, text)
        conn.ws.transport.abort()  # ... and is lost with the socket and its session
        await page.wait_for_function(
            f"{state}.connected && {state}.sessionId !== {first!r}")
        assert await page.input_value("#transcript") == " ".join(texts)
        assert any("not answered" in e for e in await page.evaluate(f"{state}.errors"))
        await page.click("#send")  # and it goes in the new session
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_shows_a_turn_lost_with_its_session(start_gateway, monkeypatch):
    """A turn in progress when its session is gone for good (here: dropped, and the gateway
    keeps no session for a resume) never gets its turn.done: its audio stopped, but the
    timeline had no row for it at all (a failed resume did show one, "lost")."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG}],
                             server={"resume_window_s": 0})
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me")
        first = await page.evaluate(f"{state}.sessionId")
        sessions_after_the_end_of(gw, first, monkeypatch)
        for conn in list(gw.connections):
            conn.ws.transport.abort()
        await page.wait_for_function(
            f"{state}.connected && {state}.sessionId !== {first!r}")
        assert await page.locator("#timeline [data-status=lost]").count() == 1
        assert re.fullmatch(r"· heard \d+", await page.inner_text("#timeline .heard"))
        # no turn.done, no metrics: what the server counted is unknown, not 0 (the row said
        # "0 sentences · underruns: server 0" for a turn that had spoken sentences)
        row = await page.inner_text("#timeline [data-status=lost] >> xpath=..")
        assert "– sentences" in row and "underruns: server – " in row, row
        assert errors == []


def messages_received(gateway: Any) -> list[Any]:
    """What the gateway's only session receives from here on, as decoded messages."""
    (runner,) = gateway.runners.values()
    received: list[Any] = []
    receive = runner.receive

    def receiving(message, now):
        received.append(message)
        return receive(message, now)

    runner.receive = receiving
    return received


@pytest.mark.slow
@needs_chromium
async def test_console_stop_marks_what_was_heard_to_the_sample(gateway):
    """Stop tells the gateway what was heard (the history keeps only that): the mark was the
    worklet's last periodic count, up to 53 ms (10 render quanta) old, so it said less than
    was heard. The flush that silences the turn answers with the exact count: that is the
    mark now."""
    from gateway.core.codec import ClientCancel, ClientPlayback

    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me everything")
        received = messages_received(gateway)
        # Stop 25 ms after a periodic count came (half the time to the next one)
        await page.evaluate("""async () => {
            const s = window.consoleState, n = s.workletReports;
            while (s.workletReports === n) await new Promise((r) => setTimeout(r, 1));
            await new Promise((r) => setTimeout(r, 25));
            document.querySelector("#stop").click();
        }""")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'cancelled'")
        await page.wait_for_function(f"!{state}.playing && {state}.bufferedSamples === 0")
        heard = await page.evaluate(f"{state}.samplesPlayed")  # (the first turn's, all)
        marks = [m for m in received if isinstance(m, ClientPlayback)]
        cancel = next(i for i, m in enumerate(received) if isinstance(m, ClientCancel))
        assert marks and received.index(marks[-1]) < cancel
        assert marks[-1].played_ms == pytest.approx(heard / 24, abs=0.5)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_stop_then_send_at_once_marks_the_stopped_reply_before_the_transcript(
        start_gateway):
    """Stop's exact mark goes once the flush answers, a few ms on; a transcript sent in the
    same tick went before it, and its turn cut the stopped reply's history at the last
    periodic mark (up to 250 ms old): the Stop's mark and cancel came after, too late. The
    transcript now waits for them. (The new reply has no audio: what the page played in
    the end is what was heard of the stopped one.)"""
    from gateway.core.codec import ClientCancel, ClientPlayback, ClientTranscript

    code = "```\n" + "".join(f"x = {i}\n" for i in range(40)) + "```"
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG},
                              {"transcript": "Show me", "reply": code}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_until_playing(page, "Tell me")
        received = messages_received(gw)
        await page.evaluate("""() => {
            document.querySelector("#stop").click();
            document.querySelector("#transcript").value = "Show me";
            document.querySelector("#send").click();
        }""")
        await page.wait_for_function(f"{state}.lastTurn?.turnId === 2")
        await page.wait_for_function(f"!{state}.playing && {state}.bufferedSamples === 0")
        heard = await page.evaluate(f"{state}.samplesPlayed")
        said = next(i for i, m in enumerate(received) if isinstance(m, ClientTranscript))
        before = [m for m in received[:said] if getattr(m, "turn_id", None) == 1]
        assert [type(m) for m in before[-2:]] == [ClientPlayback, ClientCancel], received
        assert before[-2].played_ms == pytest.approx(heard / 24, abs=0.5)
        assert errors == []


# Test instrument in the page: each playback mark as it is sent, with the worklet's count
# and the latency the browser reports at that moment (the context it plays through).
RECORD_MARKS = """(() => {
  const Context = window.AudioContext;
  window.AudioContext = class extends Context {
    constructor(options) { super(options); window.playing = this; }
  };
  window.marks = [];
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (typeof data === "string" && data.includes('"playback"')) {
      const s = window.consoleState, ctx = window.playing;
      window.marks.push({mark: JSON.parse(data), played: s.samplesPlayed,
                         running: s.playing || s.bufferedSamples > 0,
                         latencyMs: (ctx.baseLatency + (ctx.outputLatency || 0)) * 1000});
    }
    return send.call(this, data);
  };
})()"""
# With RECORD_MARKS, ``page.evaluate(MARKS_OF, n)``: the played_ms of turn n's marks sent.
MARKS_OF = "n => window.marks.filter(m => m.mark.turn_id === n).map(m => m.mark.played_ms)"


@pytest.mark.slow
@needs_chromium
async def test_console_marks_what_left_the_speaker_not_what_the_player_rendered(gateway):
    """Playback marks said what the worklet had rendered, but the browser hands it on to
    the system and the speaker (baseLatency + outputLatency: 100-200 ms on Bluetooth), so
    after a barge-in the history kept words not yet heard. A mark now counts rendered less
    what the browser reports as still on its way, never below the turn's previous mark, and
    all of it once the player has run out (its tail has played)."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", init=RECORD_MARKS) as (page, errors):
        await talk_when_ready(page, "Hello")  # the first turn: the player's count starts at 0
        await first_turn_heard(page)
        await heard_out(page)
        await talk(page, "Tell me everything")  # its barge-in mark: all of the turn, heard
        await page.wait_for_function(f"{state}.turnId === 2")
        marks = await page.evaluate("window.marks.filter(m => m.mark.turn_id === 1)")
        playing = [m for m in marks if m["running"]]
        assert playing and min(m["latencyMs"] for m in playing) > 0  # Chromium reports some
        last = 0.0
        for m in marks:
            rendered = m["played"] / 24
            expected = max(last, rendered - m["latencyMs"]) if m["running"] else rendered
            assert m["mark"]["played_ms"] == round(expected), (m, last)
            last = m["mark"]["played_ms"]
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_keeps_marking_a_reply_its_paused_player_still_holds(gateway):
    """protocol.md asks a paused player to keep sending marks with the same ``played_ms``
    (between marks the server takes playback to go on), but the console sent none equal to
    the turn's last, so with its AudioContext suspended (Safari when the page is left) the
    server sent on as though the reply was heard. The same mark goes every 250 ms while the
    context is not running and the turn has audio left to play; none once it played out.
    The page's time moves only when the test moves it (``paused``); the test suspends the
    context itself. (On the page's running clock, a test held up 0.4 s between its moves
    counted 10 marks where it moved the clock for 4.)"""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", paused=True,
                       init=RECORD_MARKS) as (page, errors):
        await talk_when_ready(page, "Hello")
        await first_turn_heard(page)
        await heard_out(page)
        await page.clock.fast_forward(250)  # its last mark: all of it heard
        played_out = await page.evaluate(MARKS_OF, 1)
        await page.evaluate("window.playing.suspend()")
        for _ in range(4):
            await page.clock.fast_forward(250)
        assert await page.evaluate(MARKS_OF, 1) == played_out  # nothing left to play
        before = await page.evaluate(f"{state}.samplesPlayed")
        await talk(page, "Tell me everything")  # (resumes the context)
        await page.wait_for_function(f"{state}.turnId === 2 && {state}.samplesPlayed > "
                                     f"{before} + 4800")
        await page.clock.fast_forward(250)
        playing = await page.evaluate(MARKS_OF, 2)
        assert playing
        await page.evaluate("window.playing.suspend()")
        for _ in range(4):
            await page.clock.fast_forward(250)
        paused = (await page.evaluate(MARKS_OF, 2))[len(playing):]
        assert len(paused) == 4 and len(set(paused[1:])) == 1, (playing, paused)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_marks_a_reply_that_comes_while_its_player_is_suspended(gateway):
    """A turn whose audio came while the AudioContext was suspended (Safari when the page
    is left, here the test) got no mark at all: the worklet reports nothing while
    suspended, its last word (the answer to the flush at the turn's start: empty, not
    playing) read as a player run dry, so the gateway took the reply as heard and sent on.
    The flush itself is answered while suspended (Chromium). Marks now say nothing of it
    was heard, every 250 ms, as for a player paused mid-turn."""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", clock=True,
                       init=RECORD_MARKS) as (page, errors):
        await talk_when_ready(page, "Hello")
        await first_turn_heard(page)
        await heard_out(page)
        received = await page.evaluate(f"{state}.samplesReceived")
        conn = reading_paused(gateway)  # the transcript goes, its turn waits ...
        await talk_sent(page, "Tell me everything")
        await page.evaluate("window.playing.suspend()")  # ... and the page is left
        await page.wait_for_function("window.playing.state === 'suspended'")
        conn.ws.transport.resume_reading()
        await page.wait_for_function(f"{state}.turnId === 2 && "
                                     f"{state}.samplesReceived > {received} + 4800")
        for _ in range(4):
            await page.clock.fast_forward(250)
        marks = await page.evaluate(MARKS_OF, 2)
        assert len(marks) >= 4 and set(marks) == {0}, marks  # (the clock also runs on)
        assert errors == []


async def types_a_transcript_where_the_focus_is(page: Any) -> None:
    """The transcript box has the focus: typed into with the keyboard alone, it is sent and
    answered."""
    assert await page.evaluate("document.activeElement.id") == "transcript"
    await page.keyboard.type("Hello")
    await page.keyboard.press("Enter")
    await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")


@pytest.mark.slow
@needs_chromium
async def test_console_a_keyboard_user_types_the_transcript_at_once(start_gateway):
    """Nothing had the focus on load: a keyboard user pressed Tab five times to reach the
    transcript box. It has the focus on load; when the gateway asks for a token, the token
    field has it, and once the token lets the page in, the transcript box again."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}])
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.connected")
        await types_a_transcript_where_the_focus_is(page)
        assert errors == []
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi there."}],
                             server={"tokens": ["s3cret"]})
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function("window.consoleState.needsToken")
        assert await page.evaluate("document.activeElement.id") == "token"
        await page.keyboard.type("s3cret")
        await page.keyboard.press("Enter")
        await page.wait_for_function("window.consoleState.connected")
        await types_a_transcript_where_the_focus_is(page)
        assert errors == []


# Test instrument in the page: how many times the browser said it was online again, and
# the pongs the page had then (its own listener runs after this one, in the same dispatch).
ONLINE_SEEN = """window.online = 0;
addEventListener("online", () => {
  window.online += 1;
  window.pongs = window.consoleState.pongs;
});"""


# Test instrument in the page: the tab hidden and shown again (``setVisibility``), with the
# browser's own event; headless Chromium keeps every tab visible, whichever is in front. And
# how many times it was shown, with the pongs the page had then (as ONLINE_SEEN).
VISIBILITY = """window.shown = 0;
let visibility = "visible";
Object.defineProperty(document, "visibilityState", {get: () => visibility});
Object.defineProperty(document, "hidden", {get: () => visibility === "hidden"});
window.setVisibility = (value) => {
  visibility = value;
  document.dispatchEvent(new Event("visibilitychange"));
};
document.addEventListener("visibilitychange", () => {
  if (visibility !== "visible") return;
  window.shown += 1;
  window.pongs = window.consoleState.pongs;
});"""


async def network_back(page: Any, n: int) -> None:
    """The browser's network gone and back, the ``n``-th time (ONLINE_SEEN)."""
    await page.context.set_offline(True)
    await page.context.set_offline(False)
    await page.wait_for_function(f"window.online === {n}")  # (the page's listener ran after)


async def tab_shown(page: Any, n: int) -> None:
    """The page's tab hidden and shown again, the ``n``-th time (VISIBILITY)."""
    await page.evaluate("setVisibility('hidden')")
    await page.evaluate("setVisibility('visible')")  # (every listener has run)
    assert await page.evaluate("window.shown") == n


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("instrument, back", [(ONLINE_SEEN, network_back),
                                              (VISIBILITY, tab_shown)],
                         ids=["network-back", "tab-shown"])
async def test_console_probes_its_socket_as_soon_as_the_network_or_its_tab_is_back(
        start_gateway, instrument, back):
    """The network came back after a drop the socket never heard of (the path it used is
    dead): the page went on waiting for its pings' silence, 12-17 s, before it resumed on a
    new socket. The browser's ``online`` event makes it ping at once, and without an answer
    within PROBE_MS it gives the socket up and resumes; a socket that answers is kept.
    Likewise when its tab is shown again: a phone's browser tab left in the background for
    minutes came back with a socket that had died meanwhile (its timers throttled, nothing
    noticed), and the page found out only when the user next sent something."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    state = "window.consoleState"
    given_up = f"{state}.errors.some(e => e.startsWith('no answer'))"
    async with console(f"http://127.0.0.1:{gw.port}/", clock=True,
                       init=instrument) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        session_id = await page.evaluate(f"{state}.sessionId")
        # back, its socket still good (Chromium's offline spares it): it answers
        await back(page, 1)
        await page.wait_for_function(f"{state}.pongs > window.pongs")
        await page.clock.fast_forward(PROBE_MS)
        assert not await page.evaluate(given_up)
        (runner,) = gw.runners.values()
        # the socket's path is dead: the gateway reads nothing more from it (its pings
        # included), while the socket stays open, as across a network that changed
        runner.connection.ws.transport.pause_reading()
        await back(page, 2)
        await page.clock.fast_forward(PROBE_MS)
        assert await page.evaluate(given_up)
        await resumed_and_answering(page, session_id)
        assert errors == []


# Test instrument in the page: ONLINE_SEEN, and how many sockets the page has made.
SOCKETS_MADE = ONLINE_SEEN + """
window.socketsMade = 0;
window.WebSocket = class extends WebSocket {
  constructor(...args) { super(...args); window.socketsMade += 1; }
};"""


# Test instrument in the page: the wait of each reconnect the page has set (its
# ``setTimeout(connect, ms)``), in order. A failed socket is counted (``reconnects``) when
# it closes, its retry set only once /health has answered: a test moving the page's clock
# for the retry moves it after the retry is set, or the retry waits for a move to come.
RETRIES_SET = """window.retriesSet = [];
(() => {
  const setTimeoutOfThePage = window.setTimeout;  // (Playwright's clock, installed first)
  window.setTimeout = (fn, ms, ...args) => {
    if (fn.name === "connect") window.retriesSet.push(ms);
    return setTimeoutOfThePage(fn, ms, ...args);
  };
})();"""


async def retries(page: Any, n: int) -> None:
    """Wait until the page has counted ``n`` reconnects and set the ``n``-th's retry
    (RETRIES_SET; on a paused clock both stay so until the test moves it)."""
    await page.wait_for_function(
        f"window.consoleState.reconnects === {n} && window.retriesSet.length === {n}")


@pytest.mark.slow
@needs_chromium
async def test_console_reconnects_at_once_when_the_network_is_back(start_gateway):
    """A socket dropped while the network was gone: each reconnect failed and the next
    waited twice as long (up to 8 s). When the browser said the network was back, the
    page went on waiting the backoff. It reconnects at once now, and resumes. The page's
    time moves only when the test moves it (``paused``), for the failed reconnects: on its
    own clock, a test slower than the first backoff (500 ms) under load found the page
    reconnected and resumed before the network went, and waited for a failure for good."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", paused=True,
                       init=SOCKETS_MADE + RETRIES_SET) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        session_id = await page.evaluate(f"{state}.sessionId")
        (runner,) = gw.runners.values()
        runner.connection.ws.transport.abort()  # dropped: no close frame
        await retries(page, 1)
        await page.context.set_offline(True)
        for n, wait_ms in ((2, 500), (3, 1000), (4, 2000)):  # each failed: the next waits longer
            await page.clock.fast_forward(wait_ms)
            await retries(page, n)
        assert await page.evaluate("window.retriesSet") == [500, 1000, 2000, 4000]
        made = await page.evaluate("window.socketsMade")  # the next waits 4 s
        await page.context.set_offline(False)
        await page.wait_for_function("window.online === 1")  # (the page's listener ran after)
        assert await page.evaluate("window.socketsMade") == made + 1
        await resumed_and_answering(page, session_id)
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_says_each_status_and_error_once_while_it_retries(start_gateway):
    """The gateway gone, the page retries for as long as it stays open (up to every 8 s):
    each failed try wrote its status again, unchanged, into the status live region, and a
    screen reader read "disconnected (1006)" out at every one; on a full gateway, that and
    "the gateway is full" in turn. Each status is announced once, as is the error. The
    page's time moves only when the test moves it (``paused``): on its own clock, a test
    slower than a backoff (500 ms) under load waited for a count the page had passed."""
    gw = await start_gateway()
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/", paused=True,
                       init=LISTEN_TO_LIVE_REGIONS + RETRIES_SET) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        await gw.aclose()
        await retries(page, 1)
        for n, wait_ms in ((2, 500), (3, 1000), (4, 2000), (5, 4000), (6, 8000)):
            await page.clock.fast_forward(wait_ms)
            await retries(page, n)
        assert await page.evaluate("window.retriesSet") == [500, 1000, 2000, 4000, 8000, 8000]
        said = await page.evaluate("window.announced")
        assert [text for region, text in said if region == "status"] == [
            f"connected · {await page.evaluate(f'{state}.sessionId')}",
            "disconnected (1001)", "disconnected (1006)"]
        (error,) = [text for region, text in said if region == "errors"]
        assert "the gateway stopped; reconnecting" in error
        assert errors == []
    # a full gateway: the status said "disconnected (1006)", then that it was full, at
    # every retry
    from websockets.asyncio.client import connect

    gw = await start_gateway(server={"max_sessions": 1})
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as other:
        await other.recv()  # session.created: the gateway is full
        async with console(f"http://127.0.0.1:{gw.port}/", paused=True,
                           init=LISTEN_TO_LIVE_REGIONS + RETRIES_SET) as (page, errors):
            full = "the gateway is full (1 sessions); retrying"
            for n, wait_ms in ((1, 0), (2, 500), (3, 1000), (4, 2000)):
                await page.clock.fast_forward(wait_ms)
                await retries(page, n)
                assert await page.text_content("#status") == full
            said = await page.evaluate("window.announced")
            assert [text for region, text in said if region == "status"] == [full]
            assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_gives_up_a_socket_still_connecting_when_the_network_is_back(
        start_gateway):
    """A socket made while the network was dying hangs in CONNECTING (its SYN or handshake
    lost): when the browser said the network was back, the page went on waiting for it,
    up to OPEN_WITHIN_MS (10 s), before it made another. It gives it up at once now and
    resumes on a new socket. The page's time moves only when the test moves it
    (``paused``), for the first reconnect's backoff: on its own clock, a test slower than
    OPEN_WITHIN_MS under load saw the page give the held socket up by itself first."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}])
    state = "window.consoleState"
    async with holding_relay(gw.port) as (port, holds), \
            console(f"http://127.0.0.1:{port}/", paused=True, init=SOCKETS_MADE) as (page, errors):
        await page.wait_for_function(f"{state}.connected")
        session_id = await page.evaluate(f"{state}.sessionId")
        holds.put_nowait(None)  # the next connection made is held
        (runner,) = gw.runners.values()
        runner.connection.ws.transport.abort()  # dropped: no close frame
        await page.wait_for_function(f"{state}.reconnects === 1")
        await page.clock.fast_forward(500)  # the reconnect's backoff
        async with hang_guard("the held socket's being made"):
            await holds.join()  # its socket is made, and held: CONNECTING
        made = await page.evaluate("window.socketsMade")
        await page.context.set_offline(True)
        await page.context.set_offline(False)
        await page.wait_for_function("window.online === 1")  # (the page's listener ran after)
        assert await page.evaluate("window.socketsMade") == made + 1
        assert await page.evaluate(f"{state}.reconnects") == 2  # (given up: one more)
        await resumed_and_answering(page, session_id)
        assert errors == []


@asynccontextmanager
async def holding_relay(upstream: int) -> AsyncIterator[tuple[int, asyncio.Queue[None]]]:
    """Test infrastructure: a TCP relay on 127.0.0.1:0 to the gateway's port ``upstream``,
    byte for byte, but while its queue is not empty each connection it accepts takes one
    of its items and is held: nothing it sends is forwarded and nothing comes back, as a
    connection made across a network that died (a socket stays CONNECTING). Yields its port
    and that queue (``join()``: every hold has taken a connection)."""
    holds: asyncio.Queue[None] = asyncio.Queue()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not holds.empty():
            holds.get_nowait()
            holds.task_done()
            await reader.read()  # until the browser gives the connection up
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], holds


@asynccontextmanager
async def sub_path_proxy(upstream: int, prefix: str, *, origin: bool = False
                         ) -> AsyncIterator[tuple[int, list[str]]]:
    """Test infrastructure: a reverse proxy on 127.0.0.1:0 that serves the gateway on port
    ``upstream`` under ``prefix`` (as nginx's ``location /voice/ { proxy_pass
    http://gateway/; }`` or Home Assistant's ingress), built from websockets (its server,
    and its client for the socket it relays) and httpx (the GETs it forwards). Yields its
    port and every path asked of it; a path outside ``prefix`` is its 404. It sends no
    Origin on (the gateway then takes the socket for a non-browser client's) unless
    ``origin``: then the browser's goes on, and the gateway's refusal of the upgrade comes
    back as it was."""
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidStatus
    from websockets.http11 import Response
    from websockets.typing import Origin

    asked: list[str] = []
    upstreams: dict[Any, Any] = {}  # the browser's socket: the gateway's socket it relays
    async with httpx.AsyncClient(timeout=HANG_S, base_url=f"http://127.0.0.1:{upstream}") as client:

        async def forward(connection: Any, request: Any) -> Any:
            asked.append(request.path)
            if not request.path.startswith(prefix):
                return connection.respond(404, "not under the proxy's path\n")
            path = request.path.removeprefix(prefix.rstrip("/"))
            if request.headers.get("Upgrade", "").lower() == "websocket":
                offered = [p.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol")
                           for p in value.split(",")]
                try:
                    upstreams[connection] = await connect(
                        f"ws://127.0.0.1:{upstream}{path}", subprotocols=offered or None,
                        origin=Origin(request.headers["Origin"]) if origin else None)
                except InvalidStatus as refused:
                    return refused.response
                return None  # the browser's handshake goes on: relay()
            answer = await client.get(path, headers={
                k: v for k, v in request.headers.raw_items() if k.lower() == "authorization"})
            return Response(answer.status_code, answer.reason_phrase, Headers(
                (k, v) for k, v in answer.headers.items()
                if k.lower() in ("content-type", "content-length", "cache-control")),
                answer.content)

        async def relay(downstream: Any) -> None:
            async with upstreams.pop(downstream) as up:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(pipe(downstream, up))
                    tasks.create_task(pipe(up, downstream))

        async def pipe(source: Any, sink: Any) -> None:
            async for message in source:
                await sink.send(message)
            await sink.close()

        async with serve(relay, "127.0.0.1", 0, process_request=forward,
                         select_subprotocol=lambda c, offered: upstreams[c].subprotocol) as server:
            yield server.sockets[0].getsockname()[1], asked


@pytest.mark.slow
@needs_chromium
async def test_console_works_behind_a_reverse_proxy_under_a_sub_path(gateway):
    """Behind a proxy at /voice/ the page asked for /static/console.js and the socket at
    /v1/voice, outside the proxy's path: nothing loaded. Every URL it asks is relative to
    the page now: its assets, the worklet, /health and the socket."""
    async with sub_path_proxy(gateway.port, "/voice/") as (port, asked):
        async with console(f"http://127.0.0.1:{port}/voice/") as (page, errors):
            assert all(path.startswith("/voice/") for path in asked), asked
            await talk_when_ready(page, "Hello")
            await page.wait_for_function(
                "window.consoleState.lastTurn?.status === 'completed'")
            await heard_out(page)
            assert await page.evaluate("window.consoleState.samplesPlayed") > 0
            assert errors == []
        assert {"/voice/", "/voice/static/console.js", "/voice/static/console.css",
                "/voice/static/worklet.js", "/voice/v1/voice"} <= set(asked), asked
        assert all(path.startswith("/voice/") for path in asked), asked


@pytest.mark.slow
@needs_chromium
async def test_console_opened_without_the_sub_paths_slash_reloads_with_it(gateway):
    """A proxy that strips "/voice" (Traefik's StripPrefix, Caddy's handle_path) answers
    "/voice" with the page too; the browser then resolved the page's relative URLs against
    "/": its script, style and socket were asked outside the proxy's path, and nothing
    but the bare page loaded. The page now reloads itself at "/voice/"."""
    async with sub_path_proxy(gateway.port, "/voice") as (port, asked):
        async with console(f"http://127.0.0.1:{port}/voice") as (page, errors):
            await talk_when_ready(page, "Hello")
            await page.wait_for_function(
                "window.consoleState.lastTurn?.status === 'completed'")
            assert page.url == f"http://127.0.0.1:{port}/voice/"
            assert errors == []
        assert {"/voice", "/voice/", "/voice/static/console.js", "/voice/static/console.css",
                "/voice/static/worklet.js", "/voice/v1/voice"} <= set(asked), asked
        # outside the path only the page before its reload, and what the browser's preload
        # scanner fetched ahead from it (the proxy's 404s, not used)
        outside = {path for path in asked if not path.startswith("/voice/")}
        assert outside <= {"/voice", "/static/console.css", "/static/console.js"}, asked


@pytest.mark.slow
@needs_chromium
async def test_console_says_its_origin_is_refused_on_a_gateway_with_tokens(start_gateway):
    """A gateway with tokens and an --origin list that leaves the page out (here: served by
    a proxy that passes the browser's Origin on) refuses the socket with 403
    forbidden_origin: the page, its token good and the gateway not full, retried for ever
    saying only "disconnected (1006)". It now says what most likely refuses it, once."""
    gw = await start_gateway([], server={"tokens": ["s3cret"],
                                         "origins": ["http://elsewhere.test"]})
    state = "window.consoleState"
    async with sub_path_proxy(gw.port, "/voice/", origin=True) as (port, _):
        async with console(f"http://127.0.0.1:{port}/voice/?token=s3cret") as (page, errors):
            await page.wait_for_function(f"{state}.originRefused")
            await page.wait_for_function(f"{state}.reconnects >= 3")
            st = await page.evaluate(state)
            assert not st["connected"] and not st["needsToken"]
            (why,) = [e for e in st["errors"] if "origin" in e]  # said once
            assert f"--origin http://127.0.0.1:{port}" in why
            assert errors == []
    assert gw.metrics.errors["forbidden_origin"] >= 3


@pytest.mark.slow
@needs_chromium
async def test_console_sends_every_transcript_lost_with_its_socket_again(start_gateway):
    """Two transcripts sent and lost with the socket before either turn started: the page
    kept only the last one sent, and sent only it again after the resume. Both go again,
    in their order."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."},
                              {"transcript": "Thanks", "reply": "You are welcome."}])
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        conn = reading_paused(gw)  # what the page sends now stays unread ...
        for text in ("Hello", "Thanks"):
            await talk_sent(page, text)
        conn.ws.transport.abort()  # ... and is lost with the socket
        await page.wait_for_function(f"{state}.resumes === 1")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        assert [t["turnId"] for t in await page.evaluate(f"{state}.turns")] == [1, 2]
        assert await page.inner_text("#reply") == "You are welcome."
        assert errors == []


class HoldingProxy:
    """Test infrastructure: a TCP proxy on 127.0.0.1:0 in front of the gateway. ``hold()``:
    what the gateway sends no longer reaches the browser (the downlink stalls; what the
    browser sends still goes up); ``cut()`` then aborts every connection open (both sides,
    no close handshake). Connections made after that pass through untouched."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.holding = False
        self.open: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def hold(self) -> None:
        self.holding = True

    def cut(self) -> None:
        for down, up in self.open:
            down.transport.abort()
            up.transport.abort()
        self.open.clear()
        self.holding = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        pair = (writer, up_writer)
        self.open.append(pair)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                       held: bool) -> None:
            while data := await source.read(65536):
                if not (held and self.holding and pair in self.open):
                    sink.write(data)
            sink.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True),
                             return_exceptions=True)

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


@pytest.mark.slow
@needs_chromium
async def test_console_a_refusal_in_the_replay_does_not_shift_its_turns(start_gateway):
    """Two transcripts on their way, the first answered by a turn and the second refused
    (rate_limited), Stop pressed, then a third sent: the socket drops before any answer
    came. The page counted the turns session.resumed said had started against its
    transcripts in order, the refused one included: it sent Stop's cancels again for the
    turn ids it expected, and the one it took for the refused transcript's was the third
    transcript's, typed after Stop, whose reply was cut; and it sent that transcript again,
    taking it for lost. Each transcript is matched to its own turn or refusal now."""
    gw = await start_gateway([{"transcript": "Tell me", "reply": LONG},
                              {"transcript": "Hello", "reply": "Hi. Nice to hear you."}],
                             server={"turns_per_minute": 2})
    proxy = HoldingProxy(gw.port)
    port = await proxy.start()
    state = "window.consoleState"
    try:
        async with console(f"http://127.0.0.1:{port}/") as (page, errors):
            await talk_until_playing(page, "Tell me")
            (runner,) = gw.runners.values()
            receive, hellos = runner.receive, asyncio.Queue[None]()

            def receiving(message, now):
                if getattr(message, "text", None) == "Hello":
                    runner._turn_times.clear()  # a minute has passed since the refusal
                    hellos.put_nowait(None)
                return receive(message, now)

            runner.receive = receiving
            proxy.hold()  # nothing more reaches the page
            for text in ("Tell me more", "And more"):  # a turn, then refused (2 a minute)
                await talk_sent(page, text)
            await page.click("#stop")
            await talk(page, "Hello")  # after Stop: its reply is wanted
            await unless_hung(hellos.get())  # (and started a turn)
            proxy.cut()
            await page.wait_for_function(f"{state}.resumes === 1")
            await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
            st = await page.evaluate(state)
            assert [(t["turnId"], t["status"]) for t in st["turns"]] == [
                (1, "cancelled"), (2, "cancelled"), (3, "completed")]
            assert hellos.empty()  # sent once
            assert gw.metrics.turns["completed"] == 1 and gw.metrics.turns["cancelled"] == 2
            assert await page.inner_text("#reply") == "Hi. Nice to hear you."
            assert errors == []
    finally:
        await proxy.aclose()


@pytest.mark.slow
@needs_chromium
async def test_console_keeps_a_bounded_timeline_through_a_long_session(start_gateway):
    """A voice tried for an hour is hundreds of turns: every one added a timeline row and an
    entry in the page's state, kept for good, so the page grew for as long as it was open.
    It keeps the latest TIMELINE_TURNS, the newest first."""
    keep = int(re.search(r"^const TIMELINE_TURNS = (\d+);",
                         (STATIC_DIR / "console.js").read_text(), re.M)[1])
    gw = await start_gateway([{"transcript": "Hi", "reply": "Yes."}],
                             server={"turns_per_minute": 0})
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, page_errors):
        await page.wait_for_function(
            "window.consoleState.connected && window.consoleState.audioReady")
        for n in range(1, keep + 6):
            await talk(page, "Hi")
            await page.wait_for_function(f"window.consoleState.lastTurn?.turnId === {n}")
        state = await page.evaluate("window.consoleState")
        assert [t["turnId"] for t in state["turns"]] == list(range(6, keep + 6))
        rows = page.locator("#timeline .turn b")
        assert await rows.count() == keep
        assert await rows.first.inner_text() == f"turn {keep + 5}"
        assert await rows.last.inner_text() == "turn 6"
        assert state["errors"] == [] and page_errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_keeps_a_bounded_error_list_through_a_long_session(start_gateway):
    """Each error (a transcript refused for the rate, a turn whose LLM failed) stayed in the
    list and in the page's state for as long as the page was open; it keeps the latest
    TIMELINE_TURNS, the newest first."""
    keep = int(re.search(r"^const TIMELINE_TURNS = (\d+);",
                         (STATIC_DIR / "console.js").read_text(), re.M)[1])
    gw = await start_gateway([{"transcript": "Hi", "reply": "Yes."}],
                             server={"turns_per_minute": 1})
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, page_errors):
        await page.evaluate("""new MutationObserver((changes) => {  // errors shown, all told
            for (const c of changes) window.shown = (window.shown ?? 0) + c.addedNodes.length;
        }).observe(document.querySelector("#errors"), {childList: true})""")
        await talk_when_ready(page, "Hi")
        for n in range(1, keep + 6):
            await talk(page, f"Hi {n}")
            await page.wait_for_function(f"window.shown === {n}")
        errors = await page.evaluate("window.consoleState.errors")
        assert len(errors) == keep and all(e.startswith("rate_limited") for e in errors)
        assert await page.locator("#errors li").count() == keep
        assert page_errors == []



@pytest.mark.slow
@needs_chromium
async def test_console_reads_each_sentence_apart_from_its_engine(start_gateway):
    """Each sentence of the list was read out run together with its engine ("Hi.espeak"):
    the engine is set apart by a margin only, which a screen reader does not hear."""
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi. Nice to hear you."}])
    async with console(f"http://127.0.0.1:{gw.port}/") as (page, errors):
        await talk_when_ready(page, "Hello")
        await page.wait_for_function("window.consoleState.lastTurn?.status === 'completed'")
        assert await page.locator("#sentences").aria_snapshot() == (
            "- list:\n  - listitem: Hi. — espeak\n  - listitem: Nice to hear you. — espeak")
        # seen as before: the engine, a margin from its sentence
        assert await page.locator("#sentences li .engine").all_inner_texts() == ["espeak"] * 2
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_says_once_that_a_token_is_needed(start_gateway):
    """A gateway wanting a token: the status said "this gateway needs a token" and the
    error "this gateway needs a token: enter it in the Session panel", both live regions,
    so a screen reader read the same news out twice. The error says it (and what to do)."""
    gw = await start_gateway(server={"tokens": ["s3cret"]})
    async with console(f"http://127.0.0.1:{gw.port}/", init=LISTEN_TO_LIVE_REGIONS) as (
            page, errors):
        await page.wait_for_function("window.consoleState.needsToken")
        said = [text for _, text in await page.evaluate("window.announced")]
        assert len([text for text in said if "token" in text]) == 1, said
        # a token refused: said again at each one typed (a status would say it once)
        for _ in range(2):
            await page.fill("#token", "wrong")
            await page.press("#token", "Enter")
            await page.wait_for_function("window.consoleState.needsToken")
        said = [text for _, text in await page.evaluate("window.announced")]
        assert len([text for text in said if "refused this token" in text]) == 2, said
        assert errors == []


async def ax_node(page: Any, selector: str) -> dict[str, Any]:
    """The accessibility tree's node of the element ``selector`` (Chromium's, over CDP):
    its role, name and properties (``pressed``), as a screen reader is given them."""
    cdp = await page.context.new_cdp_session(page)
    root = (await cdp.send("DOM.getDocument"))["root"]["nodeId"]
    node = await cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})
    (ax, *_) = (await cdp.send("Accessibility.getPartialAXTree",
                               {"nodeId": node["nodeId"], "fetchRelatives": False}))["nodes"]
    await cdp.detach()
    return {"role": ax["role"]["value"], "name": ax["name"]["value"],
            **{p["name"]: p["value"]["value"] for p in ax.get("properties", [])}}


# Test instrument: a speech recognizer that listens until stopped (the browser's own needs
# a microphone and its vendor's servers, which a headless test has neither of).
LISTENING_RECOGNIZER = """window.SpeechRecognition = class {
  start() { window.recognizer = this; }
  stop() { setTimeout(() => this.onend?.(), 0); }
};"""


@pytest.mark.slow
@needs_chromium
async def test_console_speak_is_a_toggle_that_keeps_its_name(gateway):
    """Speak had no aria-pressed until first pressed (a plain button, then a toggle), and
    while it listened its name was "Listening…": a screen reader heard a new control rather
    than the same one pressed. It is a toggle named Speak, its state in aria-pressed."""
    async with console(f"http://127.0.0.1:{gateway.port}/", init=LISTENING_RECOGNIZER) as (
            page, errors):
        await page.wait_for_function("window.consoleState.connected")
        mic = await ax_node(page, "#mic")
        assert (mic["role"], mic["name"], mic.get("pressed")) == ("button", "Speak", "false")
        await page.click("#mic")
        await page.wait_for_function("window.recognizer")
        assert (await ax_node(page, "#mic"))["pressed"] == "true"
        assert (await ax_node(page, "#mic"))["name"] == "Speak"
        # and a sighted person reads it too, not from the colour alone (WCAG 1.4.1)
        assert await page.evaluate(
            "getComputedStyle(document.querySelector('#mic'), '::after').content"
        ) == '" · listening" / ""'
        await page.click("#mic")
        await page.wait_for_function(
            "document.querySelector('#mic').getAttribute('aria-pressed') === 'false'")
        assert (await ax_node(page, "#mic"))["pressed"] == "false"
        assert (await ax_node(page, "#mic"))["name"] == "Speak"
        assert errors == []


@pytest.mark.slow
@needs_chromium
async def test_console_matches_each_refusal_to_the_message_it_names(gateway):
    """The console took any refusal without a turn (but rate_limited) for the refusal of
    the settings it waited on, and left any transcript refused otherwise waiting for its
    turn. A transcript the gateway refuses as empty (U+0085 is white space to it, not to
    JavaScript's trim) sent with settings naming an unknown voice, at once: the transcript's
    refusal was taken for the settings', every field was put back (the instructions just
    typed too), and the transcript, taken as still unanswered, was sent again after the
    next resume, where it took the place of the next one, whose reply was then heard
    twice. Each message is named now (event_id) and each error matched by its name. (The
    console sends no transcript of white space since: this one goes out as such.)"""
    from gateway.core.codec import ClientTranscript

    refused = """(() => {
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) {
        return send.call(this, typeof data === "string" ?
          data.replace('"text":"Refuse me"', '"text":"\\u0085"') : data);
      };
    })()"""
    state = "window.consoleState"
    async with console(f"http://127.0.0.1:{gateway.port}/", init=refused) as (page, errors):
        await page.wait_for_function(f"{state}.connected && {state}.audioReady")
        conn = reading_paused(gateway)  # the messages go at once, answered together
        await talk_sent(page, "Refuse me")
        await page.fill("#instructions", "Answer in one word.")
        await page.fill("#voice", "klingon")
        await page.click("#apply")
        conn.ws.transport.resume_reading()
        await page.wait_for_function(f"{state}.errors.length === 2")
        said, voice = await page.evaluate(f"{state}.errors")
        assert said.startswith("invalid_field:") and said.endswith(
            "(the transcript “Refuse me”); the transcript is back in the box"), said
        assert voice.startswith("unknown_voice:") and voice.endswith("(the settings)"), voice
        # the voice refused is put back, the instructions typed with it are kept
        assert await page.input_value("#voice") == ""
        assert await page.input_value("#instructions") == "Answer in one word."

        await page.fill("#transcript", "Hello")
        await page.click("#send")
        await page.wait_for_function(f"{state}.lastTurn?.status === 'completed'")
        received = messages_received(gateway)
        conn.ws.transport.abort()  # nothing is waiting for an answer: nothing goes again
        await page.wait_for_function(f"{state}.resumes === 1")
        await talk(page, "Tell me everything")
        await page.wait_for_function(f"{state}.turnId !== 1")
        assert await page.evaluate(f"{state}.turnId") == 2
        assert [m.text for m in received if isinstance(m, ClientTranscript)] == [
            "Tell me everything"]
        assert errors == []
