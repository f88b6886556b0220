"""A flood of refused requests is not a flood of log lines: the first few of each kind are
logged, then how many were left out; the counters in /metrics count every one."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest

from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.log_limit import LOGGERS, LogLimit, limited
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S


def record(kind: str | None, created: float) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "tests.refusals", "levelno": logging.INFO,
                                  "levelname": "INFO", "msg": "refused", "created": created,
                                  **(limited(kind) if kind else {})})


def test_the_first_of_each_kind_pass_then_the_next_window_says_how_many_were_left_out(
        caplog):
    limit = LogLimit(logged=2, window_s=60)
    caplog.set_level(logging.INFO, logger="tests.refusals")
    passed = [limit.filter(record("bad_token", t)) for t in (0, 1, 2, 3, 59.9)]
    assert passed == [True, True, False, False, False]
    assert limit.filter(record("malformed", 30))  # each kind has its own
    assert limit.filter(record(None, 30))  # not a refusal
    assert caplog.records == []
    assert limit.filter(record("bad_token", 60))  # a new window
    (summary,) = caplog.records
    assert summary.levelno == logging.INFO
    assert summary.getMessage().startswith("3 more line(s) of this kind (bad_token) since ")
    assert summary.getMessage().endswith(" were not logged (at most 2 per 60 s; /metrics "
                                         "counts them all)")
    assert limit.filter(record("bad_token", 61)) and not limit.filter(record("bad_token", 62))
    caplog.clear()
    assert limit.filter(record("bad_token", 500))  # nothing was left out: no summary
    assert limit.filter(record("bad_token", 1000)) and len(caplog.records) == 1


async def test_a_flood_of_refused_requests_logs_a_few_lines_and_counts_them_all(caplog):
    """One client sent ~800 speech requests a second with a bad token, or ~1,400 malformed
    ones: each wrote a log line."""
    caplog.set_level(logging.INFO)
    gw = Gateway(load_config(server={"port": 0, "tokens": ("s3cret",)},
                             llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    gw.log_limit.window_s = 3600  # (the test's requests all fall in one window)
    flood = 3 * gw.log_limit.logged
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            for _ in range(flood):
                answer = await http.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                         json={"input": "Hi."},
                                         headers={"Authorization": "Bearer wrong"})
                assert answer.status_code == 401
                reader, writer = await asyncio.open_connection("127.0.0.1", gw.http_port)
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                assert (await reader.read()).startswith(b"HTTP/1.1 400")
                writer.close()
        metrics = gw.telemetry.registry.get_sample_value(
            "gateway_http_speech_requests_total",
            {"format": "-", "stream": "-", "status": "rejected"})
    finally:
        await gw.aclose()
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if m.startswith("speech rejected: 401")]) == gw.log_limit.logged
    assert len([m for m in said if "refused (400)" in m]) == gw.log_limit.logged
    assert gw.metrics.errors["unauthorized"] == flood and metrics == flood
    # closed, the gateway leaves no filter on the loggers
    assert not any(isinstance(f, LogLimit) for name in LOGGERS
                   for f in logging.getLogger(name).filters)


async def test_a_request_either_port_refuses_is_a_line_naming_the_client_and_why(caplog):
    """A phone refused for a wrong token (401), a page of an origin not allowed (403) and a
    socket past max_sessions (503) left no line on the voice port, nor /metrics without a
    token on the HTTP port: the operator of a phone that could not connect read a silent
    log. Each is now one line (limited as the others; the token in the query is not in it)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    from tests.wsclient import recv_event

    caplog.set_level(logging.INFO)
    gw = Gateway(load_config(server={"port": 0, "tokens": ("s3cret",), "max_sessions": 1,
                                     "origins": ("https://hub.example",)},
                             llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    voice = f"ws://127.0.0.1:{gw.port}/v1/voice"
    statuses = []
    try:
        async with connect(f"{voice}?token=s3cret") as ws:  # the one session it takes
            await recv_event(ws, "session.created")
            for refused in ({"uri": f"{voice}?token=wrong-one"},
                            {"uri": f"{voice}?token=s3cret", "origin": "https://evil.example"},
                            {"uri": f"{voice}?token=s3cret"}):
                with pytest.raises(InvalidStatus) as info:
                    async with connect(**refused):
                        pass
                statuses.append(info.value.response.status_code)
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            answer = await http.get(f"http://127.0.0.1:{gw.http_port}/metrics")
            statuses.append(answer.status_code)
    finally:
        await gw.aclose()
    assert statuses == [401, 403, 503, 401]
    said = [r.getMessage() for r in caplog.records if " refused (" in r.getMessage()]
    assert len(said) == 4, said
    peer = r"from 127\.0\.0\.1:\d+ refused"
    assert re.fullmatch(rf"/v1/voice {peer} \(401 unauthorized\): a valid token is required .*",
                        said[0])
    assert re.fullmatch(rf"/v1/voice {peer} \(403 forbidden_origin\): .*evil\.example.*",
                        said[1])
    assert re.fullmatch(rf"/v1/voice {peer} \(503 server_full\): too many sessions; .*",
                        said[2])
    assert re.fullmatch(rf"/metrics {peer} \(401 invalid_api_key\): a valid API key .*",
                        said[3])
    assert not any("wrong-one" in m for m in said)
