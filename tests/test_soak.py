"""bench/soak.py end to end, briefly: a real gateway process, aborts + resumes, cancels,
stalled readers and session churn; nothing lost, nothing failed, nothing left open."""

from __future__ import annotations

import json

import pytest

from bench import soak


@pytest.mark.slow
def test_a_short_soak_loses_nothing(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = soak.main(["--sessions", "6", "--minutes", "0.25", "--sample-s", "2",
                    "--renew-every", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert sum(result["turns"].values()) > 0 and result["frames"] > 0
    assert result["seq_gaps"] == result["seq_repeats"] == result["violations"] == 0
    assert "failed" not in result["turns"] and "lost" not in result["turns"]
    assert result["fds"]["idle_after"] == result["fds"]["start"]  # every socket closed
    assert result["tasks"]["idle_after"] == result["tasks"]["start"]  # and every task ended
    assert result["gateway"]["sessions_after"] == 0 and result["gateway"]["exit_code"] == 0
    assert "frames lost / duplicated" in capsys.readouterr().out
