"""float -> PCM16 conversion and model resolution shared by the MLX engines (no model needed)."""

from __future__ import annotations

import logging
import re
import sys
import threading

import numpy as np
import pytest

from engines.base import EngineError
from engines.mlx_common import float_to_pcm16, library_output_logged, resolve_model_path
from tests.hang_guard import HANG_S


def pcm(values):
    return np.frombuffer(float_to_pcm16(np.asarray(values, dtype=np.float32)), dtype="<i2")


def test_full_scale_is_symmetric_and_does_not_wrap():
    assert pcm([1.0, -1.0, 0.0]).tolist() == [32767, -32767, 0]


def test_out_of_range_samples_saturate_instead_of_wrapping():
    assert pcm([1.5, -3.0, 1.0000001]).tolist() == [32767, -32767, 32767]


def test_rounds_to_nearest_instead_of_truncating_toward_zero():
    lsb = 1 / 32767
    assert pcm([0.6 * lsb, -0.6 * lsb, 0.4 * lsb, 2.5 * lsb]).tolist() == [1, -1, 0, 2]


def test_non_finite_audio_is_an_engine_failure():
    with pytest.raises(EngineError) as err:
        float_to_pcm16(np.array([0.1, np.nan], dtype=np.float32))
    assert err.value.code == "engine_failed"


def test_missing_directory_is_an_engine_failure(tmp_path):
    with pytest.raises(EngineError, match="does not exist"):
        resolve_model_path(tmp_path / "nope")


def test_hub_id_not_in_local_cache_is_refused_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EngineError, match="not in the local Hugging Face cache") as err:
        resolve_model_path("mlx-community/Qwen3-TTS-12Hz-0.6B-Base-bf16")
    assert err.value.code == "engine_failed"


def test_hub_id_in_local_cache_resolves_to_its_snapshot(tmp_path, monkeypatch):
    repo = tmp_path / "models--acme--tiny"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model_path("acme/tiny") == snap


class RecordingStream:
    """Test double: a stream that records when it is closed."""

    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def step(self) -> bytes | None:
        return None

    def close(self) -> None:
        self.events.append(f"close {self.name}")


def lifecycle():
    import logging

    from engines.mlx_common import MlxLifecycle

    return MlxLifecycle("tiny", logging.getLogger("tests.mlx_lifecycle"))


def test_lifecycle_refuses_an_engine_that_is_not_loaded():
    with pytest.raises(EngineError, match=r"^tiny engine used before load\(\)$") as err:
        lifecycle().admit(None)
    assert err.value.code == "engine_failed"


def test_lifecycle_refuses_mlx_work_from_another_thread():
    import threading

    life = lifecycle()
    life.claim_thread()
    life.admit(object())
    life.check_thread()
    caught: list[BaseException] = []

    def other():
        for call in (lambda: life.admit(object()), life.check_thread):
            try:
                call()
            except EngineError as exc:
                caught.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert [e.code for e in caught] == ["engine_failed", "engine_failed"]
    assert all("gpu lane's single worker thread" in str(e) for e in caught)


def test_close_unloads_first_then_closes_open_streams_then_clears_the_cache(monkeypatch):
    import mlx.core as mx

    life = lifecycle()
    events: list[str] = []
    monkeypatch.setattr(mx, "clear_cache", lambda: events.append("clear cache"))
    a = life.track(RecordingStream(events, "a"))
    b = life.track(RecordingStream(events, "b"))

    def unload() -> bool:
        events.append("unload")
        return True

    life.close(unload)
    assert events[0] == "unload"
    assert sorted(events[1:3]) == ["close a", "close b"]
    assert events[3:] == ["clear cache"]
    del a, b  # kept alive until here: the lifecycle only holds its streams weakly


def test_close_of_an_engine_never_loaded_leaves_the_mlx_cache_alone(monkeypatch):
    import mlx.core as mx

    life = lifecycle()
    events: list[str] = []
    monkeypatch.setattr(mx, "clear_cache", lambda: events.append("clear cache"))
    stream = life.track(RecordingStream(events, "a"))
    life.close(lambda: False)
    assert events == ["close a"]
    del stream


def test_streams_are_held_weakly():
    import gc

    life = lifecycle()
    events: list[str] = []
    life.track(RecordingStream(events, "dropped"))
    gc.collect()
    life.close(lambda: False)
    assert events == []


def test_warm_up_and_log_speaks_once_and_logs_the_load_line(caplog):
    import logging

    from engines.synthetic import SyntheticEngine

    engine = SyntheticEngine(rtf=0, ttfa_ms=0)
    engine.load()
    life = lifecycle()
    opened: list[str] = []
    real_open = engine.open

    def spy(request):
        opened.append(request.text)
        return real_open(request)

    engine.open = spy
    with caplog.at_level(logging.INFO, logger="tests.mlx_lifecycle"):
        warmup_s = life.warm_up_and_log(engine, "Hi.", "tiny loaded %s in %.2f s", "/m", 1.5)
    engine.close()
    assert opened == ["Hi."] and warmup_s >= 0
    (record,) = [r for r in caplog.records if r.name == "tests.mlx_lifecycle"]
    assert re.fullmatch(
        r"tiny loaded /m in 1\.50 s; warm-up took \d+\.\d\d s; mlx active \d+ MB, peak \d+ MB",
        record.getMessage(),
    )


def test_runaway_budget_is_per_character_with_a_floor():
    from engines.mlx_common import runaway_budget_s

    assert runaway_budget_s("x" * 40, 0.25, 3.0) == 10.0
    assert runaway_budget_s("Hi.", 0.25, 3.0) == 3.0


def test_a_chinese_sentence_read_slowly_is_not_a_runaway():
    """Mandarin TTS speaks 0.15 to 0.3 s a syllable (0.25 slow), one character each: at
    0.25 s a character the budget was the slow reading itself, and its pauses took it over
    (``engine_runaway``, the sentence stopped in the middle). A CJK character now counts
    three letters: a Chinese sentence has about the margin an English one has."""
    from engines.mlx_common import runaway_budget_s

    chinese = "我们明天早上八点在公司门口见面，然后一起去机场。"  # 22 syllables, 2 pauses
    english = "We meet at the office at eight tomorrow, then go to the airport together."
    assert runaway_budget_s(chinese, 0.25, 3.0) >= 2.5 * (22 * 0.25 + 2 * 0.3)
    assert runaway_budget_s(english, 0.25, 3.0) >= 2.5 * len(english) * 0.07


def test_a_loads_prints_go_to_the_log_and_every_other_threads_to_stdout(capsys, caplog):
    """Two loads overlap (two lanes) and end in the other order; the main thread prints
    meanwhile (the gateway's "stopped while starting") and after."""
    steps = [threading.Event() for _ in range(4)]

    def load(name: str, start: int, end: int) -> None:
        with library_output_logged(logging.getLogger(f"test.{name}")):
            print(f"Loaded speech tokenizer from /models/{name}")
            steps[start].set()
            assert steps[end].wait(HANG_S)
            print("Warning: Could not load tokenizer:", name, end="")  # no newline: flushed

    with caplog.at_level(logging.DEBUG, logger="test"):
        first = threading.Thread(target=load, args=("a", 0, 2))
        second = threading.Thread(target=load, args=("b", 1, 3))
        first.start()
        assert steps[0].wait(HANG_S)
        second.start()
        assert steps[1].wait(HANG_S)
        print("stopped while starting")
        steps[2].set()
        first.join()
        print("first load over")
        steps[3].set()
        second.join()
    print("both over")
    assert capsys.readouterr().out == "stopped while starting\nfirst load over\nboth over\n"
    assert sorted((r.name, r.levelname, r.getMessage()) for r in caplog.records) == [
        ("test.a", "DEBUG", "Loaded speech tokenizer from /models/a"),
        ("test.a", "WARNING", "Warning: Could not load tokenizer: a"),
        ("test.b", "DEBUG", "Loaded speech tokenizer from /models/b"),
        ("test.b", "WARNING", "Warning: Could not load tokenizer: b")]
    assert type(sys.stdout).__module__ != "engines.mlx_common"  # put back
