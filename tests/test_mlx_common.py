"""float -> PCM16 conversion and model resolution shared by the MLX engines (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import EngineError
from engines.mlx_common import float_to_pcm16, resolve_model_path


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
