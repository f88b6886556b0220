"""Turns through real HTTP LLM servers: the scripted SSE double and a real mlx_lm.server."""

from __future__ import annotations

import asyncio
import logging
import re
import signal

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.config import load_config
from gateway.io.server import Gateway
from tests.hang_guard import HANG_S, unless_hung
from tests.servers import (
    Burst,
    Comment,
    Done,
    Drop,
    Finish,
    Hang,
    Raw,
    ServeProcess,
    Status,
    Text,
    Usage,
    reply_script,
    resetting_port,
)
from tests.wsclient import read_turn, recv_event, send

OMLX_USAGE = {"prompt_tokens": 20, "completion_tokens": 14, "total_tokens": 34,
              "generation_tokens_per_second": 51.5}


async def start_gateway(llm_url: str, **llm) -> Gateway:
    gw = Gateway(load_config(server={"port": 0}, llm={"url": llm_url, **llm}))
    await gw.start()
    return gw


async def turn(gw: Gateway, text: str = "hi", **session):
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        if session:
            await send(ws, type="session.update", session=session)
            await recv_event(ws, "session.updated")
        await send(ws, type="transcript", text=text)
        return await read_turn(ws)


async def test_burst_with_usage_after_finish_gives_exact_text_and_rate(scripted_llm_server):
    pieces = ["The design review ", "starts at 3:30 p.m. ", "in the big room. ",
              "Your call is ", "at 5 p.m. sharp."]
    scripted_llm_server.script([Comment(), Burst(tuple(Text(p) for p in pieces)),
                                Finish(), Usage(OMLX_USAGE), Done()])
    gw = await start_gateway(scripted_llm_server.url)
    try:
        result = await turn(gw, "What's on my calendar?", max_lead_ms=30000)
    finally:
        await gw.aclose()
    assert result.reply == "".join(pieces)
    assert result.done["status"] == "completed"
    assert result.done["metrics"]["llm_tokens_per_s"] == 51.5
    assert [s["text"] for s in result.of("sentence")][-1] == "Your call is at 5 p.m. sharp."
    (request,) = scripted_llm_server.chats
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["messages"][-1] == {"role": "user", "content": "What's on my calendar?"}
    assert "model" not in request.body


@pytest.mark.parametrize("script, code", [
    ([Status(500)], "llm_failed"),
    ([Text("Half a sentence. And then"), Drop()], "llm_failed"),
    # the break right after a sentence's end: it is complete, so spoken too
    ([Text("Half a sentence. "), Drop()], "llm_failed"),
    # an aborted request (vLLM: finish_reason "abort") was a completed turn that spoke
    # "And then" and kept it in the history as said
    ([Text("Half a sentence. And then"), Finish("abort"), Done()], "llm_failed"),
    ([Text("Okay. "), Text("{broken"), Finish(), Done()], None),  # text, not JSON: fine
])
async def test_llm_failures_end_the_turn_failed_and_speak_what_was_complete(
        scripted_llm_server, script, code):
    scripted_llm_server.script(script)
    gw = await start_gateway(scripted_llm_server.url)
    try:
        result = await turn(gw, max_lead_ms=30000)
    finally:
        await gw.aclose()
    if code is None:
        assert result.done["status"] == "completed"
        return
    (error,) = result.of("error")
    assert error["error"]["code"] == code and error["turn_id"] == result.turn_id
    assert result.done["status"] == "failed"
    if script[0] != Status(500):  # the complete sentence before the drop is still spoken
        assert [s["text"] for s in result.of("sentence")] == ["Half a sentence."]
        assert result.frames and result.frames[-1].turn_end


@pytest.mark.parametrize("rest", [[Finish(), Drop()],
                                  [Finish(), Usage(OMLX_USAGE), Done(), Drop()],
                                  [Finish(), Raw(b'event: error\ndata: {"message": "boom"}\n\n'),
                                   Done()]],
                         ids=["after-finish", "after-done", "error-after-finish"])
async def test_a_reply_whose_connection_breaks_once_it_is_whole_is_spoken_and_kept_whole(
        scripted_llm_server, rest):
    """A server (or a proxy) that broke the connection after the finish_reason chunk (or
    [DONE]) failed a reply that was whole: its last sentence went unsaid, the turn ended
    with llm_failed, and the next turn told the LLM its reply had been cut (" …"). A late
    end is no failure (AFTER_FINISH_S), nor is a broken one, nor an error sent there."""
    scripted_llm_server.script([Text("Hosting came to $184.50. "), Text("That is all"), *rest],
                               reply_script(["Fine."]))
    gw = await start_gateway(scripted_llm_server.url)
    try:
        first, second = await turns(gw, "hosting?", "thanks")
    finally:
        await gw.aclose()
    assert first.done["status"] == "completed" and not first.of("error")
    assert [s["text"] for s in first.of("sentence")] == ["Hosting came to $184.50.",
                                                         "That is all"]
    assert gw.llm_failing is None
    assert scripted_llm_server.chats[1].body["messages"][1:] == [
        {"role": "user", "content": "hosting?"},
        {"role": "assistant", "content": "Hosting came to $184.50. That is all"},
        {"role": "user", "content": "thanks"}]


async def test_a_reply_cut_at_the_token_limit_speaks_its_whole_sentences_only(
        scripted_llm_server):
    """finish_reason "length": the unfinished sentence was spoken ("Most") and the turn
    said completed, where a reply cut at max_reply_chars drops it and fails."""
    from tests.servers import reply_script

    scripted_llm_server.script(reply_script(["Hosting cost more than in May. ", "Most"],
                                            finish="length"))
    gw = await start_gateway(scripted_llm_server.url)
    try:
        result = await turn(gw, max_lead_ms=30000)
    finally:
        await gw.aclose()
    assert [s["text"] for s in result.of("sentence")] == ["Hosting cost more than in May."]
    (error,) = result.of("error")
    assert error["error"] == {"code": "llm_failed", "message": "the reply reached the LLM's "
                              "token limit (max_tokens); the rest is not spoken"}
    assert result.done["status"] == "failed"
    assert gw.llm_failing is None  # the LLM answered as asked: it is not failing


def _chunk(delta: bytes, finish: bytes = b"null") -> Raw:
    return Raw(b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
               b'"delta":' + delta + b',"finish_reason":' + finish + b'}]}\n\n')


TOOL_CALL = [  # as vLLM and llama.cpp stream a tool call: content null, then the finish
    _chunk(b'{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1",'
           b'"type":"function","function":{"name":"get_weather","arguments":""}}]}'),
    _chunk(b'{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\"Oslo\\"}"}}]}'),
    Finish("tool_calls"), Done()]


@pytest.mark.parametrize("script, code, message, spoken", [
    ([Finish(), Done()], "llm_empty_reply", "the LLM's reply was empty: nothing to say", []),
    ([Text("\n\n"), Finish(), Done()], "llm_empty_reply",
     "the LLM's reply was empty: nothing to say", []),
    # a reasoning model that thought and said nothing: vLLM, llama.cpp and oMLX send the
    # thought in reasoning_content (content null), mlx_lm.server in reasoning
    ([_chunk(b'{"role":"assistant","content":null,"reasoning_content":"The user says hi."}'),
      _chunk(b'{"reasoning":" Hm."}'), Finish(), Done()], "llm_empty_reply",
     "the LLM's reply was only a thought (21 characters, not said): nothing to say", []),
    ([Text("<think>Hm, a greeting.</think>"), Finish(), Done()], "llm_empty_reply",
     "the LLM's reply was only a thought (30 characters, not said): nothing to say", []),
    # a <think> never closed (its model cut, or its server's template half-applied)
    ([Text("<think>Hm, a gree"), Text("ting"), Finish(), Done()], "llm_empty_reply",
     "the LLM's reply was only a thought (21 characters, not said): nothing to say", []),
    (TOOL_CALL, "llm_failed", "the LLM stopped its reply to call a tool (finish_reason "
     "'tool_calls'), and the gateway offers none; the rest is not spoken", []),
    ([Text("Let me check the weather. "), *TOOL_CALL], "llm_failed",
     "the LLM stopped its reply to call a tool (finish_reason 'tool_calls'), and the "
     "gateway offers none; the rest is not spoken", ["Let me check the weather."]),
    ([Text("Sure. Here is how to"), Finish("content_filter"), Done()], "llm_failed",
     "the LLM server's content filter held back the rest of the reply (finish_reason "
     "'content_filter'); the rest is not spoken", ["Sure."]),
], ids=["nothing", "white-space", "reasoning-only", "think-only", "think-unclosed", "tool-call",
        "words-then-tool-call", "content-filter"])
async def test_a_reply_with_nothing_to_say_or_cut_short_fails_and_says_why(
        scripted_llm_server, caplog, script, code, message, spoken):
    """These turns ended `completed` with no audio and no error (or spoke an unfinished
    sentence): the listener heard nothing and never knew why. Like an llm_failed turn,
    the history keeps what was said, or '…'. The operator is told too, as of any failed
    LLM turn: these were the only ones without a log line."""
    scripted_llm_server.script(script, reply_script(["Fine."]))
    gw = await start_gateway(scripted_llm_server.url)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway"):
            first, second = await turns(gw, "hi", "again")
    finally:
        await gw.aclose()
    assert [e["error"] for e in first.of("error")] == [{"code": code, "message": message}]
    (warning,) = [r for r in caplog.records if r.name.startswith("gateway")]
    assert warning.levelno == logging.WARNING
    assert re.fullmatch(r"session \S+: " + re.escape(
        f"the LLM's reply fails the turn ({code}): {message}"), warning.getMessage())
    assert first.done["status"] == "failed"
    assert [s["text"] for s in first.of("sentence")] == spoken
    assert bool(first.frames) == bool(spoken)
    assert gw.metrics.errors[code] == 1
    assert gw.llm_failing is None  # the LLM answered as asked: it is not failing
    assert second.reply == "Fine." and second.done["status"] == "completed"
    history = scripted_llm_server.chats[1].body["messages"][1:]
    # (what it said, then " …" when its text went on: protocol.md's History)
    said = {"Let me check the weather.": "Let me check the weather.", "Sure.": "Sure. …"}[
        spoken[0]] if spoken else "…"
    assert history == [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": said},
                       {"role": "user", "content": "again"}]


async def test_an_llm_that_fails_every_turn_its_reply_logs_a_few_lines_and_counts_all(
        scripted_llm_server, caplog):
    """An LLM that answered every turn empty (a thinking model at a small max_tokens) wrote
    a WARNING per turn of every session, without end; now as many as refusals are."""
    flood = 5
    scripted_llm_server.script(*[[Finish(), Done()]] * flood)
    gw = await start_gateway(scripted_llm_server.url)
    gw.log_limit.logged, gw.log_limit.window_s = 2, 3600  # (the test's turns: one window)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway"):
            results = await turns(gw, *["hi"] * flood)
    finally:
        await gw.aclose()
    assert [r.done["status"] for r in results] == ["failed"] * flood
    failed = [r for r in caplog.records if "the LLM's reply fails the turn" in r.getMessage()]
    assert len(failed) == gw.log_limit.logged
    assert gw.metrics.errors["llm_empty_reply"] == flood


def test_an_llm_server_killed_as_the_connection_is_made_fails_the_turn_out_of_reach(caplog):
    """Under uvloop, as the gateway serves: the LLM server resets the turn's connection as
    it is made (killed then, in bench/SOAK.md), and the turn failed llm_failed with anyio's
    AttributeError ('NoneType' object has no attribute 'getpeername') and its traceback at
    ERROR ("LLM backend failed"): it is llm_unavailable, as a refused connection is."""
    uvloop = pytest.importorskip("uvloop")

    async def one_turn() -> tuple[list, dict]:
        with resetting_port(asyncio.get_running_loop()) as port:
            gw = await start_gateway(f"http://127.0.0.1:{port}/v1")
            try:
                result = await turn(gw)
            finally:
                await gw.aclose()
        return result.of("error"), result.done

    with caplog.at_level(logging.DEBUG):
        errors, done = uvloop.run(one_turn())
    (error,) = errors
    assert error["error"]["code"] == "llm_unavailable"
    assert error["error"]["message"].startswith("cannot reach LLM server http://127.0.0.1:")
    assert done["status"] == "failed"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_malformed_sse_is_llm_failed(scripted_llm_server):
    from tests.servers import Raw

    scripted_llm_server.script([Raw(b"data: {not json}\n\n")])
    gw = await start_gateway(scripted_llm_server.url)
    try:
        result = await turn(gw)
    finally:
        await gw.aclose()
    assert result.of("error")[0]["error"]["code"] == "llm_failed"
    assert result.done["status"] == "failed"


async def test_barge_in_closes_the_llm_stream(scripted_llm_server):
    scripted_llm_server.script([Text("Thinking about it. "), Text("Still here "), Hang()],
                               [Text("Fine."), Finish(), Done()])
    gw = await start_gateway(scripted_llm_server.url)
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="first")
            first_id = (await recv_event(ws, "text.delta"))["turn_id"]
            await send(ws, type="transcript", text="second")
            first = await read_turn(ws, first_id)
            assert first.done["status"] == "cancelled"
            second = await read_turn(ws)
            assert second.done["status"] == "completed"
        # the hanging stream of the first turn was closed by the gateway
        await unless_hung(scripted_llm_server.chats[0].disconnected.wait())
        history = scripted_llm_server.chats[1].body["messages"]
        assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    finally:
        await gw.aclose()


@pytest.mark.slow
async def test_full_turn_through_a_real_mlx_lm_server(tiny_llama_server):
    gw = await start_gateway(tiny_llama_server.url, max_tokens=12)
    try:
        result = await turn(gw, "Say something.", max_lead_ms=30000)
    finally:
        await gw.aclose()
    # random weights: the text is noise, but it streams and ends; mostly at the 12-token
    # limit ("length"), which is no fault of the LLM's but leaves a sentence unfinished
    if result.done["status"] == "failed":
        assert [e["error"]["message"] for e in result.of("error")] == [
            "the reply reached the LLM's token limit (max_tokens); the rest is not spoken"]
    else:
        assert result.done["status"] == "completed" and not result.of("error")
    assert gw.llm_failing is None
    assert result.of("text.delta")
    assert result.done["metrics"]["ttft_ms"] is not None


def test_cli_serves_and_exits_cleanly_on_sigterm():
    with ServeProcess("--port", "0") as gw:
        url = gw.voice_url
        assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1/voice")
        health = httpx.get(f"http://127.0.0.1:{gw.port}/health", timeout=HANG_S).json()
        assert health["status"] == "ok"
        # the start-up heap is out of the collector's reach (freeze_startup_heap)
        assert health["loop"]["gc_frozen_objects"] > 10_000
        gw.signal(signal.SIGTERM)
        code, output = gw.finish()
    assert code == 0, output
    assert "LLM:" in output and "shutting down" in output


async def test_a_runaway_reply_is_cut_at_max_reply_chars_and_its_stream_closed(
        scripted_llm_server):
    # one delta of ~1.1 MB (a runaway model, or a server sending all at once) used to go to
    # the client as one text.delta bigger than the outbox: closed as a slow consumer
    # (a cap of 2,000 characters instead of 32,000 keeps the spoken part short)
    sentence = "This goes on and on. "
    scripted_llm_server.script([Text(sentence * 52_000), Hang()])
    gw = Gateway(load_config(server={"port": 0}, llm={"url": scripted_llm_server.url},
                             session={"max_reply_chars": 2_000, "max_lead_ms": 600_000}))
    await gw.start()
    try:
        result = await turn(gw)
        await unless_hung(scripted_llm_server.chats[0].disconnected.wait())
    finally:
        await gw.aclose()
    assert result.reply == (sentence * 52_000)[:2_000]
    (error,) = result.of("error")
    assert error["error"] == {"code": "llm_failed", "message": "the reply passed 2,000 "
                              "characters; the rest is not spoken"}
    assert result.done["status"] == "failed" and result.frames[-1].turn_end
    spoken = [s["text"] for s in result.of("sentence")]
    assert len(spoken) == 2_000 // len(sentence) and set(spoken) == {sentence.strip()}
    assert gw.metrics.errors.get("slow_consumer", 0) == 0


async def test_a_session_closed_by_its_own_output_queues_no_synthesis(scripted_llm_server):
    """Effects come in lists; when one of them closes the session (its output passed the
    outbox), the rest must not run: the StartSynthesis after it put hundreds of dead jobs on
    the lane ahead of every live session (a live one-sentence turn then took 79 s)."""
    # one text.delta of 100,000 characters, over a 64 KiB outbox (the reply cap raised for it)
    reply = "Party time is here now. " * 4_200
    scripted_llm_server.script([Text(reply), Finish(), Done()])
    gw = Gateway(load_config(server={"port": 0, "outbox_bytes": 64 * 1024},
                             llm={"url": scripted_llm_server.url},
                             session={"max_reply_chars": 200_000}))
    await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="celebrate")
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await ws.recv()
            assert closed.value.rcvd.code == 1013
        await unless_hung(gw.wait_no_sessions())
        assert gw.metrics.errors["slow_consumer"] == 1
        assert gw.lane.queue_depth == 0 and gw.lane.stats.steps == 0
    finally:
        await gw.aclose()


# --- reasoning models' thoughts ([llm] thinking) ------------------------------------------

R1_STREAM = ["Okay, the user says hi. ", "I should greet them back.", "\n</th", "ink>\n\n",
             "Hello! How can I help?"]
"""A DeepSeek-R1 distill's (or QwQ's) reply: its chat template opened <think> in the prompt,
so the stream starts inside the thought and carries only the </think> (split here)."""


async def turns(gw: Gateway, *texts: str) -> list:
    """One session, one turn per text, each read to its turn.done."""
    results = []
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="session.update", session={"max_lead_ms": 30000})
        await recv_event(ws, "session.updated")
        for text in texts:
            await send(ws, type="transcript", text=text)
            results.append(await read_turn(ws))
    return results


async def gateway_thinking(url: str, thinking: str) -> Gateway:
    from engines.llm_openai import OpenAiLlm

    gw = Gateway(load_config(server={"port": 0}, llm={"url": url}),
                 llm=OpenAiLlm(url, thinking=thinking))
    await gw.start()
    return gw


async def test_a_thought_the_template_opened_is_neither_heard_nor_kept(scripted_llm_server):
    scripted_llm_server.script(reply_script(R1_STREAM), reply_script(["Hm.</think>Fine."]))
    gw = await gateway_thinking(scripted_llm_server.url, "opened")
    try:
        first, second = await turns(gw, "hi", "again")
    finally:
        await gw.aclose()
    assert first.reply == "\n\nHello! How can I help?"
    assert [s["text"] for s in first.of("sentence")] == ["Hello!", "How can I help?"]
    assert first.done["status"] == "completed" and not first.of("error")
    assert second.reply == "Fine." and second.done["status"] == "completed"
    history = scripted_llm_server.chats[1].body["messages"]
    assert [m for m in history if m["role"] == "assistant"] == [
        {"role": "assistant", "content": "Hello! How can I help?"}]


async def test_by_default_an_unopened_thought_is_said_but_never_its_tag_and_the_operator_told(
        scripted_llm_server, caplog):
    """"tagged" never holds the first sentence back for a tag that may come: the thought
    before a lone </think> has been said by then. The tag itself was spoken as a sentence
    of its own ('</think>'); now it is dropped, and a warning says what to set."""
    scripted_llm_server.script(reply_script(R1_STREAM))
    with caplog.at_level(logging.WARNING, logger="engines.llm_openai"):
        gw = await start_gateway(scripted_llm_server.url)
        try:
            result = await turn(gw, max_lead_ms=30000)
            health = gw.health()["llm"]
        finally:
            await gw.aclose()
    assert [s["text"] for s in result.of("sentence")] == [
        "Okay, the user says hi.", "I should greet them back.", "Hello!", "How can I help?"]
    assert health["thinking"] == {"mode": "tagged", "unopened": 1, "unclosed": 0}
    assert "</think>" not in result.reply
    (warning,) = [r for r in caplog.records if r.name == "engines.llm_openai"]
    assert 'set [llm] thinking = "opened"' in warning.getMessage()


@pytest.mark.parametrize("finish", ["stop", "length"])
async def test_a_reply_that_never_ends_its_thought_says_nothing_and_the_turn_ends(
        scripted_llm_server, finish):
    """'opened' and no </think>: thinking cut at the token limit, or a model that did not
    think. Nothing is said (a thought held back is never spoken late); the turn ends, and
    says why (it ended completed, with no audio and no error)."""
    scripted_llm_server.script(reply_script(["The user says hi. ", "Greet th"], finish=finish),
                               reply_script(["Thought.</think>Hi."]))
    gw = await gateway_thinking(scripted_llm_server.url, "opened")
    try:
        silent, after = await turns(gw, "hi", "again")
        health = gw.health()["llm"]
    finally:
        await gw.aclose()
    assert not silent.of("text.delta") and not silent.of("sentence")
    assert [e["error"]["message"] for e in silent.of("error")] == [
        "the LLM's reply was only a thought (26 characters, not said): nothing to say"
        if finish == "stop" else
        "the reply reached the LLM's token limit (max_tokens); the rest is not spoken"]
    assert silent.done["status"] == "failed"
    assert after.reply == "Hi." and after.done["status"] == "completed"
    assert health["thinking"] == {"mode": "opened", "unopened": 0, "unclosed": 1}


async def test_the_thinking_settings_reach_the_backend(scripted_llm_server):
    scripted_llm_server.script(reply_script(R1_STREAM))
    gw = await start_gateway(scripted_llm_server.url, thinking="opened",
                             chat_template_kwargs={"reasoning_effort": "low"})
    try:
        result = await turn(gw, max_lead_ms=30000)
    finally:
        await gw.aclose()
    assert scripted_llm_server.chats[0].body["chat_template_kwargs"] == {
        "reasoning_effort": "low"}
    assert result.reply == "\n\nHello! How can I help?"


OVERFLOW = Status(400, b'{"error": {"message": "Prompt (9210 tokens) exceeds max context window '
                       b'of 8192 tokens", "type": "invalid_request_error"}}')
"""What oMLX answers a prompt longer than its model's context (llama.cpp, vLLM and others
word it their own way: ``engines.llm_openai.CONTEXT_FULL``)."""


async def test_a_conversation_grown_past_the_llm_context_forgets_its_oldest_turns(
        scripted_llm_server):
    """A session whose history outgrew the LLM's context failed every turn from then on
    (llm_failed, HTTP 400): each failed turn only made the history longer. The oldest half
    of the turns is now forgotten and the request made again, until it fits."""
    scripted_llm_server.script(
        reply_script(["One."]), reply_script(["Two."]), reply_script(["Three."]),
        [OVERFLOW], [OVERFLOW], reply_script(["Four."]))
    gw = await start_gateway(scripted_llm_server.url)
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            for text in ("first", "second", "third"):
                await send(ws, type="transcript", text=text)
                assert (await read_turn(ws)).done["status"] == "completed"
            await send(ws, type="transcript", text="fourth")
            fourth = await read_turn(ws)
    finally:
        await gw.aclose()
    assert fourth.done["status"] == "completed" and not fourth.of("error")
    assert fourth.reply == "Four."
    users = [[m["content"] for m in chat.body["messages"] if m["role"] == "user"]
             for chat in scripted_llm_server.chats[3:]]
    assert users == [["first", "second", "third", "fourth"], ["third", "fourth"], ["fourth"]]
    assert gw.llm_failing is None  # the LLM answered as asked: it is not failing


async def test_a_request_past_the_llm_context_with_no_history_fails_the_turn_only(
        scripted_llm_server):
    scripted_llm_server.script([OVERFLOW], reply_script(["Fine."]))
    gw = await start_gateway(scripted_llm_server.url)
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="a very long question")
            first = await read_turn(ws)
            await send(ws, type="transcript", text="short")
            second = await read_turn(ws)
    finally:
        await gw.aclose()
    (error,) = first.of("error")
    assert error["error"]["code"] == "llm_failed"
    assert "exceeds max context window" in error["error"]["message"]
    assert first.done["status"] == "failed"
    assert second.done["status"] == "completed"
    assert len(scripted_llm_server.chats) == 2
    # the question that did not fit is not sent again: an LLM refused it with "short" too,
    # a request more, before the session forgot it
    assert scripted_llm_server.chats[1].body["messages"][1:] == [
        {"role": "user", "content": "short"}]


async def test_an_older_llama_cpp_error_field_fails_the_turn_with_its_words(
        scripted_llm_server):
    """llama.cpp until September 2025 reported a failure mid-stream as an ``error:`` SSE
    field, then ``[DONE]``: the turn ended ``completed`` with half a reply, the server's
    words lost. The turn now fails with them; the sentence said before it is still spoken."""
    scripted_llm_server.script([
        Text("One sentence. And then"),
        Raw(b'error: {"code":500,"message":"Failed to decode the batch","type":'
            b'"server_error"}\n\n'), Done()])
    gw = await start_gateway(scripted_llm_server.url)
    try:
        result = await turn(gw, max_lead_ms=30000)
    finally:
        await gw.aclose()
    (error,) = result.of("error")
    assert error["error"]["code"] == "llm_failed"
    assert "Failed to decode the batch" in error["error"]["message"]
    assert result.done["status"] == "failed"
    assert [s["text"] for s in result.of("sentence")] == ["One sentence."]
