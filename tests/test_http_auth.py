"""The HTTP API port takes the voice socket's tokens; no token ever reaches a log line."""

from __future__ import annotations

import logging

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.io.auth import RedactTokens, install_redaction, redact
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S
from tests.servers import ServeProcess
from tests.wsclient import read_turn, recv_event, send

SECRET = "s3cret-Token_value"
OTHER = "second-token-xyz"


@pytest.fixture
async def gateway():
    gw = Gateway(load_config(server={"port": 0, "tokens": (SECRET, OTHER)},
                             llm={"tokens_per_s": 0}, session={"max_lead_ms": 30_000}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.aclose()


def assert_openai_401(response: httpx.Response) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"error": {
        "message": response.json()["error"]["message"], "type": "invalid_request_error",
        "param": None, "code": "invalid_api_key"}}


async def test_http_api_requires_a_token_except_health(gateway):
    base = f"http://127.0.0.1:{gateway.http_port}"
    speech = {"input": "Hello there.", "response_format": "wav"}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base) as http:
        assert_openai_401(await http.post("/v1/audio/speech", json=speech))
        assert_openai_401(await http.post("/v1/audio/speech", json=speech,
                                          headers={"Authorization": "Bearer nope"}))
        for path in ("/v1/models", "/v1/audio/voices", "/metrics"):
            assert_openai_401(await http.get(path))
        assert (await http.get("/health")).status_code == 200  # open for probes
        ok = await http.post("/v1/audio/speech", json=speech,
                             headers={"Authorization": f"Bearer {SECRET}"})
        assert ok.status_code == 200 and ok.content[:4] == b"RIFF"
        assert (await http.get(f"/v1/models?token={OTHER}")).status_code == 200
        assert (await http.get("/metrics", headers={"Authorization": f"bearer {OTHER}"})
                ).status_code == 200
    assert gateway.metrics.errors["unauthorized"] == 5
    # the two refused speech requests are counted (and logged) as speech refusals are
    refused = gateway.telemetry.http_speech.labels("-", "-", "rejected")._value.get()
    assert refused == 2


async def test_voice_port_routes_need_the_token_too(gateway):
    base = f"http://127.0.0.1:{gateway.port}"
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base) as http:
        for path in ("/metrics", "/v1/models", "/v1/models/synthetic"):
            refused = await http.get(path)
            assert refused.status_code == 401
            # RFC 9110's "MUST" for a 401, and what docs/http-api.md says both ports send
            assert refused.headers["www-authenticate"] == "Bearer"
            # OpenAI's shape, as the HTTP API port's; the code the voice socket's refusal has
            assert refused.json() == {"error": {
                "message": refused.json()["error"]["message"], "type": "invalid_request_error",
                "param": None, "code": "unauthorized"}}
            assert (await http.get(path, headers={"Authorization": f"Bearer {SECRET}"})
                    ).status_code == 200
        assert (await http.get("/health")).status_code == 200
        # two Authorization headers: which one is meant? a 401 (it was a 500)
        two = [("Authorization", f"Bearer {SECRET}"), ("Authorization", "Bearer x")]
        assert (await http.get("/v1/models", headers=two)).status_code == 401


async def test_tokens_never_reach_the_logs(gateway, caplog):
    caplog.set_level(logging.DEBUG)  # websockets logs every request line at DEBUG
    caplog.set_level(logging.DEBUG, logger="websockets.server")  # (the CLI quiets it)
    voice = f"ws://127.0.0.1:{gateway.port}/v1/voice"
    with pytest.raises(InvalidStatus):
        async with connect(f"{voice}?token=wrong-{SECRET}"):
            pass
    async with connect(f"{voice}?token={SECRET}") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text="A turn with a token.")
        assert (await read_turn(ws)).done["status"] == "completed"
    async with connect(voice, additional_headers={"Authorization": f"Bearer {OTHER}"}) as ws:
        await recv_event(ws, "session.created")
    async with httpx.AsyncClient(timeout=HANG_S) as http:
        r = await http.post(f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech?token={OTHER}",
                            json={"input": "Hi."})
        assert r.status_code == 200
    # the gateway's side: not the test's own clients (httpx, websockets.client)
    server_side = [r for r in caplog.records
                   if not r.name.startswith(("httpx", "httpcore", "websockets.client"))]
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in server_side)
    assert "v1/voice" in text  # the request lines were logged...
    assert SECRET not in text and OTHER not in text  # ...without the tokens


def test_redact_masks_query_and_bearer_tokens():
    assert redact("GET /v1/voice?token=abc&x=1 HTTP/1.1") == "GET /v1/voice?token=***&x=1 HTTP/1.1"
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer ***"
    assert redact("subprotocol bearer.abc") == "subprotocol bearer.***"
    assert redact("Authorization: BEARER a!b$c@d") == "Authorization: BEARER ***"
    assert redact("Sec-WebSocket-Protocol: bearer.a!b#c, voice.v1") == \
        "Sec-WebSocket-Protocol: bearer.***, voice.v1"
    assert redact("nothing secret here") == "nothing secret here"


def test_redaction_masks_the_values_of_a_mapping_of_args():
    record = logging.LogRecord("lib", logging.INFO, __file__, 1, "%(path)s after %(n)d",
                               ({"path": "/v1/voice?token=abc", "n": 3},), None)
    assert RedactTokens().filter(record)
    assert record.getMessage() == "/v1/voice?token=*** after 3"


async def test_a_refusal_is_logged_in_the_words_its_client_reads(caplog):
    """The mask took the placeholders of the 401 messages for tokens: the log read "send
    'Authorization: Bearer *** with one of the gateway's tokens" and "?token=*** or a
    'bearer.*** WebSocket subprotocol)" while the client read what to send."""
    caplog.set_level(logging.INFO)
    gw = Gateway(load_config(server={"port": 0, "tokens": (SECRET,)}, llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            answers = [
                await http.post(f"http://127.0.0.1:{gw.http_port}/v1/audio/speech",
                                json={"input": "Hi."}, headers={"Authorization": "Bearer x"}),
                await http.get(f"http://127.0.0.1:{gw.http_port}/metrics"),
                await http.get(f"http://127.0.0.1:{gw.port}/metrics?token=x")]
    finally:
        await gw.aclose()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("gateway")]
    for answer in answers:
        assert answer.status_code == 401
        message = answer.json()["error"]["message"]
        assert "<token>" in message
        assert [line for line in said if line.endswith(f": {message}")], (message, said)


REQUEST_LINE_LOGGERS = ("websockets.server", "uvicorn.error", "uvicorn.access")


def test_install_redaction_masks_request_lines_before_any_handler_sees_them():
    """A handler of the request-line loggers' own (an application's logging config) sees
    their records before the root handlers do, so these loggers carry the filter; records
    of every other logger are masked by the root handlers'. Installed twice, once."""
    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(f"{record.name}: {record.getMessage()}")

    loggers = [logging.getLogger(name) for name in REQUEST_LINE_LOGGERS]
    root, own = Keep(), Keep()
    for logger in loggers:  # (an earlier test's gateway installed it)
        for f in [f for f in logger.filters if isinstance(f, RedactTokens)]:
            logger.removeFilter(f)
    logging.getLogger().addHandler(root)
    try:
        install_redaction()
        install_redaction()
        for logger in loggers:
            assert sum(isinstance(f, RedactTokens) for f in logger.filters) == 1
            logger.addHandler(own)
            logger.error("GET /v1/voice?token=s3cret HTTP/1.1")
            logger.removeHandler(own)
        logging.getLogger("some.library").error("GET /v1/voice?token=s3cret HTTP/1.1")
    finally:
        logging.getLogger().removeHandler(root)
    assert [line.split(":")[0] for line in own.lines] == list(REQUEST_LINE_LOGGERS)
    assert "some.library: GET /v1/voice?token=*** HTTP/1.1" in root.lines
    assert not [line for line in own.lines + root.lines if "s3cret" in line]


@pytest.mark.slow
def test_the_cli_at_debug_level_never_prints_a_token():
    import asyncio
    import signal

    with ServeProcess("--port", "0", "--tts", "synthetic", "--token", SECRET,
                      "--log-level", "DEBUG") as gw:
        voice, http_port = gw.voice_url, gw.http_port

        async def talk() -> None:
            with pytest.raises(InvalidStatus):
                async with connect(f"{voice}?token=wrong-{SECRET}"):
                    pass
            async with connect(f"{voice}?token={SECRET}") as ws:
                await recv_event(ws, "session.created")
                await send(ws, type="say", text="Hello.")
                await read_turn(ws)
            async with httpx.AsyncClient(timeout=HANG_S) as http:
                r = await http.post(f"http://127.0.0.1:{http_port}/v1/audio/speech"
                                    f"?token={SECRET}", json={"input": "Hi."})
                assert r.status_code == 200

        asyncio.run(talk())
        gw.signal(signal.SIGTERM)
        output = gw.finish()[1]
    assert "/v1/voice?token=***" in output  # the request line was logged, masked
    assert SECRET not in output


async def test_a_browser_app_on_another_origin_may_call_the_api(gateway):
    # CORS: the preflight carries no token and must not be refused for it; the answer to
    # the real request lets the page read the audio and the X- headers
    base = f"http://127.0.0.1:{gateway.http_port}"
    origin = {"Origin": "http://hub.local:3000"}
    async with httpx.AsyncClient(timeout=HANG_S, base_url=base) as http:
        preflight = await http.options("/v1/audio/speech", headers={
            **origin, "Access-Control-Request-Method": "POST",
            # (OpenAI's JS SDK adds its x-stainless-* headers to every request)
            "Access-Control-Request-Headers": "authorization,content-type,"
                                              "x-stainless-retry-count,x-stainless-lang"})
        speech = await http.post("/v1/audio/speech", json={"input": "Hi.", "stream": False},
                                 headers={**origin, "Authorization": f"Bearer {SECRET}"})
        refused = await http.post("/v1/audio/speech", json={"input": "Hi."}, headers=origin)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "x-stainless-lang" in preflight.headers["access-control-allow-headers"].lower()
    assert speech.status_code == 200 and speech.headers["access-control-allow-origin"] == "*"
    exposed = speech.headers["access-control-expose-headers"].lower()
    assert "x-audio-ms" in exposed
    # a 503's Retry-After too (not a CORS-safelisted header): OpenAI's JS SDK, and a page's
    # own retry, read it to wait as long as the gateway asks
    assert "retry-after" in exposed
    # a refusal is readable too (the page can show why)
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"


async def test_with_an_origin_allowlist_only_those_origins_get_cors():
    gw = Gateway(load_config(server={"port": 0, "origins": ("http://hub.local:3000",)},
                             llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            allowed = await http.get("/v1/models", headers={"Origin": "http://hub.local:3000"})
            other = await http.get("/v1/models", headers={"Origin": "http://evil.example"})
            # a page's "simple" POST needs no preflight: refused, not spoken unseen
            simple = await http.post("/v1/audio/speech", content=b'{"input": "Hi."}',
                                     headers={"Origin": "http://evil.example",
                                              "Content-Type": "text/plain"})
            no_origin = await http.post("/v1/audio/speech", json={"input": "Hi."})
            preflight = await http.options("/v1/audio/speech", headers={
                "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
            two = await http.get("/v1/models", headers=[("Origin", "http://hub.local:3000"),
                                                        ("Origin", "http://evil.example")])
    finally:
        await gw.aclose()
    assert allowed.headers["access-control-allow-origin"] == "http://hub.local:3000"
    assert "access-control-allow-origin" not in other.headers
    assert other.status_code == simple.status_code == two.status_code == 403  # (as the WS upgrade)
    assert simple.json()["error"]["code"] == "forbidden_origin"
    assert no_origin.status_code == 200  # not a browser: let in, as on the voice socket
    # as http-api.md says: the CORS layer's own refusal, which the browser obeys
    assert (preflight.status_code, preflight.text) == (400, "Disallowed CORS origin")
    assert "access-control-allow-origin" not in preflight.headers


async def test_without_tokens_a_page_of_another_site_cannot_call_the_api():
    # a page's simple POST (no preflight) was spoken, and CORS "*" let it read the audio
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            simple = await http.post("/v1/audio/speech", content=b'{"input": "Hi."}',
                                     headers={"Origin": "http://evil.example",
                                              "Content-Type": "text/plain"})
            models = await http.get("/v1/models", headers={"Origin": "http://evil.example"})
            no_origin = await http.post("/v1/audio/speech", json={"input": "Hi."})
            health = await http.get("/health", headers={"Origin": "http://evil.example"})
            # the voice port's plain GETs answer any Origin, with no CORS header to read them
            voice_port = await http.get(f"http://127.0.0.1:{gw.port}/v1/models",
                                        headers={"Origin": "http://evil.example"})
    finally:
        await gw.aclose()
    assert health.status_code == 200  # open on purpose, as to a client without a token
    assert "access-control-allow-origin" not in health.headers
    assert voice_port.status_code == 200
    assert "access-control-allow-origin" not in voice_port.headers
    assert simple.status_code == models.status_code == 403
    assert simple.json()["error"]["code"] == "forbidden_origin"
    assert "access-control-allow-origin" not in models.headers
    assert no_origin.status_code == 200  # not a browser


async def test_origins_star_lets_any_page_call_the_api():
    gw = Gateway(load_config(server={"port": 0, "origins": ("*",)}, llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as http:
            models = await http.get("/v1/models", headers={"Origin": "http://app.example"})
    finally:
        await gw.aclose()
    assert models.status_code == 200
    assert models.headers["access-control-allow-origin"] == "*"


async def test_tokens_of_any_characters_and_case_never_reach_the_logs(caplog):
    # websockets logs every request header at DEBUG. The masks stopped at the first
    # character outside [A-Za-z0-9._~+/=-] ("Bearer ***!c$d#Secret9") and missed a
    # scheme the gateway accepts in any case ("BEARER <token>" was logged whole).
    token = "Ab!c$d#Secret9"
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="websockets.server")  # (the CLI quiets it)
    gw = Gateway(load_config(server={"port": 0, "tokens": (token,)}, llm={"tokens_per_s": 0}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        voice = f"ws://127.0.0.1:{gw.port}/v1/voice"
        for offer in ({"additional_headers": {"Authorization": f"Bearer {token}"}},
                      {"additional_headers": {"Authorization": f"BEARER {token}"}},
                      {"subprotocols": ["voice.v1", f"bearer.{token}"]}):
            async with connect(voice, **offer) as ws:
                await recv_event(ws, "session.created")
        with pytest.raises(InvalidStatus):  # a near miss (a typo) is not logged either
            async with connect(voice, additional_headers={
                    "Authorization": f"bearer {token}x"}):
                pass
    finally:
        await gw.aclose()
    server_side = [r for r in caplog.records
                   if not r.name.startswith(("httpx", "httpcore", "websockets.client"))]
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in server_side)
    assert "Authorization" in text  # the headers were logged...
    assert "Secret9" not in text  # ...without the tokens, or any part of them


async def test_the_llm_urls_password_is_shown_to_no_one(refused_port, caplog):
    # An LLM behind a proxy with basic auth is configured as http://user:password@host/v1.
    # /health (open to anyone on the LAN, tokens or not) showed that URL whole, and so did
    # every llm_unavailable error sent to a voice client and the log lines about the LLM.
    caplog.set_level(logging.INFO)
    gw = Gateway(load_config(server={"port": 0, "tokens": (SECRET,)},
                             llm={"url": f"http://hub:pa55word@127.0.0.1:{refused_port}/v1"}),
                 engine=SyntheticEngine(rtf=0, ttfa_ms=0, lane="cpu"))
    await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice?token={SECRET}") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="Hello?")
            turn = await read_turn(ws)
        async with httpx.AsyncClient(timeout=HANG_S) as http:
            health = [(await http.get(f"http://127.0.0.1:{port}/health")).text
                      for port in (gw.port, gw.http_port)]
    finally:
        await gw.aclose()
    (error,) = turn.of("error")
    assert error["error"]["code"] == "llm_unavailable"
    assert f"127.0.0.1:{refused_port}" in error["error"]["message"]  # still says where
    seen = [error["error"]["message"], *health,
            *(r.getMessage() for r in caplog.records if not r.name.startswith("httpx"))]
    assert all("pa55word" not in text for text in seen), seen
