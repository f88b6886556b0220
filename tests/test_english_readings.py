"""What English voices are given for notations they misread (``engines.spell.english_readings``):
espeak's English voices (``espeak_text(english=True)``) and the engines that read digits
badly (``spell_out``, chatterbox). Other languages' espeak voices are given the text as it was.
"""

from __future__ import annotations

import pytest

from engines.base import SynthesisRequest
from engines.spell import english_readings, spell_out

espeak = pytest.importorskip("engines.espeak")


@pytest.fixture(scope="module")
def engine():
    e = espeak.EspeakEngine()
    e.load()
    yield e
    e.close()


def samples(engine, text: str, voice: str = "en-us") -> int:
    """How many samples espeak makes for ``text`` (``text`` as the gateway gives it)."""
    stream = engine.open(SynthesisRequest(text=text, voice=voice))
    n = 0
    while (chunk := stream.step()) is not None:
        n += len(chunk) // 2
    return n


def check(text: str, english: str, spelled: str) -> None:
    """``text`` reads ``english`` in espeak's English voices and ``spelled`` in chatterbox;
    espeak's other voices get it unchanged (but for minus signs)."""
    assert espeak.espeak_text(text, english=True) == english
    assert spell_out(text) == spelled
    assert spell_out(spelled) == spelled  # idempotent
    assert espeak.espeak_text(text) == text


# --- comparison signs ---------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("7 > 5 and 3 < 4.", "7 greater than 5 and 3 less than 4.",
     "seven greater than five and three less than four."),
    ("Keep it <5% or >90%.", "Keep it less than 5% or greater than 90%.",
     "Keep it less than five percent or greater than ninety percent."),
    ("If x >= 10 and y <= 2, x > y.",
     "If x greater than or equal to 10 and y less than or equal to 2, x greater than y.",
     "If x greater than or equal to ten and y less than or equal to two, x greater than y."),
    ("x \u2264 3, y \u2265 4, a \u2260 b, \u03c0 \u2248 3.14",
     "x less than or equal to 3, y greater than or equal to 4, a not equal to b, "
     "\u03c0 approximately 3.14",
     "x less than or equal to three, y greater than or equal to four, a not equal to b, "
     "\u03c0 approximately three point one four"),
])
def test_comparison_signs_are_said(text, english, spelled) -> None:
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "a -> b => c <- d", "Use <div> and </div> tags.", "x<y", "1 << 4 >> 2", "a <> b",
    "Go to Settings > Devices > Add.", "Open Wi-Fi > 5 GHz.", "Home > Kitchen > Lights",
])
def test_arrows_tags_shifts_and_menus_are_no_comparison(text) -> None:
    assert english_readings(text) == text


def test_espeak_says_a_comparison_it_skipped(engine) -> None:
    # "7 > 5." was "seven five" with a pause: 1.26 s against 1.73 s for the words
    words = samples(engine, "7 greater than 5.")
    assert samples(engine, "7 > 5.") == pytest.approx(words, rel=0.02)
    # German keeps its own reading: no English word in a German voice
    assert samples(engine, "7 > 5.", "de") < samples(engine, "7 greater than 5.", "de") * 0.8
