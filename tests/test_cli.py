"""``voice-gateway serve``: flags and ``VOICE_GATEWAY_TOKENS`` over the ``--config`` file."""

from __future__ import annotations

import pytest

from gateway.cli import _parser, build_config, main


def config_of(*argv: str):
    return build_config(_parser().parse_args(["serve", *argv]))


def test_defaults_are_the_embedded_offline_ones(monkeypatch):
    monkeypatch.delenv("VOICE_GATEWAY_TOKENS", raising=False)
    c = config_of()
    assert (c.server.host, c.server.port) == ("127.0.0.1", 8780)
    assert c.tts.engine == "espeak" and c.llm.url is None and c.server.tokens == ()


def test_tokens_come_from_flags_and_the_environment(monkeypatch):
    monkeypatch.setenv("VOICE_GATEWAY_TOKENS", " env-a , ,env-b")
    c = config_of("--token", "flag-a", "--token", "flag-b")
    assert c.server.tokens == ("flag-a", "flag-b", "env-a", "env-b")


def test_flags_override_the_config_file_and_the_rest_of_it_stands(tmp_path, monkeypatch):
    monkeypatch.delenv("VOICE_GATEWAY_TOKENS", raising=False)
    toml = tmp_path / "gw.toml"
    toml.write_text('[server]\nport = 9000\nhost = "127.0.0.1"\norigins = ["https://a.example"]\n'
                    '[session]\nmax_lead_ms = 2000\nframe_ms = 20\n')
    c = config_of("--config", str(toml), "--port", "9100", "--origin", "https://b.example",
                  "--frame-ms", "60")
    assert c.server.port == 9100 and c.server.origins == ("https://b.example",)
    assert c.session.frame_ms == 60 and c.session.max_lead_ms == 2000  # from the file


@pytest.mark.parametrize(("argv", "message"), [
    (["--synthetic-rtf", "0.5"], "--synthetic-* options need --tts synthetic"),
    (["--config", "/nonexistent/gw.toml"], "No such file"),
])
def test_a_bad_command_line_exits_2_with_the_reason(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_public_bind_without_a_token_exits_2_before_serving(capsys, monkeypatch):
    monkeypatch.delenv("VOICE_GATEWAY_TOKENS", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "without a token" in capsys.readouterr().err
