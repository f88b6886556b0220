"""A whole speech answer (``"stream": false``) is held in a ``Spool``: in memory up to a bound,
in a temporary file past it, read back a slice at a time as it is sent; the file is gone
however the answer ends. The bound is made 1000 bytes here so that every answer goes to
disk, and the temporary directory a directory of the test's own (``tempfile.tempdir``).

"Gone" is checked twice: every spool the HTTP port made is closed, and (where the OS lists a
process's open files in ``/proc/self/fd``) no open file of the process is in that
directory. ``tempfile.TemporaryFile`` unlinks its file at once, so the directory's listing
would say nothing: an open descriptor is what holds the disk space.

The gateways are real, on 127.0.0.1:0; steps are ordered by awaiting events, never by
sleeping.
"""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import os
import socket
import tempfile
import threading
import wave
from pathlib import Path

import httpx
import orjson
import pytest

from engines.synthetic import SyntheticEngine
from gateway.core.audio_formats import Encoder
from gateway.io import http_api, spool
from gateway.io.spool import Spool
from tests.hang_guard import HANG_S, unless_hung
from tests.test_http_api import (
    TEXT,
    FailingEngine,
    base,
    leave_a_whole_wav_while_it_is_made,
    read_to_the_end,
    stalled_client,
)

PROC_FDS = Path("/proc/self/fd")


def open_files_in(directory: Path) -> list[str]:
    """The files of this process open in ``directory`` (deleted ones too); [] where the OS
    does not list them."""
    if not PROC_FDS.is_dir():
        return []
    found = []
    for fd in PROC_FDS.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # (closed meanwhile: the one listing the directory)
            continue
        if target.startswith(f"{directory}{os.sep}"):
            found.append(target)
    return found


class Spools(list[Spool]):
    """Every spool the HTTP port made, in order."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.rolled = threading.Event()
        """Set once one went to disk."""

    def assert_gone(self, count: int) -> None:
        """``count`` spools were made, each went to disk, and none is left open."""
        assert len(self) == count and all(s.on_disk for s in self), [
            (s.on_disk, s.closed) for s in self
        ]
        assert [s.closed for s in self] == [True] * count
        assert open_files_in(self.directory) == []


@pytest.fixture
def spools(tmp_path, monkeypatch) -> Spools:
    directory = tmp_path / "spool"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    monkeypatch.setattr(spool, "SPOOL_MEMORY_BYTES", 1000)
    made = Spools(directory)

    class Recorded(Spool):
        def __init__(self, memory_bytes: int | None = None) -> None:
            super().__init__(memory_bytes)
            made.append(self)

        def _roll(self) -> None:
            super()._roll()
            made.rolled.set()

    monkeypatch.setattr(http_api, "Spool", Recorded)
    return made


async def encoder_calls_done(gw) -> None:
    """Once the calls queued on the encoder thread so far have run (a compressed answer's
    spool is closed there, after its encoder)."""
    await unless_hung(asyncio.wrap_future(gw.http.encoder_thread.submit(lambda: None)))


# ---- the spool alone ----------------------------------------------------------------------


def test_a_spool_stays_in_memory_up_to_its_bound_then_goes_to_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    small, large = Spool(100), Spool(100)
    try:
        small.write(b"x" * 100)
        large.write(b"a" * 60)
        large.write(b"b" * 60)  # past 100: the 120 bytes go to disk
        large.seek(0)
        large.write(b"c")  # (a header rewritten at the start, as muxers do)
        large.seek(0, os.SEEK_END)
        large.write(b"d")
        assert not small.on_disk and large.on_disk
        assert small.size() == 100 and large.size() == 121
        assert large.read_at(0, 62) == b"c" + b"a" * 59 + b"bb"
        assert large.read_at(110, 64) == b"b" * 10 + b"d"  # short at the end
        assert large.read_at(121, 64) == b""
        assert len(open_files_in(tmp_path)) == (1 if PROC_FDS.is_dir() else 0)
    finally:
        small.close()
        large.close()
    assert small.closed and large.closed and open_files_in(tmp_path) == []


def test_a_spool_that_cannot_make_its_file_stays_in_memory_and_says_so(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    held = Spool(10)
    held.write(b"0123456789abc")
    held.write(b"def")
    assert not held.on_disk and held.size() == 16 and held.read_at(8, 100) == b"89abcdef"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "stays in memory past 13 bytes" in warned[0]
    assert str(tmp_path / "missing") in warned[0]
    held.close()


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "aac", "flac"])
def test_a_whole_file_written_to_a_spool_on_disk_is_the_one_made_in_memory(
    tmp_path, monkeypatch, fmt
):
    """Each muxer's fix-ups at the end (a WAV's or FLAC's lengths, MP3's LAME frame) are
    written back at the start of a file already on disk. (An Ogg stream's serial number is
    random: an Opus file is compared past it and its pages' checksums.)"""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pcm = bytes(range(256)) * 400  # 2 s of noise
    in_memory = Encoder(fmt, streamed=False)
    in_memory.encode(pcm[:50_000])
    in_memory.encode(pcm[50_000:])
    expected = in_memory.finish()
    out = Spool(1000)
    try:
        spooled = Encoder(fmt, streamed=False, out=out)
        assert spooled.encode(pcm[:50_000]) == spooled.encode(pcm[50_000:]) == b""
        assert spooled.finish() == b""
        spooled.close()
        assert out.on_disk and out.size() == len(expected)
        got = b"".join(out.read_at(at, 4096) for at in range(0, out.size(), 4096))
    finally:
        out.close()
    if fmt == "opus":
        got, expected = without_ogg_serials(got), without_ogg_serials(expected)
    assert got == expected


def without_ogg_serials(data: bytes) -> bytes:
    """``data``, an Ogg file, with each page's serial number and checksum zeroed."""
    out, at = bytearray(data), 0
    while at < len(out):
        assert out[at : at + 4] == b"OggS"
        out[at + 14 : at + 18] = out[at + 22 : at + 26] = bytes(4)
        segments = out[at + 26]
        at += 27 + segments + sum(out[at + 27 : at + 27 + segments])
    return bytes(out)


# ---- how a whole answer ends: its file is gone each way -----------------------------------


async def test_a_whole_answer_sent_in_full_leaves_no_file(start_gateway, spools):
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        wav = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "wav", "stream": False}
        )
        mp3 = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "mp3", "stream": False}
        )
        streamed = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "wav"}
        )
    await unless_hung(gw.http.idle.wait())
    await encoder_calls_done(gw)
    for answer in (wav, mp3):
        assert answer.status_code == 200
        assert int(answer.headers["content-length"]) == len(answer.content) > 1000
    with wave.open(io.BytesIO(wav.content)) as w:
        assert w.getnframes() * 2 == len(wav.content) - 44
        assert int(wav.headers["x-audio-ms"]) == round(w.getnframes() / 24)
        pcm = w.readframes(w.getnframes())
    assert pcm == streamed.content[44:]  # the same audio as streamed, every byte of it
    spools.assert_gone(2)  # (a streamed answer has none)


async def test_a_whole_answer_its_client_left_mid_file_leaves_no_file(start_gateway, spools):
    gw = await start_gateway()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", gw.http_port))
    # 230 s of audio, 11 MB: more than the loopback socket's buffers hold
    body = orjson.dumps(
        {"input": (TEXT + " ") * 60 + ".", "response_format": "wav", "stream": False}
    )
    await loop.sock_sendall(
        sock,
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    got = bytearray()
    while len(got) < 100_000:  # the headers and a part of the file
        got += await loop.sock_recv(sock, 1 << 16)
    assert len(spools) == 1 and not spools[0].closed  # being sent from it
    sock.close()
    await unless_hung(gw.http.idle.wait())
    assert got.startswith(b"HTTP/1.1 200 ")
    spools.assert_gone(1)


async def test_a_whole_answer_cut_by_a_shutdown_leaves_no_file(start_gateway, spools, monkeypatch):
    gw = await start_gateway()
    sock = await stalled_client(gw, monkeypatch, response_format="wav", stream=False)
    assert len(spools) == 1 and not spools[0].closed
    monkeypatch.setattr(http_api, "SHUTDOWN_GRACE_S", 0)  # over before the client reads
    await gw.aclose()
    data = await read_to_the_end(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert len(body) < int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    spools.assert_gone(1)


async def test_a_whole_answer_whose_encoder_failed_leaves_no_file(
    start_gateway, spools, monkeypatch
):
    real_mux = Encoder._mux

    def broken(self, samples):  # a TEST DOUBLE of a codec failing once some audio went out
        self.muxed = getattr(self, "muxed", 0) + 1
        if self.muxed > 3:
            raise RuntimeError("a test double's broken codec")
        real_mux(self, samples)

    monkeypatch.setattr(Encoder, "_mux", broken)
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        answer = await client.post(
            "/v1/audio/speech",
            json={"input": (TEXT + " ") * 4, "response_format": "mp3", "stream": False},
        )
    await encoder_calls_done(gw)
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "encoder_failed"
    spools.assert_gone(1)


async def test_a_whole_answer_whose_engine_failed_leaves_no_file(start_gateway, spools):
    """The engine fails at its second step, the first one's audio (more than the bound)
    spooled already."""
    gw = await start_gateway(engine=FailingEngine(rtf=0, ttfa_ms=0))
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        answers = [
            await client.post(
                "/v1/audio/speech",
                json={
                    "input": "A sentence long enough for two steps of audio.",
                    "response_format": fmt,
                    "stream": False,
                },
            )
            for fmt in ("wav", "pcm")
        ]
    await encoder_calls_done(gw)
    for answer in answers:
        assert answer.status_code == 502 and answer.json()["error"]["code"] == "engine_failed"
    spools.assert_gone(2)


async def test_a_whole_answer_its_client_left_while_it_was_made_leaves_no_file(
    start_gateway, spools, caplog
):
    caplog.set_level(logging.INFO)  # (the request's line, awaited)
    release = threading.Event()

    def sleep(seconds: float) -> None:  # a FAKE sleep: none, but held once the spool rolled
        if spools.rolled.is_set():
            assert release.wait(HANG_S), "never released"

    gw = await start_gateway(engine=SyntheticEngine(sleep=sleep))
    try:  # (it leaves once the answer is on disk, being made)
        await leave_a_whole_wav_while_it_is_made(gw, spools.rolled)
    finally:
        release.set()
    spools.assert_gone(1)


# ---- where the files go -------------------------------------------------------------------


async def test_an_answer_whose_temporary_file_cannot_be_made_is_answered_from_memory(
    start_gateway, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    monkeypatch.setattr(spool, "SPOOL_MEMORY_BYTES", 1000)
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        wav = await client.post(
            "/v1/audio/speech", json={"input": TEXT, "response_format": "wav", "stream": False}
        )
        pcm = await client.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"})
    assert wav.status_code == 200 and wav.content[44:] == pcm.content
    assert int(wav.headers["content-length"]) == len(wav.content)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("a whole speech answer stays in memory")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("text", "fmt"),
    [(TEXT, "wav"), ("Hi.", "pcm")],
    # past 64 KiB more after the roll, or not (and pcm: no seek to a header at the end)
    ids=["while-encoding", "at-its-end"],
)
async def test_a_disk_that_fills_up_under_an_answer_fails_it_with_a_precise_error(
    start_gateway, spools, monkeypatch, text, fmt
):
    class Full(io.FileIO):  # a TEST DOUBLE of a disk full once the file was made
        writes = 0

        def write(self, data):  # noqa: ANN001, ANN202
            self.writes += 1
            if self.writes > 1:  # (the first: what the spool held as it rolled)
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    def temporary_file(buffering: int) -> io.BufferedRandom:
        fd, path = tempfile.mkstemp()
        os.unlink(path)
        return io.BufferedRandom(Full(fd, "r+b"), buffering)

    monkeypatch.setattr(spool.tempfile, "TemporaryFile", temporary_file)
    gw = await start_gateway()
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base(gw)) as client:
        answer = await client.post(
            "/v1/audio/speech", json={"input": text, "response_format": fmt, "stream": False}
        )
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "encoder_failed"
    assert answer.json()["error"]["message"] == (
        f"writing {fmt} failed: OSError: [Errno 28] No space left on device"
    )
    spools.assert_gone(1)
