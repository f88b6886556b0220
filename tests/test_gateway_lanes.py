"""Two real engines on two lanes in the live gateway: turns are placed per turn
(``tts.also``), with a real HTTP LLM (the scripted SSE double) decoding or not."""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from engines import registry
from engines.base import EngineError, SynthesisRequest
from engines.synthetic import SyntheticEngine
from gateway.config import load_config
from gateway.core.placement import LaneLoad, place
from gateway.io.lanes import Lane
from gateway.io.server import Gateway
from tests.fixtures_mlx import NO_STEP_DEADLINE
from tests.hang_guard import HANG_S, unless_hung
from tests.servers import Hang, Text
from tests.wsclient import LineSeen, TurnResult, gapless, read_turn, recv_event, send

LONG = ("This first sentence is long on purpose, so that its synthesis is still queued on "
        "its lane, paced just in time, when the listener interrupts the reply halfway "
        "through it and the gateway has to drop whatever it had planned to say next.")

TWO_LANES = {
    "engine": "synthetic", "voice": "mid",
    # gpu: free steps (inline); ane: small real costs, so idle placement prefers the gpu
    "options": {"rtf": 0.0, "ttfa_ms": 0.0, "name": "synthetic-gpu"},
    "also": "synthetic",
    "also_options": {"lane": "ane", "rtf": 0.05, "ttfa_ms": 5.0, "name": "synthetic-ane"},
}


async def two_lane_gateway(llm_url: str | None = None, **tts) -> Gateway:
    llm = {"url": llm_url} if llm_url else {"tokens_per_s": 0}
    gw = Gateway(load_config(server={"port": 0}, llm=llm, tts={**TWO_LANES, **tts}))
    await gw.start()
    return gw


def expected_lane(gw: Gateway, llm_decoding: bool) -> str:
    """What ``place`` says for a turn arriving at an idle gateway."""
    return place([LaneLoad(gw.profiles[name], 0) for name in gw.lanes], llm_decoding)


async def test_while_the_llm_decodes_the_turn_speaks_on_the_ane_lane(scripted_llm_server):
    # the LLM sends a first sentence and keeps decoding (hangs) while it is spoken
    scripted_llm_server.script([Text(LONG + " "), Text("And then"), Hang()])
    gw = await two_lane_gateway(scripted_llm_server.url)
    try:
        lane = expected_lane(gw, llm_decoding=True)
        assert lane == "ane"  # place() leaves the GPU to a decoding LLM when ane is feasible
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="transcript", text="Tell me something long.")
            sentence = await recv_event(ws, "sentence")
            assert sentence["engine"] == "synthetic-ane"
            owner = (next(iter(gw.runners)), sentence["turn_id"])
            assert gw.lane_for(owner) is gw.lanes["ane"]
            assert gw.placer is not None and gw.placer.active("ane") == 1
            # the reply (an eager first clause, then the rest of the sentence) is still being
            # made just in time on the ane lane; nothing on the gpu
            assert gw.lanes["ane"].queue_depth >= 1 and gw.lanes["gpu"].queue_depth == 0

            async with httpx.AsyncClient(timeout=HANG_S) as client:
                r = await client.get(f"http://127.0.0.1:{gw.http_port}/health")
            health = r.json()
            assert list(health["lanes"]) == ["gpu", "ane"]
            assert health["lanes"]["ane"]["engine"] == "synthetic-ane"
            assert health["lanes"]["ane"]["turns"] == 1 and health["lanes"]["gpu"]["turns"] == 0
            assert health["lanes"]["ane"]["steps"] > 0 and health["lanes"]["gpu"]["steps"] == 0
            assert {e["lane"] for e in health["engines"].values()} == {"gpu", "ane"}

            # barge-in: the turn's job is dropped from the ane lane, the LLM stream closed
            await send(ws, type="cancel")
            result = await read_turn(ws, sentence["turn_id"])
        done = result.done
        assert done["status"] == "cancelled"
        assert done["metrics"]["engines"] == ["synthetic-ane"]
        assert gw.lanes["ane"].queue_depth == 0 and gw.lanes["ane"].stats.jobs_cancelled >= 1
        assert gw.lanes["gpu"].stats.steps == 0
        assert gw.placer.active("ane") == 0 and gw.lane_for(owner) is gw.lane
        await scripted_llm_server.chats[0].disconnected.wait()  # the LLM stream closed
    finally:
        await gw.aclose()


async def test_with_no_llm_decoding_and_a_free_gpu_the_turn_stays_where_place_says():
    gw = await two_lane_gateway()
    try:
        lane = expected_lane(gw, llm_decoding=False)
        engine = gw.lanes[lane].engine.name
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="Hello there. How are you?")  # no LLM at all
            result = await read_turn(ws)
        assert lane == "gpu"  # these profiles: the gpu's first audio is earlier
        assert result.done["status"] == "completed"
        assert result.done["metrics"]["engines"] == [engine]
        assert {s["engine"] for s in result.of("sentence")} == {engine}
        assert gw.lanes[lane].stats.jobs_done == 2
        assert gw.lanes["ane"].stats.steps == 0
        assert gw.placer is not None and gw.placer.active(lane) == 0  # released at turn.done
    finally:
        await gw.aclose()


async def test_a_voice_only_the_second_engine_has_is_spoken_there():
    # espeak (cpu lane) has no "high" voice; the synthetic engine on the ane lane has
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "espeak", "also": "synthetic",
        "also_options": {"lane": "ane", "rtf": 0.0, "ttfa_ms": 0.0, "name": "synthetic-ane"}}))
    await gw.start()
    try:
        assert gw.placer is not None and gw.placer.lanes_with("high") == ["ane"]
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="session.update", session={"voice": "high"})
            await recv_event(ws, "session.updated")
            await send(ws, type="say", text="Only one lane has this voice.")
            result = await read_turn(ws)
        assert result.done["metrics"]["engines"] == ["synthetic-ane"]
        # background HTTP speech: the primary lane, unless only the other has the voice
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            url = f"http://127.0.0.1:{gw.http_port}/v1/audio/speech"
            r = await client.post(url, json={"input": "Hi.", "voice": "high",
                                             "response_format": "pcm"})
            assert r.status_code == 200 and r.headers["x-engine"] == "synthetic-ane"
            assert len(r.content) > 0
            r = await client.post(url, json={"input": "Hi.", "response_format": "pcm"})
            assert r.status_code == 200 and r.headers["x-engine"] == "espeak"
        assert gw.lanes["ane"].stats.jobs_done == 2 and gw.lanes["cpu"].stats.jobs_done == 1
    finally:
        await gw.aclose()


async def test_metrics_and_models_list_both_lanes():
    gw = await two_lane_gateway()
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            text = (await client.get(f"http://127.0.0.1:{gw.http_port}/metrics")).text
            models = (await client.get(f"http://127.0.0.1:{gw.http_port}/v1/models")).json()
        for lane in ("gpu", "ane"):
            assert f'gateway_lane_queue_depth{{lane="{lane}"}}' in text
            assert f'gateway_lane_turns{{lane="{lane}"}}' in text
        assert [(m["id"], m["lane"]) for m in models["data"]] == [
            ("synthetic-gpu", "gpu"), ("synthetic-ane", "ane")]
    finally:
        await gw.aclose()


async def test_two_engines_of_one_name_are_two_models():
    """/health keyed them ``<name>@<lane>``; /v1/models listed ``synthetic`` twice, and
    ``/v1/models/synthetic`` was the first of them only."""
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "synthetic", "options": {"rtf": 0.0, "ttfa_ms": 0.0},
        "also": "synthetic", "also_options": {"lane": "ane", "rtf": 0.0, "ttfa_ms": 0.0}}))
    await gw.start()
    try:
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.http_port}") as client:
            models = (await client.get("/v1/models")).json()["data"]
            ane = await client.get("/v1/models/synthetic@ane")
    finally:
        await gw.aclose()
    assert [(m["id"], m["lane"]) for m in models] == [("synthetic@gpu", "gpu"),
                                                      ("synthetic@ane", "ane")]
    assert list(gw.health()["engines"]) == [m["id"] for m in models]
    assert ane.status_code == 200 and ane.json()["lane"] == "ane"


def test_two_engines_on_one_lane_is_a_config_error():
    config = load_config(server={"port": 0},
                         tts={**TWO_LANES, "also_options": {"lane": "gpu"}})
    with pytest.raises(ValueError, match="different lanes"):
        Gateway(config)


@pytest.mark.parametrize("profiles, message", [
    ({"cpu": {"rtf": 0.5}}, "no engine runs on lane"),
    ({"ane": {"speed": 2.0}}, "unknown timing"),
])
def test_bad_profiles_are_config_errors(profiles, message):
    config = load_config(server={"port": 0}, tts={**TWO_LANES, "profiles": profiles})
    with pytest.raises(ValueError, match=message):
        Gateway(config)


def test_a_second_engine_without_timing_figures_needs_a_profile():
    """An engine that declares no ``timing`` (the remote http one: its server's speed is not
    known here) gives placement nothing to go by: refused naming the table that gives it
    one, and taken with ``[tts.profiles.<lane>]`` (README, Timing)."""
    tts = {"engine": "espeak", "also": "http", "also_options": {"url": "http://127.0.0.1:9/v1"}}
    with pytest.raises(ValueError) as refused:
        Gateway(load_config(server={"port": 0}, tts=tts))
    assert str(refused.value) == ("engine 'http' declares no timing figures to place turns "
                                  "with: set [tts.profiles.remote] first_s and rtf")
    gw = Gateway(load_config(server={"port": 0}, tts={
        **tts, "profiles": {"remote": {"first_s": 0.2, "rtf": 0.3}}}))
    assert gw.profiles["remote"].first_s == 0.2 and gw.profiles["remote"].rtf == 0.3
    for lane in gw.lanes.values():  # never started: stop the lane threads
        lane._executor.shutdown()


def test_profiles_override_the_engines_own_figures():
    gw = Gateway(load_config(server={"port": 0},
                             tts={**TWO_LANES, "profiles": {"ane": {"rtf": 0.7}}}))
    assert gw.profiles["ane"].rtf == 0.7 and gw.profiles["ane"].first_s == 0.005
    assert gw.profiles["gpu"].shares_gpu and not gw.profiles["ane"].shares_gpu
    for lane in gw.lanes.values():  # never started: stop the lane threads
        lane._executor.shutdown()


def test_the_cli_flag_names_the_second_engine(tmp_path):
    from gateway.cli import _parser

    args = _parser().parse_args(["serve", "--tts", "qwen3", "--tts-also", "ane"])
    assert args.tts_also == "ane"
    toml = tmp_path / "hub.toml"
    toml.write_text('[tts]\nengine = "qwen3"\nalso = "ane"\n'
                    '[tts.also_options]\nvoice = "Serena"\n'
                    '[tts.profiles.ane]\nrtf = 0.8\n')
    config = load_config(toml)
    assert config.tts.also == "ane" and config.tts.also_options == {"voice": "Serena"}
    assert config.tts.profiles == {"ane": {"rtf": 0.8}}


async def test_one_lane_gateway_keeps_its_single_lane(start_gateway):
    gw = await start_gateway()
    assert list(gw.lanes) == [gw.lane.name] and gw.placer is None
    health = gw.health()
    assert list(health["lanes"]) == [gw.lane.name] and "turns" not in health["lanes"]["cpu"]


async def test_health_counts_the_primary_engines_voices_under_engine():
    """``/health`` ``engine`` is the primary's (docs/http-api.md), but its ``voices`` was
    every lane's: 144 for espeak (141) beside a synthetic second engine (3)."""
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "also": "synthetic", "also_options": {"lane": "ane", "rtf": 0.0, "ttfa_ms": 0.0}}))
    await gw.start()
    try:
        health = gw.health()
    finally:
        await gw.aclose()
    espeak = len(gw.lane_voices["cpu"])
    assert health["engine"]["name"] == "espeak" and health["engine"]["voices"] == espeak
    assert health["engines"]["espeak"]["voices"] == espeak
    assert health["engines"]["synthetic"]["voices"] == 3 and len(gw.voices) == espeak + 3


@pytest.mark.slow
async def test_the_hubs_two_lanes_qwen3_custom_voice_and_the_ane_port_share_serena(
        scripted_llm_server, tiny_qwen3_custom_voice, monkeypatch):
    # The hub's two-lane set-up: qwen3 with a CustomVoice model on the gpu (its built-in
    # "serena", through mlx-audio's real loader) next to the ANE port (test double of the
    # Core ML module), both speaking "Serena". Placement then uses the engines' own timing
    # (calibration.json): while an LLM decodes, the ane lane takes the first turn it can
    # keep in real time (1 x 0.705 <= 1), and a second turn at once goes to the gpu
    # (2 x 0.705 > 1 on ane; 1 x 0.97 on the gpu).
    from tests.test_ane_engine import make_double_module

    module, _ = make_double_module()
    monkeypatch.setitem(sys.modules, "qwen3_tts_ane", module)
    scripted_llm_server.script([Text("Here is a first sentence for you. "), Text("And then"),
                                Hang()])
    gw = Gateway(load_config(server={"port": 0}, llm={"url": scripted_llm_server.url}, tts={
        "engine": "qwen3", "model": str(tiny_qwen3_custom_voice), "voice": "serena",
        "options": {"max_tokens": 6}, "also": "ane",
        "step_timeout_s": NO_STEP_DEADLINE}))  # (a tiny model's step is slow, not stuck)
    await gw.start()
    try:
        assert gw.placer is not None and gw.placer.lanes_with("SERENA") == ["gpu", "ane"]
        assert gw.placer.lanes_with("aria") == ["gpu"]
        url = f"ws://127.0.0.1:{gw.port}/v1/voice"
        async with connect(url) as a, connect(url) as b:
            for ws in (a, b):
                await recv_event(ws, "session.created")
            await send(a, type="transcript", text="Say something.")
            first = await recv_event(a, "sentence")
            assert first["engine"] == "ane"  # the LLM is decoding: the GPU is left to it
            assert gw.llm_streams == 1 and gw.placer.active("ane") == 1
            await send(b, type="say", text="Hello from the other lane.")
            second = await read_turn(b)
            assert second.done["status"] == "completed"
            assert second.done["metrics"]["engines"] == ["qwen3"]
            assert second.audio_ms > 0
            await send(a, type="cancel")
            assert (await read_turn(a, first["turn_id"])).done["status"] == "cancelled"
        assert gw.lanes["gpu"].stats.jobs_done >= 1 and gw.lanes["ane"].stats.steps >= 1
        assert gw.placer.active("ane") == 0 and gw.placer.active("gpu") == 0
    finally:
        await gw.aclose()


async def test_placement_learns_what_the_lanes_measure(scripted_llm_server):
    # The ane lane's engine really takes 0.6 s per audio second (it sleeps on its thread),
    # while its configured figures claim 0.3: enough for two listeners at once. After one
    # turn there, placement uses the measured rate, and a second concurrent turn goes to
    # the gpu instead of overloading ane.
    scripted_llm_server.script([Text("Here is a first sentence for you. "), Text("And then"),
                                Hang()])
    gw = Gateway(load_config(server={"port": 0}, llm={"url": scripted_llm_server.url}, tts={
        "engine": "synthetic", "voice": "mid",
        "options": {"rtf": 0.0, "ttfa_ms": 0.0, "name": "synthetic-gpu"},
        "also": "synthetic",
        "also_options": {"lane": "ane", "rtf": 0.6, "ttfa_ms": 5.0, "step_ms": 40,
                         "name": "synthetic-ane"},
        "profiles": {"gpu": {"first_s": 0.2, "rtf": 0.0},
                     "ane": {"first_s": 0.005, "rtf": 0.3}}}))
    await gw.start()
    try:
        assert gw.placer is not None and gw.placer.profile("ane").rtf == 0.3
        url = f"ws://127.0.0.1:{gw.port}/v1/voice"
        async with connect(url) as a, connect(url) as b:
            for ws in (a, b):
                await recv_event(ws, "session.created")
            # idle: ane's (configured) first audio is earlier, so this turn is spoken there
            await send(a, type="say", text="A first turn, long enough for a few dozen steps.")
            warm = await read_turn(a)
            assert warm.done["metrics"]["engines"] == ["synthetic-ane"]
            learned = gw.placer.profile("ane")
            assert learned.rtf >= 0.55 and learned.first_s == 0.005  # too few openings yet

            await send(a, type="transcript", text="Say something.")  # the LLM decodes
            first = await recv_event(a, "sentence")
            assert first["engine"] == "synthetic-ane"
            await send(b, type="say", text="And a second turn at the same time.")
            second = await read_turn(b)
            assert second.done["metrics"]["engines"] == ["synthetic-gpu"]

            async with httpx.AsyncClient(timeout=HANG_S) as client:
                health = (await client.get(f"http://127.0.0.1:{gw.http_port}/health")).json()
            assert health["lanes"]["ane"]["timing"]["measured"] == ["rtf"]
            assert health["lanes"]["ane"]["timing"]["samples"]["rtf"] >= 8
            assert health["lanes"]["ane"]["timing"]["rtf"] >= 0.55  # (still measuring)
            gpu = health["lanes"]["gpu"]["timing"]
            assert gpu["first_s"] == 0.2 and gpu["rtf_llm"] is None  # one opening: configured
            await send(a, type="cancel")
            assert (await read_turn(a, first["turn_id"])).done["status"] == "cancelled"
    finally:
        await gw.aclose()


class BrokenAne(SyntheticEngine):
    """TEST DOUBLE: a second engine whose model breaks. ``fail="open"``: every synthesis
    fails before any audio; ``fail="mid"``: each stream fails after its first chunk;
    ``fail="empty"``: after a first step that made no audio (an empty chunk)."""

    def __init__(self, fail: str = "open", **options) -> None:
        super().__init__(**options)
        self.fail = fail
        self.opened = 0

    def open(self, request: SynthesisRequest):
        self.opened += 1
        if self.fail == "open":
            raise EngineError("engine_failed", "the model cannot start (test double)")
        stream = super().open(request)
        real_step, steps = stream.step, 0

        def step():
            nonlocal steps
            steps += 1
            if steps > 1:
                raise EngineError("engine_failed", "the model broke mid-sentence (test double)")
            return b"" if self.fail == "empty" else real_step()

        stream.step = step
        return stream


async def one_turn(gw: Gateway, text: str = "First sentence here. And a second one."
                   ) -> TurnResult:
    """A new session on ``gw`` says ``text``: that turn, read to its end."""
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
        await recv_event(ws, "session.created")
        await send(ws, type="say", text=text)
        return await read_turn(ws)


def broken_ane_gateway(monkeypatch, fail: str) -> Gateway:
    monkeypatch.setitem(registry.TTS_ENGINES, "broken", f"{__name__}:BrokenAne")
    return Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "synthetic", "voice": "mid",
        "options": {"rtf": 0.0, "ttfa_ms": 0.0, "name": "synthetic-gpu"},
        "also": "broken",
        "also_options": {"fail": fail, "lane": "ane", "rtf": 0.0, "ttfa_ms": 0.0,
                         "step_ms": 80, "name": "broken-ane"},
        # idle turns prefer ane (earlier first audio), so every turn tries it first
        "profiles": {"gpu": {"first_s": 0.2, "rtf": 0.0},
                     "ane": {"first_s": 0.005, "rtf": 0.05}}}))


async def test_a_turn_whose_second_engine_fails_is_spoken_by_the_primary(monkeypatch):
    gw = broken_ane_gateway(monkeypatch, "open")
    await gw.start()
    try:
        ane = gw.lanes["ane"].engine
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            for turn in range(1, 5):
                await send(ws, type="say", text="First sentence here. And a second one.")
                result = await read_turn(ws)
                # nothing lost, nothing said twice, no error: the primary said it all
                assert result.done["status"] == "completed" and result.of("error") == []
                assert [s["engine"] for s in result.of("sentence")] == ["synthetic-gpu"] * 2
                assert result.done["metrics"]["engines"] == ["synthetic-gpu"]
                gapless(result)
                # three failures in a row trip ane's breaker: the 4th turn never tries it
                assert ane.opened == min(turn, 3)
        assert gw.lanes["ane"].queue_depth == 0 and gw.lanes["gpu"].stats.jobs_done == 8
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            health = (await client.get(f"http://127.0.0.1:{gw.http_port}/health")).json()
        assert health["lanes"]["ane"]["rerouted"] == 3 and health["lanes"]["ane"]["tripped"]
        assert health["lanes"]["gpu"]["tripped"] is False
        # three turns placed on ane, then it opened once, and the 4th went to the gpu
        assert [(health["lanes"][n]["placed"], health["lanes"][n]["trips"])
                for n in ("gpu", "ane")] == [(1, 0), (3, 1)]
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            scrape = (await client.get(f"http://127.0.0.1:{gw.http_port}/metrics")).text
        assert 'gateway_lane_turns_placed_total{lane="ane"} 3.0' in scrape
        assert 'gateway_lane_turns_placed_total{lane="gpu"} 1.0' in scrape
        assert 'gateway_lane_breaker_trips_total{lane="ane"} 1.0' in scrape
        assert gw.metrics.errors["engine_failed"] == 0
    finally:
        await gw.aclose()


async def test_a_rerouted_turn_keeps_its_sessions_lead_on_the_primary(monkeypatch):
    """Jobs moved to the primary lane after the second engine failed were submitted
    without the session's max_lead: the primary made their audio as far ahead as the
    server's default instead of the session's own."""
    gw = broken_ane_gateway(monkeypatch, "open")
    submitted = []
    submit = Lane.submit

    def recording(self, owner, payload, **kwargs):
        submitted.append((self.name, payload.index, kwargs.get("max_lead")))
        return submit(self, owner, payload, **kwargs)

    monkeypatch.setattr(Lane, "submit", recording)
    await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            await send(ws, type="session.update", session={"max_lead_ms": 20_000})
            await recv_event(ws, "session.updated")
            await send(ws, type="say", text="First sentence here. And a second one.")
            assert (await read_turn(ws)).done["status"] == "completed"
        assert {lane for lane, _, _ in submitted} == {"ane", "gpu"}  # moved: a reroute
        assert {lead for _, _, lead in submitted} == {20.0}
    finally:
        await gw.aclose()


async def test_a_second_engine_failing_mid_sentence_ends_it_there_and_the_primary_goes_on(
        monkeypatch):
    gw = broken_ane_gateway(monkeypatch, "mid")
    await gw.start()
    try:
        result = await one_turn(gw)
        assert result.done["status"] == "completed" and result.of("error") == []
        # the first sentence stops after the one chunk ane made (the listener heard it;
        # no word is said twice); the second is the primary's
        assert [s["engine"] for s in result.of("sentence")] == ["broken-ane", "synthetic-gpu"]
        first, second = result.of("sentence.done")
        assert first["audio_ms"] == 80 and first["cut_short"] is True  # said, not hidden
        assert "cut_short" not in second
        assert result.done["metrics"]["engines"] == ["broken-ane", "synthetic-gpu"]
        gapless(result)
        assert gw.placer is not None and gw.placer.rerouted["ane"] == 1
    finally:
        await gw.aclose()


class StuckAne(SyntheticEngine):
    """TEST DOUBLE: a second engine whose model gets stuck. The first call on its lane
    thread waits for ``gate``; once ``stuck`` is set, every later call blocks until
    ``release`` (a kernel that never returns)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.blocks = True  # on the lane thread, where it can hang like a real model
        self.entered, self.gate, self.release = (threading.Event(), threading.Event(),
                                                 threading.Event())
        self.stuck = False

    def _call(self) -> None:
        if not self.gate.is_set():
            self.entered.set()
            self.gate.wait()
        elif self.stuck:
            self.release.wait()

    def open(self, request: SynthesisRequest):
        self._call()
        stream = super().open(request)
        real_step = stream.step

        def step():
            self._call()
            return real_step()

        stream.step = step
        return stream


async def test_turns_queued_on_a_second_lane_that_gets_stuck_are_spoken_by_the_primary(
        monkeypatch):
    """The ane engine gets stuck (engine_timeout) on one turn while another session's turn
    waits on that lane. The stuck turn moved to the primary; the one waiting failed with
    engine_unavailable although the primary was free to speak it (its jobs were failed
    as cancelled, which a reroute skips)."""
    monkeypatch.setitem(registry.TTS_ENGINES, "stuck", f"{__name__}:StuckAne")
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "synthetic", "voice": "mid",
        "options": {"rtf": 0.0, "ttfa_ms": 0.0, "name": "synthetic-gpu"},
        "also": "stuck",
        "also_options": {"lane": "ane", "rtf": 0.0, "ttfa_ms": 0.0, "name": "stuck-ane"},
        "profiles": {"gpu": {"first_s": 0.2, "rtf": 0.0},
                     "ane": {"first_s": 0.005, "rtf": 0.05}}}))
    await gw.start()
    ane = gw.lanes["ane"]
    engine = ane.engine
    ane.step_timeout_s = None  # the gated call: no limit
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as a, \
                connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as b:
            await recv_event(a, "session.created")
            await recv_event(b, "session.created")
            await send(a, type="say", text="First sentence here. And a second one.")
            await asyncio.to_thread(engine.entered.wait)  # a's first call holds ane
            await send(b, type="say", text="Bee speaks here. And says more.")
            started = await recv_event(b, "turn.started")  # (its jobs were submitted)
            assert ane.queue_depth == 4  # both turns wait on ane
            # the next call on ane gets stuck, and times out
            ane.step_timeout_s = 0.05
            engine.stuck = True
            engine.gate.set()
            first, second = await read_turn(a), await read_turn(b, started["turn_id"])
            assert ane.unhealthy is not None and "engine_timeout" in ane.unhealthy
        # the primary speaks, so the gateway is ok; the stuck lane says so on its own, in
        # /health and in /metrics (whose gateway_status follows the primary only)
        async with httpx.AsyncClient(timeout=HANG_S,
                                     base_url=f"http://127.0.0.1:{gw.port}") as http:
            health = (await http.get("/health")).json()
            metrics = (await http.get("/metrics")).text
        assert health["status"] == "ok" and health["engine"]["unhealthy"] is None
        assert health["lanes"]["ane"]["unhealthy"] == ane.unhealthy
        assert health["lanes"]["gpu"]["unhealthy"] is None
        assert 'gateway_lane_unhealthy{lane="ane"} 1.0' in metrics
        assert 'gateway_lane_unhealthy{lane="gpu"} 0.0' in metrics
        for result in (first, second):
            assert result.done["status"] == "completed", result.events
            assert result.of("error") == []
            assert result.done["metrics"]["engines"][-1] == "synthetic-gpu"
            gapless(result)
        assert ane.queue_depth == 0
    finally:
        engine.release.set()
        await gw.aclose()


async def test_a_second_engine_failing_after_a_step_without_audio_has_its_sentence_said_again(
        monkeypatch):
    """A step that made no audio (an empty chunk: a remote server's empty delta) counted as
    audio heard: the failing sentence was ended as cut short with nothing said (the whole
    sentence lost, its ``sentence`` naming the engine that made none of it), where a
    sentence none of whose audio went out is said again by the primary."""
    gw = broken_ane_gateway(monkeypatch, "empty")
    await gw.start()
    try:
        result = await one_turn(gw)
        assert result.done["status"] == "completed" and result.of("error") == []
        assert [s["engine"] for s in result.of("sentence")] == ["synthetic-gpu"] * 2
        assert all("cut_short" not in d and d["audio_ms"] > 0
                   for d in result.of("sentence.done"))
        assert result.done["metrics"]["engines"] == ["synthetic-gpu"]
        gapless(result)
    finally:
        await gw.aclose()


class MeetingRemote(SyntheticEngine):
    """TEST DOUBLE: an engine whose steps may run at once (``parallel_steps``, as the http
    engine's), and whose first steps of ``meet`` sessions wait for each other: they are
    all in flight together, for certain."""

    parallel_steps = 4
    meet = 3

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.blocks = True
        self.together = threading.Barrier(self.meet, timeout=60)

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        real_step, first = stream.step, [True]

        def step():
            if first[0]:
                first[0] = False
                self.together.wait()
            return real_step()

        stream.step = step
        return stream


def _union_s(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


async def test_a_lane_running_steps_at_once_is_busy_for_the_time_any_runs(monkeypatch):
    """Busy share (``/health`` ``busy_share_1m``, ``gateway_lane_busy_ratio``) is the share
    of wall time the lane had a step in flight; compute seconds add up every step. On a
    lane running several steps at once both were the sum of the steps, so eight steps
    waiting on a server together read as eight times the time, and a lane at a fraction
    of its capacity as fully busy (capped at 1)."""
    monkeypatch.setitem(registry.TTS_ENGINES, "meeting", f"{__name__}:MeetingRemote")
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "meeting", "voice": "mid",
        "options": {"rtf": 0.0, "ttfa_ms": 0.0, "lane": "remote"}}))
    await gw.start()
    lane = gw.lanes["remote"]
    assert lane.parallel_steps == MeetingRemote.parallel_steps
    steps: list[tuple[float, float]] = []
    record = gw.telemetry.job_step

    def job_step(name, job, started, seconds, audio_bytes, occupied):
        steps.append((started, started + seconds))
        record(name, job, started, seconds, audio_bytes, occupied)

    monkeypatch.setattr(gw.telemetry, "job_step", job_step)
    try:
        clients = [await connect(f"ws://127.0.0.1:{gw.port}/v1/voice")
                   for _ in range(MeetingRemote.meet)]
        for ws in clients:
            await recv_event(ws, "session.created")
            await send(ws, type="say", text="One short sentence.")
        for ws in clients:
            result = await read_turn(ws)
            assert result.done["status"] == "completed", result.events
            await ws.close()
        now = time.perf_counter()
        busy, compute = gw.telemetry.busy["remote"], gw.telemetry.compute["remote"]
        step_s = sum(end - start for start, end in steps)
        assert compute.busy_s(now) == pytest.approx(step_s, abs=1e-6)
        assert busy.busy_s(now) == pytest.approx(_union_s(steps), abs=1e-6)
        assert busy.busy_s(now) < step_s  # (the first steps overlapped, for certain)
    finally:
        await gw.aclose()


@pytest.mark.parametrize(("tts", "expected"), [
    ({"engine": "synthetic"}, None),  # an engine that declares none: no limit
    ({"engine": "synthetic", "max_open_streams": 3}, 3),
    ({"engine": "synthetic", "fallback": "espeak", "max_open_streams": 0}, None),
])
def test_max_open_streams_is_the_configured_or_the_engines_own(tts, expected):
    gw = Gateway(load_config(tts=tts))
    assert gw.lane.scheduler.max_open == expected


@pytest.mark.parametrize(("tts", "expected"), [
    ({"engine": "synthetic", "max_open_streams": 16}, 2),  # qwen3's bound: 2 kept
    ({"engine": "synthetic", "max_open_streams": 3}, 1),
    ({"engine": "synthetic", "max_open_streams": 1}, 0),  # one stream: none kept
    ({"engine": "synthetic"}, 0),
    ({"engine": "synthetic", "max_open_streams": 16, "interactive_reserved_streams": 0}, 0),
    ({"engine": "synthetic", "max_open_streams": 16, "interactive_reserved_streams": 5}, 5),
])
def test_streams_kept_for_voice_sessions_are_the_configured_or_an_eighth(tts, expected):
    """Scheduler rule 6b: of the lane's open streams, those background requests never
    hold (``[tts] interactive_reserved_streams``; default ``max_open // 8``, at least 1)."""
    gw = Gateway(load_config(tts=tts))
    assert gw.lane.scheduler.reserved == expected


def test_a_fallback_keeps_its_primarys_max_open_streams(monkeypatch):
    monkeypatch.setattr(SyntheticEngine, "max_open_streams", 5, raising=False)
    gw = Gateway(load_config(tts={"engine": "synthetic", "fallback": "espeak"}))
    assert gw.lane.scheduler.max_open == 5


class GatedRemote(SyntheticEngine):
    """TEST DOUBLE: an engine whose steps may run at once (``parallel_steps``, as the http
    engine's), and whose steps wait on the lane's threads until ``gate`` is set
    (``entered`` once the first one does; ``texts``: each step's text as it does): a stream
    stays open for as long as a test needs."""

    parallel_steps = 2

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.blocks = True
        self.entered, self.gate = threading.Event(), threading.Event()
        self.texts: queue.SimpleQueue[str] = queue.SimpleQueue()

    def open(self, request: SynthesisRequest):
        stream = super().open(request)
        real_step = stream.step

        def step():
            self.texts.put(request.text)
            self.entered.set()
            self.gate.wait()
            return real_step()

        stream.step = step
        return stream


async def gated_gateway(monkeypatch, max_open_streams: int
                        ) -> tuple[Gateway, GatedRemote, LineSeen]:
    """A started gateway whose one lane (``remote``) runs a ``GatedRemote`` with at most
    ``max_open_streams`` open, and a handler that sees the lane say sentences wait for one
    (the caller removes it from the ``gateway.io.lanes`` logger)."""
    monkeypatch.setitem(registry.TTS_ENGINES, "gated", f"{__name__}:GatedRemote")
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        "engine": "gated", "voice": "mid", "max_open_streams": max_open_streams,
        "options": {"rtf": 0.0, "ttfa_ms": 0.0, "lane": "remote"}}))
    await gw.start()
    line = LineSeen("streams open (max_open_streams")
    logging.getLogger("gateway.io.lanes").addHandler(line)
    return gw, gw.lanes["remote"].engine, line  # type: ignore[return-value]


async def test_health_and_metrics_show_the_streams_open_and_the_sentences_waiting_for_one(
        monkeypatch):
    """Scheduler rule 6 (``max_open_streams``) was seen only in one log line: ``/health``
    and ``/metrics`` had the lane's queue depth but not that its sentences waited for an
    open stream to end, nor how many were open of how many allowed."""
    from tests.test_http_api import metrics

    gw, engine, line = await gated_gateway(monkeypatch, 1)
    base = f"http://127.0.0.1:{gw.http_port}"

    async def read() -> tuple[dict, dict[str, float]]:
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            health = (await client.get(f"{base}/health")).json()["lanes"]["remote"]
            figures = metrics((await client.get(f"{base}/metrics")).text)
        names = ("open_streams", "max_open_streams", "interactive_reserved_streams",
                 "streams_waiting")
        return ({key: health[key] for key in names},
                {name: figures.get(f"gateway_lane_{name}{{lane=remote}}") for name in names})

    try:
        assert await read() == ({"open_streams": 0, "max_open_streams": 1,
                                 "interactive_reserved_streams": 0, "streams_waiting": 0},
                                {"open_streams": 0, "max_open_streams": 1,
                                 "interactive_reserved_streams": 0, "streams_waiting": 0})
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as a, \
                connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as b:
            await recv_event(a, "session.created")
            await recv_event(b, "session.created")
            await send(a, type="say", text="First sentence here.")
            await asyncio.to_thread(engine.entered.wait)  # a's stream is open, its step held
            await send(b, type="say", text="Bee speaks here.")
            await line.seen.wait()  # the lane had a place for b's step, but no stream
            waiting = {"open_streams": 1, "max_open_streams": 1,
                       "interactive_reserved_streams": 0, "streams_waiting": 1}
            assert await read() == (waiting, waiting)
            engine.gate.set()
            for ws in (a, b):
                assert (await read_turn(ws)).done["status"] == "completed"
        idle = {"open_streams": 0, "max_open_streams": 1, "interactive_reserved_streams": 0,
                "streams_waiting": 0}
        assert await read() == (idle, idle)
    finally:
        engine.gate.set()
        logging.getLogger("gateway.io.lanes").removeHandler(line)
        await gw.aclose()


async def test_an_http_speech_request_leaves_the_reserved_stream_to_a_voice_session(
        monkeypatch):
    """Scheduler rule 6b through the gateway: other apps' HTTP speech requests held every
    open stream, and a voice turn waited for a whole request to end. With 2 streams (1 kept
    for voice sessions by default) a second request waits while the first holds one, and a
    voice turn that comes after it opens the kept one at once."""
    gw, engine, line = await gated_gateway(monkeypatch, 2)
    url = f"http://127.0.0.1:{gw.http_port}/v1/audio/speech"
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            def speak(text: str) -> asyncio.Task:
                return asyncio.create_task(client.post(url, json={
                    "input": text, "response_format": "pcm"}))

            first = speak("An app reads a long article.")
            assert await asyncio.to_thread(engine.texts.get) == "An app reads a long article."
            second = speak("Another app reads another.")
            # a step slot and a stream are free, but kept: the lane says it waits, or (the
            # bug) its step starts
            started = asyncio.ensure_future(asyncio.to_thread(engine.texts.get))
            await asyncio.wait({started, asyncio.ensure_future(line.seen.wait())},
                               return_when=asyncio.FIRST_COMPLETED)
            engine.texts.put("(waits)")  # (ends the read if the line came first)
            assert await started == "(waits)"
            assert gw.health()["lanes"]["remote"]["streams_waiting"] == 1
            async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
                await recv_event(ws, "session.created")
                await send(ws, type="say", text="The hub answers now.")
                assert await asyncio.to_thread(engine.texts.get) == "The hub answers now."
                engine.gate.set()
                assert (await read_turn(ws)).done["status"] == "completed"
            for request in (first, second):
                assert (await request).status_code == 200
    finally:
        engine.gate.set()
        logging.getLogger("gateway.io.lanes").removeHandler(line)
        await gw.aclose()


async def test_a_lane_without_a_bound_on_its_streams_shows_none():
    gw = await two_lane_gateway()
    try:
        async with httpx.AsyncClient(timeout=HANG_S) as client:
            health = (await client.get(f"http://127.0.0.1:{gw.http_port}/health")).json()
            text = (await client.get(f"http://127.0.0.1:{gw.http_port}/metrics")).text
        for lane in ("gpu", "ane"):
            assert health["lanes"][lane]["max_open_streams"] is None
            assert health["lanes"][lane]["interactive_reserved_streams"] == 0
            assert f'gateway_lane_open_streams{{lane="{lane}"}} 0.0' in text
            assert f'gateway_lane_max_open_streams{{lane="{lane}"}}' not in text
            assert f'gateway_lane_interactive_reserved_streams{{lane="{lane}"}}' not in text
    finally:
        await gw.aclose()


async def test_a_lane_says_once_that_sentences_wait_for_a_stream_while_they_do(caplog):
    """Scheduler rule 6's log lines: one WARNING when sentences start waiting for an open
    stream, one INFO when none waits any more. A stream that ended while others waited,
    with its place kept for a waiting sentence that an open stream ran before, read as
    "none waits" (open streams below the bound): an INFO and a new WARNING at every
    sentence end (1,114 of each in 20,000 decisions at 200 sessions, 16 streams).
    Here: y and x are open and their listeners hold audio, so p and q, later sentences
    of older streams due now, wait for a stream; x ends and y's listener runs short
    (a playback mark), so y, the oldest stream, steps before p takes x's place."""
    from gateway.io.lanes import SynthesisJob

    deadlines: dict[str, float] = {}
    lane = Lane("gpu", SyntheticEngine(rtf=0.0, ttfa_ms=0.0), max_open_streams=2,
                deadline_of=lambda job, now: deadlines.get(job.owner, job.deadline))
    loop = asyncio.get_running_loop()
    ended = {owner: loop.create_future() for owner in "yxpq"}

    class Sink:
        def on_audio(self, job, pcm, engine, ready_at) -> None:
            if job.owner in "yx" and not (job.owner == "y" and ended["x"].done()):
                deadlines[job.owner] = loop.time() + 60.0  # its listener holds audio

        def on_done(self, job, truncated=False, notes=()) -> None:
            ended[job.owner].set_result(job.owner)
            if job.owner == "x":
                deadlines["y"] = 0.0  # y's listener is short of audio now
                lane.touch("y")

        def on_failed(self, job, code, message) -> None:
            ended[job.owner].set_exception(AssertionError(code))

    sink = Sink()
    texts = {"y": LONG, "x": "Short one.", "p": "Pea here.", "q": "Queue here."}
    since = {"y": None, "x": None, "p": 0.5, "q": 0.6}
    caplog.set_level(logging.INFO, logger="gateway.io.lanes")
    for owner, text in texts.items():
        lane.submit(owner, SynthesisJob(SynthesisRequest(text), sink), deadline=0.0,
                    since=since[owner])
    lane.loaded = True
    runner = asyncio.create_task(lane.run())
    try:
        assert await asyncio.gather(*ended.values()) == list("yxpq")
    finally:
        runner.cancel()
        await lane.aclose()
    said = [record.getMessage() for record in caplog.records
            if "open stream" in record.getMessage() or "streams open" in record.getMessage()]
    assert said == ["lane gpu: 2 streams open (max_open_streams 2, 1 kept for voice sessions): "
                    "new sentences wait for one to end",
                    "lane gpu: no sentence waits for an open stream any more"]


class EndingSink:
    """A job's sink whose ``ended`` says how the job ended: ``"done"`` or its error code."""

    def __init__(self) -> None:
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_audio(self, job, pcm, engine, ready_at) -> None:
        pass

    def on_done(self, job, truncated=False, notes=()) -> None:
        self.ended.set_result("done")

    def on_failed(self, job, code, message) -> None:
        self.ended.set_result(code)


async def test_a_probe_does_not_end_a_failing_spell_whose_last_failure_was_an_engine_bug():
    """``Lane.server_answers`` ends a spell whose last failure was the server out of reach.
    An engine's bug after such a failure (an exception that is no engine error: failing,
    logged with its traceback) left that failure's time standing, and the next probe
    that reached the server said the lane was well: /health ok on an idle hub whose
    engine failed every job."""
    from engines.base import ServerUnreachable
    from gateway.io.lanes import SynthesisJob

    class Failing(SyntheticEngine):
        """TEST DOUBLE: each ``open`` raises the next of ``errors``."""

        def __init__(self) -> None:
            super().__init__(rtf=0.0, ttfa_ms=0.0)
            self.errors: list[Exception] = [
                ServerUnreachable("engine_failed", "TTS server: ConnectError()"),
                RuntimeError("a bug")]

        def open(self, request: SynthesisRequest):
            raise self.errors.pop(0)

    lane = Lane("remote", Failing())

    lane.loaded = True
    runner = asyncio.create_task(lane.run())
    try:
        for owner in ("unreachable", "bug"):
            sink = EndingSink()
            lane.submit(owner, SynthesisJob(SynthesisRequest("Hello there."), sink),
                        deadline=0.0)
            assert await sink.ended == "engine_failed"
        lane.server_answers(time.monotonic())  # a probe begun after both reached the server
        assert lane.failing == "engine_failed"
    finally:
        runner.cancel()
        await lane.aclose()


async def test_a_gateway_bug_on_a_second_lane_fails_its_turn_not_the_engine(monkeypatch):
    """A bug in the session handling the end of a sentence the second lane made
    (``on_done``, as in test_faults' one-lane case) is the gateway's ``internal_error``,
    not the engine's: the turn fails with it, as on the primary, and ane's breaker does not
    hear of it. It was taken for ane's engine failing: counted against its breaker (three
    such bugs sent every turn to the primary, a healthy engine shut out) and "rerouted"
    with its sentence cut short while the lane had already dropped the turn's next
    sentences (``Lane._consumer_failed``), so the turn waited for them for ever."""
    from gateway.io.connection import SessionRunner

    on_done = SessionRunner.on_done

    def buggy(self, job, truncated=False, notes=()):
        on_done(self, job, truncated, notes)
        if "BUG" in job.payload.request.text:
            raise TypeError("a scripted bug after the sentence")

    monkeypatch.setattr(SessionRunner, "on_done", buggy)
    gw = Gateway(load_config(server={"port": 0}, llm={"tokens_per_s": 0}, tts={
        **TWO_LANES,
        # idle turns prefer ane (earlier first audio), so every turn is placed there
        "profiles": {"gpu": {"first_s": 0.2, "rtf": 0.0},
                     "ane": {"first_s": 0.005, "rtf": 0.05}}}))
    await gw.start()
    try:
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/voice") as ws:
            await recv_event(ws, "session.created")
            for _ in range(gw.placer.breaker_failures):  # type: ignore[union-attr]
                await send(ws, type="say", text="A BUG ends this one. And this one never "
                                                "comes.")
                bad = await read_turn(ws)  # (it waited for ever)
                (error,) = bad.of("error")
                assert error["error"] == {"code": "internal_error", "message":
                                          "TypeError: a scripted bug after the sentence"}
                assert bad.done["status"] == "failed"
                assert [s["engine"] for s in bad.of("sentence")] == ["synthetic-ane"]
            # ane's engine never failed: its breaker is closed, and the next turn is its
            await send(ws, type="say", text="The engine is fine. It says this.")
            result = await read_turn(ws)
            assert result.done["status"] == "completed"
            assert result.done["metrics"]["engines"] == ["synthetic-ane"]
            gapless(result)
        assert gw.placer is not None and gw.placer.rerouted["ane"] == 0
        assert not gw.placer.tripped("ane", time.monotonic())
        assert gw.lanes["ane"].queue_depth == 0 and gw.lanes["gpu"].stats.jobs_done == 0
    finally:
        await gw.aclose()


@pytest.mark.parametrize("at_once", [1, 2])
async def test_a_lane_stopped_mid_step_with_work_queued_cancels_it_all_and_leaves_nothing(
        caplog, at_once):
    """The lane's task cancelled (the gateway stopping) while a step waits for its engine
    call under the step deadline, with another owner's job queued: the wait is dropped
    (the call's outcome is not wanted: here the engine, interrupted, raises), both jobs
    end cancelled, their sinks are not told of a failure, and the lane is neither stuck nor
    unhealthy; with steps at once, each step's task ends with the lane. The whole suite
    never stopped a lane mid-step (``_call_limited``'s cancellation, ``_serve``'s cancel of
    the steps at once); a wait dropped without cancelling it leaves an asyncio ERROR
    ("Future exception was never retrieved") when the call then fails."""
    import gc

    from gateway.io.lanes import SynthesisJob

    entered, release = threading.Event(), threading.Event()

    def gated(seconds: float) -> None:  # TEST DOUBLE of the engine's compute
        entered.set()
        assert release.wait(HANG_S)
        raise EngineError("engine_failed", "interrupted")

    class Engine(SyntheticEngine):
        parallel_steps = at_once  # 2: both owners' steps in flight as the lane stops

    lane = Lane("gpu", Engine(sleep=gated))
    assert lane.step_timeout_s is not None  # (the deadline's wait is the one cancelled)
    told: list[tuple[str, str]] = []

    class Sink:
        def on_audio(self, job, pcm, engine, ready_at) -> None:
            told.append((job.owner, "audio"))

        def on_done(self, job, truncated=False, notes=()) -> None:
            told.append((job.owner, "done"))

        def on_failed(self, job, code, message) -> None:
            told.append((job.owner, code))

    for owner in ("running", "queued"):
        lane.submit(owner, SynthesisJob(SynthesisRequest("Hello there."), Sink()),
                    deadline=0.0)
    lane.loaded = True
    caplog.set_level(logging.ERROR, logger="asyncio")
    runner = asyncio.create_task(lane.run())
    try:
        assert await asyncio.to_thread(entered.wait, HANG_S)
        assert lane.busy and lane.queue_depth == 2
        assert len(lane._stepping) == at_once
        steps = set(lane._step_tasks)  # (steps at once run in tasks of their own)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        # they end with the lane, though their engine calls go on on the lane's threads
        await unless_hung(asyncio.gather(*steps, return_exceptions=True))
        assert len(steps) == (at_once if at_once > 1 else 0)
        assert all(task.cancelled() for task in steps)
        closing = asyncio.create_task(lane.aclose())  # cancels both; closes after the call
        release.set()  # the interrupted call returns: it raises
        await closing
    finally:
        release.set()
        runner.cancel()
        await lane.aclose()
    del runner, closing
    gc.collect()
    await asyncio.sleep(0)  # (the loop reports an unretrieved exception on its next turn)
    assert told == []
    assert (lane.stats.jobs_cancelled, lane.stats.jobs_failed, lane.stats.jobs_done) == \
        (2, 0, 0)
    assert lane.queue_depth == 0 and not lane.busy and lane.stuck_calls == 0
    assert lane.unhealthy is None
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


async def test_an_engine_stream_whose_close_fails_is_logged_and_the_lane_goes_on(caplog):
    """Closing a finished job's stream runs on the lane thread, where nobody awaits it: a
    close that raised would vanish into a future nobody reads. It is logged with its
    traceback, once per failure, and the lane serves the next job (the whole suite never
    had a close fail: ``_close_quietly``'s except was unrun)."""
    from engines.synthetic import SyntheticStream
    from gateway.io.lanes import SynthesisJob

    class BadClose(SyntheticEngine):
        """TEST DOUBLE: its streams speak, then raise when closed."""

        def open(self, request: SynthesisRequest):
            stream = super().open(request)
            assert isinstance(stream, SyntheticStream)

            def close() -> None:
                SyntheticStream.close(stream)
                raise RuntimeError("close broke")

            stream.close = close
            return stream

    lane = Lane("gpu", BadClose(rtf=0.0, ttfa_ms=0.0))
    caplog.set_level(logging.ERROR, logger="gateway.io.lanes")
    lane.loaded = True
    runner = asyncio.create_task(lane.run())
    try:
        for owner in ("first", "second"):
            sink = EndingSink()
            lane.submit(owner, SynthesisJob(SynthesisRequest("Hello there."), sink),
                        deadline=0.0)
            assert await sink.ended == "done"
        await lane.call(lambda: None)  # the lane thread has run both closes by now
    finally:
        runner.cancel()
        await lane.aclose()
    closes = [r for r in caplog.records if r.getMessage() == "closing a synthesis stream failed"]
    assert len(closes) == 2 and all(r.exc_info and r.exc_info[0] is RuntimeError
                                    for r in closes)
    assert (lane.stats.jobs_done, lane.stats.jobs_failed) == (2, 0) and lane.failing is None


async def test_a_fifo_lane_runs_one_step_at_a_time_though_its_engine_could_run_more():
    """``[scheduler] policy = "fifo"`` (whole jobs in arrival order) on an engine that runs
    steps at once (``parallel_steps``): one step at a time, the next job's not begun while
    one is in flight. The whole suite never ran fifo with steps at once."""
    from gateway.core.scheduler import LanePolicy
    from gateway.io.lanes import SynthesisJob

    entered, release = threading.Event(), threading.Event()

    def gated(seconds: float) -> None:  # TEST DOUBLE of the engine's compute
        entered.set()
        assert release.wait(HANG_S)

    class TwoAtOnce(SyntheticEngine):
        parallel_steps = 2

    lane = Lane("gpu", TwoAtOnce(sleep=gated))
    lane.scheduler.policy = LanePolicy.FIFO
    assert lane.parallel_steps == 2
    loop = asyncio.get_running_loop()
    ended = {owner: loop.create_future() for owner in ("first", "second")}

    class Sink:
        def on_audio(self, job, pcm, engine, ready_at) -> None:
            pass

        def on_done(self, job, truncated=False, notes=()) -> None:
            ended[job.owner].set_result("done")

        def on_failed(self, job, code, message) -> None:
            ended[job.owner].set_result(code)

    for owner in ended:
        lane.submit(owner, SynthesisJob(SynthesisRequest("Hi."), Sink()), deadline=0.0)
    lane.loaded = True
    runner = asyncio.create_task(lane.run())
    try:
        assert await asyncio.to_thread(entered.wait, HANG_S)
        # the first job's step is in the engine: with two at once the second's would have
        # been taken (it is, in the same turn of the loop that takes the first)
        assert [job.owner for job in lane._stepping] == ["first"]
        release.set()
        assert await asyncio.gather(*ended.values()) == ["done", "done"]
    finally:
        release.set()
        runner.cancel()
        await lane.aclose()


async def test_a_lane_that_fails_itself_fails_what_waits_and_stays_unhealthy(caplog,
                                                                             monkeypatch):
    """A bug in the lane or its scheduler (here ``next_job`` raising: a FAKE fault) stops
    the lane's task: it turns unhealthy for good, says so once at ERROR with the
    traceback, and every job waiting fails ``engine_unavailable`` naming why, rather than
    wait for ever with nothing serving it. The whole suite never had the lane itself fail
    (``Lane.run``'s except was unrun)."""
    from gateway.core.scheduler import LaneScheduler
    from gateway.io.lanes import SynthesisJob

    lane = Lane("gpu", SyntheticEngine(rtf=0.0, ttfa_ms=0.0))

    def broken(self, now: float):
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(LaneScheduler, "next_job", broken)
    loop = asyncio.get_running_loop()
    failed = {owner: loop.create_future() for owner in ("a", "b")}

    class Sink:
        def on_audio(self, job, pcm, engine, ready_at) -> None:
            failed[job.owner].set_exception(AssertionError("audio"))

        def on_done(self, job, truncated=False, notes=()) -> None:
            failed[job.owner].set_exception(AssertionError("done"))

        def on_failed(self, job, code, message) -> None:
            failed[job.owner].set_result((code, message))

    for owner in failed:
        lane.submit(owner, SynthesisJob(SynthesisRequest("Hi."), Sink()), deadline=0.0)
    caplog.set_level(logging.ERROR, logger="gateway.io.lanes")
    lane.loaded = True
    runner = asyncio.create_task(lane.run())
    try:
        why = "the lane stopped: RuntimeError: scheduler bug"
        assert await unless_hung(asyncio.gather(*failed.values())) == [
            ("engine_unavailable", f"the gpu lane cannot synthesize: {why}")] * 2
        await runner  # it ended (it does not raise: nobody awaits it until the end)
        assert lane.unhealthy == why and lane.queue_depth == 0
        assert lane.stats.jobs_failed == 2
        stopped = [r for r in caplog.records if r.getMessage() == "lane gpu stopped"]
        assert len(stopped) == 1 and stopped[0].exc_info is not None
    finally:
        runner.cancel()
        await lane.aclose()
