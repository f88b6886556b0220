"""What the phone app does, in Python: a reference client for protocol v1 (protocol.md).

    python examples/phone_client.py "What's on my calendar?" "And tomorrow?"
    python examples/phone_client.py --file transcripts.txt --out turns/
    python examples/phone_client.py --play          # type transcripts; a line typed while
                                                    # the reply plays interrupts it (barge-in)

One WebSocket holds the session across turns. For each transcript the client:

1. sends ``{"type":"transcript","text":...}`` and waits for ``turn.started`` (its turn_id);
2. reads ``text.delta`` / ``sentence`` events and binary audio frames (12-byte header +
   PCM16 mono 24 kHz), saving each turn's audio as ``turn-NNN.wav`` in ``--out`` (all that
   was sent) and, with ``--play``, playing it on the default output device (skipped if there
   is none, or no ``sounddevice``: ``pip install sounddevice``) up to a barge-in;
3. plays at real time (a virtual clock when not playing aloud) and sends
   ``{"type":"playback","turn_id":...,"played_ms":...}`` every 250 ms while audio plays
   (typed turns too, while the next line is being typed), so the server paces its sending
   and knows what the listener heard: played aloud, what has left the speaker (what was
   copied to the device less its output latency, by PortAudio's timing), until the last
   of it has;
4. on ``turn.done`` closes the WAV; with ``cancelled`` it drops the audio not yet played.

Every message goes named (``event_id``: ``p1``, ``p2``, ...; a transcript or the settings
sent again after a resume keep their first name), and an ``error`` is matched to what it
names (protocol.md, Errors), not to what was sent before it: a refusal is the refused
transcript's, the settings' or another message's (a mark: printed with its name); a turn's
error is kept with its ``turn.done`` in ``results`` (``"error"``). An error that names nothing
(a frame the gateway could not read) is matched by order, as before: the oldest transcript
waiting for its turn.

A transcript refused as ``rate_limited`` is sent again after a wait (1 s, doubling to 8 s)
instead of moving on to the next: a file sent on at once, each line refused at once, is
closed by the gateway with 1008 ``too many messages``, and that ends the session.

Barge-in: a new transcript while a reply is playing sends a final ``playback`` mark, drops
the buffered audio and then sends the transcript (which cancels the turn server-side); typed
while the socket is down, or lost with it, the two go (again) after the resume, the mark
first, since the gateway cuts the reply's history from it. From args or ``--file`` each
reply is heard to its end unless ``--barge-in-after SECONDS``. From stdin, any line typed
while the reply plays barges in (the next line is read once the turn it asks for started).

If the gateway cannot be reached at all, or is full (HTTP 503 ``server_full``, said so),
the client gives up after ``--connect-attempts`` tries in a row (default 5, about 8 s) and
exits with status 2; a gateway that refuses the
handshake (HTTP 401: a missing or wrong ``--token``) is not retried. Once it has connected,
``--connect-attempts`` no longer applies: when the socket drops (a gateway restarting or
stopped, the network) the client tries again without limit while a turn is still to send
or hear (typing: until Ctrl-C or the end of input): 0.5 s after the
drop, then twice as long after each failed try up to 8 s (each wait ±20 %, so at most
9.6 s between tries; ``RECONNECT_S``), one note per try on stderr (``[disconnected: WHY;
reconnecting in N s]``, then ``[connection failed: WHY; reconnecting in N s]``). Transcripts
wait for the connection meanwhile. It stops by itself (status 2) only when the gateway
refuses the handshake (HTTP 4xx: a token no longer taken) or another device has taken the
session over (close 4000). Connected again, it resumes its session (protocol.md, Resume): the
first message on the new socket is ``session.resume`` with the ``seq`` of the last frame it
received, and the server re-sends what followed, so the reply goes on where it was cut, into
the same WAV, with ``seq`` gapless. Events the server re-sends that the client had (those
after that frame, counted) are skipped; settings the replay does not answer go again once
it is in (lost with the socket: a ``session.update`` is idempotent). If the
resume fails (the window passed, the gateway restarted), the client falls back: it
re-applies its settings and sends again the transcript whose reply was cut off, in the
fresh session (typed ones too); a reply that had come whole plays its tail out.

stdout gets the paths of the WAV files saved, one a line, once the run ends (what a script
reads); everything else goes to stderr: each transcript sent (``> ...``), the reply's text as
it comes, and notes in brackets, each note on a line of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import re
import struct
import sys
import threading
import time
import urllib.parse
import wave
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

RATE = 24_000
HEADER = struct.Struct("<BBHII")  # version u8, flags u8, sentence u16, turn_id u32, seq u32
MARK_EVERY_S = 0.25
CLOSE_RESUMED_ELSEWHERE = 4000  # protocol.md, Close codes
REFUSALS = frozenset({"text_too_long", "rate_limited", "invalid_field", "message_too_large"})
"""Errors that refuse a transcript outright (protocol.md, Errors): no turn starts for it."""
RECONNECT_S = (0.5, 8.0)
"""The wait before trying to connect again: 0.5 s after a connection that held or a first
failure, doubling to 8 s, each wait drawn ±20 % (at most 9.6 s between tries)."""
RETRY_LIMITED_S = (1.0, 8.0)
"""A transcript refused as ``rate_limited`` is sent again after 1 s, doubling to 8 s: a
slot frees when a turn of the last minute ages out. Moving on to the next line instead
sent the rest of a file at once (each refused at once) and the gateway closed the socket
with 1008 ``too many messages``, which ends the session."""


class ClockPlayer:
    """Plays nothing, but consumes audio at real time: what a speaker would have played."""

    def __init__(self) -> None:
        self._end = 0.0  # monotonic time when the buffered audio runs out
        self._queued_s = 0.0  # audio fed since start_turn()

    def start_turn(self) -> None:
        self._end, self._queued_s = 0.0, 0.0

    def feed(self, pcm: bytes) -> None:
        now, seconds = time.monotonic(), len(pcm) / 2 / RATE
        self._end = max(self._end, now) + seconds  # after an underrun, resume on arrival
        self._queued_s += seconds

    def buffered_s(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def played_ms(self) -> float:
        return (self._queued_s - self.buffered_s()) * 1000

    def flush(self) -> None:
        self._queued_s -= self.buffered_s()
        self._end = time.monotonic()

    def close(self) -> None:
        pass


class SpeakerPlayer(ClockPlayer):
    """Plays through the default output device (``sounddevice``); counts what has left the
    speaker: what the callback copied to the device, less what the device still holds.

    Each callback's audio leaves the speaker from the time PortAudio gives for its first
    sample (``time.outputBufferDacTime``; where a host API leaves it 0, the callback's
    ``time.currentTime`` plus the stream's ``latency``), at the stream's rate, on the
    stream's clock (``stream.time``). Counting what was copied instead, the marks ran ahead
    of the listener by the output latency (tens of ms on a wired output, 100-200 ms on
    Bluetooth), and a barge-in's history kept words that had not been heard (protocol.md,
    ``playback``). What it reports never goes back within a turn nor past what it copied."""

    def __init__(self) -> None:
        import sounddevice  # raises ImportError/OSError when there is no library or device

        super().__init__()
        self._buf = bytearray()
        self._copied = 0  # bytes of this turn copied to the device
        self._out = 0  # bytes of this turn out of the speaker, of the chunks let go
        self._chunks: collections.deque[tuple[float, int, int]] = collections.deque()
        """Each callback's audio of this turn not yet all out: (the stream time its first
        sample leaves the speaker, its first byte's offset in the turn, its length)."""
        self._lock = threading.Lock()
        self._stream = sounddevice.RawOutputStream(samplerate=RATE, channels=1, dtype="int16",
                                                   callback=self._callback)
        self._stream.start()

    def _callback(self, out: Any, frames: int, when: Any, _status: Any) -> None:
        with self._lock:  # audio thread: copy what we have, pad the rest with silence
            n = min(len(out), len(self._buf))
            out[:n] = self._buf[:n]
            out[n:] = bytes(len(out) - n)
            del self._buf[:n]
            if n:
                dac = when.outputBufferDacTime or \
                    (when.currentTime or self._stream.time) + self._stream.latency
                self._chunks.append((dac, self._copied, n))
                self._copied += n

    def _out_by(self, now: float) -> int:
        """The bytes of this turn out of the speaker at stream time ``now`` (under the lock).
        Grows with ``now``: a chunk is let go only once all of it is out."""
        while self._chunks:
            dac, start, n = self._chunks[0]
            out = round((now - dac) * RATE) * 2  # (whole samples)
            if out < n:
                return max(self._out, start + out)
            self._chunks.popleft()
            self._out = start + n
        return self._out

    def start_turn(self) -> None:
        with self._lock:
            self._buf.clear()
            self._chunks.clear()
            self._copied = self._out = 0

    def feed(self, pcm: bytes) -> None:
        with self._lock:
            self._buf += pcm

    def buffered_s(self) -> float:
        """Audio still to be heard: not yet copied, or copied and still in the device (so
        the marks go on until the tail has left the speaker, and the last says all of it)."""
        now = self._stream.time
        with self._lock:
            return (len(self._buf) + self._copied - self._out_by(now)) / 2 / RATE

    def played_ms(self) -> float:
        now = self._stream.time
        with self._lock:
            return self._out_by(now) / 2 / RATE * 1000

    def flush(self) -> None:
        with self._lock:  # (what the device holds still plays: it is counted as it does)
            self._buf.clear()

    def close(self) -> None:
        self._stream.close()


class GaveUp(Exception):
    """The gateway cannot be reached, or refused the connection: retrying will not help."""


class PhoneClient:
    def __init__(self, url: str, out_dir: Path, player: ClockPlayer, *,
                 settings: dict[str, Any] | None = None, verbose: bool = True,
                 token: str | None = None, connect_attempts: int = 5) -> None:
        self.url, self.out_dir, self.player = url, out_dir, player
        # here, not in main(): a WAV that cannot be opened mid-turn is an OSError, which
        # the connection loop took for a network drop and resumed on every turn
        out_dir.mkdir(parents=True, exist_ok=True)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.connect_attempts = connect_attempts
        self.settings = settings or {}
        self.verbose = verbose
        self.turns = 0  # local turn counter: names the WAV files across reconnects
        self.saved: list[Path] = []
        self.results: list[dict[str, Any]] = []  # turn.done events, in order
        self._ws: ClientConnection | None = None
        self._turn_id: int | None = None  # the turn whose audio we are receiving
        self._barged: int | None = None  # the turn a barge-in cut: no more of it is heard
        self._wav: wave.Wave_write | None = None
        self._pending: list[int] = []  # local numbers of transcripts sent, not yet started
        self._named: dict[str, int] = {}  # event_id of each transcript in _pending: its number
        self._sent = 0  # event_ids given so far (each message sent is named: "p1", "p2", ...)
        self._turn_errors: dict[int, dict[str, Any]] = {}  # a turn's error, until its turn.done
        self._done = asyncio.Event()  # set on the turn.done of the last transcript sent
        self._done.set()
        self._started = asyncio.Event()  # set while no transcript sent waits for its turn
        self._started.set()
        self._in_flight = False  # a transcript was sent and its turn.done has not come
        self._asked: tuple[str, dict[str, Any] | None] | None = None
        """The last transcript sent, and the barge-in mark sent before it."""
        self._asked_id: str | None = None  # the event_id _asked went with (again: the same)
        self._again = False  # the reconnect sends ``_asked`` again (``_ask_again``)
        self._limited = False  # the last transcript was refused as rate_limited
        self._updating = False  # a session.update was sent and its answer has not come
        self._update_id: str | None = None  # the event_id of the settings (again: the same)
        self._update_again = False  # the resume sends the settings again (``_ask_again``)
        self._connected = asyncio.Event()
        self._session_id: str | None = None
        self._resume_token: str | None = None
        self._last_seq: int | None = None  # seq of the last frame received
        self._ended: set[int] = set()  # turn ids whose turn.done was handled
        self._since_frame = 0  # events received after the last frame
        self._skip = 0  # replayed events still to skip after a resume: we had them
        self._replay = 0  # replayed messages still to come after those: we did not have them
        self.resumes = 0
        self.resumes_failed = 0
        self.frames_lost = 0  # seq gaps seen (should stay 0, resumes included)
        self.frames_repeated = 0
        self._line_open = False  # stderr's last line is reply text not ended yet (``note``)

    def say(self, *parts: Any) -> None:
        """A note on stderr (``verbose``), on a line of its own (``note``)."""
        if self.verbose:
            self.note(*parts)

    def note(self, *parts: Any) -> None:
        """Print ``parts`` on stderr on a line of their own: the reply's text is printed there
        as it comes, with no line break of its own, and a ``[barge-in]`` or ``[connection
        failed: ...]`` in the middle of a reply went on at the end of its words."""
        print("\n" if self._line_open else "", end="", file=sys.stderr)
        print(*parts, file=sys.stderr, flush=True)
        self._line_open = False

    def _print_text(self, text: str) -> None:
        """The reply's text as it comes, on stderr (stdout has the WAV files' paths only)."""
        if self.verbose and text:
            print(text, end="", file=sys.stderr, flush=True)
            self._line_open = not text.endswith("\n")

    # ---- connection, with reconnect --------------------------------------------------

    async def run(self, transcripts: Any, *, sequential: bool, barge_in_after: float | None
                  ) -> None:
        """Connect (and reconnect) while ``talk`` sends ``transcripts`` (an async iterator).
        Raises ``GaveUp`` when the gateway cannot be reached or refuses the connection."""
        try:
            async with asyncio.TaskGroup() as tasks:
                link = tasks.create_task(self._keep_connected())
                marks = tasks.create_task(self._keep_marking())
                try:
                    await self._talk(transcripts, sequential, barge_in_after)
                finally:
                    link.cancel()
                    marks.cancel()
                    if self._ws is not None:
                        await self._ws.close()
        except* GaveUp as group:
            raise group.exceptions[0] from None

    async def _keep_connected(self) -> None:
        """Connect, and after each drop or failed attempt wait ``RECONNECT_S`` (doubling, each
        wait ±20 %) and try again, one note per attempt: ``connect_attempts`` tries in a row
        before the gateway was first reached, then for as long as it takes (``GaveUp``: a
        refusal that the same request would meet again)."""
        backoff = RECONNECT_S[0]
        failures = 0  # attempts that did not reach the gateway before it was ever reached
        while True:
            connected = False
            try:
                async with connect(self._url(), compression=None, max_size=2**20,
                                   additional_headers=self.headers) as ws:
                    created = json.loads(await ws.recv())
                    assert created["type"] == "session.created", created
                    if not await self._resume(ws, created):
                        self._cut_off()  # the old session is gone: start over in this one
                        self._session_id = created["session_id"]
                        self._resume_token = created.get("resume_token")
                        self._last_seq = None
                        self._since_frame = self._skip = self._replay = 0
                        self._updating, self._update_again = bool(self.settings), False
                        if self.settings:
                            self._update_id = self._name()
                            await ws.send(json.dumps({"type": "session.update",
                                                      "event_id": self._update_id,
                                                      "session": self.settings}))
                        self.say(f"[connected: {created['session_id']}]")
                    self._ws, backoff, connected = ws, RECONNECT_S[0], True
                    if not self._replay:  # (else once the replay is in: _messages)
                        await self._ask_again(ws)
                        self._connected.set()
                    await self._read(ws)
                    # (closed by the gateway with a close frame: a restart's 1001)
                    why = f"closed by the gateway ({ws.close_code}" + \
                        (f" {ws.close_reason})" if ws.close_reason else ")")
            except (InvalidHandshake, OSError, ConnectionClosed) as exc:
                if isinstance(exc, InvalidStatus) and 400 <= exc.response.status_code < 500:
                    # refused (auth, wrong path): the same next time
                    status = exc.response.status_code
                    hint = " (a missing or wrong --token?)" if status in (401, 403) else ""
                    raise GaveUp(f"{self.url} refused the connection: HTTP {status}"
                                 f"{hint}") from None
                if isinstance(exc, ConnectionClosed) and exc.rcvd is not None and \
                        exc.rcvd.code == CLOSE_RESUMED_ELSEWHERE:
                    # another device took the session over: taking it back would have the
                    # two close each other for ever
                    raise GaveUp("the session was resumed elsewhere (close 4000)") from None
                why = _refusal(exc)
                if self._session_id is None:  # never connected yet (5xx from a proxy too)
                    failures += 1
                    if failures >= self.connect_attempts:
                        self.say(f"[connection failed: {why}]")
                        reached = "server_full" in why
                        raise GaveUp(f"{'' if reached else 'cannot reach '}{self.url} "
                                     f"({failures} attempts): {why}") from None
            self._connected.clear()
            self._ws = None
            delay = backoff * random.uniform(0.8, 1.2)
            # one note per attempt (it said "[connection failed: ...]", then "[disconnected;
            # reconnecting in ...]" after every attempt that never connected)
            if self._session_id is None:
                self.say(f"[connection failed: {why}; retrying in {delay:.1f} s "
                         f"(attempt {failures} of {self.connect_attempts})]")
            else:
                self.say(f"[{'disconnected' if connected else 'connection failed'}: {why}; "
                         f"reconnecting in {delay:.1f} s]")
            await asyncio.sleep(delay)
            backoff = min(backoff * 2, RECONNECT_S[1])

    def _url(self) -> str:
        """The gateway URL; when reconnecting, naming the session to resume (``?resume=``),
        which lets the socket in even when the gateway is full (protocol.md, Resume)."""
        if self._session_id is None:
            return self.url
        parts = urllib.parse.urlsplit(self.url)
        query = urllib.parse.urlencode([*urllib.parse.parse_qsl(parts.query),
                                        ("resume", self._session_id)])
        return parts._replace(query=query).geturl()

    async def _resume(self, ws: ClientConnection, created: dict[str, Any]) -> bool:
        """Continue the previous session on ``ws``; False when there is none to continue
        or the server refused (``resume_failed``)."""
        if self._session_id is None or self._resume_token is None:
            return False
        await ws.send(json.dumps({"type": "session.resume", "event_id": self._name(),
                                  "session_id": self._session_id,
                                  "resume_token": self._resume_token,
                                  "last_seq": -1 if self._last_seq is None else self._last_seq}))
        answer = json.loads(await ws.recv())
        if answer["type"] == "session.resumed":
            self.resumes += 1
            # the replay starts after frame last_seq: the events that followed it came
            # already. Handled again, a refusal (an error with no turn) was taken for the
            # refusal of the transcript sent since, whose reply then went unheard.
            self._skip = min(self._since_frame, answer["replayed"])
            self._replay = answer["replayed"] - self._skip
            self.say(f"[resumed {self._session_id}: {answer['replayed']} messages replayed]")
            # no answer to the settings came: they were lost with the socket (nothing is
            # replayed to the server) unless the replay answers them. Sent again once it is
            # in (protocol.md, Resume: idempotent), so that only one sending is ever
            # unanswered: sent at once, a replay cut short by another drop came again with
            # the answers of both, and the second was taken for a transcript's refusal
            self._update_again = self._updating
            # a transcript not answered yet was lost with the socket unless the replay
            # answers it: with its turn.started, or with its refusal (the gateway answers
            # each as it reads it). session.resumed's turn_id still the last turn seen start
            # does not say it was lost: a refusal in the replay was taken for a transcript
            # lost, which was sent again, and its second refusal taken for the next one's
            self._again = bool(self._pending) and not self._replay
            return True
        self.resumes_failed += 1
        why = answer.get("error", {}).get("message")  # (it says what the session goes on in)
        self.say(f"[resume failed: {why}]" if why else
                 f"[resume failed ({answer['type']}); continuing in {created['session_id']}]")
        return False

    def _cut_off(self) -> None:
        """The reply in progress will never finish: drop it, and have the reconnect send
        its transcript again. One whose turn.done came plays on: it came whole, and its
        last max_lead_ms (the gateway ends a turn when it has sent it) are the client's."""
        self._turn_id = self._barged = None  # (turn ids start again in a new session)
        self._close_wav()
        if self._in_flight:
            self.player.flush()
        self._again = self._in_flight

    async def _ask_again(self, ws: ClientConnection) -> None:
        """Send again on ``ws`` the settings a resume found unanswered (``_update_again``),
        then the transcript whose reply will not come (lost with the old socket, or cut off
        by a failed resume: ``_again``), the mark of its barge-in first while its turn is
        the gateway's latest. Here, not in _talk: typed, the client was already waiting
        for the next line, and the reply was lost until one came."""
        if self._update_again and self._updating:  # (first: the turn is for them)
            await ws.send(json.dumps({"type": "session.update", "event_id": self._update_id,
                                      "session": self.settings}))
        self._update_again = False
        if not self._again or self._asked is None:
            return
        self._again = False  # (if this socket drops too, the next resume says whether)
        text, mark = self._asked
        if not self._pending:  # its turn had started: its reply again, in a new WAV
            self.turns += 1
            self._pending.append(self.turns)
        del self._pending[:-1]  # (a barge-in's transcript went after those before it)
        # under the name it first had: an answer to either sending is this transcript's
        named = self._asked_id or self._name()
        self._named = {named: self._pending[0]}
        self.say(f"> {text}")
        if mark is not None and mark["turn_id"] == self._turn_id:
            await ws.send(json.dumps({**mark, "event_id": self._name()}))
        await ws.send(json.dumps({"type": "transcript", "event_id": named, "text": text}))

    def _name(self) -> str:
        """A new ``event_id`` (protocol.md: an ``error`` answering the message names it)."""
        self._sent += 1
        return f"p{self._sent}"

    async def _send(self, **message: Any) -> None:
        await self._connected.wait()
        assert self._ws is not None
        message.setdefault("event_id", self._name())
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            # closed before the reader noticed (a stopping gateway's 1001 right after its
            # turn.done): lost with the socket, a transcript is sent again after the
            # reconnect (_ask_again), as when the socket drops after the send
            pass

    # ---- what the user says ------------------------------------------------------------

    async def _talk(self, transcripts: Any, sequential: bool, barge_in_after: float | None
                    ) -> None:
        async for text in transcripts:
            mark = self._barge_in_if_speaking()
            retry_in = RETRY_LIMITED_S[0]
            while True:
                await self._connected.wait()
                self.turns += 1
                self._pending.append(self.turns)
                self._done.clear()
                self._started.clear()
                self._in_flight = True
                self._asked, ws = (text, mark), self._ws
                self._asked_id = self._name()
                self._named[self._asked_id] = self.turns
                self.say(f"> {text}")
                if mark is not None and mark["turn_id"] == self._turn_id:
                    # what was heard of the reply it cuts, first (again after a resume: the
                    # gateway cuts that reply's history from the mark it has; not after a
                    # failed one: the new session never had that turn)
                    await self._send(**mark)
                if self._ws is ws:  # (else the reconnect sent both again: _ask_again)
                    await self._send(type="transcript", event_id=self._asked_id, text=text)
                if sequential:
                    await self._listen(barge_in_after)
                else:  # until its turn starts or it is refused
                    await self._started.wait()
                if not self._limited:
                    break
                self._limited = False  # the gateway asks to wait and retry
                self.say(f"[sending it again in {retry_in:.0f} s]")
                await asyncio.sleep(retry_in)
                retry_in = min(retry_in * 2, RETRY_LIMITED_S[1])
        await self._listen(None)  # hear the last reply out

    async def _listen(self, barge_in_after: float | None) -> None:
        """Wait for the turn to end and its audio to play (or ``barge_in_after`` seconds of
        it)."""
        started = time.monotonic()
        while not (self._done.is_set() and self.player.buffered_s() == 0):
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation
            # that comes in the step the turn ends, and the client went on talking
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MARK_EVERY_S):
                    await self._done.wait()
            if self._done.is_set():  # let the buffered audio play out
                await asyncio.sleep(min(MARK_EVERY_S, self.player.buffered_s()))
            if barge_in_after is not None and time.monotonic() - started >= barge_in_after:
                return

    async def _keep_marking(self) -> None:
        """A playback mark every ``MARK_EVERY_S`` while a reply plays (or is awaited), however
        the transcripts come: typed ones too, while the next line is being typed."""
        while True:
            await asyncio.sleep(MARK_EVERY_S)
            if not self._done.is_set() or self.player.buffered_s() > 0:
                await self._mark()

    async def _mark(self) -> None:
        if self._turn_id is not None and self._ws is not None:
            try:
                await self._ws.send(json.dumps({"type": "playback", "event_id": self._name(),
                                                "turn_id": self._turn_id,
                                                "played_ms": round(self.player.played_ms())}))
            except ConnectionClosed:
                pass  # the reader notices and reconnects

    def _barge_in_if_speaking(self) -> dict[str, Any] | None:
        """Stop the sound of the reply playing; returns the mark of what was heard of it, to
        send before the transcript (None: no reply playing, or the tail of one whose session
        a failed resume ended: nobody to tell)."""
        if not self.player.buffered_s() and (self._turn_id is None or self._done.is_set()):
            return None
        mark = None if self._turn_id is None else {
            "type": "playback", "turn_id": self._turn_id,
            "played_ms": round(self.player.played_ms())}
        self.player.flush()
        self._barged = self._turn_id  # (its frames still on their way are not played)
        self.say("[barge-in]")
        return mark

    # ---- what the server says --------------------------------------------------------

    async def _messages(self, ws: ClientConnection) -> Any:
        """What ``ws`` receives, less the events a resume replays that came already. Once
        the replay is in, every transcript (and the settings) sent before the drop has its
        answer: the one left unanswered is sent again, and only then are more sent (a
        transcript sent during the replay would be taken for one lost)."""
        async for message in ws:
            if self._skip:
                self._skip -= 1  # (an event received before the drop)
                continue
            replayed = self._replay > 0
            self._replay -= replayed
            yield message
            if replayed and not self._replay:
                self._again = bool(self._pending)
                await self._ask_again(ws)
                self._connected.set()

    async def _read(self, ws: ClientConnection) -> None:
        async for message in self._messages(ws):
            if isinstance(message, bytes):
                self._since_frame = 0
                _version, _flags, _sentence, turn_id, seq = HEADER.unpack_from(message)
                self._count_seq(seq)
                if turn_id == self._turn_id and self._wav is not None:
                    pcm = message[HEADER.size:]
                    self._wav.writeframes(pcm)  # (all the gateway sent of the turn)
                    if turn_id != self._barged:
                        self.player.feed(pcm)
                continue
            self._since_frame += 1
            event = json.loads(message)
            match event["type"]:
                case "turn.started" | "turn.done" if event["turn_id"] in self._ended:
                    pass  # re-sent after a resume: already handled
                case "turn.started" if event["turn_id"] == self._turn_id:
                    pass  # re-sent after a resume: the WAV is open
                case "turn.started":
                    self._close_wav()
                    self._turn_id = event["turn_id"]
                    number = self._pending.pop(0) if self._pending else self.turns
                    self._named = {k: n for k, n in self._named.items() if n in self._pending}
                    if not self._pending:
                        self._started.set()
                    path = self.out_dir / f"turn-{number:03d}.wav"
                    self._wav = wave.open(str(path), "wb")
                    self._wav.setnchannels(1)
                    self._wav.setsampwidth(2)
                    self._wav.setframerate(RATE)
                    self.saved.append(path)
                    self.player.start_turn()
                case "text.delta":
                    self._print_text(event["delta"])
                case "turn.done" if event["turn_id"] == self._turn_id:
                    self._ended.add(event["turn_id"])
                    self._close_wav()
                    error = self._turn_errors.pop(event["turn_id"], None)
                    # the turn's own error (named by its transcript's event_id), with its end
                    self.results.append(event if error is None else {**event, "error": error})
                    m = event["metrics"]
                    heard = ("no audio" if m.get("ttfa_ms") is None else  # (null: none sent)
                             f"first audio {m['ttfa_ms']} ms, {m.get('audio_ms')} ms of audio")
                    self.say(f"[turn {event['turn_id']} {event['status']}: {heard}]")
                    if event["status"] != "completed":
                        self.player.flush()  # nothing more of this turn will be heard
                    if not self._pending:
                        self._in_flight = False
                        self._done.set()
                case "error" if "turn_id" not in event and \
                        event["error"].get("event_id") is not None:
                    self._refused(event["error"])
                case "session.updated" | "error" if self._updating and "turn_id" not in event:
                    # the answer to the settings, sent before any transcript unanswered (and
                    # only once all sent before them are answered or lost): their refusal
                    # (invalid_field, text_too_long) is no transcript's; the session goes on
                    # with the gateway's defaults
                    self._updating = False
                    if event["type"] == "error":
                        self.say(f"[settings refused: error {event['error']['code']}: "
                                 f"{event['error']['message']}]")
                case "error":
                    self.say(f"[error {event['error']['code']}: {event['error']['message']}]")
                    if "turn_id" in event and event["turn_id"] not in self._ended:
                        # kept for its turn.done (results)
                        self._turn_errors.setdefault(event["turn_id"], event["error"])
                    elif event["error"]["code"] in REFUSALS and self._pending:
                        # named nothing (a frame the gateway could not read): taken, as
                        # before, for the refusal of the oldest transcript not yet started
                        self._refuse(self._pending[0], event["error"])
                case _:
                    pass  # sentence, sentence.done, pong

    def _refused(self, error: dict[str, Any]) -> None:
        """The ``error`` (no turn) that names the message it refuses (``event_id``): the
        settings, a transcript, or another message (a playback mark), whatever the order of
        what was sent and however many times (a resume sends some again, with their names).
        Matched by order, the refusal of one was taken for another's: a transcript's for the
        settings', or a mark's for the next transcript's, whose reply then went unheard."""
        named = error["event_id"]
        if named == self._update_id:
            if self._updating:  # (else a second answer to them: sent again after a resume)
                self._updating = False  # the session goes on with the gateway's defaults
                self.say(f"[settings refused: error {error['code']}: {error['message']}]")
            return
        number = self._named.get(named)
        if number is None or number not in self._pending:
            # not a transcript waiting for its turn: a mark, or one answered already
            self.say(f"[error {error['code']}: {error['message']} ({named})]")
            return
        self.say(f"[error {error['code']}: {error['message']}]")
        if error["code"] in REFUSALS:  # (server_full: the socket closes; it goes again)
            del self._named[named]
            self._refuse(number, error)

    def _refuse(self, number: int, error: dict[str, Any]) -> None:
        """The transcript ``number`` (local, in ``_pending``) was refused: no turn.done will
        come for it."""
        self._pending.remove(number)
        if error["code"] == "rate_limited":
            self._limited = True  # _talk sends it again after a wait
        else:
            self.results.append({"type": "refused", "status": "refused", "error": error})
        if not self._pending:
            self._in_flight = False
            self._done.set()
            self._started.set()

    def _count_seq(self, seq: int) -> None:
        expected = 0 if self._last_seq is None else (self._last_seq + 1) % 2**32
        if seq == expected:
            self._last_seq = seq
        elif (seq - expected) % 2**32 < 2**31:
            self.frames_lost += (seq - expected) % 2**32
            self.say(f"[{(seq - expected) % 2**32} frames lost]")
            self._last_seq = seq
        else:
            self.frames_repeated += 1

    def _close_wav(self) -> None:
        if self._wav is not None:
            self._wav.close()
            self._wav = None


def _refusal(exc: Exception) -> str:
    """What a failed connection says: a full gateway's 503 by its code (protocol.md,
    Connection: ``server_full``), since it was reached."""
    if isinstance(exc, InvalidStatus) and exc.response.status_code == 503:
        try:
            code = json.loads(exc.response.body or b"")["error"]["code"]
        except (ValueError, TypeError, KeyError):
            code = None
        if code == "server_full":
            return "the gateway is full (HTTP 503 server_full)"
    return str(exc)


async def _from_list(items: list[str]) -> Any:
    for item in items:
        yield item


async def _from_stdin() -> Any:
    while line := await asyncio.to_thread(sys.stdin.readline):
        if line.strip():
            yield line.strip()


def make_player(play: bool) -> ClockPlayer:
    if play:
        try:
            return SpeakerPlayer()
        except ImportError:  # not a missing device: a library the gateway does not install
            print("[--play needs sounddevice: pip install sounddevice; saving WAV files only]",
                  file=sys.stderr)
        except Exception as exc:  # OSError, sounddevice.PortAudioError
            print(f"[no audio device ({exc}); saving WAV files only]", file=sys.stderr)
    return ClockPlayer()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Reference voice client (protocol v1): sends "
                                "each transcript, prints the reply (stderr) and saves its "
                                "audio as turn-NNN.wav (their paths on stdout, at the end). "
                                "Once connected, it reconnects after a drop without limit "
                                "(until Ctrl-C) and resumes the session.")
    p.add_argument("transcripts", nargs="*", help="what the user says, one turn each; none "
                   "(and no --file): type them, a line typed while a reply plays barges in")
    p.add_argument("--url", default="ws://127.0.0.1:8780/v1/voice",
                   help="the gateway's voice socket (default %(default)s)")
    p.add_argument("--token", help="bearer token, when the gateway has tokens configured")
    p.add_argument("--connect-attempts", type=int, default=5, metavar="N",
                   help="give up after N failed tries in a row before the first connection "
                   "(default %(default)s); once connected, a dropped socket is tried again "
                   "without limit, 0.5 s doubling to 8 s between tries (each ±20%%)")
    p.add_argument("--file", help="transcripts, one per line ('-' for stdin)")
    p.add_argument("--out", default="turns", help="directory for turn-NNN.wav (default turns/)")
    p.add_argument("--play", action="store_true", help="play through the default device "
                   "(needs sounddevice: pip install sounddevice)")
    p.add_argument("--voice", help="the session's voice (GET /v1/audio/voices lists them; "
                   "default: the gateway's)")
    p.add_argument("--instructions", help="the LLM's system message for this session")
    p.add_argument("--frame-ms", type=int, help="audio frame length: 20, 40, 60, 80, 100 "
                   "or 120 (default: the gateway's, 40)")
    p.add_argument("--barge-in-after", type=float, metavar="SECONDS",
                   help="send the next transcript this long into each reply")
    args = p.parse_args(argv)
    if urllib.parse.urlsplit(args.url).scheme not in ("ws", "wss"):  # (http: a traceback)
        p.error(f"--url must be the gateway's ws:// or wss:// URL, not {args.url!r}")
    if args.token is not None and not re.fullmatch(r"[!-~]([ -~]*[!-~])?", args.token):
        # (as the gateway's own tokens: a line break was tried --connect-attempts times and
        # given up as "cannot reach" the gateway, which had never been asked)
        p.error("--token: a token is printable ASCII, without a space at either end: the "
                "Authorization header carries nothing else as written")
    if args.connect_attempts < 1:
        p.error(f"--connect-attempts must be at least 1, not {args.connect_attempts}")
    if args.barge_in_after is not None and not args.barge_in_after >= 0:
        p.error(f"--barge-in-after must be 0 or more seconds, not {args.barge_in_after:g}")
    settings = {k: v for k, v in {"voice": args.voice, "instructions": args.instructions,
                                  "frame_ms": args.frame_ms}.items() if v is not None}
    out = Path(args.out)
    if args.transcripts:
        source, sequential = _from_list(args.transcripts), True
    elif args.file and args.file != "-":
        try:
            lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            p.error(f"--file: {exc}")
        source, sequential = _from_list([x.strip() for x in lines if x.strip()]), True
    else:
        source, sequential = _from_stdin(), False
    try:  # (PhoneClient makes it too: a traceback)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file of that name, a directory it may not write in
        p.error(f"--out: cannot make the directory for turn-NNN.wav: {exc}")
    player = make_player(args.play)
    client = PhoneClient(args.url, out, player, settings=settings, token=args.token,
                         connect_attempts=args.connect_attempts)
    try:
        asyncio.run(client.run(source, sequential=sequential,
                               barge_in_after=args.barge_in_after))
    except KeyboardInterrupt:
        pass
    except GaveUp as exc:  # (a session resumed elsewhere: in the middle of a reply)
        client.note(f"[gave up: {exc}]")
        return 2
    finally:
        player.close()
    for path in client.saved:
        print(path)
    return 0 if all(r["status"] in ("completed", "cancelled") for r in client.results) else 1


if __name__ == "__main__":
    sys.exit(main())
