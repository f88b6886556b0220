"""Which LLM model a client may ask for (``session.llm.model``): the server's own, those
the operator offers with ``[llm] models``, or any with ``"*"``. Any client could name any
model, and oMLX loaded it, for every session: on the hub a second 26B model swaps the
first out (seconds for every listener's next reply) or does not fit at all."""

from __future__ import annotations

import pytest

from gateway.config import load_config
from gateway.core.codec import ClientSessionUpdate
from gateway.core.session import SendEvent, Session, SessionSettings
from tests.wsclient import read_turn, recv_event, send


def only_event(effects) -> dict:
    (effect,) = effects
    assert isinstance(effect, SendEvent)
    return effect.event


def test_a_model_the_server_does_not_offer_is_refused_and_nothing_changes():
    s = Session("s", settings=SessionSettings(llm_model="gemma", temperature=0.7),
                llm_models=["qwen3-8b"])
    event = only_event(s.receive(ClientSessionUpdate(
        {"llm": {"model": "llama-70b", "temperature": 0.2}}), 0.0))
    assert event["error"] == {"code": "unknown_model", "message":
                              "LLM model 'llama-70b' is not offered here; offered: gemma, "
                              "qwen3-8b (the server's [llm] model and models)"}
    assert (s.settings.llm_model, s.settings.temperature) == ("gemma", 0.7)
    for model in ("qwen3-8b", "gemma", None):  # offered, the server's own, its default
        event = only_event(s.receive(ClientSessionUpdate({"llm": {"model": model}}), 0.0))
        assert event["type"] == "session.updated"
        assert event["session"]["llm"]["model"] == (model or "gemma")


def test_without_a_configured_model_only_the_llm_servers_default_is_used():
    s = Session("s", llm_models=())
    event = only_event(s.receive(ClientSessionUpdate({"llm": {"model": "x"}}), 0.0))
    assert event["error"]["code"] == "unknown_model"
    assert "only the LLM server's default model is used here" in event["error"]["message"]


def test_any_model_when_the_session_is_given_no_list():
    s = Session("s")
    event = only_event(s.receive(ClientSessionUpdate({"llm": {"model": "x"}}), 0.0))
    assert event["session"]["llm"]["model"] == "x"


@pytest.mark.parametrize(("llm", "asked", "code"), [
    ({}, "other", "unknown_model"),  # the default: the server's model only
    ({"model": "gemma"}, "gemma", None),
    ({"model": "gemma", "models": ("qwen",)}, "qwen", None),
    ({"models": ("*",)}, "anything", None),
])
async def test_the_gateway_offers_its_model_and_what_the_operator_lists(start_gateway, llm,
                                                                         asked, code):
    gw = await start_gateway([{"transcript": "Hello", "reply": "Hi."}], llm=llm)
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws)
        await send(ws, type="session.update", session={"llm": {"model": asked}})
        event = await recv_event(ws)
        if code is None:
            assert event["session"]["llm"]["model"] == asked
        else:
            assert event["error"]["code"] == code
        await send(ws, type="transcript", text="Hello")
        assert (await read_turn(ws)).done["status"] == "completed"


@pytest.mark.parametrize("models", [("",), ("gemma", " ")])
def test_models_are_names(models):
    with pytest.raises(ValueError, match="llm.models"):
        load_config(llm={"models": models})
