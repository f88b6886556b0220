"""Per-turn lane choice (``gateway.core.placement.TurnPlacer``): sans-I/O, no clock."""

from __future__ import annotations

import pytest

from gateway.core.placement import (
    LaneLoad,
    LaneProfile,
    StepTimes,
    TurnPlacer,
    place,
    profile_from,
)

# the hub's figures (calibration.json): qwen3 0.6B on the GPU, the Core ML port on the ANE
GPU = profile_from("gpu", {"first_s": 0.107, "rtf": 0.44, "first_s_llm": 0.216,
                           "rtf_llm": 0.97})
ANE = profile_from("ane", {"first_s": 0.045, "rtf": 0.705})


def placer(gpu_voices=("Serena", "clone"), ane_voices=("Serena",)) -> TurnPlacer:
    return TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": gpu_voices, "ane": ane_voices},
                      primary="gpu")


def test_profile_from_marks_only_the_gpu_lane_as_shared_with_the_llm():
    assert GPU.shares_gpu and GPU.predict(llm_decoding=True) == (0.216, 0.97)
    assert not ANE.shares_gpu and ANE.predict(llm_decoding=True) == (0.045, 0.705)


@pytest.mark.parametrize("figures, message", [
    ({"rtf": 0.4}, "first_s"),
    ({"first_s": 0.1, "rtf": 0.4, "speed": 2}, "unknown"),
    ({"first_s": -1, "rtf": 0.4}, ">= 0"),
])
def test_profile_from_refuses_incomplete_or_unknown_figures(figures, message):
    with pytest.raises(ValueError, match=message):
        profile_from("ane", figures)


@pytest.mark.parametrize("llm_decoding", [False, True])
def test_a_turn_goes_where_place_says_among_the_lanes_with_its_voice(llm_decoding):
    p = placer()
    expected = place([LaneLoad(GPU, 0), LaneLoad(ANE, 0)], llm_decoding)
    assert p.place_turn("t1", "serena", llm_decoding) == expected
    assert p.active(expected) == 1


def test_while_the_llm_decodes_a_turn_leaves_the_gpu_to_it():
    assert placer().place_turn("t1", "Serena", llm_decoding=True) == "ane"


@pytest.mark.parametrize(("llm_decoding", "expected"), [
    (True, "ane"),  # the GPU's first audio is sooner, but the LLM keeps the GPU
    (False, "gpu"),  # nothing to leave it to: the sooner first audio
])
def test_leaving_the_gpu_to_the_llm_comes_before_the_sooner_first_audio(llm_decoding,
                                                                        expected):
    fast_gpu = LaneProfile("gpu", first_s=0.02, rtf=0.3, shares_gpu=True, first_s_llm=0.03,
                           rtf_llm=0.5)
    assert place([LaneLoad(fast_gpu, 0), LaneLoad(ANE, 0)], llm_decoding) == expected


def test_place_without_a_lane_says_so():
    with pytest.raises(ValueError, match="no lane has this voice"):
        place([], llm_decoding=False)


def test_a_lane_that_does_not_share_the_gpu_ignores_llm_figures():
    """Contention figures apply only where the LLM decodes on the same device."""
    ane = LaneProfile("ane", first_s=0.045, rtf=0.7, first_s_llm=0.3, rtf_llm=1.5)
    assert ane.predict(llm_decoding=True) == (0.045, 0.7)


def test_a_turn_keeps_its_lane_for_every_later_segment():
    p = placer()
    first = p.place_turn("t1", "Serena", llm_decoding=True)
    # the LLM has finished and the other lane is now better: still one voice per reply
    assert p.place_turn("t1", "Serena", llm_decoding=False) == first
    assert p.lane_of("t1") == first and p.active(first) == 1


def test_a_full_ane_lane_sends_the_next_turn_to_the_gpu():
    p = placer()
    assert p.place_turn("t1", "Serena", llm_decoding=True) == "ane"
    # (1 + 1) * 0.705 > 1: a second listener would starve on the ANE
    assert p.place_turn("t2", "Serena", llm_decoding=True) == "gpu"
    assert p.release("t1") == "ane"
    assert p.place_turn("t3", "Serena", llm_decoding=True) == "ane"


@pytest.mark.parametrize("voice", ["clone", None, "nobody"])
def test_a_voice_only_the_primary_has_no_voice_or_an_unknown_one_stays_on_the_primary(voice):
    p = placer()
    assert p.place_turn("t1", voice, llm_decoding=True) == "gpu"


def test_a_voice_only_the_other_lane_has_goes_there():
    p = placer(gpu_voices=("clone",))
    assert p.lanes_with("Serena") == ["ane"]
    assert p.place_turn("t1", "Serena", llm_decoding=False) == "ane"


def test_an_unusable_lane_is_skipped_unless_it_alone_has_the_voice():
    p = placer()
    assert p.place_turn("t1", "Serena", llm_decoding=True, usable=["gpu"]) == "gpu"
    only_ane = placer(gpu_voices=("clone",))
    assert only_ane.place_turn("t2", "Serena", llm_decoding=True, usable=["gpu"]) == "ane"


def test_release_is_idempotent_and_frees_the_lane():
    p = placer()
    lane = p.place_turn("t1", "Serena", llm_decoding=True)
    assert p.release("t1") == lane and p.release("t1") is None
    assert p.active(lane) == 0 and p.lane_of("t1") is None


def test_every_lane_needs_a_profile_and_voices():
    with pytest.raises(ValueError):
        TurnPlacer({"gpu": GPU}, {"gpu": (), "ane": ()}, primary="gpu")
    with pytest.raises(ValueError):
        TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": (), "ane": ()}, primary="cpu")


def test_lane_profile_is_what_place_reads():
    # the placer hands place() exactly its profiles and counts
    p = TurnPlacer({"gpu": LaneProfile("gpu", 0.1, 0.9, shares_gpu=True),
                    "ane": LaneProfile("ane", 0.2, 0.9)},
                   {"gpu": ["a"], "ane": ["a"]}, primary="gpu")
    assert p.place_turn("t1", "a", llm_decoding=False) == "gpu"  # earlier first audio
    assert p.place_turn("t2", "a", llm_decoding=False) == "ane"  # gpu: 2 * 0.9 > 1


# ---- measured figures (StepTimes) -------------------------------------------------------

def test_a_figure_is_measured_once_it_has_enough_samples():
    t = StepTimes(min_samples=3)
    for _ in range(2):
        t.step(0.2, 0.32, opened=False, llm=False)
    assert t.measured() == {} and t.apply(ANE) is ANE
    t.step(0.2, 0.32, opened=False, llm=False)
    assert t.measured() == {"rtf": pytest.approx(0.625)}
    assert t.apply(ANE) == LaneProfile("ane", first_s=0.045, rtf=pytest.approx(0.625))


def test_opening_steps_give_first_audio_later_steps_rtf_and_llm_steps_their_own():
    t = StepTimes(min_samples=1)
    t.step(0.30, 0.32, opened=True, llm=False)   # open + prefill + first chunk
    t.step(0.16, 0.32, opened=False, llm=False)
    t.step(0.50, 0.32, opened=True, llm=True)
    t.step(0.32, 0.32, opened=False, llm=True)
    t.step(0.01, 0.0, opened=False, llm=False)   # no audio: no rate to learn
    assert t.measured() == pytest.approx(
        {"first_s": 0.30, "rtf": 0.5, "first_s_llm": 0.50, "rtf_llm": 1.0})
    assert t.samples() == {"first_s": 1, "rtf": 1, "first_s_llm": 1, "rtf_llm": 1}
    measured = t.apply(GPU)
    assert measured.predict(llm_decoding=False) == pytest.approx((0.30, 0.5))
    assert measured.predict(llm_decoding=True) == pytest.approx((0.50, 1.0))
    assert measured.shares_gpu


def test_the_median_ignores_a_cold_start_and_the_window_follows_a_change():
    t = StepTimes(window=8, min_samples=4)
    t.step(5.0, 0.32, opened=False, llm=False)  # first step of a cold model: kernels compile
    for _ in range(4):
        t.step(0.16, 0.32, opened=False, llm=False)
    assert t.measured()["rtf"] == pytest.approx(0.5)
    for _ in range(8):  # the device got slower (another app took the ANE)
        t.step(0.32, 0.32, opened=False, llm=False)
    assert t.measured()["rtf"] == pytest.approx(1.0)


def test_measured_figures_change_where_turns_go():
    # configured: ane keeps two listeners fed (2 x 0.45 <= 1); measured: it cannot
    ane = profile_from("ane", {"first_s": 0.045, "rtf": 0.45})
    timing = {"gpu": StepTimes(min_samples=2), "ane": StepTimes(min_samples=2)}
    p = TurnPlacer({"gpu": GPU, "ane": ane}, {"gpu": ["serena"], "ane": ["serena"]},
                   primary="gpu", timing=timing)
    assert p.place_turn("a", "serena", llm_decoding=True) == "ane"
    assert p.place_turn("b", "serena", llm_decoding=True) == "ane"
    p.release("a"), p.release("b")
    for _ in range(2):
        timing["ane"].step(0.224, 0.32, opened=False, llm=False)  # rtf 0.7
    assert p.profile("ane").rtf == pytest.approx(0.7) and p.profiles["ane"] is ane
    assert p.place_turn("c", "serena", llm_decoding=True) == "ane"
    assert p.place_turn("d", "serena", llm_decoding=True) == "gpu"


# ---- failures: move, breaker ------------------------------------------------------------

def test_move_carries_a_turn_and_its_count_to_another_lane():
    p = placer()
    assert p.place_turn("t", "serena", llm_decoding=True) == "ane"
    p.move("t", "gpu")
    assert p.lane_of("t") == "gpu" and (p.active("gpu"), p.active("ane")) == (1, 0)
    assert p.rerouted == {"gpu": 0, "ane": 1}
    p.move("t", "gpu")  # already there: nothing changes
    assert p.rerouted["ane"] == 1 and p.active("gpu") == 1
    p.release("t")
    assert (p.active("gpu"), p.active("ane")) == (0, 0)


def test_the_breaker_trips_after_failures_in_a_row_and_lets_one_try_after_the_reset():
    p = TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": ["serena"], "ane": ["serena"]},
                   primary="gpu", breaker_failures=2, breaker_reset_s=10.0)
    p.failed("ane", now=0.0)
    p.succeeded("ane", now=0.5)  # a success in between: the count starts over
    p.failed("ane", now=1.0)
    assert not p.tripped("ane", now=1.0)
    p.failed("ane", now=2.0)
    assert p.tripped("ane", now=2.0) and p.tripped("ane", now=11.9)
    assert not p.tripped("ane", now=12.0)  # half-open: the next turn may try it
    p.failed("ane", now=12.5)  # and one more failure trips it again at once
    assert p.tripped("ane", now=12.5) and not p.tripped("gpu", now=12.5)
    p.succeeded("ane", now=23.0)  # a success after the reset closes it
    assert not p.tripped("ane", now=23.0)
    p.failed("ane", now=24.0)  # and the failures in a row start over
    assert not p.tripped("ane", now=24.0)


def test_a_success_of_a_turn_placed_before_the_trip_does_not_close_the_breaker():
    """A turn stays on its lane: one placed on ``ane`` before its breaker tripped goes on
    there, and its sentence that ends well closed the breaker at once, so new turns went
    back to a lane that had just failed (bench/soak.py --engine-lanes: open 0.48 s of a
    5 s reset). README: no new turn is placed there for the reset."""
    p = TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": ["serena"], "ane": ["serena"]},
                   primary="gpu", breaker_failures=2, breaker_reset_s=10.0)
    assert p.place_turn("older", "serena", llm_decoding=False) == "ane"
    p.failed("ane", now=1.0)
    p.failed("ane", now=2.0)
    p.succeeded("ane", now=2.5)  # the older turn's next sentence, on the tripped lane
    assert p.tripped("ane", now=2.5) and p.tripped("ane", now=11.9)
    assert not p.tripped("ane", now=12.0)


def test_a_profile_of_zero_under_llm_load_is_zero_not_the_idle_figure():
    """``[tts.profiles.<lane>]`` may say a lane costs nothing while an LLM decodes (a
    remote lane); 0.0 read as "not given" and the idle figures were used (core review)."""
    from gateway.core.placement import LaneProfile

    lane = LaneProfile("remote", 0.3, 0.5, shares_gpu=True, first_s_llm=0.0, rtf_llm=0.0)
    assert lane.predict(llm_decoding=True) == (0.0, 0.0)
    assert lane.predict(llm_decoding=False) == (0.3, 0.5)
    assert LaneProfile("gpu", 0.3, 0.5, shares_gpu=True).predict(True) == (0.3, 0.5)


# ---- place(): feasibility, then the GPU, then first audio --------------------------------

def lane(name, first_s, rtf, shares_gpu=False, **llm) -> LaneProfile:
    return LaneProfile(name, first_s, rtf, shares_gpu=shares_gpu, **llm)


def test_among_feasible_lanes_the_earliest_first_audio_wins_even_at_full_load():
    # fast: one listener already, (1 + 1) * 0.5 == 1 still keeps both fed in real time
    fast, light = lane("fast", 0.05, 0.5), lane("light", 0.1, 0.3)
    assert place([LaneLoad(fast, 1), LaneLoad(light, 0)], llm_decoding=False) == "fast"
    # one more listener and it cannot: the other lane, though its first audio is later
    assert place([LaneLoad(fast, 2), LaneLoad(light, 0)], llm_decoding=False) == "light"


def test_with_no_feasible_lane_the_least_loaded_one_is_chosen():
    slow, busy = lane("slow", 0.05, 1.2), lane("busy", 0.5, 0.4)
    assert place([LaneLoad(slow, 0), LaneLoad(busy, 3)], llm_decoding=False) == "slow"
    assert place([LaneLoad(slow, 1), LaneLoad(busy, 3)], llm_decoding=False) == "busy"
    with pytest.raises(ValueError):
        place([], llm_decoding=False)


def test_under_llm_load_a_gpu_lane_is_judged_by_its_llm_figures():
    gpu = lane("gpu", 0.05, 0.44, shares_gpu=True, first_s_llm=0.5, rtf_llm=0.97)
    slow = lane("slow", 0.1, 1.2)
    # idle: (1 + 1) * 0.44 fits; decoding: (1 + 1) * 0.97 does not, and slow's 1.2 is less
    assert place([LaneLoad(gpu, 1), LaneLoad(slow, 0)], llm_decoding=False) == "gpu"
    assert place([LaneLoad(gpu, 1), LaneLoad(slow, 0)], llm_decoding=True) == "slow"
    # two lanes on the GPU: the earlier first audio while the LLM decodes
    other = lane("other", 0.2, 0.3, shares_gpu=True, first_s_llm=0.3)
    assert place([LaneLoad(gpu, 0), LaneLoad(other, 0)], llm_decoding=False) == "gpu"
    assert place([LaneLoad(gpu, 0), LaneLoad(other, 0)], llm_decoding=True) == "other"


def test_profile_from_keeps_the_llm_figures_and_accepts_zero():
    gpu = profile_from("gpu", {"first_s": 0.1, "rtf": 0.4, "first_s_llm": 0.2,
                               "rtf_llm": 0.9})
    assert gpu == LaneProfile("gpu", 0.1, 0.4, shares_gpu=True, first_s_llm=0.2,
                              rtf_llm=0.9)
    assert profile_from("ane", {"first_s": 0.1, "rtf": 0.4}) == LaneProfile("ane", 0.1, 0.4)
    remote = profile_from("remote", {"first_s": 0, "rtf": 0.0})  # a lane that costs nothing
    assert remote.predict(llm_decoding=True) == (0.0, 0.0) and not remote.shares_gpu


def test_a_step_window_forgets_the_oldest_samples():
    t = StepTimes(window=4, min_samples=1)
    for seconds in (0.16, 0.16, 0.16, 0.16, 0.32, 0.32, 0.32, 0.32):
        t.step(seconds, 0.32, opened=False, llm=False)
    assert t.measured()["rtf"] == pytest.approx(1.0)
    assert t.samples()["rtf"] == 4


# ---- TurnPlacer: counts, ties, LLM activity ----------------------------------------------

def test_the_placer_passes_the_llm_activity_to_place():
    # idle, the GPU has the earlier first audio; decoding, the turn leaves it to the LLM
    ane = profile_from("ane", {"first_s": 0.2, "rtf": 0.7})
    p = TurnPlacer({"gpu": GPU, "ane": ane}, {"gpu": ["a"], "ane": ["a"]}, primary="gpu")
    assert p.place_turn("t1", "a", llm_decoding=False) == "gpu"
    assert p.place_turn("t2", "a", llm_decoding=True) == "ane"


def test_a_tie_between_lanes_goes_to_the_primary():
    same = {"a": LaneProfile("a", 0.1, 0.3), "b": LaneProfile("b", 0.1, 0.3)}
    p = TurnPlacer(same, {"a": ["v"], "b": ["v"]}, primary="b")
    assert p.lanes_with("V") == ["b", "a"]
    assert p.place_turn("t1", "v", llm_decoding=False) == "b"


def test_every_turn_placed_on_a_lane_counts_until_released():
    p = placer()
    for owner in ("t1", "t2", "t3"):
        assert p.place_turn(owner, None, llm_decoding=False) == "gpu"
    assert p.active("gpu") == 3
    p.release("t2")
    assert p.active("gpu") == 2


def test_moves_add_to_the_new_lanes_count_and_each_one_counts_as_a_reroute():
    p = placer()
    assert p.place_turn("a", None, llm_decoding=True) == "gpu"
    assert p.place_turn("b", "serena", llm_decoding=True) == "ane"
    assert p.place_turn("c", None, llm_decoding=True) == "gpu"
    p.move("b", "gpu")
    assert (p.active("gpu"), p.active("ane")) == (3, 0)
    assert p.place_turn("d", "serena", llm_decoding=True) == "ane"
    p.move("d", "gpu")
    assert p.rerouted == {"gpu": 0, "ane": 2} and p.active("gpu") == 4
    p.move("nobody", "ane")  # no turn: nothing to move
    p.move("a", "gpu")  # already there: no reroute
    assert p.rerouted == {"gpu": 0, "ane": 2} and (p.active("gpu"), p.active("ane")) == (4, 0)


def test_no_new_turn_is_placed_on_a_tripped_lane_until_its_reset():
    """README ("Failures"): no new turn is placed on a tripped lane for the reset, unless no
    other lane has the voice; a turn placed there before stays. ``placed`` counts each
    placement, ``trips`` each opening, once (a failure while open only extends it)."""
    # ane answers first and has room for many turns: every turn goes there while closed
    roomy = {"gpu": LaneProfile("gpu", first_s=0.2, rtf=0.05),
             "ane": LaneProfile("ane", first_s=0.01, rtf=0.05)}
    p = TurnPlacer(roomy, {"gpu": ["serena"], "ane": ["serena", "only"]},
                   primary="gpu", breaker_failures=2, breaker_reset_s=10.0)
    assert p.place_turn("older", "serena", llm_decoding=False, now=0.0) == "ane"
    p.failed("ane", now=1.0)
    p.failed("ane", now=2.0)  # tripped until 12.0
    p.failed("ane", now=3.0)  # open already: until 13.0, the same trip
    assert p.trips == {"gpu": 0, "ane": 1}
    for i, now in enumerate((2.0, 7.0, 12.9)):
        assert p.place_turn(f"new{i}", "serena", llm_decoding=False, now=now) == "gpu"
    assert p.place_turn("older", "serena", llm_decoding=False, now=4.0) == "ane"  # kept
    assert p.place_turn("solo", "only", llm_decoding=False, now=5.0) == "ane"  # no other
    assert p.placed == {"gpu": 3, "ane": 2}
    # after the reset the next turn may try it again; one more failure opens it again
    assert p.place_turn("later", "serena", llm_decoding=False, now=13.0) == "ane"
    p.failed("ane", now=13.5)
    assert p.trips == {"gpu": 0, "ane": 2}
    assert p.place_turn("last", "serena", llm_decoding=False, now=14.0) == "gpu"
    assert p.placed == {"gpu": 4, "ane": 3}


def test_a_fresh_lane_trips_only_after_breaker_failures_in_a_row():
    p = TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": ["serena"], "ane": ["serena"]},
                   primary="gpu", breaker_failures=2, breaker_reset_s=10.0)
    p.failed("ane", now=0.0)
    assert not p.tripped("ane", now=0.0)
    p.failed("ane", now=1.0)
    assert p.tripped("ane", now=1.0)


# ---- the gateway's defaults and what a misconfigured lane is told ------------------------

def test_a_lane_as_the_gateway_builds_it_measures_from_its_8th_step_the_median_of_its_last_32():
    """README ("Timing"): once a lane has 8 interactive steps of a kind, the median of its
    last 32 replaces the configured figure; ``gateway.io.lanes`` builds ``StepTimes()``."""
    t = StepTimes()
    for _ in range(7):
        t.step(0.16, 0.32, opened=False, llm=False)
    assert t.measured() == {} and t.apply(ANE) is ANE
    t.step(0.16, 0.32, opened=False, llm=False)
    assert t.measured() == {"rtf": pytest.approx(0.5)}
    # 9 more slow steps (17 in all), then 16 fast ones: the last 32 are half and half
    for _ in range(9):
        t.step(0.16, 0.32, opened=False, llm=False)
    for _ in range(16):
        t.step(0.32, 0.32, opened=False, llm=False)
    assert t.samples()["rtf"] == 32
    assert t.measured()["rtf"] == pytest.approx(0.75)


def test_a_placer_as_the_gateway_builds_it_trips_a_lane_after_three_failures_for_30_s():
    """README ("Failures"): three failures in a row trip a lane's breaker, no new turn is
    placed there for 30 s; ``gateway.io.server`` builds its ``TurnPlacer`` with the
    defaults."""
    p = TurnPlacer({"gpu": GPU, "ane": ANE}, {"gpu": ["serena"], "ane": ["serena"]},
                   primary="gpu")
    p.failed("ane", now=0.0)
    p.failed("ane", now=1.0)
    assert not p.tripped("ane", now=1.0)
    p.failed("ane", now=2.0)
    assert p.tripped("ane", now=2.0) and p.tripped("ane", now=31.9)
    assert not p.tripped("ane", now=32.0)


@pytest.mark.parametrize("figures, message", [
    ({"first_s": 0.1, "rtf": 0.4, "speed": 2, "pitch": 1},
     "lane ane: unknown timing figure(s) pitch, speed; known: first_s, rtf, first_s_llm, "
     "rtf_llm"),
    ({"first_s_llm": 0.2}, "lane ane: timing figure(s) first_s, rtf missing"),
])
def test_a_bad_lane_profile_is_refused_naming_the_figures_at_fault(figures, message):
    """``[tts.profiles.<lane>]`` is written by hand: the refusal at start names the lane,
    every figure at fault and, for a misspelt one, the names it could have meant."""
    with pytest.raises(ValueError) as refused:
        profile_from("ane", figures)
    assert str(refused.value) == message
