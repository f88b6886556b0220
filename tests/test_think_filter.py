"""A reasoning model's thoughts, never spoken: ``ThinkFilter`` on every split of a stream,
``OpenAiLlm`` over a scripted server (thoughts in the content or in a field of their own),
and the ``[llm]`` settings that choose how thoughts show."""

from __future__ import annotations

import json
import logging
import re
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.base import LlmDelta, LlmDone, LlmRequest
from engines.llm_openai import OpenAiLlm, ThinkFilter
from gateway.config import load_config
from tests.servers import Done, Finish, Raw, Text, reply_script

R1 = "Okay, the user says hi. I should greet them.\n</think>\n\nHello! How can I help?"
"""A DeepSeek-R1 distill's stream: its template opened <think>, the stream has none."""
QWEN = "<think>\nThe user says hi.\n</think>\n\nHello! How can I help?"
"""A Qwen3's stream: the thought opened in the content."""


def said(chunks: list[str], opened: bool = False) -> str:
    thoughts = ThinkFilter(opened=opened)
    return "".join(thoughts.feed(c) for c in chunks) + thoughts.finish()


def reference(text: str, opened: bool) -> str:
    """What a whole text says: a thought runs to its first </think> (or the end); a
    </think> that closes none is dropped."""
    if opened:
        text = text.partition("</think>")[2]
    return re.sub(r"<think>.*?(?:</think>|\Z)|</think>", "", text, flags=re.DOTALL)


def splits(text: str, pieces: int) -> list[list[str]]:
    """``text`` cut in ``pieces`` pieces at every choice of places."""
    return [[text[a:b] for a, b in zip((0, *cuts), (*cuts, len(text)), strict=True)]
            for cuts in combinations(range(1, len(text)), pieces - 1)]


@pytest.mark.parametrize(("text", "opened", "expected"), [
    (R1, True, "\n\nHello! How can I help?"),
    (QWEN, False, "\n\nHello! How can I help?"),
    # a template that opens <think> and a model that writes one anyway: still one thought
    ("<think>Hmm.</think>Yes.", True, "Yes."),
    # after the template's thought, a tagged one is dropped too
    ("Hmm.</think>Yes. <think>Again.</think>No.", True, "Yes. No."),
    # a reply that speaks of tags is said whole
    ("Use <b> and </b>, or <thinker>.", False, "Use <b> and </b>, or <thinker>."),
    # "tagged" over a template that opened the thought: said, but never the tag itself
    (R1, False, "Okay, the user says hi. I should greet them.\n\n\nHello! How can I help?"),
])
def test_thoughts_are_dropped_however_the_stream_is_cut(text, opened, expected):
    assert reference(text, opened) == expected
    for pieces in (1, 2, 3):
        for chunks in splits(text, pieces):
            assert said(chunks, opened) == expected, chunks


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "<th", "ink>", "think",
                                 ">", "/", "a", " b. ", "\n"]), max_size=12),
       st.booleans(), st.data())
def test_any_chunking_says_what_the_whole_text_says(parts, opened, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(text) - 1, 1)))))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=False)]
    assert said(chunks, opened) == reference(text, opened)


def test_tagged_holds_back_only_what_may_begin_a_tag():
    """Latency is the product: the first sentence goes as it comes, not after a tag."""
    thoughts = ThinkFilter()
    assert thoughts.feed("Hello there. ") == "Hello there. "
    assert thoughts.feed("Sure.</") == "Sure."  # (held: it may close a thought)
    assert thoughts.feed("b> ok <") == "</b> ok "
    assert thoughts.finish() == "<"


def test_opened_says_nothing_before_the_thought_ends_then_everything_at_once():
    thoughts = ThinkFilter(opened=True)
    assert [thoughts.feed(c) for c in ["Okay, ", "a greeting.", "</th"]] == ["", "", ""]
    assert thoughts.feed("ink>Hello") == "Hello"
    assert thoughts.feed(" there.") == " there."
    assert thoughts.finish() == ""
    assert not thoughts.inside and not thoughts.unopened


@pytest.mark.parametrize("chunks", [["Thinking on and on"], ["Thinking </thi"], []])
def test_opened_without_a_closing_tag_says_nothing(chunks):
    thoughts = ThinkFilter(opened=True)
    assert "".join(thoughts.feed(c) for c in chunks) + thoughts.finish() == ""
    assert thoughts.inside and thoughts.opened  # (what tells OpenAiLlm to warn)


def test_a_closing_tag_that_closes_no_thought_is_counted_with_what_was_said_before():
    thoughts = ThinkFilter()
    assert thoughts.feed("Okay, hi.\n</th") == "Okay, hi.\n"
    assert thoughts.feed("ink>\n\nHello.") == "\n\nHello."
    assert (thoughts.unopened, thoughts.said_before_unopened) == (1, 10)
    assert thoughts.feed("</think>") == ""
    assert (thoughts.unopened, thoughts.said_before_unopened) == (2, 10)


def test_a_server_that_sends_thoughts_apart_ends_the_thought_the_template_opened():
    """mlx_lm.server (``reasoning``), vLLM, llama.cpp and oMLX (``reasoning_content``) parse
    thoughts themselves: their content is the reply, with no </think> in it."""
    opened = ThinkFilter(opened=True)
    assert opened.feed("") == ""
    opened.reasoning_seen()
    assert opened.feed("Hello.") == "Hello."
    tagged = ThinkFilter()
    assert tagged.feed("<think>x") == ""
    tagged.reasoning_seen()  # (a thought the content opened is the content's own)
    assert tagged.feed("y</think>Hi.") == "Hi."


# --- OpenAiLlm over a scripted server ----------------------------------------------------


def delta(**fields: str) -> Raw:
    """A chunk whose delta carries ``fields`` (``reasoning``, ``reasoning_content``...)."""
    chunk = {"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", **fields}, "finish_reason": None}]}
    return Raw(b"data: " + json.dumps(chunk).encode() + b"\n\n")


async def reply(backend: OpenAiLlm) -> tuple[str, LlmDone]:
    events = [e async for e in backend.stream(LlmRequest(messages=[
        {"role": "user", "content": "hi"}]))]
    assert isinstance(events[-1], LlmDone)
    return "".join(e.text for e in events if isinstance(e, LlmDelta)), events[-1]


@pytest.fixture
async def backend_of(scripted_llm_server):
    made: list[OpenAiLlm] = []

    def make(**options) -> OpenAiLlm:
        made.append(OpenAiLlm(scripted_llm_server.url, **options))
        return made[-1]

    yield make
    for backend in made:
        await backend.aclose()


async def test_tagged_over_an_opened_template_drops_the_tag_and_warns_once(
        scripted_llm_server, backend_of, caplog):
    scripted_llm_server.script(reply_script(["Okay, hi.\n</th", "ink>\n\nHello."]),
                               reply_script(["Hmm.</think>Hi."]))
    backend = backend_of()
    with caplog.at_level(logging.WARNING, logger="engines.llm_openai"):
        assert (await reply(backend))[0] == "Okay, hi.\n\n\nHello."
        assert (await reply(backend))[0] == "Hmm.Hi."
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING
    assert "10 characters" in warning.getMessage()
    assert 'set [llm] thinking = "opened"' in warning.getMessage()
    assert backend.thoughts_unopened == 2


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_opened_speaks_the_content_of_a_server_that_sends_thoughts_apart(
        scripted_llm_server, backend_of, field):
    scripted_llm_server.script([delta(**{field: "The user says hi."}),
                                delta(**{field: " Greet."}), Text("Hello!"), Finish(), Done()])
    text, done = await reply(backend_of(thinking="opened"))
    assert text == "Hello!" and done.finish_reason == "stop"


@pytest.mark.parametrize(("finish", "advice"), [
    ("stop", 'set [llm] thinking = "tagged"'),
    ("length", "raise [llm] max_tokens"),
])
async def test_opened_without_a_closing_tag_ends_having_said_nothing(
        scripted_llm_server, backend_of, caplog, finish, advice):
    scripted_llm_server.script(reply_script(["Thinking ", "on and on </th"], finish=finish),
                               reply_script(["More thought."]))
    backend = backend_of(thinking="opened")
    with caplog.at_level(logging.WARNING, logger="engines.llm_openai"):
        assert await reply(backend) == ("", LlmDone(finish_reason=finish, thought_chars=23))
        assert (await reply(backend))[0] == ""
    (warning,) = caplog.records
    assert "ended inside a thought" in warning.getMessage()
    assert advice in warning.getMessage()
    assert backend.thoughts_unclosed == 2 and backend.thoughts_unopened == 0


async def test_tagged_with_a_thought_never_closed_says_what_came_before_and_warns_once(
        scripted_llm_server, backend_of, caplog):
    """"tagged" and a <think> with no </think> after it: what came before was said, the
    thought was not, and the operator is told the tag was never closed (the whole suite
    only ever ended "opened" replies inside a thought, whose advice differs)."""
    scripted_llm_server.script(reply_script(["Sure. <thi", "nk>Now I ponder"]),
                               reply_script(["<think>More."]))
    backend = backend_of()
    with caplog.at_level(logging.WARNING, logger="engines.llm_openai"):
        text, done = await reply(backend)
        assert (text, done.finish_reason, done.thought_chars) == ("Sure. ", "stop", 19)
        assert (await reply(backend))[0] == ""
    (warning,) = caplog.records
    assert warning.getMessage() == (
        "The LLM's reply (25 characters) ended inside a thought, which was not said; its "
        "<think> was never closed (warned once; counted in thoughts_unclosed)")
    assert backend.thoughts_unclosed == 2 and backend.thoughts_unopened == 0


async def test_opened_with_a_second_closing_tag_says_the_text_around_it_and_warns_once(
        scripted_llm_server, backend_of, caplog):
    """"opened": the first </think> ends the thought the template opened; another after it
    closes nothing. It is dropped, the reply around it said, and the operator told the
    model closed a thought twice (not to set "opened", which is set already: the whole
    suite only ever met a lone </think> under "tagged")."""
    scripted_llm_server.script(reply_script(["Plan.</think>Hello.", "</think> Bye."]),
                               reply_script(["Plan.</think>A.</think>B."]))
    backend = backend_of(thinking="opened")
    with caplog.at_level(logging.WARNING, logger="engines.llm_openai"):
        assert (await reply(backend))[0] == "Hello. Bye."
        assert (await reply(backend))[0] == "A.B."
    (warning,) = caplog.records
    assert warning.getMessage() == (
        "The LLM wrote </think> with no <think> before it, after the thought the template "
        "opened had ended: the 6 characters said before it were most likely thinking, "
        "spoken and kept in the history; the model closed a thought twice (warned once; "
        "counted in thoughts_unopened)")
    assert backend.thoughts_unopened == 2 and backend.thoughts_unclosed == 0


async def test_chat_template_kwargs_go_with_each_request_only_when_set(
        scripted_llm_server, backend_of):
    await reply(backend_of())
    await reply(backend_of(chat_template_kwargs={"enable_thinking": False}))
    bodies = [r.body for r in scripted_llm_server.chats]
    assert "chat_template_kwargs" not in bodies[0]
    assert bodies[1]["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_backend_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="thinking must be one of tagged, opened"):
        OpenAiLlm("http://127.0.0.1:1/v1", thinking="auto")


# --- [llm] settings -------------------------------------------------------------------------


def test_the_config_defaults():
    assert load_config().llm.thinking == "tagged"
    assert load_config().llm.chat_template_kwargs == {}


def test_thinking_settings_load_from_toml(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text('[llm]\nurl = "http://127.0.0.1:8081/v1"\nthinking = "opened"\n'
                    "[llm.chat_template_kwargs]\nthinking_budget = 256\n")
    llm = load_config(path).llm
    assert (llm.thinking, llm.chat_template_kwargs) == ("opened", {"thinking_budget": 256})


@pytest.mark.parametrize(("llm", "message"), [
    ({"thinking": "auto"}, "llm.thinking must be one of tagged, opened, not 'auto'"),
    ({"thinking": "opened", "chat_template_kwargs": {"enable_thinking": False}},
     "every reply would be silent"),
    ({"chat_template_kwargs": "enable_thinking=false"}, "llm.chat_template_kwargs must be"),
])
def test_thinking_settings_that_cannot_work_are_refused(llm, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(llm=llm)
