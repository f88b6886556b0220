"""OpenAiLlm against a scripted server (exact bytes) and a real mlx_lm.server (tiny llama)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from engines.base import (
    EngineError,
    LlmContextFull,
    LlmDelta,
    LlmDone,
    LlmEvent,
    LlmRequest,
    NewConnectionWatch,
    ServerUnreachable,
)
from engines.llm_openai import OpenAiLlm, ThinkFilter, tokens_per_s_from
from tests.hang_guard import HANG_S, hang_guard
from tests.servers import (
    OMLX_KEEPALIVE,
    Burst,
    Comment,
    Done,
    Drop,
    EncodedSseServer,
    Finish,
    Hang,
    KeepAlive,
    Raw,
    ScriptedLlmServer,
    Status,
    Text,
    Usage,
    reply_script,
    resetting_port,
)

REQUEST = LlmRequest(messages=[{"role": "user", "content": "Hi"}])
OMLX_USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 3,
    "total_tokens": 15,
    "time_to_first_token": 0.21,
    "prompt_tokens_per_second": 240.0,
    "generation_tokens_per_second": 51.5,
}


async def collect(llm: OpenAiLlm, request: LlmRequest = REQUEST) -> list[LlmEvent]:
    async with hang_guard("the stream's end"):  # client timeouts are what is tested
        return [event async for event in llm.stream(request)]


async def failure(llm: OpenAiLlm) -> EngineError:
    """The EngineError that ends a turn's stream: the test fails if the stream ends well."""
    with pytest.raises(EngineError) as info:
        await collect(llm)
    return info.value


async def failure_closing(llm: OpenAiLlm) -> EngineError:
    """``failure`` of a backend the test made for itself, closed whatever the stream did."""
    try:
        return await failure(llm)
    finally:
        await llm.aclose()


@pytest.fixture
async def llm(scripted_llm_server: ScriptedLlmServer):
    # (a read timeout that bounds a hang, not one any test holds: at 1 s a server slowed by a
    # starved machine before its first byte failed the stream llm_unavailable)
    backend = OpenAiLlm(scripted_llm_server.url, timeout=httpx.Timeout(5.0, read=30.0))
    yield backend
    await backend.aclose()


async def test_exact_text_and_usage_after_finish(llm, scripted_llm_server):
    scripted_llm_server.script(
        [
            Comment("keepalive 1/2"),
            Comment("keepalive 2/2"),
            Text("Hel"),
            Text("lo, "),
            Text("world."),
            Finish("stop"),
            Usage(OMLX_USAGE),  # after finish_reason, as oMLX and mlx_lm.server send it
            Done(),
        ]
    )
    events = await collect(llm)
    assert events == [
        LlmDelta("Hel"),
        LlmDelta("lo, "),
        LlmDelta("world."),
        LlmDone(finish_reason="stop", tokens_per_s=51.5, usage=OMLX_USAGE),
    ]


async def test_request_body_and_headers(scripted_llm_server):
    plain = OpenAiLlm(scripted_llm_server.url)
    named = OpenAiLlm(scripted_llm_server.url + "/", model="gemma", api_key="sk-test")
    try:
        await collect(plain)
        await collect(named, LlmRequest(REQUEST.messages, temperature=0.2, max_tokens=7))
    finally:
        await plain.aclose()
        await named.aclose()
    first, second = scripted_llm_server.requests
    assert first.path == second.path == "/v1/chat/completions"
    assert first.body == {
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }  # no "model": mlx_lm.server would try the hub for an unknown name
    assert "authorization" not in first.headers
    assert second.body["model"] == "gemma"
    assert second.body["temperature"] == 0.2
    assert second.body["max_tokens"] == 7
    assert second.headers["authorization"] == "Bearer sk-test"


async def test_a_server_that_refuses_stream_options_is_asked_without_them(
        llm, scripted_llm_server, caplog):
    """Azure AI's serverless models answer 400 "Extra parameters ['stream_options'] are not
    allowed", Mistral's API 422 "extra_forbidden": every turn failed llm_failed."""
    scripted_llm_server.refused_fields = ("stream_options",)
    scripted_llm_server.script(reply_script(["Hi there."]), reply_script(["Again."]))
    first = await collect(llm)
    assert [e.text for e in first if isinstance(e, LlmDelta)] == ["Hi there."]
    assert isinstance(first[-1], LlmDone)
    refused, asked_again = scripted_llm_server.chats
    assert "stream_options" in refused.body and "stream_options" not in asked_again.body
    (warning,) = [r for r in caplog.records if r.name == "engines.llm_openai"]
    assert "refuses stream_options (LLM server answered HTTP 400: " in warning.getMessage()
    # remembered: the next turn goes without them at once
    assert [e.text for e in await collect(llm) if isinstance(e, LlmDelta)] == ["Again."]
    assert len(scripted_llm_server.chats) == 3
    assert "stream_options" not in scripted_llm_server.chats[2].body


async def test_a_refusal_that_only_echoes_stream_options_leaves_them_on(
        llm, scripted_llm_server, caplog):
    """A FastAPI/pydantic server (vLLM, SGLang, llama-cpp-python are built so) answers a
    request that fails validation for another reason, here a missing ``model``, with a 422
    whose ``input`` echoes the whole body, ``stream_options`` included: the gateway said
    the server refuses them (a WARNING naming the wrong cause) and never asked for usage
    again, though the answer without them failed the same way. They are off only once a
    request without them is answered."""
    def missing_model(body: bytes) -> Status:
        return Status(422, b'{"detail":[{"type":"missing","loc":["body","model"],"msg":'
                      b'"Field required","input":' + body + b"}]}")

    scripted_llm_server.script(
        [missing_model(b'{"stream":true,"stream_options":{"include_usage":true}}')],
        [missing_model(b'{"stream":true}')], reply_script(["Hi."]))
    failed = await failure(llm)
    assert failed.code == "llm_failed"
    assert '"input":{"stream":true}}]}' in failed.message  # (the answer without them)
    assert llm.stream_options
    assert not [r for r in caplog.records if "refuses stream_options" in r.getMessage()]
    await collect(llm)
    assert "stream_options" in scripted_llm_server.chats[2].body


async def test_another_400_naming_no_stream_options_still_fails(llm, scripted_llm_server):
    scripted_llm_server.script([Status(400, b'{"error": {"message": "bad temperature"}}')])
    failed = await failure(llm)
    assert failed.code == "llm_failed" and "bad temperature" in failed.message
    assert len(scripted_llm_server.chats) == 1 and llm.stream_options


async def test_burst_of_chunks_in_one_write_yields_to_the_loop(llm, scripted_llm_server):
    words = [f" w{i}" for i in range(300)]
    pieces = ["".join(words[i : i + 7]) for i in range(0, 300, 7)]  # 43 chunks, ~7 tokens each
    scripted_llm_server.script([Burst(tuple(reply_script(pieces, usage=OMLX_USAGE)))])

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    seen: list[int] = []
    text = ""
    done = None
    task = asyncio.create_task(ticker())
    try:
        async with hang_guard("the stream's end"):
            async for event in llm.stream(REQUEST):
                if isinstance(event, LlmDelta):
                    text += event.text
                    seen.append(ticks)
                else:
                    done = event
    finally:
        task.cancel()
    assert text == "".join(words)
    assert done == LlmDone("stop", 51.5, OMLX_USAGE)
    # Another task ran while the buffered burst was being consumed.
    assert seen[-1] - seen[0] >= len(pieces) - 1


async def test_keepalives_ids_and_role_only_deltas_are_skipped(llm, scripted_llm_server):
    scripted_llm_server.script(
        [
            Comment("keepalive 3/40"),
            Raw(b"id: 1\n\n"),  # an event without data
            Raw(b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'),
            Text("A"),
            Comment(""),
            Text("B"),
            Raw(b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n'),
            Finish("length"),
            Done(),
        ]
    )
    assert await collect(llm) == [LlmDelta("A"), LlmDelta("B"), LlmDone("length", None, None)]


async def test_replacement_chars_and_invalid_utf8_pass_through_as_text(llm, scripted_llm_server):
    scripted_llm_server.script(
        [
            Text("a\ufffdb"),
            Raw(b'data: {"choices":[{"index":0,"delta":{"content":"x\xffy"}}]}\n\n'),
            Finish(),
            Done(),
        ]
    )
    events = await collect(llm)
    assert events[:2] == [LlmDelta("a\ufffdb"), LlmDelta("x\ufffdy")]


async def test_finish_without_done_is_accepted_and_done_without_finish_too(
    llm, scripted_llm_server
):
    scripted_llm_server.script([Text("a"), Finish("stop")], [Text("b"), Done()])
    assert await collect(llm) == [LlmDelta("a"), LlmDone("stop")]
    assert await collect(llm) == [LlmDelta("b"), LlmDone(None)]


async def test_connection_is_reused_between_streams(llm, scripted_llm_server):
    await collect(llm)
    await collect(llm)
    ports = {r.client_port for r in scripted_llm_server.requests}
    assert len(scripted_llm_server.requests) == 2 and len(ports) == 1


@pytest.mark.parametrize(
    ("script", "fragment"),
    [
        ([Status(500, b"Internal meltdown")], "HTTP 500: 'Internal meltdown'"),
        ([Status(404, b'{"error": "no such model"}')], "HTTP 404"),
        ([Status(200, b'{"choices": []}', "application/json")], "not an event stream"),
        ([Text("ok"), Raw(b"data: {not json\n\n"), Done()], "malformed JSON"),
        # orjson before 3.9.15 had no depth limit: it recursed down 500,000 brackets until
        # the stack ran out, and the whole gateway died of a segmentation fault
        ([Text("ok"), Raw(b"data: " + b"[" * 500_000 + b"]" * 500_000 + b"\n\n")],
         "malformed JSON"),
        ([Raw(b'data: {"error": {"message": "model crashed"}}\n\n')], "model crashed"),
        # vLLM's own error shape (some versions stream it unwrapped), then [DONE]: the cut
        # reply was taken as whole
        ([Text("half a rep"), Raw(b'data: {"object": "error", "message": "out of KV cache", '
                                  b'"type": "InternalServerError", "param": null, "code": 500}'
                                  b'\n\n'), Done()], "out of KV cache"),
        # an error event in a shape of its own: the reply ended "without finish_reason",
        # and the server's reason was lost
        ([Text("One. "), Raw(b'event: error\ndata: {"message": "boom"}\n\n')], "boom"),
        ([Text("One. "), Raw(b'event: error\ndata: out of memory\n\n')], "out of memory"),
        # llama.cpp until September 2025 (its PR #16109) named the field "error", which SSE
        # parsers skip, and ended with [DONE]: the turn was taken as whole (or empty)
        ([Text("One. "), Raw(b'error: {"code": 500, "message": "Failed to decode the batch"}'
                             b'\n\n'), Done()], "Failed to decode the batch"),
        ([Text("One. "), Raw(b'error: {"message": "slot unavailable"}\n\n')],
         "slot unavailable"),
        ([Text("half a rep"), Drop()], "broke off"),
        ([Text("no ending")], "without finish_reason or [DONE]"),
        # vLLM ends an aborted request (engine shutdown, a pause, memory) as if it finished
        ([Text("half a rep"), Finish("abort"), Done()], "ended the reply early ('abort')"),
        ([Text("half a rep"), Finish("error"), Done()], "ended the reply early ('error')"),
        # shapes no OpenAI-compatible server sends: named, not a Python error from deep in
        # the gateway with a traceback
        ([Raw(b'data: {"choices": ["oops"]}\n\n')], "malformed LLM chunk ('delta')"),
        ([Raw(b'data: {"choices": {"delta": {}}}\n\n')], "malformed LLM chunk ('choices')"),
        ([Raw(b'data: [{"choices": []}]\n\n')], "unexpected LLM chunk"),
        ([Raw(b'data: {"choices": [{"delta": {"content": 42}}]}\n\n')],
         "malformed LLM chunk (not text)"),
        ([Raw(b'data: {"choices": [{"delta": {"content": [{"type": "text"}]}}]}\n\n')],
         "malformed LLM chunk (not text)"),
    ],
    ids=["500", "404", "not-sse", "bad-json", "deep-json", "error-payload", "vllm-error-object",
         "error-event-json", "error-event-text", "llama-cpp-error-field",
         "llama-cpp-error-field-no-done", "dropped", "no-finish",
         "finish-abort", "finish-error",
         "choice-not-object", "choices-not-list", "chunk-not-object", "content-number",
         "content-parts"],
)
async def test_failures_map_to_llm_failed(llm, scripted_llm_server, script, fragment):
    scripted_llm_server.script(script)
    error = await failure(llm)
    assert error.code == "llm_failed"
    assert fragment in error.message


@pytest.mark.parametrize(
    "script", [[Hang()], [Comment(), Text("a"), Hang()],
               # oMLX's keep-alives are chunks with an empty delta: they held it open for ever
               [KeepAlive(every_s=0.05, chunk=True)]],
    ids=["before-headers", "mid-stream", "omlx-keep-alive-chunks"]
)
async def test_a_server_that_hangs_times_out_as_unavailable(scripted_llm_server, script):
    # [llm] stall_timeout_s bounds the wait for the headers too: it used to be a fixed 60 s
    llm = OpenAiLlm(scripted_llm_server.url, stall_s=0.3)
    scripted_llm_server.script(script)
    error = await failure_closing(llm)
    assert error.code == "llm_unavailable"
    assert f"LLM server {scripted_llm_server.url} sent no" in error.message
    assert " for 0.3 s " in error.message
    async with hang_guard("the server seeing the client leave"):
        await scripted_llm_server.requests[0].disconnected.wait()


@pytest.mark.parametrize("chunk", [False, True], ids=["comments", "omlx-chunks"])
async def test_keep_alives_after_the_last_token_do_not_hold_the_stream_open(
        scripted_llm_server, chunk):
    # every comment resets httpx's read timeout; the stall bound counts data events only,
    # and of those only the ones that say something: oMLX's keep-alives (its default
    # sse_keepalive_mode "chunk") are data chunks with an empty delta, and held a turn of a
    # stuck oMLX open for ever.
    # stall_s is HANG_S until the token has come, and 1 s from then on (the stream reads it
    # at each wait): a short stall_s from the start bounded the wait for "Half a reply" too,
    # and a machine stalled that long failed the test before its first token. After the
    # token a slow machine only makes the end come later; keep-alives that reset the bound
    # keep the stream open until hang_guard ends it.
    llm = OpenAiLlm(scripted_llm_server.url, stall_s=HANG_S)
    scripted_llm_server.script(
        [Comment(), Text("Half a reply"), KeepAlive(every_s=0.05, chunk=chunk)])
    got = []
    try:
        with pytest.raises(EngineError) as info:
            async with hang_guard("the stream's end"):  # (as in collect)
                async for event in llm.stream(REQUEST):
                    got.append(event)
                    llm.stall_s = 1.0
    finally:
        await llm.aclose()
    assert [e.text for e in got] == ["Half a reply"]
    assert info.value.code == "llm_unavailable"
    assert info.value.message == (f"LLM server {scripted_llm_server.url} sent no data for "
                                  "1 s (deltas so far: 1)")
    # (the server was still sending keep-alives: it saw the client leave mid-response)
    async with hang_guard("the server seeing the client leave"):
        await scripted_llm_server.requests[0].disconnected.wait()


async def test_omlx_keep_alive_chunks_between_tokens_are_nothing_said(scripted_llm_server):
    llm = OpenAiLlm(scripted_llm_server.url, stall_s=5)
    scripted_llm_server.script([Raw(OMLX_KEEPALIVE), Text("One"), Raw(OMLX_KEEPALIVE),
                                Text(" two."), Finish(), Raw(OMLX_KEEPALIVE), Done()])
    try:
        events = await collect(llm)
    finally:
        await llm.aclose()
    assert events == [LlmDelta("One"), LlmDelta(" two."), LlmDone("stop")]


async def test_connection_refused_is_unavailable(refused_port):
    llm = OpenAiLlm(f"http://127.0.0.1:{refused_port}/v1", timeout=2.0)
    error = await failure_closing(llm)
    assert error.code == "llm_unavailable"
    assert f"127.0.0.1:{refused_port}" in error.message


@pytest.mark.parametrize("url", ["127.0.0.1:8081/v1", "ftp://host/v1", "http:///v1",
                                 # a port out of range started a gateway that could never
                                 # connect; one not a number was httpx's InvalidURL, a
                                 # traceback
                                 "http://host:99999/v1", "http://host:0/v1",
                                 "http://host:abc/v1", "http://[::1/v1"])
def test_a_bad_url_is_refused_at_construction(url):
    with pytest.raises(ValueError, match="^LLM url must be http"):
        OpenAiLlm(url)


def test_a_bad_ports_refusal_hides_the_password():
    with pytest.raises(ValueError) as info:
        OpenAiLlm("http://me:s3cret@host:99999/v1")
    assert str(info.value) == ("LLM url must be http(s)://host[:port]/base, not "
                               "'http://me:***@host:99999/v1' (Port out of range 0-65535)")


async def test_unresolvable_host_is_unavailable():
    llm = OpenAiLlm("http://llm.invalid/v1", timeout=2.0)
    error = await failure_closing(llm)
    assert error.code == "llm_unavailable"


async def test_cancelling_the_consumer_closes_the_connection(llm, scripted_llm_server):
    scripted_llm_server.script([Text("first"), Hang()])
    got_first = asyncio.Event()

    async def consume() -> None:
        async for event in llm.stream(REQUEST):
            if isinstance(event, LlmDelta):
                got_first.set()

    task = asyncio.create_task(consume())
    async with hang_guard("the first delta"):
        await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with hang_guard("the server seeing the client leave"):
        await scripted_llm_server.requests[0].disconnected.wait()


async def test_closing_the_stream_early_closes_the_connection(llm, scripted_llm_server):
    scripted_llm_server.script([Text("first"), Hang()])
    async with contextlib.aclosing(llm.stream(REQUEST)) as events:
        assert await anext(events) == LlmDelta("first")
    async with hang_guard("the server seeing the client leave"):
        await scripted_llm_server.requests[0].disconnected.wait()


@pytest.mark.parametrize(
    ("usage", "timings", "decode_s", "expected"),
    [
        ({"completion_tokens": 30, "generation_tokens_per_second": 51.5}, None, 2.0, 51.5),
        # a plain OpenAI usage: the server's count after the first token, over the time the
        # text took to arrive (never chunk counts: one chunk may hold many tokens)
        ({"completion_tokens": 30}, None, 0.5, 58.0),
        ({"completion_tokens": 30}, None, 0.0, None),  # all in one chunk: no time to divide
        ({"completion_tokens": 30}, None, 0.01, None),  # a burst says nothing of the server
        ({"completion_tokens": 1}, None, 0.5, None),
        ({"completion_tokens": True}, None, 0.5, None),
        (None, None, 0.5, None),
        ({"completion_tokens": 30}, {"predicted_per_second": 42.0}, 2.0, 42.0),
        ({"completion_tokens": 30}, {"predicted_n": 30, "predicted_ms": 600.0}, 2.0, 50.0),
        ({"completion_tokens": 30}, {"predicted_ms": 1500.0}, 2.0, 20.0),
    ],
)
def test_tokens_per_s_comes_from_the_server(usage, timings, decode_s, expected):
    assert tokens_per_s_from(usage, timings, decode_s) == expected


def test_a_bursty_first_chunk_counts_its_share_of_the_tokens():
    # 60 tokens in chunks of 6 at 50 tok/s: the last chunk comes 54 tokens (1.08 s) after
    # the first; counting the first chunk as one token said 54.6 tok/s, not 50
    assert tokens_per_s_from({"completion_tokens": 60}, None, 1.08, 0.1) == pytest.approx(50)


async def test_llama_cpp_timings_give_the_rate(llm, scripted_llm_server):
    timings = b'"timings": {"predicted_n": 4, "predicted_ms": 100.0}'
    scripted_llm_server.script(
        [
            Text("ab"),
            Raw(
                b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
                + timings
                + b"}\n\n"
            ),
            Done(),
        ]
    )
    events = await collect(llm)
    assert events[-1] == LlmDone("stop", 40.0, None)


@pytest.mark.slow
def test_the_real_mlx_lm_server_starts_warning_of_nothing(tiny_llama_server):
    """mlx_lm.server warned at each start that it is not for production (a UserWarning in
    the log the tests show when a start fails): a test server is none, and the warning is
    ignored by its message (tests/servers.py MLX_LM_SERVER_WARNING)."""
    assert not [line for line in tiny_llama_server.log if "Warning" in line], \
        "".join(tiny_llama_server.log)


@pytest.mark.slow
async def test_real_stream_from_mlx_lm_server(tiny_llama_server):
    llm = OpenAiLlm(tiny_llama_server.url, timeout=httpx.Timeout(30.0))
    try:
        events = await collect(llm, LlmRequest(REQUEST.messages, max_tokens=5))
        again = await collect(llm, LlmRequest(REQUEST.messages, max_tokens=3))
    finally:
        await llm.aclose()
    deltas, done = events[:-1], events[-1]
    assert deltas and all(isinstance(d, LlmDelta) and d.text for d in deltas)
    assert isinstance(done, LlmDone)
    assert done.finish_reason in {"length", "stop"}
    assert done.usage is not None and 1 <= done.usage["completion_tokens"] <= 5
    assert done.usage["prompt_tokens"] > 0
    # mlx_lm.server reports no rate: its completion_tokens over the text's arrival time,
    # when that took long enough to say something (5 tiny tokens may not)
    assert done.tokens_per_s is None or 0 < done.tokens_per_s < 100_000
    assert isinstance(again[-1], LlmDone) and again[-1].usage["completion_tokens"] <= 3



@pytest.mark.parametrize("chunks", [
    ["<think>The user wants hosting.</think>Hosting came to $184.50."],
    ["<think>", "The user wants hosting.", "</think>", "Hosting came to $184.50."],
    ["<thi", "nk>The user wants ho", "sting.</th", "ink>Hosting came to $", "184.50."],
    list("<think>The user wants hosting.</think>Hosting came to $184.50."),
])
def test_thoughts_in_the_content_are_not_spoken(chunks):
    thoughts = ThinkFilter()
    said = "".join(thoughts.feed(c) for c in chunks) + thoughts.finish()
    assert said == "Hosting came to $184.50."


def test_a_lone_angle_bracket_is_spoken_once_it_is_no_tag():
    thoughts = ThinkFilter()
    assert thoughts.feed("1 <") == "1 "  # held: it may open a tag
    assert thoughts.feed(" 2, and <b> is bold <") == "< 2, and <b> is bold "
    assert thoughts.finish() == "<"


async def test_a_reasoning_model_thinking_in_its_content_is_heard_answering_only(
        llm, scripted_llm_server):
    scripted_llm_server.script(reply_script(
        ["<think>", "Hosting is", " in the invoices.</think>\n\n", "It came to $184.50."]))
    events = await collect(llm)
    assert "".join(e.text for e in events if isinstance(e, LlmDelta)) == "\n\nIt came to $184.50."


@pytest.mark.parametrize("rest", [
    [Finish(), Usage(OMLX_USAGE), Hang()],  # no [DONE]
    [Finish(), Hang()],  # neither usage nor [DONE]
    [Finish(), Usage(OMLX_USAGE), Done(), Hang()],  # [DONE], then the body stays open
], ids=["no-done", "no-usage", "body-open"])
async def test_a_whole_reply_ends_even_if_the_server_is_slow_with_the_rest(
        scripted_llm_server, monkeypatch, rest):
    """The reply was spoken, but a server (or proxy) slow to send the usage, [DONE] or the
    end of its body failed the turn llm_unavailable after stall_s (60 s)."""
    from engines import llm_openai

    monkeypatch.setattr(llm_openai, "AFTER_FINISH_S", 0.2)
    await ends_whole(scripted_llm_server, 30, rest)


@pytest.mark.parametrize("error", [
    Raw(b'event: error\ndata: {"message": "usage unavailable"}\n\n'),
    Raw(b'data: {"error": {"message": "usage unavailable"}}\n\n'),
    Raw(b'error: {"message": "usage unavailable"}\n\n'),  # llama.cpp before #16109
], ids=["event", "payload", "error-field"])
async def test_an_error_after_the_finish_reason_leaves_the_reply_whole(
        llm, scripted_llm_server, caplog, error):
    """The reply was whole (its finish_reason came), and a break in the connection after it
    was already no failure; an error the server sent in its place failed the turn
    llm_failed all the same, its last sentence unsaid and the history saying it was cut."""
    scripted_llm_server.script([Text("All "), Text("of it."), Finish(), error, Done()])
    events = await collect(llm)
    assert [e.text for e in events if isinstance(e, LlmDelta)] == ["All ", "of it."]
    assert events[-1] == LlmDone("stop")
    assert "usage unavailable" in caplog.text  # (the operator is told)


async def test_an_error_after_the_finish_reason_is_warned_once(llm, scripted_llm_server,
                                                                caplog):
    """A server that sends it after every reply warns once; later ones go to DEBUG, and
    every reply stays whole."""
    error = Raw(b'data: {"error": {"message": "usage unavailable"}}\n\n')
    scripted_llm_server.script(*[[Text("All of it."), Finish(), error, Done()]] * 2)
    with caplog.at_level("DEBUG", logger="engines.llm_openai"):
        for _ in range(2):
            assert (await collect(llm))[-1] == LlmDone("stop")
    said = [r.levelname for r in caplog.records if "usage unavailable" in r.getMessage()]
    assert said == ["WARNING", "DEBUG"]


async def test_what_comes_after_done_is_read_and_not_said(llm, scripted_llm_server):
    """A server (or proxy) that goes on after ``[DONE]``: the body is read to its end, so
    the connection can be reused, and nothing of it is said."""
    scripted_llm_server.script(
        [Text("Said."), Finish(), Done(), Text(" Not said."), Finish(), Done()],
        [Text("Next."), Finish(), Done()])
    events = await collect(llm)
    assert [e.text for e in events if isinstance(e, LlmDelta)] == ["Said."]
    assert events[-1] == LlmDone("stop")
    assert [e.text for e in await collect(llm) if isinstance(e, LlmDelta)] == ["Next."]


@pytest.mark.parametrize("tail", ["<", "</thi", "<th"])
async def test_a_reply_ending_in_what_could_have_begun_a_tag_says_it_at_the_end(
        llm, scripted_llm_server, tail):
    """The thought filter holds back what may be the start of ``<think>`` or ``</think>``
    until it can tell; a reply that ends there says it as its last delta, not dropped."""
    scripted_llm_server.script([Text("Use a "), Text(tail), Finish(), Done()])
    events = await collect(llm)
    assert "".join(e.text for e in events if isinstance(e, LlmDelta)) == "Use a " + tail
    assert events[-1] == LlmDone("stop")


async def test_an_error_after_an_aborted_finish_fails_with_the_servers_words(
        llm, scripted_llm_server):
    scripted_llm_server.script([Text("half a rep"), Finish("error"),
                                Raw(b'data: {"error": {"message": "out of KV cache"}}\n\n'),
                                Done()])
    error = await failure(llm)
    assert error.code == "llm_failed" and "out of KV cache" in error.message


async def test_a_whole_reply_ends_well_with_a_stall_timeout_shorter_than_the_wait_after_it(
        scripted_llm_server):
    """stall_timeout_s also bounds httpx's read timeout: set below AFTER_FINISH_S, it failed
    a whole reply llm_unavailable when the server was slow with its usage or [DONE]. (The
    ReadTimeout ends the wait as any break after the finish does: without that, it fails.)"""
    # (below AFTER_FINISH_S, 2 s, but not short: it bounds the wait for the reply too)
    await ends_whole(scripted_llm_server, 1.5, [Finish(), Hang()])


async def test_a_read_timeout_shorter_than_the_stall_bound_is_the_one_named(
        scripted_llm_server):
    """A read timeout given apart from stall_s (timeout=) that ended a reply before its
    finish failed it "sent no data for 60 s", stall_s, though it had waited 1.5 s."""
    llm = OpenAiLlm(scripted_llm_server.url, timeout=httpx.Timeout(5.0, read=1.5), stall_s=3600)
    scripted_llm_server.script([Text("Half a rep"), Hang()])
    error = await failure_closing(llm)
    assert error.code == "llm_unavailable"
    assert " for 1.5 s (ReadTimeout)" in error.message, error.message


async def ends_whole(server: ScriptedLlmServer, stall_s: float, rest: list) -> None:
    """A backend with ``stall_s`` gets "All of it." then ``rest``: the reply ends whole."""
    backend = OpenAiLlm(server.url, stall_s=stall_s)
    server.script([Text("All "), Text("of it."), *rest])
    try:
        events = await collect(backend)
    finally:
        await backend.aclose()
    assert [e.text for e in events if isinstance(e, LlmDelta)] == ["All ", "of it."]
    assert events[-1].finish_reason == "stop"


@pytest.mark.parametrize(("first", "retried"), [
    (Status(503, b'{"error": {"message": "Model is loading"}}', retry_after="0.2"), True),
    (Status(429, retry_after="0.1"), True),
    (Status(429, retry_after="60"), False),  # too long for a listener: fail now
    (Status(503), False),  # no Retry-After: a real failure
    (Status(500, retry_after="0.1"), False),
])
async def test_a_busy_server_is_tried_once_more_after_the_wait_it_asks(
        llm, scripted_llm_server, first, retried):
    """A transient "loading" or "busy" answer failed a turn that had said nothing yet."""
    scripted_llm_server.script([first], reply_script(["Here it is."]))
    loop = asyncio.get_running_loop()
    started = loop.time()
    if retried:
        events = await collect(llm)
        assert events[0] == LlmDelta("Here it is.") and len(scripted_llm_server.chats) == 2
        assert loop.time() - started >= float(first.retry_after)  # it waited as asked
    else:
        error = await failure(llm)
        assert error.code == "llm_failed" and f"HTTP {first.code}" in error.message
        assert len(scripted_llm_server.chats) == 1


async def test_a_busy_server_twice_fails_the_turn(llm, scripted_llm_server):
    busy = Status(429, retry_after="0")
    scripted_llm_server.script([busy], [busy])
    error = await failure(llm)
    assert error.code == "llm_failed" and "HTTP 429" in error.message
    assert len(scripted_llm_server.chats) == 2


async def test_more_turns_at_once_than_an_http_pool_holds_all_reach_the_server(
        scripted_llm_server):
    """httpx caps a client at 100 connections by default: the 101st concurrent turn waited
    for a free one and failed llm_unavailable (PoolTimeout) after 10 s, never reaching the
    server (engines review). Each stream here holds its connection until the end."""
    scripted_llm_server.default_script = [Text("first"), Hang()]
    llm = OpenAiLlm(scripted_llm_server.url)
    turns = 105

    firsts: list[LlmEvent] = []
    everyone = asyncio.Event()

    async def first_delta() -> None:
        async with contextlib.aclosing(llm.stream(REQUEST)) as stream:
            firsts.append(await anext(stream))
            if len(firsts) == turns:
                everyone.set()
            await everyone.wait()  # the connection stays taken until every turn has one

    try:
        async with hang_guard("every stream's first delta"):
            await asyncio.gather(*(first_delta() for _ in range(turns)))
        assert firsts == [LlmDelta("first")] * turns
        assert len(scripted_llm_server.chats) == turns
    finally:
        await llm.aclose()


@pytest.mark.parametrize(("status", "full"), [
    (Status(400, b'{"error": {"message": "Prompt (9210 tokens) exceeds max context window of '
                 b'8192 tokens"}}'), True),  # oMLX
    (Status(400, b'{"error": {"message": "This model\'s maximum context length is 8192 tokens. '
                 b'However, you requested 9000 tokens.", "code": "context_length_exceeded"}}'),
     True),  # vLLM, OpenAI
    (Status(400, b'{"error": {"code": 400, "message": "the request exceeds the available context '
                 b'size, try increasing it", "type": "exceed_context_size_error"}}'),
     True),  # llama.cpp
    (Status(422, b'{"error": "Input validation error: `inputs` tokens + `max_new_tokens` must '
                 b'be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`", '
                 b'"error_type": "validation"}'), True),  # TGI
    (Status(422, b'{"error": "Input validation error: `inputs` must have less than 4096 tokens. '
                 b'Given: 5000", "error_type": "validation"}'), True),  # TGI
    (Status(413, b""), True),
    (Status(400, b'{"error": {"message": "temperature must be at most 2"}}'), False),
    (Status(422, b'{"error": "Input validation error: `max_new_tokens` must be <= 2048. Given: '
                 b'4096", "error_type": "validation"}'), False),  # the reply's cap: not history
    (Status(500, b'{"error": {"message": "maximum context length"}}'), False),
], ids=["omlx", "vllm", "llama.cpp", "tgi-total", "tgi-input", "413", "other-400",
        "tgi-max-new-tokens", "500"])
async def test_a_prompt_longer_than_the_context_is_told_apart(llm, scripted_llm_server, status,
                                                              full):
    scripted_llm_server.script([status])
    error = await failure(llm)
    assert isinstance(error, LlmContextFull) is full
    assert error.code == "llm_failed" and f"HTTP {status.code}" in error.message


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("endless", [
    Raw(b"data: " + b"x" * (5 << 20)),  # one line that never ends
    Raw(b"data: x\n" * (1 << 20)),  # data lines, and never the blank line that ends them
], ids=["line", "event"])
async def test_an_event_that_never_ends_fails_the_turn_instead_of_filling_memory(
        scripted_llm_server, endless, gzip):
    """The SSE parser buffered it whole until stall_s: 534 MB of memory for 512 MB sent at
    full speed, and the turn failed as 'sent no data ... queued behind other requests'.
    gzip'd (a proxy compressing the stream; httpx asked for gzip), the bound counted the
    bytes on the wire, a thousandth of what the parser held."""
    scripted_llm_server.gzip = gzip
    llm = OpenAiLlm(scripted_llm_server.url, stall_s=60)
    scripted_llm_server.script([Text("One. "), endless, Hang()])
    error = await failure_closing(llm)
    assert error.code == "llm_failed"
    assert "without ending an SSE event (at most 4,194,304)" in error.message
    async with hang_guard("the server seeing the client leave"):
        await scripted_llm_server.requests[0].disconnected.wait()


async def test_a_gzipped_stream_reads_as_any_other(llm, scripted_llm_server):
    scripted_llm_server.gzip = True
    scripted_llm_server.script([Comment(), Text("Hi"), Text(" there."), Finish(), Done()])
    assert await collect(llm) == [LlmDelta("Hi"), LlmDelta(" there."), LlmDone("stop")]


async def test_a_compressed_answer_that_decodes_huge_holds_no_more_than_its_bound():
    """httpx decoded each read whole before the bound counted it: 600 bytes on the wire,
    gzip'd twice (``Content-Encoding: gzip, gzip``, both layers decoded), became one 64 MiB
    piece (256 MiB: +569 MiB), per turn. The client asks for no compression, and an answer
    compressed anyway is decoded a bounded piece at a time: the turn fails at the bound as
    an uncompressed one does, holding about the bound (traced: 4.8 MB; main: 148 MB)."""
    import gzip
    import tracemalloc

    from engines.llm_openai import MAX_EVENT_BYTES

    server = EncodedSseServer(b"gzip, gzip", gzip.compress(gzip.compress(
        b"data: " + b"x" * (64 << 20))))
    llm = OpenAiLlm(server.url, stall_s=60)
    tracemalloc.start()
    try:
        error = await failure(llm)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        await llm.aclose()
        server.close()
    assert error.code == "llm_failed"
    assert "without ending an SSE event (at most 4,194,304)" in error.message
    assert peak < 2 * MAX_EVENT_BYTES, f"{peak:,} bytes"  # (4.8 MB; main: 148 MB)
    assert b"\r\naccept-encoding: identity\r\n" in server.request.lower()


@pytest.mark.parametrize("encoding", [b"br", b"gzip, zstd"])
async def test_an_answer_in_an_encoding_it_cannot_decode_fails_naming_it(encoding):
    """httpx passed an encoding it had no decoder for (brotli, zstd: optional packages) on
    as it came, and the parser read its bytes as events; it decoded them, without a bound,
    when the package was there. Now the turn fails, naming it."""
    server = EncodedSseServer(encoding, b"\x8b\x02\x80data: [DONE]\n\n\x03")  # (any bytes)
    try:
        error = await failure_closing(OpenAiLlm(server.url))
    finally:
        server.close()
    assert error.code == "llm_failed"
    assert f"the LLM server sent its answer {encoding.decode().split()[-1]}-encoded" in \
        error.message


@pytest.mark.parametrize("encoding", [b"", b"gzip,"], ids=["empty", "trailing-comma"])
async def test_an_empty_content_encoding_names_no_encoding(encoding):
    """``Content-Encoding:`` with no value, or a list that ends in a comma, names no
    encoding (httpx skipped the empty name). Read as the name of one, every turn failed
    with "the LLM server sent its answer -encoded"."""
    import gzip

    reply = (b'data: {"choices": [{"index": 0, "delta": {"content": "Hi."}}]}\n\n'
             b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
             b"data: [DONE]\n\n")
    server = EncodedSseServer(encoding, gzip.compress(reply) if encoding else reply)
    llm = OpenAiLlm(server.url)
    try:
        assert await collect(llm) == [LlmDelta("Hi."), LlmDone("stop")]
    finally:
        await llm.aclose()
        server.close()


@pytest.mark.parametrize(("encoding", "body"), [(b"br", b"\x8b\x02\x80too long\x03"),
                                                (b"gzip", b"too long, not gzip")],
                         ids=["br", "not-gzip"])
async def test_an_error_page_it_cannot_decode_still_tells_the_status(encoding, body):
    """An error answer's body in an encoding the client does not decode (a proxy's ``br``;
    a ``gzip`` that is not) failed the turn with that, and hid the status, and what it
    asks for: a 413 (the prompt past the context) made the session forget its oldest
    turns; it failed every turn instead. The status stands now, the body as far as it
    decodes."""
    server = EncodedSseServer(encoding, body, status=b"413 Payload Too Large",
                              content_type=b"text/plain")
    try:
        error = await failure_closing(OpenAiLlm(server.url))
    finally:
        server.close()
    assert isinstance(error, LlmContextFull)
    assert error.message.startswith("LLM server answered HTTP 413: ")
    assert "body not decoded" in error.message


async def test_a_whole_reply_in_one_chunk_is_no_endless_event(llm, scripted_llm_server):
    reply = "\N{GRINNING FACE}" * 32_000  # max_reply_chars, 12 bytes each as JSON escapes
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": reply}}]})
    assert len(chunk) > 384_000
    scripted_llm_server.script([Raw(f"data: {chunk}\n\n".encode()), Finish(), Done()])
    assert await collect(llm) == [LlmDelta(reply), LlmDone("stop")]



class KeepAliveServer:
    """A plain HTTP/1.1 server on 127.0.0.1:0 that answers each request with a whole SSE
    reply and keeps the connection open, except for the requests ``actions`` names by
    their order of arrival (0, 1, ...): ``close`` or ``reset`` the connection once the
    request is read, without a byte of answer (what a server's keep-alive timer does when
    it fires as a request arrives), or send the answer's ``headers`` only, then close."""

    REPLY = (b'data: {"choices":[{"index":0,"delta":{"content":"Hi."},"finish_reason":null}]}'
             b'\n\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
             b"data: [DONE]\n\n")

    def __init__(self, actions: dict[int, str]) -> None:
        self.actions = actions
        self.seen: list[int] = []  # the connection (0, 1, ...) of each request, in order
        self._connections = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        await self._server.wait_closed()
        # 3.11's wait_closed waits for no connection: one whose handler was still reading
        # was left to the GC, its socket unclosed
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._handlers)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(writer)
        connection, self._connections = self._connections, self._connections + 1
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in request.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                action = self.actions.get(len(self.seen), "answer")
                self.seen.append(connection)
                if action == "reset":
                    writer.transport.abort()
                    return
                if action == "close":
                    break
                writer.write(head % len(self.REPLY))
                if action == "headers":
                    break
                writer.write(self.REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def test_only_a_failure_between_a_new_connection_and_the_request_is_a_loss_as_made(
        scripted_llm_server):
    """``NewConnectionWatch`` reads httpcore's trace events by name: only between a new
    connection's ``connect_tcp.complete`` and the request's first byte is an
    ``AttributeError`` taken for a connection lost as it was made (not one from anywhere
    else), and a request on a kept-alive connection is ``reused``."""
    async with httpx.AsyncClient(timeout=HANG_S) as client:
        for reused in (False, True):
            watch = NewConnectionWatch()
            seen: list[tuple[str, bool]] = []

            async def trace(name: str, info: dict, watch=watch, seen=seen) -> None:
                await watch(name, info)
                seen.append((name, watch.lost_as_made(AttributeError("getpeername"))))
                assert not watch.lost_as_made(ValueError())  # (another error: no loss)

            answer = await client.get(f"{scripted_llm_server.url}/models",
                                      extensions={"trace": trace})
            assert answer.status_code == 200
            assert watch.reused is reused
            names = [name for name, _ in seen]
            lost = [name for name, lost in seen if lost]
            if reused:
                assert lost == [] and "connection.connect_tcp.started" not in names
            else:  # (and no longer once the request goes out)
                assert lost == ["connection.connect_tcp.complete"]
                assert names[names.index(lost[0]) + 1] == "http11.send_request_headers.started"


def test_a_server_that_resets_the_connection_as_it_is_made_is_out_of_reach():
    """Under uvloop (the gateway's loop) a connection reset between uvloop's connect and
    httpcore's first question to it (its ``ssl_object``) left the transport with no socket,
    and anyio's ``extra_attributes`` raised ``AttributeError: 'NoneType' object has no
    attribute 'getpeername'``: the turn failed llm_failed with the library's words and a
    traceback at ERROR (bench/SOAK.md, an LLM server killed under the soak). No byte of
    the request went out: the server is out of reach, as when it refuses."""
    uvloop = pytest.importorskip("uvloop")

    async def turn() -> EngineError:
        with resetting_port(asyncio.get_running_loop()) as port:
            return await failure_closing(OpenAiLlm(f"http://127.0.0.1:{port}/v1"))

    error = uvloop.run(turn())
    assert isinstance(error, ServerUnreachable)
    assert error.code == "llm_unavailable"
    assert error.message.startswith("cannot reach LLM server http://127.0.0.1:")


@pytest.mark.parametrize("action", ["close", "reset"])
async def test_a_kept_alive_connection_closed_as_the_request_goes_out_is_tried_again(action):
    """uvicorn (under oMLX and vLLM) and llama.cpp close a connection idle for 5 s, as
    httpx drops one: a turn that started about 5 s after the last reply ended met a
    connection closing under its request, and failed llm_failed ('broke off:
    ReadError'; 16 turns in 300 timed near a 0.2 s keep-alive). Nothing of the answer had
    come: it is sent again, at once, on a new connection."""
    server = KeepAliveServer({1: action})
    async with server as url:
        llm = OpenAiLlm(url)
        try:
            first = await collect(llm)
            second = await collect(llm)
        finally:
            await llm.aclose()
    assert first == second == [LlmDelta("Hi."), LlmDone("stop")]
    assert server.seen == [0, 0, 1]  # the second request twice, then on a new connection


@pytest.mark.parametrize(("actions", "seen"), [
    ({0: "close"}, [0]),  # a new connection: the server took the request, then died
    ({1: "headers"}, [0, 0]),  # part of the answer came: the server had the request
], ids=["new-connection", "answer-begun"])
async def test_a_request_the_server_may_have_read_is_not_sent_twice(actions, seen):
    server = KeepAliveServer(actions)
    async with server as url:
        llm = OpenAiLlm(url)
        try:
            with pytest.raises(EngineError) as info:
                for _ in seen:
                    await collect(llm)
        finally:
            await llm.aclose()
    assert info.value.code == "llm_failed" and "broke off" in info.value.message
    assert server.seen == seen


LLAMA_CPP_CONTEXT = (b'{"code":400,"message":"the request exceeds the available context size. '
                     b'try increasing the context size or enable context shift","type":'
                     b'"invalid_request_error"}')


@pytest.mark.parametrize(("script", "said", "full"), [
    ([Raw(b'data: {"error":' + LLAMA_CPP_CONTEXT + b"}\n\n"), Done()], [], True),
    ([Raw(b"event: error\ndata: " + LLAMA_CPP_CONTEXT + b"\n\n")], [], True),
    # llama.cpp until September 2025, with its [DONE]: every turn of a long session went empty
    ([Raw(b"error: " + LLAMA_CPP_CONTEXT + b"\n\n"), Done()], [], True),
    ([Text("Once upon a"), Raw(b'data: {"error":' + LLAMA_CPP_CONTEXT + b"}\n\n"), Done()],
     ["Once upon a"], False),
    ([Raw(b'data: {"error":{"code":500,"message":"Failed to decode the batch"}}\n\n'), Done()],
     [], False),
], ids=["context", "context-event", "context-error-field", "context-after-text",
        "other-error"])
async def test_an_error_in_the_stream_that_says_the_context_is_full_is_told_apart(
        llm, scripted_llm_server, script, said, full):
    """llama.cpp says a prompt outgrew its context in the stream, not as an HTTP 400: the
    turn failed, and every later one too, as the history only grows. Before a word, it is
    LlmContextFull, so the session forgets its oldest turns and asks again."""
    scripted_llm_server.script(script)
    got: list[LlmEvent] = []
    with pytest.raises(EngineError) as info:
        async with hang_guard("the stream's end"):
            async for event in llm.stream(REQUEST):
                got.append(event)
    assert [e.text for e in got if isinstance(e, LlmDelta)] == said
    assert info.value.code == "llm_failed"
    assert isinstance(info.value, LlmContextFull) is full
    assert info.value.message.startswith("LLM server error: '{\"")
