"""Segmenter: the corpus, the invariants (hypothesis), the knobs and speakable text."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.segmenter import Segment, Segmenter, SegmenterConfig, speakable

CORPUS = [json.loads(line) for line in
          (Path(__file__).parent / "data" / "segmentation.jsonl").read_text().splitlines()]
SENTENCES = SegmenterConfig(first_min_words=0, min_chars=0, max_chars=10_000)


def run(text: str, sizes: list[int] | None = None, config: SegmenterConfig | None = None,
        **kw) -> list[Segment]:
    seg = Segmenter(config, **kw)
    out: list[Segment] = []
    i = 0
    for n in sizes or [len(text)]:
        out += seg.feed(text[i:i + n])
        i += n
    out += seg.feed(text[i:])
    return out + seg.finish()


def chunks(text: str, rng: random.Random, hi: int) -> list[int]:
    sizes, total = [], 0
    while total < len(text):
        sizes.append(rng.randint(1, hi))
        total += sizes[-1]
    return sizes


def test_corpus_is_big_and_covers_the_cases():
    assert len(CORPUS) >= 200
    tags = {r["tag"] for r in CORPUS}
    assert {"ellipses", "emoji", "quotes and parentheses", "long replies"} <= tags


@pytest.mark.parametrize("row", CORPUS, ids=lambda r: str(r["id"]))
def test_corpus_boundaries_whatever_the_chunking(row):
    rng = random.Random(row["id"])
    for hi in (1, 4, 30, 10_000):
        got = [s.text for s in run(row["reply"], chunks(row["reply"], rng, hi), SENTENCES)]
        assert got == row["segments"], f"chunks up to {hi}"


# --- invariants --------------------------------------------------------------------------

_pieces = st.sampled_from([
    "Hi", "Dr.", "p.m.", "8.", "4", "3.5", " ", "  ", ". ", "! ", "? ", "... ", "…", ", ",
    "; ", ": ", " — ", " - ", "\n", "\n\n", "\"", "“", "”", "(", ")", "e.g.", "U.S.", "J.",
    "example.org", "$184.50", "15%", "11:15", "🎉", "👍🏽", "**", "*", "`", "```", "1. ", "- ",
    "# ", "the", "The", "I", "word", "Okay", "192.168.1.1", "a@b.io", "https://x.io/a?b=1",
    " and ", " in ", "in", "side", " with ", " because ", " is ", " a ", "Mr.", " 3 ", " or ",
    "今天", "很好", "。", "！", "？", "「", "」", "（", "）", "と聞いた", "，", "、", "：",
    "„", "“", "«", "»", " » ", "\u202f", "z. B.", "am 3. ", "Oktober", "Sr.", "¿", "3,5",
    "1 250 000", "EE. UU.", "Co. KG", "séc. XIX", "'", "~~", "$", "_", "Mr", " et al. ",
    "Jr.", "Day", "TP.", "είναι", ";", "\u037e", "Θα", "ד", "ר", "ค่ะ.", "ดร.", "น", "กะเพรา",
    "[1, 2]", "[1\u20133]", "[1,", " 2]",
])
_prose = st.lists(st.sampled_from([
    "a", "word", " ", "word ", "the ", "and ", "He", "3", "\"", "“", "”", "(", ")", "`", "?",
    ". ", ", ", "\n",
]), min_size=10, max_size=60).map("".join)
"""Long runs of words with few stops: where quote_max_chars, max_chars, min_chars and the
first segment's cuts meet (a quote still open when max_chars comes, a word count across a
long cut)."""
_texts = st.lists(_pieces, max_size=40).map("".join) | _prose | st.text(max_size=200)


@settings(max_examples=300)
@given(text=_texts, data=st.data())
def test_invariants(text, data):
    """Every knob of SegmenterConfig is drawn, the lengths at values the reply reaches (a
    max_chars below an open quote's quote_max_chars, min_chars above max_chars), and the
    reply is fed one character at a time or in pieces: the segments do not depend on it."""
    reach = max(len(text), 1)
    config = data.draw(st.builds(
        SegmenterConfig, first_min_words=st.integers(0, 6),
        first_phrase_words=st.integers(0, 6), first_max_words=st.integers(0, 6),
        min_chars=st.integers(0, reach), max_chars=st.integers(1, reach) | st.integers(1, 400),
        quote_max_chars=st.integers(0, reach)))
    whole = run(text, None, config)
    sizes = data.draw(st.just([1] * len(text)) | st.lists(st.integers(1, 12), max_size=60))
    assert run(text, sizes, config) == whole, "result depends on the chunking"
    pos = 0
    for i, s in enumerate(whole):
        assert s.index == i
        assert s.text and s.text == s.text.strip()
        assert text[s.start:s.start + len(s.text)] == s.text
        assert not text[pos:s.start].strip(), "text was lost between segments"
        pos = s.start + len(s.text)
        assert len(s.text) <= config.max_chars or _one_word(s.text), "passed max_chars"
    assert not text[pos:].strip()


def _one_word(text: str) -> bool:
    """What may pass max_chars (its one exception, protocol.md): a single word, a number
    written in groups ("1 250 000") counting as one, or a code block (never spoken)."""
    return " " not in re.sub(r"(?<=\d) (?=\d)", "", text) or text.startswith("```")


@pytest.mark.parametrize(("text", "segments"), [
    # full-width ends: no space follows them in Chinese or Japanese
    ("今天天气很好。我们去公园吧！你觉得呢？好的。",
     ["今天天气很好。", "我们去公园吧！", "你觉得呢？", "好的。"]),
    ("Mixed English. 中文句子。End.", ["Mixed English.", "中文句子。", "End."]),
    # the sentence goes on past a quote or bracket that closes right after the end
    ("東京は晴れです。「本当？」と聞いた。", ["東京は晴れです。", "「本当？」と聞いた。"]),
    ("他说：“你好。”然后走了。", ["他说：“你好。”然后走了。"]),
    ("「今天很好。我们走吧。」他说。明天见。", ["「今天很好。我们走吧。」他说。", "明天见。"]),
])
def test_chinese_and_japanese_sentences(text, segments):
    assert [s.text for s in run(text, config=SENTENCES)] == segments
    assert [s.text for s in run(text, [1] * len(text), SENTENCES)] == segments


def test_chinese_clause_marks_give_the_eager_first_cut_and_the_long_sentence_break():
    text = "今天北京的天气很好，最高气温二十五度。下午可能会有小雨，记得带伞。"
    # nine characters count as four words: enough for the default first_min_words
    assert [s.text for s in run(text)] == ["今天北京的天气很好，", "最高气温二十五度。",
                                           "下午可能会有小雨，记得带伞。"]
    assert [s.text for s in run("好的，我来查一下。")] == ["好的，我来查一下。"]  # too short
    long = ("我们今天去了很多地方，看了很多风景，吃了很多好吃的东西，也认识了很多新朋友，"
            "大家都非常开心。")
    got = [s.text for s in run(long, config=SegmenterConfig(first_min_words=0, max_chars=40))]
    assert got == ["我们今天去了很多地方，看了很多风景，吃了很多好吃的东西，也认识了很多新朋友，",
                   "大家都非常开心。"]  # no space to break at: the last clause mark before 40


@pytest.mark.parametrize(("text", "want"), [
    ("今天天气很好，然后我们去公园。", ["今天天气很好，", "然后我们去公园。"]),  # six: 4 words
    ("天气很好，然后我们去公园。", ["天气很好，然后我们去公园。"]),  # four characters: 3 words
])
def test_two_chinese_characters_count_as_a_word_for_the_eager_first_cut(text, want):
    assert [s.text for s in run(text)] == want


def test_chinese_clause_marks_inside_brackets_or_quotes_never_cut():
    text = "他说「我们今天去公园散步，然后去吃饭。」"
    assert [s.text for s in run(text)] == [text]
    assert [s.text for s in run(text, [1] * len(text))] == [text]


def test_chinese_list_items_ending_in_a_clause_mark_end_at_their_newline():
    text = "1. 苹果；\n2. 香蕉；\n3. 橙子。"
    assert [s.text for s in run(text, config=SENTENCES)] == ["1. 苹果；", "2. 香蕉；", "3. 橙子。"]


def test_the_sentence_after_a_long_chinese_one_cut_at_a_clause_mark_still_ends():
    long = ("我们今天去了很多地方，看了很多风景，吃了很多好吃的东西，也认识了很多新朋友，"
            "大家都非常开心。明天见。")
    got = [s.text for s in run(long, config=SegmenterConfig(first_min_words=0, max_chars=40))]
    assert got[1:] == ["大家都非常开心。", "明天见。"]


def test_a_full_width_end_then_a_space_keeps_the_next_sentence_whole():
    text = "会议结束了。 Then we left. Ok."
    assert [s.text for s in run(text, config=SENTENCES)] == ["会议结束了。", "Then we left.", "Ok."]


@pytest.mark.parametrize(("min_chars", "want"), [
    (5, ["你好。", "我很好。今天天气很好，我们去公园散步吧。"]),  # shorter than 5: merged
    (4, ["你好。", "我很好。", "今天天气很好，我们去公园散步吧。"]),  # exactly 4: stands
])
def test_short_chinese_sentences_merge_after_the_first(min_chars, want):
    text = "你好。我很好。今天天气很好，我们去公园散步吧。"
    assert [s.text for s in run(text, config=SegmenterConfig(first_min_words=0,
                                                             min_chars=min_chars))] == want


def test_a_run_on_chinese_sentence_is_cut_between_characters_at_max_chars():
    # no clause mark and no space: before, one segment however long (nothing to cut at)
    text = ("我们今天去了很多地方看了很多风景吃了很多好吃的东西"
            "也认识了很多新朋友大家都非常开心") * 3 + "。"
    config = SegmenterConfig(first_min_words=0, max_chars=40)
    whole = [s.text for s in run(text, config=config)]
    assert len(whole) > 1 and all(len(s) <= 40 for s in whole)
    assert "".join(whole) == text  # cut between characters: nothing dropped, no space added
    for sizes in ([1] * len(text), [7] * 20, [3, 50, 2] * 10):
        assert [s.text for s in run(text, sizes, config)] == whole
    # a space or a Latin word nearer the limit is preferred; Latin words are never cut
    mixed = "请把" + "文件" * 15 + " 发给 Alexander 然后" + "检查" * 20 + "。"
    got = [s.text for s in run(mixed, config=config)]
    assert all(len(s) <= 40 for s in got) and "Alexander" in "".join(got)
    assert got[0].endswith("发给") and got[1].startswith("Alexander")


# --- knobs -------------------------------------------------------------------------------

def test_first_segment_is_an_eager_clause_and_later_ones_are_sentences():
    text = ("Sure, I looked at the logs for you, and nothing stands out. "
            "The disk is fine, the memory is fine, and the network is fine.")
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=5))]
    assert got == ["Sure, I looked at the logs for you,", "and nothing stands out.",
                   "The disk is fine, the memory is fine, and the network is fine."]


def test_eager_clause_arrives_before_the_sentence_ends():
    seg = Segmenter(SegmenterConfig(first_min_words=4))
    assert seg.feed("The design review starts") == []
    assert [s.text for s in seg.feed(" at 3:30 p.m. today, in the")] == [
        "The design review starts at 3:30 p.m. today,"]
    assert seg.feed(" big room.") == []
    assert [s.text for s in seg.finish()] == ["in the big room."]


def test_eager_clause_never_cuts_numbers_or_inside_quotes():
    text = 'We paid 1,250 dollars for "the big one, with extras" last week, I think.'
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=2))]
    assert got == ['We paid 1,250 dollars for "the big one, with extras" last week,', "I think."]


def test_a_long_sentence_is_not_cut_inside_a_number_written_in_groups():
    # French (and Swiss, Scandinavian...) group digits with spaces: "1 250 | 000 euros"
    # was two segments, and espeak said "zéro zéro zéro euros"
    text = ("Le budget prévu pour la rénovation du bâtiment principal est de 1 250 000 euros "
            "selon le devis.")
    config = SegmenterConfig(first_min_words=0, max_chars=text.index(" 000") + 1)
    rng = random.Random(5)
    for hi in (1, 4, 10_000):
        got = [s.text for s in run(text, chunks(text, rng, hi), config)]
        assert got == ["Le budget prévu pour la rénovation du bâtiment principal est de",
                       "1 250 000 euros selon le devis."]


@pytest.mark.parametrize(("text", "want"), [
    # a German abbreviation right after the eager cut stays whole ("z." was a segment)
    ("Es gibt viele Sorten, z. B. Äpfel, Birnen und Kirschen.",
     ["Es gibt viele Sorten,", "z. B. Äpfel, Birnen und Kirschen."]),
    # a decimal comma is never a clause mark
    ("Heute sind es 3,5 Grad und morgen 4,5 Grad, sagt der Wetterbericht.",
     ["Heute sind es 3,5 Grad und morgen 4,5 Grad,", "sagt der Wetterbericht."]),
    ("Am 3. Oktober ist Feiertag, die Geschäfte sind zu.",
     ["Am 3. Oktober ist Feiertag,", "die Geschäfte sind zu."]),
])
def test_eager_clause_in_german(text, want):
    assert [s.text for s in run(text)] == want


@pytest.mark.parametrize(("text", "want"), [
    # a month English has too after a number ends the sentence, unless a German word
    # leads the day
    ("The answer is 12. August is the hottest month here.",
     ["The answer is 12.", "August is the hottest month here."]),
    ("I finished chapter 3. Jan said it was good.",
     ["I finished chapter 3.", "Jan said it was good."]),
    ("Add them up to get 7. April will be warmer.", ["Add them up to get 7.",
                                                     "April will be warmer."]),
    ("Wir fahren am 3. April los. Bis dann.", ["Wir fahren am 3. April los.", "Bis dann."]),
    ("Das Fest ist 3. Oktober. Bis dann.", ["Das Fest ist 3. Oktober.", "Bis dann."]),
])
def test_a_german_date_and_an_english_sentence_end(text, want):
    assert [s.text for s in run(text, config=SegmenterConfig(min_chars=0))] == want


def phrase(text: str, words: int, **kw) -> list[str]:
    """Segments with first_phrase_words; the same whatever the chunking."""
    config = SegmenterConfig(first_phrase_words=words, **kw)
    got = [s.text for s in run(text, config=config)]
    rng = random.Random(text)
    for hi in (1, 3, 7):
        assert [s.text for s in run(text, chunks(text, rng, hi), config)] == got
    return got


def test_first_phrase_is_off_by_default():
    assert SegmenterConfig().first_phrase_words == 0
    assert [s.text for s in run("The home team won 3 to 2 in overtime. Great game.")] == [
        "The home team won 3 to 2 in overtime.", "Great game."]


@pytest.mark.parametrize(("words", "want"), [
    (4, ["Okay, I cancelled the sync", "with the design team and sent them a note.", "Done?"]),
    (5, ["Okay, I cancelled the sync", "with the design team and sent them a note.", "Done?"]),
    (9, ["Okay, I cancelled the sync with the design team", "and sent them a note.", "Done?"]),
    (10, ["Okay, I cancelled the sync with the design team and sent them a note.", "Done?"]),
])
def test_first_phrase_cuts_before_an_opener_once_it_holds_enough_words(words, want):
    text = "Okay, I cancelled the sync with the design team and sent them a note. Done?"
    assert phrase(text, words, first_min_words=0) == want


def test_first_phrase_waits_for_the_whole_opener_and_never_cuts_mid_word():
    seg = Segmenter(SegmenterConfig(first_phrase_words=3))
    assert seg.feed("The cat was sleeping in") == []  # "in" or "inside"?
    assert seg.feed("side the box") == []
    assert [s.text for s in seg.finish()] == ["The cat was sleeping inside the box"]
    seg = Segmenter(SegmenterConfig(first_phrase_words=3))
    assert seg.feed("The cat was sleeping in") == []
    assert [s.text for s in seg.feed(" the")] == ["The cat was sleeping"]
    assert [s.text for s in seg.feed(" box. Then it woke up in a hurry.")] == [
        "in the box."]  # later sentences are never cut at a phrase
    assert [s.text for s in seg.finish()] == ["Then it woke up in a hurry."]


@pytest.mark.parametrize(("text", "want"), [
    # never leave the piece ending in an article, a determiner, a copula or a function word
    ("He saw the in crowd at last.", ["He saw the in crowd", "at last."]),
    ("The docs are at the usual place.", ["The docs are at the usual place."]),
    ("Your password must be at least twelve characters.",
     ["Your password must be at least twelve characters."]),
    ("It is one of in total ten.", ["It is one of in total ten."]),
    # never inside a protected token
    ("Mr. and Mrs. Smith are here with us.", ["Mr. and Mrs. Smith are here", "with us."]),
    ("Pick 3 or 4 apples for the pie.", ["Pick 3 or 4 apples", "for the pie."]),
    ("It starts at 3 p.m. in the big room.", ["It starts", "at 3 p.m. in the big room."]),
    ("Go to https://x.io/in and to www.in.com now.",
     ["Go to https://x.io/in", "and to www.in.com now."]),
    # never inside quotes or brackets; the cut may come right after them
    ('He said "meet me in the hall" and left.', ['He said "meet me in the hall"', "and left."]),
    ("The call (with the landlord at noon) moved.",
     ["The call (with the landlord at noon) moved."]),
    # a sentence that ends before the opener is whole goes as one
    ("It is done. Then we go in the car.", ["It is done.", "Then we go in the car."]),
    ("Timer set for ten minutes.", ["Timer set", "for ten minutes."]),
])
def test_first_phrase_respects_words_and_tokens(text, want):
    assert phrase(text, 2, first_min_words=0) == want


def test_first_phrase_and_eager_clause_whichever_comes_first():
    text = "Sure, the build passed on the main branch, and the tests are green."
    assert phrase(text, 3, first_min_words=4) == [
        "Sure, the build passed", "on the main branch, and the tests are green."]
    assert phrase(text, 8, first_min_words=4) == [
        "Sure, the build passed on the main branch,", "and the tests are green."]


def words(text: str, n: int, **kw) -> list[str]:
    """Segments with first_max_words; the same whatever the chunking."""
    config = SegmenterConfig(first_max_words=n, **kw)
    got = [s.text for s in run(text, config=config)]
    rng = random.Random(text)
    for hi in (1, 3, 7):
        assert [s.text for s in run(text, chunks(text, rng, hi), config)] == got
    return got


def test_first_max_words_is_off_by_default():
    assert SegmenterConfig().first_max_words == 0


@pytest.mark.parametrize(("n", "want"), [
    (3, ["The home team", "won the final game in overtime.", "Great game."]),
    (4, ["The home team won", "the final game in overtime.", "Great game."]),
    (5, ["The home team won the final", "game in overtime.", "Great game."]),  # not "the |"
    (7, ["The home team won the final game", "in overtime.", "Great game."]),
    (8, ["The home team won the final game in overtime.", "Great game."]),  # not "in |"
    (9, ["The home team won the final game in overtime.", "Great game."]),  # ends first
])
def test_first_max_words_cuts_after_that_many_words_whatever_the_phrase(n, want):
    assert words("The home team won the final game in overtime. Great game.", n) == want


def test_first_max_words_waits_for_the_next_word_to_start():
    seg = Segmenter(SegmenterConfig(first_max_words=2))
    assert seg.feed("Your order") == []  # "order" or "orders"?
    assert seg.feed(" ") == []  # "Your order 1 250 000" or "Your order," ...: wait
    assert [s.text for s in seg.feed("has")] == ["Your order"]
    assert [s.text for s in seg.finish()] == ["has"]
    seg = Segmenter(SegmenterConfig(first_max_words=2))
    assert [s.text for s in seg.feed("Your order ") + seg.finish()] == ["Your order"]


@pytest.mark.parametrize(("text", "want"), [
    # never inside a number, an abbreviation, a URL or a title and its name
    ("It is 1 250 000 euros in all.", ["It is 1 250 000 euros", "in all."]),
    ("We met at 3 p.m. in the big room.", ["We met at 3 p.m. in the big", "room."]),
    ("Ask Dr. Smith about the dose.", ["Ask Dr. Smith", "about the dose."]),
    ("Ask Mr Smith about the dose.", ["Ask Mr Smith", "about the dose."]),
    ("Smith et al. found the same effect.", ["Smith et al. found", "the same effect."]),
    ("Born in June, 2024 we moved.", ["Born in June, 2024 we", "moved."]),
    # a dotted word after the cut is read with the word before it: "No. 12", "im XIX."
    ("It was room No. 12 instead of No. 21.", ["It was room", "No. 12 instead of No. 21."]),
    ("Es wurde im XIX. Jahrhundert gebaut.", ["Es wurde im", "XIX. Jahrhundert gebaut."]),
    ("See https://x.io/a?b=1 now for the docs.", ["See https://x.io/a?b=1 now", "for the docs."]),
    ("It costs $5 per month now.", ["It costs $5 per", "month now."]),
    # never inside quotes, brackets or a markdown span
    ('He said "go home right now" and left it.',
     ['He said "go home right now" and left', "it."]),
    ("He said 'go home right now' and left.", ["He said 'go home right now'", "and left."]),
    ("The call (with the landlord) moved to noon.",
     ["The call (with the landlord) moved", "to noon."]),
    ("It is **really very good** news.", ["It is **really very good** news."]),
    ("Run `git commit -m fix` now and wait.", ["Run `git commit -m fix` now", "and wait."]),
    ("Use ~~the old way~~ the new one.", ["Use ~~the old way~~ the new", "one."]),
    ("Take $a plus b$ now as the sum.", ["Take $a plus b$ now", "as the sum."]),
    # a clause mark may end the word before; a bullet is no word
    ("First of all, we check the logs.", ["First of all,", "we check the logs."]),
    ("- Install the package first and wait.", ["- Install the package", "first and wait."]),
    ("- [x] Buy the milk and the eggs.", ["- [x] Buy the milk", "and the eggs."]),
    ("1. Open the app and wait.", ["1. Open the app", "and wait."]),
    ("3. Oktober ist ein Feiertag hier.", ["3. Oktober ist", "ein Feiertag hier."]),  # a day
    # a sentence, an eager clause or a phrase that ends first wins
    ("Yes. I can do that for you.", ["Yes.", "I can do that for you."]),
])
def test_first_max_words_never_cuts_a_protected_token(text, want):
    assert words(text, 3, first_min_words=0) == want


@pytest.mark.parametrize("sizes", [None, [1], [1, 1], [2]])
def test_first_max_words_counts_a_quote_line_streamed_with_its_mark_alone(sizes):
    """A Markdown quote's ">" streamed as a delta of its own (as LLM tokens come): the head
    then starts right at the gap after the mark, which holds no word yet; its count starts
    there as for one delta (without ``_head_words``'s check for a head of no word, an
    IndexError inside the segmenter, ending the turn)."""
    text = "> Keep calm and carry on, they said. Then we went home."
    got = [s.text for s in run(text, sizes, SegmenterConfig(first_max_words=3))]
    assert got == ["> Keep calm and carry", "on, they said.", "Then we went home."]


@pytest.mark.parametrize(("text", "want"), [
    ("We are at noon with the team.", ["We are at noon", "with the team."]),
    ("You're at the top of the list now.", ["You're at the top", "of the list now."]),
    ("The printer is at the back.", ["The printer is at the back."]),
    ("I went and came back home.", ["I went and came", "back home."]),
])
def test_first_max_words_never_ends_on_a_word_that_promises_more(text, want):
    """An article, a preposition, a conjunction or an auxiliary ("at", "the", "and", "is")
    promises a word the first segment would not hold: the engine says it with a final
    fall, then a gap. The cut goes on to the next word (one that is none of these)."""
    assert words(text, 3, first_min_words=0) == want


@pytest.mark.parametrize(("text", "want"), [
    # Hindi: most words carry a vowel sign (a combining mark: "बहुत", "अच्छा")
    ("यह एक बहुत अच्छा दिन है और हम सब पार्क में घूमने जा रहे हैं।",
     ["यह एक बहुत", "अच्छा दिन है और हम सब पार्क में घूमने जा रहे हैं।"]),
    # a decomposed accent ("e" + U+0301) cuts where the composed "é" does
    ("Le cafe\u0301 e\u0301tait tre\u0300s bon pour nous.",
     ["Le cafe\u0301 e\u0301tait", "tre\u0300s bon pour nous."]),
    ("Le café était très bon pour nous.", ["Le café était", "très bon pour nous."]),
])
def test_first_max_words_cuts_after_a_word_written_with_combining_marks(text, want):
    """A vowel sign or an accent written as a combining mark is part of its word: the cut
    after that many words falls where it would without the marks, not words later."""
    assert words(text, 3, first_min_words=0) == want


def test_first_max_words_with_the_eager_clause_and_first_phrase_whichever_comes_first():
    text = "Sure, the build passed on the main branch today."
    assert words(text, 6) == ["Sure, the build passed on the main", "branch today."]
    assert words(text, 6, first_min_words=1) == [
        "Sure,", "the build passed on the main branch today."]
    assert words(text, 6, first_phrase_words=3) == [
        "Sure, the build passed", "on the main branch today."]
    assert words(text, 3, first_phrase_words=3) == [
        "Sure, the build", "passed on the main branch today."]


def test_first_max_words_cuts_only_the_first_segment():
    assert words("Okay. The home team won the final game.", 2) == [
        "Okay.", "The home team won the final game."]


def test_abandon_never_returns_a_first_max_words_cut():
    """abandon feeds a made-up sentence: a cut before it would speak an unfinished text."""
    seg = Segmenter(SegmenterConfig(first_max_words=2))
    assert seg.feed("and then ") == []
    assert seg.abandon() == []


def test_short_sentences_merge_after_the_first():
    text = "Yes. Done. Okay. The rest of the reply is long enough on its own. Bye."
    got = [s.text for s in run(text, config=SegmenterConfig(min_chars=20))]
    assert got == ["Yes.", "Done. Okay. The rest of the reply is long enough on its own.", "Bye."]


def test_short_sentences_never_merge_across_a_newline():
    got = [s.text for s in run("Intro here.\n- A.\n- B.", config=SegmenterConfig(min_chars=50))]
    assert got == ["Intro here.", "- A.", "- B."]


def test_long_sentence_cut_at_last_clause_before_max_chars():
    text = ("The first part of this sentence runs on for a while, the second part keeps going "
            "with more words, and the third part finally ends it here.")
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=100))]
    assert got == ["The first part of this sentence runs on for a while, the second part keeps "
                   "going with more words,", "and the third part finally ends it here."]
    assert all(len(s) <= 100 for s in got)


def test_long_sentence_without_clause_cut_at_a_space():
    text = " ".join(["word"] * 60) + "."
    got = run(text, [7] * 60, SegmenterConfig(first_min_words=0, max_chars=50))
    assert all(len(s.text) <= 50 for s in got) and len(got) > 1
    assert " ".join(s.text for s in got) == text


@pytest.mark.parametrize(("text", "want"), [
    ("aaaa bbbbb ccccc ddddd.", ["aaaa bbbbb", "ccccc", "ddddd."]),  # a space at max_chars
    ("aaaa bbbbbb ccccc ddddd.", ["aaaa", "bbbbbb", "ccccc", "ddddd."]),  # one past it
])
def test_a_long_sentence_is_cut_at_its_last_space_within_max_chars(text, want):
    assert [s.text for s in run(text, config=SegmenterConfig(first_min_words=0,
                                                             max_chars=10))] == want


@pytest.mark.parametrize("first_min_words", [0, 4])
@pytest.mark.parametrize("mark", [".", "!", "\u2026", ",", ";", " \u2014", "\u3002", " \U0001F389",
                                  '."', ".)", ".[1]", "!**"])
def test_a_segment_never_passes_max_chars_at_a_mark_just_past_it(mark, first_min_words):
    """max_chars bounds the segment ("a longer sentence is cut", protocol.md): a sentence
    end, a clause mark or an emoji right at max_chars (or closing marks, a citation mark
    after one before it) cut there, a segment of max_chars + 1 characters or more. The
    sentence is longer than max_chars: it is cut at its last space within it."""
    text = ("words " * 8)[:41 - len(mark)] + mark + " Then we left."
    assert len(text.split(" Then")[0]) == 41
    config = SegmenterConfig(first_min_words=first_min_words, max_chars=40)
    for sizes in (None, [1] * len(text)):
        got = [s.text for s in run(text, sizes, config)]
        assert all(len(s) <= 40 for s in got), got
        assert " ".join(got) == text


@pytest.mark.timeout(20)
def test_a_word_longer_than_max_chars_is_never_cut():
    url = "https://example.com/docs/reference/very/long/path/to/the/page"
    text = f"See {url} for details."
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=20))]
    assert got == ["See", url, "for details."]  # cut right after it, not at the next stop


def test_the_text_after_a_word_longer_than_max_chars_is_cut_as_any():
    """A word running past max_chars from the start of a segment (a link to a map: said as
    its label) took the rest of its sentence along, however long: the chatterbox voice's
    150 characters became 232 (cut at a clause mark past them). The cut is right after the
    word."""
    from gateway.core.segmenter import ONE_STEP_MAX_CHARS

    link = "[here](https://maps.example.com/place/" + "x" * 140 + ")"
    tail = ("and then walk along the river for about ten minutes, past the boats, until you "
            "reach the old stone bridge near the market where the bus stops twice an hour.")
    text = f"Find it {link} {tail}"
    config = SegmenterConfig(first_min_words=0, max_chars=ONE_STEP_MAX_CHARS)
    for sizes in (None, [1] * len(text), [9] * len(text)):
        got = run(text, sizes, config)
        assert [s.text for s in got[:2]] == ["Find it", link] and got[1].spoken == "here"
        assert " ".join(s.text for s in got[2:]) == tail
        assert all(len(s.text) <= ONE_STEP_MAX_CHARS for s in got[2:])


def test_sentences_after_a_cut_at_a_space_still_end_at_their_stops():
    text = "This sentence has no clause marks and goes on well past the limit. Next one. Last one."
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=40))]
    assert got[-2:] == ["Next one.", "Last one."]


def test_decimal_split_across_chunks_waits():
    seg = Segmenter(SENTENCES)
    assert seg.feed("It took 8.") == []
    assert seg.feed("4 seconds. Then") == [Segment(0, "It took 8.4 seconds.", 0,
                                                   "It took 8.4 seconds.")]


def test_code_block_is_one_silent_segment():
    text = "Run this:\n```\npip install .\nmake test. Done\n```\nThen wait."
    got = run(text, [3] * 30, SENTENCES)
    assert [(s.text, s.spoken) for s in got] == [
        ("Run this:", "Run this:"),
        ("```\npip install .\nmake test. Done\n```", ""),
        ("Then wait.", "Then wait."),
    ]


@pytest.mark.parametrize("sizes", [[1] * 80, [3] * 30, [80]])
def test_a_line_opening_with_inline_triple_backticks_is_said(sizes):
    """Markdown takes "```x``` words" as inline code, not a code block (a fence's info string
    has no backtick): the whole line was taken for a block and said nothing."""
    text = "```code``` See https://example.com/x now.\nThen wait."
    got = run(text, sizes, SENTENCES)
    assert [(s.text, s.spoken) for s in got] == [
        ("```code``` See https://example.com/x now.", "code See example.com now."),
        ("Then wait.", "Then wait."),
    ]
    fenced = run("````python\nx = 1\n````\nDone.", sizes, SENTENCES)
    assert [(s.text, s.spoken) for s in fenced] == [
        ("````python\nx = 1\n````", ""), ("Done.", "Done.")]


@pytest.mark.parametrize("one_delta", [True, False], ids=["one delta", "per character"])
def test_the_sentences_after_a_code_block_come_as_their_text_does(one_delta):
    """A code block holds back nothing after its closing fence: each sentence after it
    comes out of the delta that completes it, on its own (not at the end of the reply, in
    one piece, nor taken into the block's silent segment)."""
    text = "Run this:\n```c\nmake(test);\n```\nThen wait.\nIt takes a minute. And"
    seg = Segmenter(SENTENCES)
    got = []
    for piece in [text] if one_delta else list(text):
        got += seg.feed(piece)
    assert [(s.text, s.spoken) for s in got] == [
        ("Run this:", "Run this:"), ("```c\nmake(test);\n```", ""),
        ("Then wait.", "Then wait."), ("It takes a minute.", "It takes a minute.")]


@pytest.mark.parametrize("sizes", [[1] * 90, [4] * 23, [90]])
def test_a_code_block_indented_in_a_list_item_ends_at_its_indented_fence(sizes):
    """Markdown indents a list item's code block, closing fence too: the rest of the
    reply was taken into the block (its fence looked for at the start of a line only) and
    never said."""
    text = "1. Install it:\n   ```bash\n   pip install foo\n   ```\n2. Run it. Then rest.\n"
    got = run(text, sizes, SENTENCES)
    assert [(s.text, s.spoken) for s in got] == [
        ("1. Install it:", "Install it:"), ("```bash\n   pip install foo\n   ```", ""),
        ("2. Run it.", "Run it."), ("Then rest.", "Then rest.")]


@pytest.mark.parametrize("sizes", [[1] * 60, [7] * 9, [60]])
def test_a_sentence_between_two_code_blocks_is_said(sizes):
    text = "```\na = 1\n```\nSay this.\n```\nb = 2\n```\nDone."
    got = run(text, sizes, SENTENCES)
    assert [(s.text, s.spoken) for s in got] == [
        ("```\na = 1\n```", ""), ("Say this.", "Say this."), ("```\nb = 2\n```", ""),
        ("Done.", "Done.")]


@pytest.mark.parametrize("sizes", [[1] * 20, [20]])
def test_a_reply_that_ends_with_a_code_block_ends_with_it_unsaid(sizes):
    """The reply's last characters are the closing fence, with no newline after it."""
    got = run("Here:\n```\nls\n```", sizes, SENTENCES)
    assert [(s.text, s.spoken) for s in got] == [("Here:", "Here:"), ("```\nls\n```", "")]


@pytest.mark.parametrize("text", ["`ls` lists the files.\nDone.", "``ls`` lists the files.\nDone."])
def test_a_line_opening_with_inline_code_is_said(text):
    """One or two backticks open inline code, not a code block: the line is said."""
    got = run(text, [1] * len(text), SENTENCES)
    assert [s.spoken for s in got] == ["ls lists the files.", "Done."]


def test_feed_after_finish_is_an_error():
    seg = Segmenter()
    seg.finish()
    with pytest.raises(RuntimeError):
        seg.feed("x")


# --- speakable ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "spoken"), [
    ("1. Open the **app**.", "Open the app."),
    ("- [x] Book *flights*", "Book flights"),
    ("## Summary", "Summary"),
    ("> Be kind.", "Be kind."),
    ("Great job! 🎉", "Great job!"),
    ("🎉", ""),
    # an emoji before a mark goes with the space before it: "Great job !" cut the mark off
    ("Great job 🎉! Yes 👍🏽, done ✅.", "Great job! Yes, done."),
    ("Merci 🎉 !", "Merci !"),
    ("|------|------|", ""),
    ("| Paris | 18 °C |", "Paris, 18 °C"),
    ("Use `git rebase -i` now.", "Use git rebase -i now."),
    ("Try the [docs](https://example.com/docs) first.", "Try the docs first."),
    ("The docs are at https://docs.python.org/3/library/asyncio.html.",
     "The docs are at docs.python.org."),
    ("Keep snake_case and 5 * 3 as they are.", "Keep snake_case and 5 * 3 as they are."),
    # a NUL ended espeak's C string: "Hello" was all it said
    ("Hello\x00 there,\x07 how are you\x1b today.", "Hello there, how are you today."),
    ("\x00\x7f", ""),
    # an LLM's invalid UTF-8 (random weights, a byte cut off) decodes to U+FFFD: not speech,
    # nor for a model's tokenizer, which took its three bytes as text to voice
    ("The caf\ufffd\ufffd is open.", "The caf is open."),
    ("\ufffd\ufffd", ""),
    # struck-out text is taken back, not said; footnote marks and <br> were read aloud
    ("It is at ~~3pm~~ 4pm, ~~not~~ **sure**.", "It is at 4pm, sure."),
    ("According to Reuters[1], rates rose.[^2] See [3](https://ex.org/n).",
     "According to Reuters, rates rose. See 3."),
    ("| Mon | Rain<br>12°C |", "Mon, Rain, 12°C"),
    ("Line one<br/>Line two", "Line one, Line two"),
    # emoji outside the emoji blocks: espeak said "hourglass not done", "timer clock"
    ("\u23f3 Almost done.", "Almost done."),
    ("Done! \u23f2\ufe0f I set it for 10 minutes \u23f0", "Done! I set it for 10 minutes"),
    ("\u25b6\ufe0f Play, \u21a9\ufe0f back, \u2139\ufe0f info", "Play, back, info"),
    # the same symbols without U+FE0F are text; a keycap keeps its digit
    ("Step 1 \u2192 preheat, \u00a92024 \u25b6", "Step 1 \u2192 preheat, \u00a92024 \u25b6"),
    ("1\ufe0f\u20e3 Preheat. Wow\u203c\ufe0f", "1 Preheat. Wow\u203c"),
    # a German date opening a line is no list number: the day was dropped
    ("3. Oktober: Tag der Deutschen Einheit", "3. Oktober: Tag der Deutschen Einheit"),
    ("1. Mai ist Feiertag.", "1. Mai ist Feiertag."),
    ("2. Maiskolben kochen", "Maiskolben kochen"),
])
def test_speakable_markdown(text, spoken):
    assert speakable(text) == spoken


@pytest.mark.parametrize(("text", "spoken"), [
    ("Hosting came to $184.50.",
     "Hosting came to one hundred eighty-four dollars and fifty cents."),
    ("It took 8.4 seconds.", "It took eight point four seconds."),
    ("About 12% more.", "About twelve percent more."),
    ("Your 11:15 moved to 11:05.", "Your eleven fifteen moved to eleven oh five."),
    ("Born July 4, 1976.", "Born July fourth, nineteen seventy-six."),
    ("On the 21st and 22nd.", "On the twenty-first and twenty-second."),
    ("Version 2.4.1 is out.", "Version two dot four dot one is out."),
    ("Dr. Patel at 3 p.m.", "Doctor Patel at three P M"),
    ("1,204 visitors", "one thousand two hundred four visitors"),
    # each of these was said wrong (engines review)
    ("In 2000 we met.", "In two thousand we met."),
    ("It raised $5 million, then $1.5 billion.",
     "It raised five million dollars, then one point five billion dollars."),
    ("Mario 64 and Mark 12", "Mario sixty-four and Mark twelve"),
    ("At 10:30pm or 10:00 am.", "At ten thirty P M or ten A M."),
    ("An MP3 player", "An MP three player"),
    ("The 12,345th visitor", "The twelve thousand three hundred forty-fifth visitor"),
    ("It costs $1.00, not $.50.", "It costs one dollar, not fifty cents."),
    ("Music of the 1990s and the 80s", "Music of the nineteen nineties and the eighties"),
    ("It is -5 degrees.", "It is minus five degrees."),
    # a range says "to": "20–22" was "twenty twenty-two"
    ("Highs of 20\u201322, for 1 \u2013 2 days.", "Highs of twenty to twenty-two, for one to "
     "two days."),
    # a scale letter after a dollar amount: was "eighty-five dollars and eighty cents B"
    ("Revenue was $85.8B, up 5%.",
     "Revenue was eighty-five point eight billion dollars, up five percent."),
    ("It raised $5.5M, then $2bn.",
     "It raised five point five million dollars, then two billion dollars."),
    ("That's $85k/year.", "That's eighty-five thousand dollars/year."),
])
def test_speakable_writes_numbers_out_for_engines_that_need_it(text, spoken):
    assert speakable(text, reads_digits=False) == spoken
    assert speakable(text, reads_digits=True) == text.replace("**", "")


@pytest.mark.parametrize(("text", "spoken"), [
    ("Dial 0958, then 0199.", "Dial zero nine five eight, then zero one nine nine."),
    ("Agent 007 lives at ZIP 02139.",
     "Agent zero zero seven lives at ZIP zero two one three nine."),
    ("At 05 past, 0.5 L for $0.50.", "At five past, zero point five L for fifty cents."),
])
def test_a_leading_zero_is_read_digit_by_digit(text, spoken):
    # it was lost: "0958" was "nine hundred fifty-eight", a phone number's digit gone
    assert speakable(text, reads_digits=False) == spoken


@pytest.mark.parametrize(("text", "spoken"), [
    ("So $x^2$ grows, and $$E = mc^2$$.", "So x^2 grows, and E = mc^2."),
    ("Let $x$ be \\(a + b\\) or \\[x_1\\].", "Let x be a + b or x_1."),
    ("The area is \\(x^2\\), not \\[2x\\].", "The area is x^2, not 2x."),  # no dollar sign
    # amounts keep their dollar signs
    ("It costs $5 and $10, $5-$10 or $5/$10.", "It costs $5 and $10, $5-$10 or $5/$10."),
    ("I paid $5 for a US$ note; $100k and $200k.", "I paid $5 for a US$ note; $100k and $200k."),
])
def test_latex_math_delimiters_are_not_said(text, spoken):
    # espeak read "$x^2$" as "dollar x two dollar"
    assert speakable(text) == spoken


@pytest.mark.parametrize(("text", "spoken"), [
    ("Is it www.example.com? Yes.", "Is it example.com? Yes."),
    ("See www.example.com, then call.", "See example.com, then call."),
    ("Visit https://example.com.", "Visit example.com."),
    ("Go to https://www.example.com/docs now.", "Go to example.com now."),
])
def test_a_url_says_its_host_and_keeps_the_punctuation_after_it(text, spoken):
    """The question mark, comma or full stop right after a bare host was taken into the
    URL and dropped with it: "Is it example.com Yes." lost its question's intonation."""
    assert speakable(text) == spoken


def test_segments_carry_the_engines_needs():
    [seg] = run("It costs $5.", reads_digits=False)
    assert (seg.text, seg.spoken) == ("It costs $5.", "It costs five dollars.")


def test_eager_clause_keeps_dates_whole_and_sentences_after_it():
    text = "The company was founded on Jan 1, 1980, in a small garage. It grew fast."
    got = [s.text for s in run(text, [2] * 40, SegmenterConfig(first_min_words=3))]
    assert got == ["The company was founded on Jan 1, 1980,", "in a small garage.", "It grew fast."]


def test_a_number_ending_a_sentence_is_no_list_marker_after_a_cut():
    got = [s.text for s in run("Sure, it was 1998. Then it moved.",
                               config=SegmenterConfig(first_min_words=1))]
    assert got == ["Sure,", "it was 1998.", "Then it moved."]


# --- cases the held-out corpus exposed (tests/data/segmentation-heldout.jsonl) -----------

def sentences(text: str) -> list[str]:
    """Sentence-mode segments; the same whatever the chunking."""
    got = [s.text for s in run(text, config=SENTENCES)]
    rng = random.Random(text)
    for hi in (1, 3, 7):
        assert [s.text for s in run(text, chunks(text, rng, hi), SENTENCES)] == got
    return got


@pytest.mark.parametrize(("text", "want"), [
    ("We're going with Plan B. Then we'll see.", ["We're going with Plan B.", "Then we'll see."]),
    ("Oranges have vitamin C. So do peppers.", ["Oranges have vitamin C.", "So do peppers."]),
    ("The answer is option A. Option B is a trap.",
     ["The answer is option A.", "Option B is a trap."]),
    ("The ticket is for Row F. Seats 12 and 13.", ["The ticket is for Row F.", "Seats 12 and 13."]),
    ("It went from a C to an A. Great work!", ["It went from a C to an A.", "Great work!"]),
    ("We chose plan B. I think it works.", ["We chose plan B.", "I think it works."]),
    ("Option B. Nobody wanted it.", ["Option B.", "Nobody wanted it."]),
    ("**Option** B. Nobody wanted it.", ["**Option** B.", "Nobody wanted it."]),
    # initials still go on
    ("John F. Kennedy was born in 1917.", ["John F. Kennedy was born in 1917."]),
    ("Our contact is M. Dubois in Lyon.", ["Our contact is M. Dubois in Lyon."]),
    ("It was written by T. S. Eliot, not E. M. Forster.",
     ["It was written by T. S. Eliot, not E. M. Forster."]),
])
def test_a_single_capital_is_a_label_before_a_sentence_and_an_initial_before_a_name(text, want):
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The U.S. Army Corps is repairing it.", ["The U.S. Army Corps is repairing it."]),
    ("The U.N. Security Council met today.", ["The U.N. Security Council met today."]),
    ("We moved to the U.S. Then she followed.", ["We moved to the U.S.", "Then she followed."]),
    ("He moved to the U.S. It\u2019s cold there.",  # a curly apostrophe in the starter
     ["He moved to the U.S.", "It\u2019s cold there."]),
    ("It was fined in the U.K. The fine was large.",
     ["It was fined in the U.K.", "The fine was large."]),
    ("She works at 10 Downing St. That's the office.",
     ["She works at 10 Downing St.", "That's the office."]),
    ("In St. Louis it's hot. Drink water.", ["In St. Louis it's hot.", "Drink water."]),
    ("From the 7th c. B.C. to the 17th c. A.D. Its length is 21,196 km.",
     ["From the 7th c. B.C. to the 17th c. A.D.", "Its length is 21,196 km."]),
    # a closing quote or bracket after it: the next word still decides (mutation testing
    # found these never ended: the word looked at was the quote's empty one)
    ('They called him "Mister T." Then they laughed.',
     ['They called him "Mister T."', "Then they laughed."]),
    ("(He moved to the U.S.) Then he left.", ["(He moved to the U.S.)", "Then he left."]),
    ("\u201cMeet me on Baker St.\u201d She hung up.",
     ["\u201cMeet me on Baker St.\u201d", "She hung up."]),
    ('He said "John F." Kennedy was there.', ['He said "John F." Kennedy was there.']),
])
def test_dotted_abbreviation_before_a_name_goes_on_before_a_sentence_ends(text, want):
    assert sentences(text) == want


def test_time_units_before_a_number_do_not_end_a_sentence():
    assert sentences("It takes 1 hr. 35 min. by train. Trains are frequent.") == [
        "It takes 1 hr. 35 min. by train.", "Trains are frequent."]
    assert sentences("Light takes 8 min. 20 sec. to reach us.") == [
        "Light takes 8 min. 20 sec. to reach us."]


def test_a_straight_quote_after_a_digit_is_an_inch_mark():
    assert sentences('The 5" screen is small? The 6.7" one is $100 more. Buy it.') == [
        'The 5" screen is small?', 'The 6.7" one is $100 more.', "Buy it."]
    assert sentences('She said "call at 5" and left. Fine.') == [
        'She said "call at 5" and left.', "Fine."]


def test_a_stray_quote_stops_protecting_after_quote_max_chars():
    stray = ('Set the mode to "fast. Then restart the service and wait for it. Check the logs '
             'after that. Then verify the output carefully before you go on. Once it is '
             'green, tell the team. Done.')
    assert len(stray) - stray.index('"') > SegmenterConfig().quote_max_chars
    assert sentences(stray) == [
        'Set the mode to "fast.', "Then restart the service and wait for it.",
        "Check the logs after that.", "Then verify the output carefully before you go on.",
        "Once it is green, tell the team.", "Done."]
    # quoted speech well within the span stays whole, and so does everything with 0
    assert sentences('She said "Stop. Wait. Go." Then she ran. Fast.') == [
        'She said "Stop. Wait. Go."', "Then she ran.", "Fast."]
    held = SegmenterConfig(first_min_words=0, quote_max_chars=0)
    assert [s.text for s in run(stray, None, held)] == [stray]


def test_a_stray_quote_is_stray_whatever_the_chunking_for_the_first_phrase():
    """A reply fed whole stepped from its stray quote to the newline past quote_max_chars
    without asking whether the quote was stray, while one fed in pieces asked (and cut
    before "and"): the first segment depended on the chunking."""
    text = 'The big dog " and then with the cat\n'
    assert phrase(text, 2, quote_max_chars=3, first_min_words=0) == [
        'The big dog "', "and then with the cat"]


@pytest.mark.parametrize("one_delta", [True, False], ids=["one delta", "per character"])
def test_a_long_cut_before_the_quote_max_chars_count_comes_first_whatever_the_chunking(
        one_delta):
    """Fed a character at a time, the open quote passed max_chars (20) before
    quote_max_chars (20 after it), and the long cut came first; fed whole, the scan asked
    about the quote first, at the far end of the text, took it as stray and ended the
    sentence inside it at "why?": the segments depended on the chunking."""
    text = 'He said "why? 2 of them left early today'
    cfg = SegmenterConfig(first_min_words=0, max_chars=20, quote_max_chars=20)
    got = run(text, None if one_delta else [1] * len(text), cfg)
    assert [s.text for s in got] == ['He said "why? 2 of', "them left early", "today"]


def test_the_long_cut_and_quote_counterexample_found_on_main():
    text = ' Day;a. "aaa He) Ha the3aaaaaa? ;aa.TP.Hi? 3aaaaaaaaaa aaaaaa Jr'
    cfg = SegmenterConfig(first_min_words=0, first_max_words=1, min_chars=13, max_chars=62,
                          quote_max_chars=54)
    assert run(text, None, cfg) == run(text, [1] * len(text), cfg)


def test_a_stray_quote_past_max_chars_is_cut_alike_whatever_the_chunking():
    """Fed in pieces, the sentence below passed max_chars before the stray „ was known to be
    stray (its next stop past quote_max_chars) and was cut long; fed whole it ended at
    "setup." (found by fuzzing with atheris). The long cut, decided first, wins fed whole
    too (``_quote_unmatched`` stands back for it)."""
    text = "He said „it walks you through the setup. First, install the app from the store."
    cfg = SegmenterConfig(first_min_words=0, max_chars=47, quote_max_chars=40)
    want = ["He said „it walks you through the setup. First,",
            "install the app from the store."]
    for sizes in (None, [49], [1] * len(text)):
        assert [s.text for s in run(text, sizes, cfg)] == want, sizes


def test_a_quote_holds_for_exactly_quote_max_chars():
    """``quote_max_chars`` counts from right after the opening mark to the last stop the
    scanner meets inside it (the "." before the closing one): a quote whose last stop is
    just that far holds, one char less releases it."""
    text = 'He said "Stop. Now we go." Then left.'
    span = text.index('."') - (text.index('"') + 1)
    whole = ['He said "Stop. Now we go."', "Then left."]
    cfg = SegmenterConfig(first_min_words=0, quote_max_chars=span)
    assert [s.text for s in run(text, None, cfg)] == whole
    cfg = SegmenterConfig(first_min_words=0, quote_max_chars=span - 1)
    assert [s.text for s in run(text, None, cfg)] == [
        'He said "Stop.', 'Now we go."', "Then left."]


def test_a_stray_quote_rescan_keeps_brackets_and_later_quotes_right():
    text = ('Use "x (see the docs. They help.) and more text to pass the span here. '
            'He said "hi. There." Then left. End.')
    cfg = SegmenterConfig(first_min_words=0, quote_max_chars=40)
    assert [s.text for s in run(text, None, cfg)] == [
        'Use "x (see the docs. They help.) and more text to pass the span here.',
        'He said "hi. There."', "Then left.", "End."]


def test_a_bracket_or_quote_after_an_abbreviation_is_decided_by_its_first_letter():
    assert sentences("It opens at 9 a.m. (It closes at noon.) Bring a card.") == [
        "It opens at 9 a.m.", "(It closes at noon.)", "Bring a card."]
    assert sentences("It opens at 9 a.m. (local time) on weekdays.") == [
        "It opens at 9 a.m. (local time) on weekdays."]


def test_an_ellipsis_before_a_number_is_a_pause():
    assert sentences("So the total is... $42.17. Not bad!") == [
        "So the total is... $42.17.", "Not bad!"]


def test_no_opening_a_sentence_is_the_answer_not_a_number_sign():
    assert sentences("No. 91 isn't prime. It's 7 × 13.") == [
        "No.", "91 isn't prime.", "It's 7 × 13."]
    assert sentences("It's No. 5 on the list. Last week No. 1.") == [
        "It's No. 5 on the list.", "Last week No. 1."]


def test_a_cut_inside_a_sentence_keeps_the_word_before_for_the_rules_that_look_back():
    """The eager clause and the long-sentence break start the next piece mid-sentence: "No."
    there is a number sign, not the answer, and "im" still makes "19." an ordinal ("No."
    and "19." were each said alone). (A semicolon: after a comma a capitalised word goes
    on without a cut, "Memphis, TN".)"""
    assert [s.text for s in run("I checked the whole list; No. 5 is the one we need.")] == [
        "I checked the whole list;", "No. 5 is the one we need."]
    text = "Das alte Schloss am Fluss wurde im 19. Jahrhundert gebaut."
    config = SegmenterConfig(first_min_words=0, max_chars=text.index(" 19.") + 2)
    for sizes in (None, [1] * len(text)):
        assert [s.text for s in run(text, sizes, config)] == [
            "Das alte Schloss am Fluss wurde im", "19. Jahrhundert gebaut."]


# --- cases the fourth held-out set exposed (tests/data/segmentation-heldout-4.jsonl) ----

@pytest.mark.parametrize(("text", "want"), [
    ("### 2. Configure the server\n\nOpen nginx.conf.",
     ["### 2. Configure the server", "Open nginx.conf."]),
    ("Done.\n## 10. Test it. Then ship.", ["Done.", "## 10. Test it.", "Then ship."]),
    ("> 3. Stir well. Then rest.", ["> 3. Stir well.", "Then rest."]),
    ("## Step 2. Then go.", ["## Step 2.", "Then go."]),  # a number after a word still ends
])
def test_a_numbered_heading_is_one_segment(text, want):
    """"### 2. Configure the server" was cut after "2.": the number after a heading's mark
    numbers it as a list marker does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("| Plan | Price |\n|---|---|\n| A | $10/mo. |\n| B | $5/mo. |\nA is faster.",
     ["| Plan | Price |", "|---|---|", "| A | $10/mo. |", "| B | $5/mo. |", "A is faster."]),
    ("| 1 | Unplug the router and wait 30 s. |", ["| 1 | Unplug the router and wait 30 s. |"]),
    ("| 1 | 好的。 |\n| 2 | 明天见！ |", ["| 1 | 好的。 |", "| 2 | 明天见！ |"]),
])
def test_a_table_row_ending_in_a_sentence_keeps_its_last_pipe(text, want):
    """A cell ending in a full stop cut its row before the closing "|", which was left as
    a segment of its own."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It prints `Hello. World.` and sets x. Run it.",
     ["It prints `Hello. World.` and sets x.", "Run it."]),
    ('Run `git commit -m "Fix. Done"` now. Then "push." Done.',
     ['Run `git commit -m "Fix. Done"` now.', 'Then "push."', "Done."]),
    ("Use ``a ` b. C`` here. Then go.", ["Use ``a ` b. C`` here.", "Then go."]),
    # a backtick closed on no line: a stray mark, the sentences after it still end
    ("A stray ` mark. Then more.\nNext. Line.",
     ["A stray ` mark.", "Then more.", "Next.", "Line."]),
    ("x `" + "Go. " * 40 + "End` now.", ["x `Go."] + ["Go."] * 39 + ["End` now."]),
])
def test_nothing_splits_inside_inline_code(text, want):
    """"It prints `Hello. World.`" was cut inside the code span, and a quote inside one
    ('`"editor.tabSize": 2`') opened a quote for the prose after it."""
    assert sentences(text) == want


def test_inline_code_waits_for_its_closing_backtick():
    seg = Segmenter(SENTENCES)
    assert seg.feed("It prints `Hello. World. ") == []
    assert [s.text for s in seg.feed("Bye.` and stops. Then")] == [
        "It prints `Hello. World. Bye.` and stops."]


# --- cases the fifth held-out set exposed (tests/data/segmentation-heldout-5.jsonl) -----

@pytest.mark.parametrize(("text", "want"), [
    ("It helps you absorb calcium.[1] Most people get enough.[2] In winter, less.",
     ["It helps you absorb calcium.[1]", "Most people get enough.[2]", "In winter, less."]),
    ("It rose.[1][2] Then it fell.[^3] Done.", ["It rose.[1][2]", "Then it fell.[^3]", "Done."]),
    ('"Go."[3] Then he left.', ['"Go."[3]', "Then he left."]),
    ("It rose.[12] and then fell.", ["It rose.[12] and then fell."]),  # lowercase: goes on
    ("Read a.[b] Then x.[1234] Then.", ["Read a.[b] Then x.[1234] Then."]),  # no citation
])
def test_a_citation_mark_after_a_sentence_end_stays_with_it(text, want):
    """"calcium.[1] Most people..." never ended: the mark right after the full stop read
    as "8.4" does, so a grounded reply citing each sentence was one segment."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("ตอนนี้เป็นปี พ.ศ. 2569 ครับ ตรงกับปี ค.ศ. 2026", ["ตอนนี้เป็นปี พ.ศ. 2569 ครับ ตรงกับปี ค.ศ. 2026"]),
    ("ประชุมเวลา 14.00 น. ที่ห้อง 3 ครับ", ["ประชุมเวลา 14.00 น. ที่ห้อง 3 ครับ"]),
    ("ตั้งนาฬิกาปลุกไหมครับ? ผมตั้งได้", ["ตั้งนาฬิกาปลุกไหมครับ?", "ผมตั้งได้"]),
    ("موعدك مع د. أحمد غداً. هل تريد تذكيراً؟ حسناً.",
     ["موعدك مع د. أحمد غداً.", "هل تريد تذكيراً؟", "حسناً."]),
    ("عددهم ٣. ثم جاء آخرون.", ["عددهم ٣.", "ثم جاء آخرون."]),  # a digit, not a letter
    ("Your meeting is at 3 p.m. 김 박사님은 3층에 있어요. 네. 알겠습니다.",
     ["Your meeting is at 3 p.m.", "김 박사님은 3층에 있어요.", "네.", "알겠습니다."]),
    ("It's at 3 p.m. in Hall 2.", ["It's at 3 p.m. in Hall 2."]),
])
def test_scripts_without_case_decide_their_abbreviations(text, want):
    """Without case, the next word's first letter read as a capital: "พ.ศ. 2569" (Thai,
    which writes no full stop) and "د. أحمد" (Dr. Ahmad) were cut after the dot, while
    "3 p.m. 김 박사님..." (a Korean sentence after an English one) never ended."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Музей на ул. Тверская, д. 12. Вход 500 руб.",
     ["Музей на ул. Тверская, д. 12.", "Вход 500 руб."]),
    ("Лекцию читает проф. Иванов в ауд. 305. Не опаздывайте!",
     ["Лекцию читает проф. Иванов в ауд. 305.", "Не опаздывайте!"]),
    ("Это музей им. Пушкина, см. с. 45. Он большой.",
     ["Это музей им. Пушкина, см. с. 45.", "Он большой."]),
    ("Офис в г. Москве. Конференция пройдёт в 2026 г. Регистрация открыта.",
     ["Офис в г. Москве.", "Конференция пройдёт в 2026 г.", "Регистрация открыта."]),
    ("Это было в 1990-х гг. Потом всё изменилось.",
     ["Это было в 1990-х гг.", "Потом всё изменилось."]),
    ("डॉ. शर्मा का क्लिनिक 9 बजे खुलता है। कीमत रु. 450 है।",
     ["डॉ. शर्मा का क्लिनिक 9 बजे खुलता है।", "कीमत रु. 450 है।"]),
])
def test_russian_and_hindi_abbreviations_do_not_end_a_sentence(text, want):
    """"ул. Тверская" (street), "проф. Иванов", "ауд. 305" (room), "डॉ. शर्मा" (Dr.) and
    "रु. 450" (rupees) were cut after the dot, as an English "Dr." or "No. 5" is not."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Я позвонил им. Они не ответили.", ["Я позвонил им.", "Они не ответили."]),
    ("Скажи им. Потом уходи.", ["Скажи им.", "Потом уходи."]),
    ("Музей им. Пушкина открыт. Театр им. А. П. Чехова тоже.",
     ["Музей им. Пушкина открыт.", "Театр им. А. П. Чехова тоже."]),
    ("Это улица им. 26 Бакинских комиссаров. Она длинная.",
     ["Это улица им. 26 Бакинских комиссаров.", "Она длинная."]),
])
def test_the_pronoun_im_ends_a_sentence_the_abbreviation_does_not(text, want):
    """"им." is "named after" ("музей им. Пушкина") and the pronoun "them" ("Я позвонил
    им."), a common last word: taken for the abbreviation alone, "Я позвонил им. Они не
    ответили." was one sentence. It goes on before a name, as "St." does, not before a word
    that opens a sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Her talk is at 10 a.m. in Hall B. Seats are limited.",
     ["Her talk is at 10 a.m. in Hall B.", "Seats are limited."]),
    ("Your meeting is in room C. Bring your laptop.",
     ["Your meeting is in room C.", "Bring your laptop."]),
    ("It was Arsenio Hall. Bring snacks.", ["It was Arsenio Hall.", "Bring snacks."]),
])
def test_a_hall_or_a_room_is_a_label(text, want):
    """"in Hall B. Seats are limited." never ended: "B." read as an initial before a name."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It comes from Oxford Univ. Press, 1998. Check it.",
     ["It comes from Oxford Univ. Press, 1998.", "Check it."]),
    ("She studied at Stanford Univ. Then she moved.",
     ["She studied at Stanford Univ.", "Then she moved."]),
])
def test_univ_goes_on_before_a_name(text, want):
    """"Oxford Univ. Press" was cut after "Univ.", which goes on before a name as "St." does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ('For example, 東京に行きます。means "I\'m going to Tokyo." It mixes scripts.',
     ['For example, 東京に行きます。means "I\'m going to Tokyo."', "It mixes scripts."]),
    ("Say ありがとう。It means thanks.", ["Say ありがとう。", "It means thanks."]),
    ("会议在三点开始。我们走吧！", ["会议在三点开始。", "我们走吧！"]),
    ("新版本已经发布。iOS 18 支持这个功能。", ["新版本已经发布。", "iOS 18 支持这个功能。"]),
    ("安装完成。macOS 用户请重启。", ["安装完成。", "macOS 用户请重启。"]),
    ("电池很好！iPhone也不贵。", ["电池很好！", "iPhone也不贵。"]),
])
def test_a_lowercase_word_right_after_a_full_width_stop_goes_on(text, want):
    """"東京に行きます。means ..." was cut after "。": a lowercase word after it goes on, as
    it does after ".", so a Japanese phrase quoted in English is one sentence; a name in
    camelCase ("iOS", "macOS") opens one, as it does after "."."""
    assert sentences(text) == want


# --- cases the sixth held-out set exposed (tests/data/segmentation-heldout-6.jsonl) -----

@pytest.mark.parametrize(("text", "want"), [
    ("That was Ken Griffey Sr. He hit .296 that year.",
     ["That was Ken Griffey Sr.", "He hit .296 that year."]),
    ("It was Ken Griffey Jr. The Mariners drafted him first.",
     ["It was Ken Griffey Jr.", "The Mariners drafted him first."]),
    ("Schools close on Martin Luther King Jr. Day this year.",
     ["Schools close on Martin Luther King Jr. Day this year."]),
    ("His son, Ken Griffey Jr., went on. Habla con el Sr. García hoy.",
     ["His son, Ken Griffey Jr., went on.", "Habla con el Sr. García hoy."]),
])
def test_sr_and_jr_end_a_sentence_before_a_word_that_opens_one(text, want):
    """"Ken Griffey Sr. He hit" was one sentence ("Sr." a title, as "Dr." is) and "King Jr.
    Day" two ("Jr." ending one before any capital): after a name they go on before a name,
    as "St." does, and end before a word that opens a sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Τι ώρα είναι; Είναι τρεις. Θα έρθεις;", ["Τι ώρα είναι;", "Είναι τρεις.", "Θα έρθεις;"]),
    ("Πού είναι το μουσείο\u037e Κοντά στο κέντρο.",
     ["Πού είναι το μουσείο\u037e", "Κοντά στο κέντρο."]),
    ("Use a semicolon; It is fine. Τι; ναι.", ["Use a semicolon; It is fine.", "Τι; ναι."]),
])
def test_a_greek_question_mark_ends_a_sentence(text, want):
    """Greek asks with ";" (U+037E, which most keyboards and LLMs write as the ASCII
    semicolon): "Τι ώρα είναι; Είναι τρεις." was one sentence. After a Greek letter it is
    a question mark; after any other, a semicolon still."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ('ד"ר כהן ממליץ לשתות מים. זה חשוב בקיץ. האם תרצה תזכורת?',
     ['ד"ר כהן ממליץ לשתות מים.', "זה חשוב בקיץ.", "האם תרצה תזכורת?"]),
    ('הוא אמר: "ד"ר כהן בא. הוא כאן." תודה רבה.',  # inside a quote: it does not close it
     ['הוא אמר: "ד"ר כהן בא. הוא כאן."', "תודה רבה."]),
])
def test_a_hebrew_gershayim_is_not_a_quote(text, want):
    """Hebrew marks an abbreviation with gershayim, which LLMs write as a straight double
    quote between two letters ("ד"ר", Dr.; "צה"ל"): taken for an opening quote, it held
    every sentence end after it for quote_max_chars."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Hôm nay ở TP. Hồ Chí Minh trời nắng. Chiều nay có mưa.",
     ["Hôm nay ở TP. Hồ Chí Minh trời nắng.", "Chiều nay có mưa."]),
    ("Tôi sống ở Tp. Hà Nội. It is in the TP. The rest is fine.",
     ["Tôi sống ở Tp. Hà Nội.", "It is in the TP.", "The rest is fine."]),
])
def test_vietnamese_tp_goes_on_before_a_city(text, want):
    """"TP. Hồ Chí Minh" (thành phố, city) was cut after "TP.": it goes on before a name as
    "St." does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("ฉันชอบกินข้าวผัดกะเพรา. คุณล่ะ ชอบกินอะไร?", ["ฉันชอบกินข้าวผัดกะเพรา.", "คุณล่ะ ชอบกินอะไร?"]),
    ("ขอบคุณค่ะ. พรุ่งนี้เจอกัน", ["ขอบคุณค่ะ.", "พรุ่งนี้เจอกัน"]),
    ("นัดกับ ดร. สมชาย ที่ รพ. ศิริราช เดือน มี.ค. นี้ครับ",
     ["นัดกับ ดร. สมชาย ที่ รพ. ศิริราช เดือน มี.ค. นี้ครับ"]),
])
def test_a_thai_full_stop_after_a_word_ends_a_sentence(text, want):
    """Thai writes no full stop, but LLMs put one in: after a dot every Thai word read as an
    abbreviation ("พ.ศ.", "น."), so "ฉันชอบกินข้าวผัดกะเพรา. คุณล่ะ..." was one sentence.
    A Thai abbreviation ends in one to three consonants ("ดร.", "รพ.", "มี.ค."); a word with
    a vowel or tone mark, or longer, ends its sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It helps you absorb calcium.[1, 2] Most people get enough.[1\u20133] In winter, less.",
     ["It helps you absorb calcium.[1, 2]", "Most people get enough.[1\u20133]",
      "In winter, less."]),
    ("It rose.[1,2,10] Then it fell.[2-4] Done.",
     ["It rose.[1,2,10]", "Then it fell.[2-4]", "Done."]),
    ("Read a.[1, x] Then b.[1,] Then c.", ["Read a.[1, x] Then b.[1,] Then c."]),  # no citation
])
def test_a_list_or_range_citation_after_a_sentence_end_stays_with_it(text, want):
    """Not from the sixth set (it cites before the full stop, "[1, 2]. It"), from its brief
    and the fifth set's known weak points: "calcium.[1, 2] Most" never ended, as
    "calcium.[1] Most" did not before the fifth set; and speech read the mark out."""
    assert sentences(text) == want
    assert speakable("calcium.[1, 2]") == "calcium."
    assert speakable("enough.[1\u20133] ok[2,3]") == "enough. ok"
    assert speakable("See [1, 2].") == "See [1, 2]."  # not after a word: said as written


# --- cases the seventh held-out set exposed (tests/data/segmentation-heldout-7.jsonl) ---

@pytest.mark.parametrize(("text", "want"), [
    ("The case is Brown v. Board of Education, 347 U.S. 483 (1954). It overturned Plessy v. "
     "Ferguson.", ["The case is Brown v. Board of Education, 347 U.S. 483 (1954).",
                   "It overturned Plessy v. Ferguson."]),
    ("The rule is Fed. R. Civ. P. 12(b)(6). See also Fed. R. Evid. 403 and 5 F. Supp. 2d 10.",
     ["The rule is Fed. R. Civ. P. 12(b)(6).",
      "See also Fed. R. Evid. 403 and 5 F. Supp. 2d 10."]),
    ("It went to the 9th Cir. 2010 ruling. Rates are set by the Fed. Markets react.",
     ["It went to the 9th Cir. 2010 ruling.", "Rates are set by the Fed.", "Markets react."]),
])
def test_legal_citations_go_on(text, want):
    """"Brown v. Board" was cut after "v." (versus), and "Fed. R. Civ. P. 12(b)(6)" after
    "Fed." and "Civ.": "v." never ends a sentence, and a citation's abbreviations go on
    before an initial, another of them or a number."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It is Piano Sonata No. 14, op. 27 no. 2. Then try Chopin's op. 9 no. 2.",
     ["It is Piano Sonata No. 14, op. 27 no. 2.", "Then try Chopin's op. 9 no. 2."]),
    ('Ps. 23 begins with "The Lord is my shepherd." And 1 Cor. 13 is about love.',
     ['Ps. 23 begins with "The Lord is my shepherd."', "And 1 Cor. 13 is about love."]),
    ("Spotkanie jest o godz. 15.00 w sali nr 4. Mötet börjar kl. 9.30 i morgon.",
     ["Spotkanie jest o godz. 15.00 w sali nr 4.", "Mötet börjar kl. 9.30 i morgon."]),
])
def test_opus_verse_and_o_clock_before_a_number_go_on(text, want):
    """"op. 27" (opus), "Ps. 23" (a psalm), Polish "godz. 15.00" and Swedish "kl. 9.30"
    (o'clock) were cut before the number, as "No. 5" once was."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Mieszkam przy ul. Długiej 5 w Gdańsku. Zapraszam!",
     ["Mieszkam przy ul. Długiej 5 w Gdańsku.", "Zapraszam!"]),
    ("Kantornya di Jl. Sudirman No. 5, Jakarta. Dhr. Jansen leidt de sessie.",
     ["Kantornya di Jl. Sudirman No. 5, Jakarta.", "Dhr. Jansen leidt de sessie."]),
    ("Lunch is at 12 Upper St. Martin's Ln. London, for 1 p.m. Then walk to Covent Garden "
     "Sq. That's it.", ["Lunch is at 12 Upper St. Martin's Ln. London, for 1 p.m.",
                        "Then walk to Covent Garden Sq.", "That's it."]),
])
def test_streets_and_titles_of_more_languages_go_on_before_a_name(text, want):
    """Polish "ul." and Indonesian "Jl." (street), the Dutch title "Dhr." (Mr.) and
    "Ln." (Lane) before a name ended the sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The Ruy Lopez goes 1. e4 e5 2. Nf3 Nc6 3. Bb5. White pins the knight.",
     ["The Ruy Lopez goes 1. e4 e5 2. Nf3 Nc6 3. Bb5.", "White pins the knight."]),
    ("Mate is 1. e4 e5 2. Bc4 Nc6 3. Qh5 Nf6?? 4. Qxf7#. Defend with 3... g6 or 3... Qe7.",
     ["Mate is 1. e4 e5 2. Bc4 Nc6 3. Qh5 Nf6?? 4. Qxf7#.",
      "Defend with 3... g6 or 3... Qe7."]),
    ("He played Nf6?? That lost. Read chapter 2. Be careful. It is 1... Oh well.",
     ["He played Nf6??", "That lost.", "Read chapter 2.", "Be careful.", "It is 1...",
      "Oh well."]),
])
def test_chess_move_numbers_do_not_end_a_sentence(text, want):
    """"1. e4 e5 2. Nf3" was cut after every move number before a piece's move, and after
    a move's "??" before the next number: a number's dot (or "...") before a move in
    algebraic notation, and a move's mark before a move number, end no sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Glad it finally compiled! :) Next time, run the tests. Nice try. ;-) But no. Classic "
     "off-by-one. xD The loop is wrong.",
     ["Glad it finally compiled! :)", "Next time, run the tests.", "Nice try. ;-)",
      "But no.", "Classic off-by-one. xD", "The loop is wrong."]),
    ("Ha, you got me there :D That one's a trick. It works :) mostly.",
     ["Ha, you got me there :D", "That one's a trick.", "It works :) mostly."]),
    ("I can't open links, sorry :( But paste the error. I'll look.",
     ["I can't open links, sorry :(", "But paste the error.", "I'll look."]),
    ("Sorry! :( Paste it here. Windows 7 is old. XP is older.",
     ["Sorry! :(", "Paste it here.", "Windows 7 is old.", "XP is older."]),
])
def test_an_emoticon_stays_with_its_sentence_and_opens_no_bracket(text, want):
    """An emoticon after a sentence end began the next segment ("Glad it compiled!" then
    ":) Next time, ..."), one before a capital ended no sentence as an emoji does, and the
    bracket of ":(" opened one, which held every sentence end until the line's."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("So the problem might be in the— Actually, which OS are you on?",
     ["So the problem might be in the—", "Actually, which OS are you on?"]),
    ("Call flush() before the—wait, no, that's old. I met two people— Anna and Bo.",
     ["Call flush() before the—wait, no, that's old.", "I met two people— Anna and Bo."]),
])
def test_a_sentence_broken_off_at_a_dash_ends_there(text, want):
    """"might be in the— Actually, ..." was one sentence: an em dash right after a word,
    then a space and a word that opens sentences, is a sentence broken off."""
    assert sentences(text) == want


# --- cases the eighth held-out set exposed (tests/data/segmentation-heldout-8.jsonl) ----

@pytest.mark.parametrize(("text", "want"), [
    ("### Q3 summary\n1. Revenue\n   a. Product: $1.2B\n   b. Services: $340M\n2. Costs.",
     ["### Q3 summary", "1. Revenue", "a. Product: $1.2B", "b. Services: $340M", "2. Costs."]),
    ("Outline:\nI. The setup\nII. The results\n  ii. Services grew. The rest fell.\nA. Lincoln",
     ["Outline:", "I. The setup", "II. The results", "ii. Services grew.", "The rest fell.",
      "A. Lincoln"]),
    ("It was plan A. The other one failed.", ["It was plan A.", "The other one failed."]),
])
def test_a_list_letter_opening_a_line_ends_no_sentence(text, want):
    """ "   a. Product: $1.2B" was cut after "a.": a letter or a Roman number opening a line
    numbers its item, as "1." does (no sentence is one letter long)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Her deputy is Maj. Tom Hale. Adm. Nimitz and Cpl. Diaz came.",
     ["Her deputy is Maj. Tom Hale.", "Adm. Nimitz and Cpl. Diaz came."]),
    ("Az időpontja dr. Kovács Annánál van. Kérem, érkezzen korábban.",
     ["Az időpontja dr. Kovács Annánál van.", "Kérem, érkezzen korábban."]),
])
def test_military_ranks_and_the_hungarian_dr_are_titles(text, want):
    """"Maj. | Tom Hale" and "dr. | Kovács" were cut: ranks and the Hungarian title, written
    in lower case, go on before the name as "Dr." does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Arsenal drew 1-1 with Man. City. They stay 2nd.",
     ["Arsenal drew 1-1 with Man. City.", "They stay 2nd."]),
    ("The ferry goes to the Isle of Man. The crossing is rough.",
     ["The ferry goes to the Isle of Man.", "The crossing is rough."]),
])
def test_man_before_a_name_is_manchester(text, want):
    """"with Man. | City." was cut: "Man." goes on before a capital that does not open
    sentences, as "St." does, and ends before one that does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("El pedido llegará el lun. 3 de nov. Si no está, vuelve el sáb. 8 de nov.",
     ["El pedido llegará el lun. 3 de nov.", "Si no está, vuelve el sáb. 8 de nov."]),
    ("Prévoyez env. 20 min. pour l'entretien.", ["Prévoyez env. 20 min. pour l'entretien."]),
])
def test_spanish_weekdays_and_french_env_go_on_before_a_number(text, want):
    """"el lun. | 3 de nov." and "env. | 20 min." were cut: a Spanish weekday before its
    day and the French "environ" (about) before its number end no sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Nehmen Sie 1 Tbl. alle 12 Std. Nicht mit Alkohol einnehmen.",
     ["Nehmen Sie 1 Tbl. alle 12 Std.", "Nicht mit Alkohol einnehmen."]),
    ("Es dauert 10 Min. Vielleicht auch mehr. Nach 2 Std. Fahrt sind wir da.",
     ["Es dauert 10 Min.", "Vielleicht auch mehr.", "Nach 2 Std. Fahrt sind wir da."]),
])
def test_a_german_count_ends_before_more_words_that_open_sentences(text, want):
    """"alle 12 Std. Nicht mit Alkohol" was one sentence: "Nicht", "Vielleicht" and other
    words that are no noun open German sentences after "Std.", "Min."."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Toget går kl. 8.15 fra Oslo S. Det er lurt å kjøpe billett. Vi ses!",
     ["Toget går kl. 8.15 fra Oslo S.", "Det er lurt å kjøpe billett.", "Vi ses!"]),
    ("Tåget går från Malmö C. Jag köper biljetten.",
     ["Tåget går från Malmö C.", "Jag köper biljetten."]),
])
def test_a_single_capital_ends_before_a_nordic_sentence_opener(text, want):
    """"fra Oslo S. Det er" was one sentence: "Det", "Jeg", "Jag", "Vi", "Hun" open
    Norwegian, Danish and Swedish sentences after a single capital, as "The" does."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Whisk 3 tbsp. vinegar with 1/2 tsp. Dijon. Add 2 oz. Parmesan. Season it.",
     ["Whisk 3 tbsp. vinegar with 1/2 tsp. Dijon.", "Add 2 oz. Parmesan.", "Season it."]),
    ("A dash is roughly 1/16 tsp. Honestly, taste it. Use 2 lbs. Dice them.",
     ["A dash is roughly 1/16 tsp.", "Honestly, taste it.", "Use 2 lbs.", "Dice them."]),
])
def test_a_kitchen_unit_goes_on_before_a_capitalized_ingredient(text, want):
    """"1/2 tsp. | Dijon." was cut: a kitchen unit before a capitalized ingredient goes on;
    before another capital it still ends its sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "spoken"), [
    ("Glad it finally compiled! :)", "Glad it finally compiled!"),
    ("Nice try. ;-) But no.", "Nice try. But no."),
    ("Classic off-by-one. xD", "Classic off-by-one."),
    ("Ha, you got me there :D", "Ha, you got me there"),
    ("It works :) mostly, :P honestly ^_^", "It works mostly, honestly"),
    ("That's great:) See you.", "That's great See you."),
    ("Sorry :(. I <3 it; XD", "Sorry. I it;"),
    # not emoticons: times, ratios, math, scopes, hex, a colon ending a line, "Answer:D"
    ("At 10:30; 16:9, x =3, a:b, std::map, 0xD, f(x): Answer:D",
     "At 10:30; 16:9, x =3, a:b, std::map, 0xD, f(x): Answer:D"),
])
def test_speakable_drops_emoticons_as_it_drops_emoji(text, spoken):
    """Emoticons reached the engine as written: espeak-ng said "colon" for ":)" after a full
    stop, "colon D" for ":D", "X D" for "xD", "three" for "<3" (and paused at "great:)")."""
    assert speakable(text) == spoken


@pytest.mark.parametrize(("text", "want"), [
    ("It's great:) See you there. Bye.", ["It's great:)", "See you there.", "Bye."]),
    ("Sorry:( I was wrong. The fix is easy.",
     ["Sorry:(", "I was wrong.", "The fix is easy."]),
    ("It works (mostly:) here. Then it fails.", ["It works (mostly:) here.", "Then it fails."]),
    ("Note:(see below) It. Answer:D Then. Ok.", ["Note:(see below) It.", "Answer:D Then.", "Ok."]),
])
def test_an_emoticon_glued_to_a_word_is_an_emoticon(text, want):
    """"Sorry:( I was wrong. The fix is easy." was one segment (the ":(" opened a bracket,
    which held every sentence end to the line's end) and "great:) See" ended nothing: ":)",
    ";)", ":(" glued to a word are emoticons, as when spaced; a ":)" closes a bracket that
    is open."""
    assert sentences(text) == want


@pytest.mark.parametrize("text", ["That's great. :)", "That's great. :D", "That's great. xD",
                                  "That's great:)", "That's great. <3"])
def test_espeak_says_nothing_for_an_emoticon_once_spoken(espeak_engine, text):
    """Real espeak-ng: the emoticon as written is heard (a word or a pause), its spoken form
    sounds as the sentence without it."""
    from tests.conftest import synthesized

    bare = len(synthesized(espeak_engine, "That's great."))
    slack = 0 if espeak_engine.deterministic else 2000  # a few pitch periods (see engines.espeak)
    assert len(synthesized(espeak_engine, text)) > bare + 2000  # 0.23-0.97 s longer
    said = len(synthesized(espeak_engine, speakable(text).rstrip(".") + "."))
    assert abs(said - bare) <= slack


@pytest.mark.parametrize(("text", "want"), [
    ('"Best pizza in town," one reviewer wrote. Another one called it good. Fine.',
     ['"Best pizza in town,"', "one reviewer wrote.", "Another one called it good.", "Fine."]),
    ("He said it (quietly, twice,) to me. It works now. Yes.",
     ["He said it (quietly, twice,)", "to me.", "It works now.", "Yes."]),
])
def test_the_eager_first_clause_after_a_closing_quote_leaves_it_closed(text, want):
    """The eager cut after 'town,"' left the quote open (its closing mark went with the
    first segment, unscanned): every later sentence end waited, and the rest of the reply
    was one segment."""
    rng = random.Random(text)
    for sizes in (None, [1] * len(text), chunks(text, rng, 5), chunks(text, rng, 17)):
        assert [s.text for s in run(text, sizes, SegmenterConfig())] == want


# --- cases the ninth held-out set exposed (tests/data/segmentation-heldout-9.jsonl), and
# the leftovers noticed before it ---------------------------------------------------------

@pytest.mark.parametrize(("text", "n", "want"), [
    ("Prenez la ligne\u00a04 jusqu'au terminus de Châtillon.", 3,
     ["Prenez la ligne\u00a04 jusqu'au", "terminus de Châtillon."]),  # "4": no plain word
    ("Rendez-vous chez Mme\u202fDupont demain matin à neuf heures.", 3,
     ["Rendez-vous chez Mme\u202fDupont", "demain matin à neuf heures."]),
])
def test_first_max_words_never_cuts_at_a_no_break_space(text, n, want):
    """"ligne | 4" and "Mme | Dupont" were cut at the no-break space the writer put there to
    keep the two words together."""
    assert words(text, n, first_min_words=0) == want


def test_a_phrase_cut_never_lands_at_a_no_break_space():
    """"a 65 | in screen": the phrase cut took "in" (inches), tied to the number by a
    no-break space, for an opener."""
    text = "The TV has a 65\u00a0in screen with HDR and a matte finish."
    assert phrase(text, 3, first_min_words=0) == [
        "The TV has a 65\u00a0in screen", "with HDR and a matte finish."]


@pytest.mark.parametrize(("text", "want"), [
    ('The band is called "Over The" in most of Europe.',
     ['The band is called "Over The"', "in most of Europe."]),
    ("The title reads (Gone With the) in the old print run.",
     ["The title reads (Gone With the)", "in the old print run."]),
])
def test_a_closed_quote_ending_in_a_function_word_allows_a_phrase_cut(text, want):
    """The closing mark was stripped before the check, so '"Over The"' counted as "the",
    an article that promises a noun: the quote or bracket is closed, nothing is promised."""
    assert phrase(text, 3, first_min_words=0) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Whisk 2 oz. Gouda into the sauce. Then add 1 tsp. Dijon mustard.",
     ["Whisk 2 oz. Gouda into the sauce.", "Then add 1 tsp. Dijon mustard."]),
    ("Crumble 3 oz. Roquefort over it. Add 2 tbsp. Serve at once.",
     ["Crumble 3 oz. Roquefort over it.", "Add 2 tbsp.", "Serve at once."]),
    ("Use 1 lb. Yukon Gold potatoes. Mash them with 2 oz. Butter is optional.",
     ["Use 1 lb. Yukon Gold potatoes.", "Mash them with 2 oz. Butter is optional."]),
])
def test_a_kitchen_unit_goes_on_before_an_ingredient_it_does_not_list(text, want):
    """"2 oz. | Gouda" was cut: only listed names ("Dijon", "Parmesan") kept the unit going.
    Now a capital after the unit ends the sentence only when it opens sentences (a starter,
    a recipe verb, an -ly adverb); the last case shows the price: a noun opening a sentence
    right after a unit is taken for an ingredient."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("I grew up on the Isle of Man. Douglas is the capital.",
     ["I grew up on the Isle of Man.", "Douglas is the capital."]),
    ("They drew 1-1 with Man. City last night.", ["They drew 1-1 with Man. City last night."]),
    ("Park in Lot C. Reception is on the ground floor.",
     ["Park in Lot C.", "Reception is on the ground floor."]),
    ("It leaves from Track B. Boarding starts at noon.",
     ["It leaves from Track B.", "Boarding starts at noon."]),
])
def test_isle_of_man_and_a_lot_letter_end_a_sentence_before_a_name(text, want):
    """"Isle of Man. Douglas" and "Lot C. Reception" went on: "Man." was taken for
    Manchester ("Man. City") and "C." for an initial ("John F. Kennedy")."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Բարև։ Ինչպե՞ս ես։ Վաղը կհանդիպենք։", ["Բարև։", "Ինչպե՞ս ես։", "Վաղը կհանդիպենք։"]),
    ("ሰላም ነው። ነገ እንገናኛለን፧ አዎ።", ["ሰላም ነው።", "ነገ እንገናኛለን፧", "አዎ።"]),
    ("မင်္ဂလာပါ။ နေကောင်းလား။", ["မင်္ဂလာပါ။", "နေကောင်းလား။"]),
    ("გამარჯობა! ხვალ შეხვდებით ოფისში. ნახვამდის!",
     ["გამარჯობა!", "ხვალ შეხვდებით ოფისში.", "ნახვამდის!"]),
])
def test_armenian_amharic_burmese_and_georgian_sentence_ends(text, want):
    """Each reply was one segment: the Armenian full stop ։, the Ethiopic ። and ፧ and the
    Myanmar ။ ended nothing, and a Georgian letter (lowercase to Unicode, caseless in use)
    after "!" or "." was read as a sentence going on."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ('"I was just about to—" "Don\'t," she snapped. He closed his mouth.',
     ['"I was just about to—"', '"Don\'t," she snapped.', "He closed his mouth."]),
    ("(We were nearly—) Then the bell rang.", ["(We were nearly—)", "Then the bell rang."]),
    ('"I was just about to—" she began.', ['"I was just about to—" she began.']),
])
def test_a_sentence_broken_off_inside_a_quote_ends_at_its_closing_mark(text, want):
    """'to—" "Don't' went on: the broken-off rule wanted a space right after the dash, and
    the closing quote stood there."""
    assert sentences(text) == want


# --- cases the tenth held-out set exposed (tests/data/segmentation-heldout-10.jsonl) ----

@pytest.mark.parametrize(("text", "want"), [
    ("ថ្ងៃនេះមានភ្លៀង។ សូមយកឆ័ត្រទៅជាមួយ។", ["ថ្ងៃនេះមានភ្លៀង។", "សូមយកឆ័ត្រទៅជាមួយ។"]),
    ("អរគុណ៕ ជួបគ្នាថ្ងៃស្អែក។", ["អរគុណ៕", "ជួបគ្នាថ្ងៃស្អែក។"]),
])
def test_the_khmer_full_stops_end_a_sentence(text, want):
    """A Khmer reply was one segment: the khan ។ and the bariyoosan ៕ ended nothing."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Το ραντεβού με τον κ. Παπαδόπουλο είναι στις 10 π.μ. Μην αργήσετε.",
     ["Το ραντεβού με τον κ. Παπαδόπουλο είναι στις 10 π.μ.", "Μην αργήσετε."]),
    ("Το γραφείο είναι στην οδ. Ερμού 12. Ανοίγει στις 9.",
     ["Το γραφείο είναι στην οδ. Ερμού 12.", "Ανοίγει στις 9."]),
    ("Зустріч на вул. Хрещатик, 22. Музей ім. Шевченка поруч.",
     ["Зустріч на вул. Хрещатик, 22.", "Музей ім. Шевченка поруч."]),
    ("Dl. Popescu vă așteaptă pe str. Lipscani nr. 5. Dna. Ionescu vine și ea.",
     ["Dl. Popescu vă așteaptă pe str. Lipscani nr. 5.", "Dna. Ionescu vine și ea."]),
    ("Si Gng. Santos ay darating bukas. Kasama niya si Bb. Cruz.",
     ["Si Gng. Santos ay darating bukas.", "Kasama niya si Bb. Cruz."]),
    ("Bw. Otieno atafika saa 4 asubuhi. Bi. Amina atakuja pia.",
     ["Bw. Otieno atafika saa 4 asubuhi.", "Bi. Amina atakuja pia."]),
    # "str." and "Bi." go on only before a name: Python's str, bismuth
    ("It returns a str. Then call len() on it.", ["It returns a str.", "Then call len() on it."]),
    ("The symbol is Bi. It is element 83.", ["The symbol is Bi.", "It is element 83."]),
])
def test_titles_and_streets_of_greek_ukrainian_romanian_tagalog_and_swahili_go_on(text, want):
    """Each was cut before the name: "κ. | Παπαδόπουλο" (Mr.), "вул. | Хрещатик" (street),
    "Dl. | Popescu", "str. | Lipscani", "Gng. | Santos", "Bw. | Otieno"; the last two cases
    ended as before (a first version took "str." and "Bi." for titles: "a str. Then" went
    on)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Adres: Atatürk Cad. No. 15. Geç kalma.", ["Adres: Atatürk Cad. No. 15.", "Geç kalma."]),
    ("Ofis Bağdat Cad. üzerinde. Bahçe Sok. No. 3 yanında.",
     ["Ofis Bağdat Cad. üzerinde.", "Bahçe Sok. No. 3 yanında."]),
    ("It is on Main St. No one parks there.", ["It is on Main St.", "No one parks there."]),
])
def test_a_turkish_street_goes_on_before_its_house_number(text, want):
    """"Atatürk Cad. | No. | 15.": "Cad." (Caddesi, after the street's name) was an unknown
    word before "No", which opens sentences, and "No." opening one is the answer."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The party is on Sat. 14 June, 3 p.m. Bring a gift.",
     ["The party is on Sat. 14 June, 3 p.m.", "Bring a gift."]),
    ("It's closed Sun. We open Mon. 9 a.m. to 5 p.m.",
     ["It's closed Sun.", "We open Mon. 9 a.m. to 5 p.m."]),
    ("We sat in the sun. 3 hours later we left.", ["We sat in the sun.", "3 hours later we left."]),
    ("A jegyek kb. 12 000 Ft-ba kerülnek. A fájl 512 kb. Elég kicsi.",
     ["A jegyek kb. 12 000 Ft-ba kerülnek.", "A fájl 512 kb.", "Elég kicsi."]),
    ("Sastanak je u pon. 5. svibnja u 9 sati. Dr. Horvat kasni.",
     ["Sastanak je u pon. 5. svibnja u 9 sati.", "Dr. Horvat kasni."]),
])
def test_a_weekday_or_about_goes_on_before_a_number(text, want):
    """"on Sat. | 14 June", Hungarian "kb. | 12 000" (about) and Croatian "u pon. | 5.
    svibnja" were cut before the number, as "Jan. 3" or "env. 20" is not; a weekday counts
    only as written ("the sun. 3 hours" ends)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The dentist is at 221 E. 57th St. Leave by 3:30.",
     ["The dentist is at 221 E. 57th St.", "Leave by 3:30."]),
    ("Drive to 400 Oak Ave. Turn left at the church.",
     ["Drive to 400 Oak Ave.", "Turn left at the church."]),
    ("Meet me at St. Cross Church. The fair is in Mill St. Park this year.",
     ["Meet me at St. Cross Church.", "The fair is in Mill St. Park this year."]),
])
def test_a_street_ends_a_sentence_before_a_direction(text, want):
    """"57th St. Leave by 3:30" went on: after a street only a ``_STARTERS`` word opened a
    sentence, and directions open theirs with a verb ("Leave", "Turn", "Take")."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The venue holds 250. No. 7 is your table.", ["The venue holds 250.", "No. 7 is your table."]),
    ("Gate B opens at 9. (Bring your pass.) No. 4 is the quickest line.",
     ["Gate B opens at 9.", "(Bring your pass.)", "No. 4 is the quickest line."]),
    ("Is 91 prime? No. 91 is 7 times 13.", ["Is 91 prime?", "No.", "91 is 7 times 13."]),
    ("No. 91 isn't prime.", ["No.", "91 isn't prime."]),
    ("Here you go.\nNo. 5 is not on the list.", ["Here you go.", "No.", "5 is not on the list."]),
])
def test_no_after_a_statement_is_a_number_sign(text, want):
    """"The venue holds 250. No. | 7 is your table": "No." opening a sentence was always taken
    for the answer. An answer opens the reply or a line, or follows a question; after a
    statement's full stop it numbers."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("გილოცავ დაბადების დღეს 🎂 ეს შენთვისაა.", ["გილოცავ დაბადების დღეს 🎂", "ეს შენთვისაა."]),
    ("Happy birthday 🎂 ეს შენთვისაა.", ["Happy birthday 🎂", "ეს შენთვისაა."]),
    ("Great 👍 thanks for asking.", ["Great 👍 thanks for asking."]),
])
def test_an_emoji_ends_a_sentence_before_a_georgian_word(text, want):
    """The leftover of the ninth set: after "!" or "." a Georgian letter counted as a capital
    (the script has no case in use), but not after an emoji, so "დღეს 🎂 ეს" went on."""
    assert sentences(text) == want


# --- cases the eleventh held-out set exposed (tests/data/segmentation-heldout-11.jsonl) --

@pytest.mark.parametrize(("text", "want"), [
    ("The contract runs for max. 24 months, incl. the trial period. It renews monthly.",
     ["The contract runs for max. 24 months, incl. the trial period.", "It renews monthly."]),
    ("Cena wynosi ok. 50 zł za osobę. Rezerwacja jest bezpłatna.",
     ["Cena wynosi ok. 50 zł za osobę.", "Rezerwacja jest bezpłatna."]),
    ("It costs max. 3 \u20ac. That's all.", ["It costs max. 3 \u20ac.", "That's all."]),
    # still an end: a capitalized "OK." is the English word, and "max." before a capital
    ("That's OK. 3 more to go.", ["That's OK.", "3 more to go."]),
    ("Turn the volume to max. Then wait.", ["Turn the volume to max.", "Then wait."]),
])
def test_max_and_the_polish_about_go_on_before_a_number(text, want):
    """"max. 24 months" (maximum) and the Polish "ok. 50 zł" (około, about) were cut before
    the number, as "min. 30 days" and "approx. 3" are not."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Kantor buka Senin s.d. Jumat. Alamatnya di Jl. Sudirman No. 5.",
     ["Kantor buka Senin s.d. Jumat.", "Alamatnya di Jl. Sudirman No. 5."]),
    ("Platiť môžete kartou, napr. Visa alebo Mastercard. Ďakujeme!",
     ["Platiť môžete kartou, napr. Visa alebo Mastercard.", "Ďakujeme!"]),
    ("ডা. রহমান আজ চেম্বারে আছেন। সময় বিকেল ৫টা।", ["ডা. রহমান আজ চেম্বারে আছেন।", "সময় বিকেল ৫টা।"]),
])
def test_indonesian_until_slovak_for_example_and_bengali_doctor_go_on(text, want):
    """The Indonesian "s.d." (sampai dengan, until: "Senin s.d. Jumat"), the Slovak and Czech
    "napr." (for example) and the Bengali "ডা." (Dr.) never end a sentence; each was cut."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The article appeared in J. Appl. Phys., Vol. 2, No. 3, pp. 45\u201367. It was cited.",
     ["The article appeared in J. Appl. Phys., Vol. 2, No. 3, pp. 45\u201367.", "It was cited."]),
    ("See Proc. Natl. Acad. Sci., 2019. Then read the review.",
     ["See Proc. Natl. Acad. Sci., 2019.", "Then read the review."]),
    ("It was in Phys. Rev. Lett. 105 first. Then in a book.",
     ["It was in Phys. Rev. Lett. 105 first.", "Then in a book."]),
    # a journal's name may end in capitals, dotted or not ("Proc.", "Natl.", "Acad." and
    # "Sci." were four sentences), and run to six abbreviations
    ("See Proc. Natl. Acad. Sci. USA 116, 1234 (2019). Then read it.",
     ["See Proc. Natl. Acad. Sci. USA 116, 1234 (2019).", "Then read it."]),
    ("See Proc. Natl. Acad. Sci. U.S.A. 116, 1234. Then read it.",
     ["See Proc. Natl. Acad. Sci. U.S.A. 116, 1234.", "Then read it."]),
    ("See Proc. Natl. Acad. Sci. U. S. A., 2019. Then read it.",
     ["See Proc. Natl. Acad. Sci. U. S. A., 2019.", "Then read it."]),
    ("It was in Phys. Rev. B 105, 045101 (2022). Then it was cited.",
     ["It was in Phys. Rev. B 105, 045101 (2022).", "Then it was cited."]),
    ("See Proc. Natl. Acad. Sci. USA, 2019. Then read it.",
     ["See Proc. Natl. Acad. Sci. USA, 2019.", "Then read it."]),
    # a semicolon or a colon right after its full stop shows it as a comma does ("Phys."
    # was a sentence)
    ("I read Phys. Rev.; it was good. Then more.",
     ["I read Phys. Rev.; it was good.", "Then more."]),
    ("I read Phys. Rev. Lett.: it was good.", ["I read Phys. Rev. Lett.: it was good."]),
    # capitals after one abbreviation alone are a new sentence; the chain reads no
    # further than six words ahead
    ("I teach Math. A 5 is a good grade.", ["I teach Math.", "A 5 is a good grade."]),
    ("I like Math. USA, UK and EU are next.", ["I like Math.", "USA, UK and EU are next."]),
    ("I passed Chem. A. B. C. D. E. F. G. H. I did.",
     ["I passed Chem.", "A. B. C. D. E. F. G. H.", "I did."]),
    # a one-word sentence after it still ends: no comma follows its full stop
    ("It's done. Yes. No, wait.", ["It's done.", "Yes.", "No, wait."]),
    ("She studies Chem. Then she works. Math. Later, art.",
     ["She studies Chem.", "Then she works.", "Math.", "Later, art."]),
])
def test_an_abbreviation_goes_on_before_one_that_a_comma_follows(text, want):
    """"J. Appl. Phys., Vol. 2" was cut after "Appl.": a journal's name is a chain of
    abbreviations, and the word after it ending in ".," shows it is one."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("I logged \U0001f3c3\U0001f3fb\u200d\u2642\ufe0f\U0001f4a8 5.2 km today. Nice pace!",
     ["I logged \U0001f3c3\U0001f3fb\u200d\u2642\ufe0f\U0001f4a8 5.2 km today.", "Nice pace!"]),
    ("I logged \U0001f3c3\U0001f3fb\u200d\u2642\ufe0f\U0001f4a8 5.2 km today. Nice",
     ["I logged \U0001f3c3\U0001f3fb\u200d\u2642\ufe0f\U0001f4a8 5.2 km today.", "Nice"]),
])
def test_a_decimal_after_an_emoji_and_the_sentence_end_after_it(text, want):
    """The tenth set's leftover, checked: "5.2" after a ZWJ emoji is not cut at its dot, and
    the sentence after it ends where it should, whatever the chunking (it did already)."""
    assert sentences(text) == want


# --- cases the twelfth held-out set exposed (tests/data/segmentation-heldout-12.jsonl) --

@pytest.mark.parametrize(("text", "want"), [
    ("\u0f44\u0f0b\u0f56\u0f7c\u0f51\u0f0b\u0f54\u0f0b\u0f61\u0f72\u0f53\u0f0d "
     "\u0f44\u0f0b\u0f63\u0fb7\u0f0b\u0f66\u0f0b\u0f63\u0f0b\u0f66\u0fa1\u0f7c\u0f51\u0f0b"
     "\u0f40\u0fb1\u0f72\u0f0b\u0f61\u0f7c\u0f51\u0f0d",
     ["\u0f44\u0f0b\u0f56\u0f7c\u0f51\u0f0b\u0f54\u0f0b\u0f61\u0f72\u0f53\u0f0d",
      "\u0f44\u0f0b\u0f63\u0fb7\u0f0b\u0f66\u0f0b\u0f63\u0f0b\u0f66\u0fa1\u0f7c\u0f51\u0f0b"
      "\u0f40\u0fb1\u0f72\u0f0b\u0f61\u0f7c\u0f51\u0f0d"]),  # ང་བོད་པ་ཡིན། ང་ལྷ་ས་ལ་སྡོད་ཀྱི་ཡོད།
    ("\u0f56\u0f40\u0fb2\u0f0b\u0f64\u0f72\u0f66\u0f0b\u0f56\u0f51\u0f7a\u0f0b\u0f63\u0f7a"
     "\u0f42\u0f66\u0f0e \u0f66\u0f90\u0f74\u0f0b\u0f42\u0f5f\u0f74\u0f42\u0f66\u0f0d",
     ["\u0f56\u0f40\u0fb2\u0f0b\u0f64\u0f72\u0f66\u0f0b\u0f56\u0f51\u0f7a\u0f0b\u0f63\u0f7a"
      "\u0f42\u0f66\u0f0e", "\u0f66\u0f90\u0f74\u0f0b\u0f42\u0f5f\u0f74\u0f42\u0f66\u0f0d"]),
    # a verse's "། །": the second shad opens the next line, so nothing is cut between them
    ("\u0f60\u0f51\u0f72\u0f0b\u0f63\u0f9f\u0f62\u0f0b\u0f56\u0fb1\u0f0d \u0f0d\u0f51\u0f7a"
     "\u0f0b\u0f63\u0f9f\u0f62\u0f0b\u0f56\u0fb1\u0f0d",
     ["\u0f60\u0f51\u0f72\u0f0b\u0f63\u0f9f\u0f62\u0f0b\u0f56\u0fb1\u0f0d \u0f0d\u0f51\u0f7a"
      "\u0f0b\u0f63\u0f9f\u0f62\u0f0b\u0f56\u0fb1\u0f0d"]),
])
def test_the_tibetan_shad_ends_a_sentence(text, want):
    """The Tibetan shad ། and double shad ༎ (U+0F0D, U+0F0E) end a sentence as the Khmer ។
    does; both were read as letters, so a Tibetan reply was one segment."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The Beatitudes are in Matt. 5:3\u201312. Luke has a shorter version in Lk. 6:20\u201323.",
     ["The Beatitudes are in Matt. 5:3\u201312.",
      "Luke has a shorter version in Lk. 6:20\u201323."]),
    ("Read 1 Tim. 3:16 and Jas. 1:5 tonight. Then pray.",
     ["Read 1 Tim. 3:16 and Jas. 1:5 tonight.", "Then pray."]),
    # a name before a bare number still ends: only a chapter and verse follow a book
    ("I called Tim. 3 days later he wrote back.", ["I called Tim.", "3 days later he wrote back."]),
    # a book written in full takes no full stop in a reference: after it one ends a sentence
    ("I called Ruth. 9:30 works.", ["I called Ruth.", "9:30 works."]),
])
def test_a_bible_book_goes_on_before_a_chapter_and_verse(text, want):
    """"Lk. 6:20–23" was cut after "Lk.": a book's abbreviation before "chapter:verse" goes
    on, as "Matt. 5" and "Ps. 23" did already."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The court cited Cal. Civ. Code \u00a7 1542 and Art. III, Sec. 2 of the Constitution. "
     "Neither helped.",
     ["The court cited Cal. Civ. Code \u00a7 1542 and Art. III, Sec. 2 of the Constitution.",
      "Neither helped."]),
    ("See Fla. Stat. \u00a7 768.81 and Art. I, \u00a7 8. It applies.",
     ["See Fla. Stat. \u00a7 768.81 and Art. I, \u00a7 8.", "It applies."]),
    # still ends: a state or "art." before a sentence that is not a citation
    ("She moved to Cal. The weather is better.", ["She moved to Cal.", "The weather is better."]),
    ("I love art. I paint daily.", ["I love art.", "I paint daily."]),
])
def test_a_statute_citation_goes_on(text, want):
    """"Cal. Civ. Code § 1542" was cut after "Cal." and "Civ.", and "Art. III," after "Art.":
    capitalized words leading to a section sign continue a citation, and a division goes on
    before its roman numeral ("I" only before a comma)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It's in Bldg. C, Rm. 204, on the 2nd floor. Take the elevator.",
     ["It's in Bldg. C, Rm. 204, on the 2nd floor.", "Take the elevator."]),
    ("Go to Ste. B2 on the left. Ring twice.", ["Go to Ste. B2 on the left.", "Ring twice."]),
    ("That was apt. A good choice, too.", ["That was apt.", "A good choice, too."]),
    ("I still check Yahoo! Finance for quotes. It's free.",
     ["I still check Yahoo! Finance for quotes.", "It's free."]),
    ("I searched on Yahoo! Then I gave up.", ["I searched on Yahoo!", "Then I gave up."]),
    ("\u0395\u03af\u03bd\u03b1\u03b9 \u03b4\u03af\u03c0\u03bb\u03b1 \u03c3\u03c4\u03b7\u03bd "
     "\u03c0\u03bb. \u03a3\u03c5\u03bd\u03c4\u03ac\u03b3\u03bc\u03b1\u03c4\u03bf\u03c2. "
     "\u0388\u03bb\u03b1!",
     ["\u0395\u03af\u03bd\u03b1\u03b9 \u03b4\u03af\u03c0\u03bb\u03b1 \u03c3\u03c4\u03b7\u03bd "
      "\u03c0\u03bb. \u03a3\u03c5\u03bd\u03c4\u03ac\u03b3\u03bc\u03b1\u03c4\u03bf\u03c2.",
      "\u0388\u03bb\u03b1!"]),  # Είναι δίπλα στην πλ. Συντάγματος. Έλα!
    ("\u0db4\u0dd0\u0db8\u0dd2\u0dab\u0dd2\u0dba\u0dda \u0d9a\u0dca\u200d\u0dbb\u0dd2.\u0dc0. "
     "1505 \u0daf\u0dd3 \u0dba. \u0d94\u0dc0\u0dd4\u0db1\u0dca \u0d86\u0dc0\u0dcf.",
     ["\u0db4\u0dd0\u0db8\u0dd2\u0dab\u0dd2\u0dba\u0dda \u0d9a\u0dca\u200d\u0dbb\u0dd2.\u0dc0. "
      "1505 \u0daf\u0dd3 \u0dba.", "\u0d94\u0dc0\u0dd4\u0db1\u0dca \u0d86\u0dc0\u0dcf."]),
    # පැමිණියේ ක්‍රි.ව. 1505 දී ය. ඔවුන් ආවා.
])
def test_a_unit_letter_a_brand_a_greek_square_and_a_sinhala_era_go_on(text, want):
    """Each was cut: "Bldg. C" (a building's letter, as "Apt. 4B" is a number), "Yahoo!
    Finance" (the brand's own mark), the Greek "πλ. Συντάγματος" (square) and the Sinhala
    "ක්‍රි.ව. 1505" (AD, before its year)."""
    assert sentences(text) == want


# --- cases the thirteenth held-out set exposed (tests/data/segmentation-heldout-13.jsonl) -

@pytest.mark.parametrize(("text", "want"), [
    ("It was published in Proc. Natl. Acad. Sci. U.S.A. The paper has over 500 citations.",
     ["It was published in Proc. Natl. Acad. Sci. U.S.A.",
      "The paper has over 500 citations."]),
    ("The study is in Proc. Natl. Acad. Sci. U.S.A.",
     ["The study is in Proc. Natl. Acad. Sci. U.S.A."]),
    ("Their follow-up appeared in Nat. Commun. in 2021. It extended the model.",
     ["Their follow-up appeared in Nat. Commun. in 2021.", "It extended the model."]),
    ("See Angew. Chem. Int. Ed. 2019, 58, 1234. The synthesis is in the SI.",
     ["See Angew. Chem. Int. Ed. 2019, 58, 1234.", "The synthesis is in the SI."]),
    # still ends: a journal word alone, a name, a dotted acronym that is no journal's
    ("He works in Med. Then he left.", ["He works in Med.", "Then he left."]),
    ("I met Nat. He was kind.", ["I met Nat.", "He was kind."]),
    ("I met Ed. 2 days later he called.", ["I met Ed.", "2 days later he called."]),
    ("I majored in Econ. U.S. students often do.",
     ["I majored in Econ.", "U.S. students often do."]),
])
def test_a_journal_title_goes_on_to_its_last_word(text, want):
    """"Proc. Natl. Acad. Sci. U.S.A." was five segments, at the end of a reply or before the
    next sentence, and "Nat. Commun." and "Angew. Chem." were cut: words of journal titles
    only went on before a comma or a number ("Nat", "Angew", "Ed" were none of them)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("It set the test under s. 1 of the Charter. Read ss. 7 to 10 too.",
     ["It set the test under s. 1 of the Charter.", "Read ss. 7 to 10 too."]),
    ("L'art. 1240 du Code civil fixe la responsabilit\u00e9. C'est l'ancien art. 1382.",
     ["L'art. 1240 du Code civil fixe la responsabilit\u00e9.", "C'est l'ancien art. 1382."]),
    ("Havo issiq, taxm. 35 \u00b0C. Suv iching.", ["Havo issiq, taxm. 35 \u00b0C.", "Suv iching."]),
    # seconds after a number still end
    ("He ran it in 9.58 s. 12 years later it still stands.",
     ["He ran it in 9.58 s.", "12 years later it still stands."]),
])
def test_a_section_an_elided_article_and_the_uzbek_about_go_on_before_a_number(text, want):
    """"under s. | 1 of the Charter" (Canadian sections), "L'art. | 1240" (the elided article
    hid "art." from ``_BEFORE_NUMBER``) and the Uzbek "taxm. | 35" (taxminan, about) were
    cut."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("\u1c65\u1c5f\u1c71\u1c5b\u1c5f\u1c72\u1c64 \u1c6f\u1c5f\u1c79\u1c68\u1c65\u1c64 \u1c60\u1c5f"
     "\u1c71\u1c5f\u1c7e \u1c71\u1c5a\u1c76\u1c5f \u1c6b\u1c5a \u1c60\u1c5f\u1c71\u1c5f\u1c7e",
     ["\u1c65\u1c5f\u1c71\u1c5b\u1c5f\u1c72\u1c64 \u1c6f\u1c5f\u1c79\u1c68\u1c65\u1c64 \u1c60\u1c5f"
      "\u1c71\u1c5f\u1c7e",
      "\u1c71\u1c5a\u1c76\u1c5f \u1c6b\u1c5a \u1c60\u1c5f\u1c71\u1c5f\u1c7e"]),
    ("\ua9b1\ua9b8\ua992\ua9bc\ua981 \ua9ab\ua9ae\ua9b8\ua983\ua9c9 \ua9a9\ua9a0\ua9b8\ua982 "
     "\ua9a4\ua9b8\ua9ae\ua9b8\ua9a4\ua9c0\ua9c9",
     ["\ua9b1\ua9b8\ua992\ua9bc\ua981 \ua9ab\ua9ae\ua9b8\ua983\ua9c9",
      "\ua9a9\ua9a0\ua9b8\ua982 \ua9a4\ua9b8\ua9ae\ua9b8\ua9a4\ua9c0\ua9c9"]),
    ("\u1b32\u1b38\u1b32\u1b44\u1b2f\u1b5f \u1b2b\u1b35\u1b22\u1b38\u1b03\u1b5f",
     ["\u1b32\u1b38\u1b32\u1b44\u1b2f\u1b5f", "\u1b2b\u1b35\u1b22\u1b38\u1b03\u1b5f"]),
    ("\ua549\ua55c\ua56e \ua514\ua60b\ua60e \ua5d3\ua5ba \ua562\ua60f",
     ["\ua549\ua55c\ua56e \ua514\ua60b\ua60e", "\ua5d3\ua5ba \ua562\ua60f"]),
    ("\u182e\u1823\u1829\u182d\u1823\u182f \u1833\u1821\u1837\u1821\u1803 "
     "\u1832\u1821\u1837\u1821\u1803",
     ["\u182e\u1823\u1829\u182d\u1823\u182f \u1833\u1821\u1837\u1821\u1803",
      "\u1832\u1821\u1837\u1821\u1803"]),
])
def test_the_ol_chiki_javanese_balinese_vai_and_mongolian_full_stops_end_a_sentence(text, want):
    """The Ol Chiki ᱾ (Santali), the Javanese ꧉, the Balinese ᭟, the Vai ꘎ and ꘏ and the
    Mongolian ᠃ were read as letters, so a reply in those scripts was one segment."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("I waited . . . and waited. The bus never came.",
     ["I waited . . . and waited.", "The bus never came."]),
    ("It was over . . . Then it began again.", ["It was over . . .", "Then it began again."]),
    ("The total is . . . $42. Not bad.", ["The total is . . . $42.", "Not bad."]),
    ("So . . . I think so.", ["So . . . I think so."]),
    # a full stop before ".NET" still ends
    ("Done. .NET is great.", ["Done.", ".NET is great."]),
])
def test_a_spaced_ellipsis_is_one(text, want):
    """"I waited . . . and" was cut after the first and the second dot: each dot before a
    space and another dot ended a sentence; the spaced ellipsis is decided at its last dot,
    as "..." is."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Haha, that's a good one ^_^ Want another joke?",
     ["Haha, that's a good one ^_^", "Want another joke?"]),
    ("I honestly don't know \u00af\\_(\u30c4)_/\u00af Maybe ask the store?",
     ["I honestly don't know \u00af\\_(\u30c4)_/\u00af", "Maybe ask the store?"]),
    ("You got all ten right! (^o^)/ That's a new record.",
     ["You got all ten right! (^o^)/", "That's a new record."]),
    ("I cried (T_T) It was sad.", ["I cried (T_T)", "It was sad."]),
    # brackets that are no face still go on and open a bracket
    ("It costs (1/2) less. Then go.", ["It costs (1/2) less.", "Then go."]),
    ("See (e.g. Smith. Jones) here. Then go.", ["See (e.g. Smith. Jones) here.", "Then go."]),
    ("x ^2 and ^ up. Then.", ["x ^2 and ^ up.", "Then."]),
])
def test_a_face_written_as_a_word_ends_a_sentence(text, want):
    """A face with no mark before it was read as a word ("good one ^_^ Want" one segment),
    a face in brackets after "!" opened the next sentence ("right! | (^o^)/ That's"), and
    the shrug's bracket hid the end after it: they go with the sentence before them, as
    ":)" does."""
    assert sentences(text) == want


# --- cases the fourteenth held-out set exposed (tests/data/segmentation-heldout-14.jsonl) -

@pytest.mark.parametrize(("text", "want"), [
    ("Ask Assoc. Prof. Tan or Asst. Prof. Rivera. Both are in on Wed.",
     ["Ask Assoc. Prof. Tan or Asst. Prof. Rivera.", "Both are in on Wed."]),
    ("Mme Leroy est l\u00e0. MM. Blanc et Roux arrivent demain.",
     ["Mme Leroy est l\u00e0.", "MM. Blanc et Roux arrivent demain."]),
    ("O Exmo. Sr. Presidente chega \u00e0s 10h. A cerim\u00f4nia come\u00e7a depois.",
     ["O Exmo. Sr. Presidente chega \u00e0s 10h.", "A cerim\u00f4nia come\u00e7a depois."]),
    ("U heeft een afspraak met dhr. Jansen. Mevr. de Vries neemt waar.",
     ["U heeft een afspraak met dhr. Jansen.", "Mevr. de Vries neemt waar."]),
    ("Warner Bros. Discovery owns HBO. It merged in 2022.",
     ["Warner Bros. Discovery owns HBO.", "It merged in 2022."]),
    ("Rendez-vous au 12 bd. Voltaire. C'est au 3e.",
     ["Rendez-vous au 12 bd. Voltaire.", "C'est au 3e."]),
    # still end: the association and the studio before a sentence's first word
    ("I joined the Bar Assoc. It helps.", ["I joined the Bar Assoc.", "It helps."]),
    ("It's made by Warner Bros. The cast is new.",
     ["It's made by Warner Bros.", "The cast is new."]),
])
def test_more_titles_and_names_go_on(text, want):
    """"Assoc. | Prof. Tan or Asst. | Prof. Rivera", the French "MM. | Blanc" (Messrs.), the
    Portuguese "Exmo. | Sr.", the Dutch lowercase "dhr. | Jansen", "Warner Bros. | Discovery"
    and the French boulevard "12 bd. | Voltaire" were cut."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Your appointment is with Prof. Dr. med. Keller. Bring your card.",
     ["Your appointment is with Prof. Dr. med. Keller.", "Bring your card."]),
    ("Dr. rer. nat. Anna Vogt leads the lab. She joined in 2018.",
     ["Dr. rer. nat. Anna Vogt leads the lab.", "She joined in 2018."]),
    ("Send it to Univ.-Prof. Dipl.-Ing. Dr. techn. Huber. He reads it.",
     ["Send it to Univ.-Prof. Dipl.-Ing. Dr. techn. Huber.", "He reads it."]),
    ("The talk is by Prof. em. Dr. Lang. It starts at four.",
     ["The talk is by Prof. em. Dr. Lang.", "It starts at four."]),
    # a field's word elsewhere still ends
    ("Don't skip your med. Then rest.", ["Don't skip your med.", "Then rest."]),
])
def test_a_doctorates_field_and_a_compound_title_go_on(text, want):
    """"Prof. Dr. med. | Keller", "Dr. rer. nat. | Anna", "Univ.-Prof. | Dipl.-Ing. | Dr.
    techn. | Huber" and "Prof. em. | Dr." were cut: the field of a German doctorate and a
    title joined to another by a hyphen were read as sentence ends."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The flight is AA 1402, dep. 07:15, arr. 10:40. The gate closes at 06:55.",
     ["The flight is AA 1402, dep. 07:15, arr. 10:40.", "The gate closes at 06:55."]),
    ("Base camp is at lat. 27.9881, long. 86.9250. Expect snow.",
     ["Base camp is at lat. 27.9881, long. 86.9250.", "Expect snow."]),
    ("Son aprox. 30 km. El viaje dura poco.", ["Son aprox. 30 km.", "El viaje dura poco."]),
    ("Zie blz. 14 t/m 16. Daar staat het.", ["Zie blz. 14 t/m 16.", "Daar staat het."]),
    ("The price is $89.99 excl. VAT. Shipping is free.",
     ["The price is $89.99 excl. VAT.", "Shipping is free."]),
    ("Please quote ref. KX-4410 when you call. Our line is open.",
     ["Please quote ref. KX-4410 when you call.", "Our line is open."]),
    ("Il est mort en 14 apr. J.-C. \u00e0 Nola. Il avait 75 ans.",
     ["Il est mort en 14 apr. J.-C. \u00e0 Nola.", "Il avait 75 ans."]),
    # still end: "long" as a word, a reference before a word, April before a sentence
    ("The queue was long. 20 people left.", ["The queue was long.", "20 people left."]),
    ("The queue was 20 m, long. 20 people left.", ["The queue was 20 m, long.", "20 people left."]),
    ("Cite it as ref. The rest is mine.", ["Cite it as ref.", "The rest is mine."]),
    ("It opens on 14 Apr. Join us.", ["It opens on 14 Apr.", "Join us."]),
])
def test_more_abbreviations_go_on_before_their_number_or_code(text, want):
    """"dep. | 07:15, arr. | 10:40", "lat. | 27.9881, long. | 86.9250", the Spanish "aprox. |
    30", the Dutch "blz. | 14" (page), "excl. | VAT", "ref. | KX-4410" (a code, where "ref. 12"
    went on) and "apr. | J.-C." (after Christ, as "av. J.-C." went on) were cut."""
    assert sentences(text) == want


def test_a_longitude_goes_on_after_an_eager_cut_at_the_latitudes_comma():
    """With the eager first clause (the default), "lat. 27.9881, | long. | 86.9250." was cut
    after "long.": the first cut took the latitude's comma out of the pending text. (The
    default config no longer cuts at that comma, "long." and a number after it being one
    unit with the latitude; first_max_words still does.)"""
    text = "Base camp is at lat. 27.9881, long. 86.9250. Expect snow."
    want = ["Base camp is at lat. 27.9881,", "long. 86.9250.", "Expect snow."]
    config = SegmenterConfig(first_max_words=4)
    assert [s.text for s in run(text, config=config)] == want
    assert [s.text for s in run(text, [1] * len(text), config)] == want
    assert [s.text for s in run(text, config=SegmenterConfig())] == [
        "Base camp is at lat. 27.9881, long. 86.9250.", "Expect snow."]


@pytest.mark.parametrize(("text", "want"), [
    ("In Korean it's written 2024. 3. 12. That's year, month, day.",
     ["In Korean it's written 2024. 3. 12.", "That's year, month, day."]),
    ("The deadline is 2024. 12. 31.", ["The deadline is 2024. 12. 31."]),
    # still end: a year before a count, a year before two numbers that are no month and day
    ("It opened in 2024. 3 people came.", ["It opened in 2024.", "3 people came."]),
    ("It opened in 2024. 13. 5. Then it closed.",
     ["It opened in 2024.", "13.", "5.", "Then it closed."]),
])
def test_a_date_written_year_month_day_with_full_stops_is_one(text, want):
    """The Korean "2024. 3. 12." was three segments: each of its full stops before a digit
    ended a sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Set (x_y) Then run it.", ["Set (x_y) Then run it."]),
    ("Swap (a_b_c) Then go.", ["Swap (a_b_c) Then go."]),
    # a face of one letter still ends its sentence
    ("Dead tired (x_x) Then I slept.", ["Dead tired (x_x)", "Then I slept."]),
    ("Oops (o_O) That was odd.", ["Oops (o_O)", "That was odd."]),
])
def test_a_bracketed_name_is_no_face(text, want):
    """"Set (x_y) | Then run it." was cut after the bracket: "(x_y)" matched a face in
    brackets (no digit, no two letters in a row, an underscore)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "spoken"), [
    ("You got all ten right! (^o^)/", "You got all ten right!"),
    ("I cried (T_T)", "I cried"),
    ("I honestly don't know \u00af\\_(\u30c4)_/\u00af", "I honestly don't know"),
    ("Yay (^o^)/!", "Yay!"),
    ("(\u256f\u00b0\u25a1\u00b0)\u256f Ugh.", "Ugh."),
    # not faces: a variable, a fraction, a bracket of words
    ("Set (x_y) first.", "Set (x_y) first."),
    ("It costs (1/2) less.", "It costs (1/2) less."),
    ("See (e.g. Smith) here.", "See (e.g. Smith) here."),
])
def test_a_face_in_brackets_is_not_said(text, spoken):
    """The faces the segmenter keeps with their sentence reached the engine as written:
    "(^o^)/" and "(T_T)", the shrug as "¯\\(ツ)/¯" (the emphasis pass took its "_(ツ)_")."""
    assert speakable(text) == spoken


# --- held-out regression guard -----------------------------------------------------------

HELDOUT = [json.loads(line) for line in
           (Path(__file__).parent / "data" / "segmentation-heldout.jsonl").read_text().splitlines()]
# Measured on the held-out corpus after the fixes above (bench/SEGMENTATION.md): the one
# remaining miss is "Hmm... I don't see" (the segmenter keeps "ellipsis + I" together).
HELDOUT_BAD, HELDOUT_MISSED = 0, 1


def _starts(reply: str, segments: list[str]) -> set[int]:
    """Segment starts as counts of non-space characters before them (first excluded)."""
    out, total = set(), 0
    for s in segments:
        out.add(total)
        total += len("".join(s.split()))
    return out - {0}


HELDOUT_2 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-2.jsonl").read_text().splitlines()]
"""The second held-out set (bench/SEGMENTATION.md, stop 33): 45 bad splits and 15 misses
before the fixes it led to, none after."""


HELDOUT_3 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-3.jsonl").read_text().splitlines()]
"""The third held-out set (a home hub's replies): 8 bad splits in 400 chunked runs before
the fixes it led to ("6 ft. 2 in.", "10 Min. Verspätung"), none after."""


HELDOUT_4 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-4.jsonl").read_text().splitlines()]
"""The fourth held-out set (rambling replies: nested quotes of several languages, units,
Roman numerals, markdown): 21 bad splits in the bench's 312 chunked runs before the fixes
it led to (a numbered heading, a table row's closing "|", inline code), none after."""


HELDOUT_5 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-5.jsonl").read_text().splitlines()]
"""The fifth held-out set (citations, European numbers, titles, addresses, shell and math in
prose, nested markdown; Russian, Korean, Hindi, Arabic, Thai, mixed): 10 bad splits and 4
misses of 204 boundaries before the fixes it led to (a citation mark after a full stop,
abbreviations of scripts without case, Russian and Hindi abbreviations, "Hall B.",
"Univ. Press", "。means"), none after."""


HELDOUT_6 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-6.jsonl").read_text().splitlines()]
"""The sixth held-out set (cooking fractions and temperatures, doses, scores, tickers, time
zones, versions and files, hashtags, citations, LaTeX, tables; Spanish, German, French,
Japanese, Chinese, Greek, Hebrew, Urdu, Vietnamese, Turkish, Thai): 2 bad splits and 6
misses of 229 boundaries before the fixes it led to ("Sr. He", "Jr. Day", a Greek ";",
a Hebrew gershayim, "TP. Hồ Chí Minh", a Thai full stop), none after."""


HELDOUT_7 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-7.jsonl").read_text().splitlines()]
"""The seventh held-out set (code help, legal and academic citations, units, addresses,
Roman numerals, music, verse, chess, emoticons, dialogue, a broken-off sentence; Korean,
Hindi, Arabic, Persian, Russian, Polish, Portuguese, Italian, Dutch, Indonesian, Swedish):
25 bad splits and 6 misses of 226 boundaries before the fixes it led to ("Brown v.
Board", "Fed. R. Civ. P.", "op. 27", "Ps. 23", "2. Nf3", emoticons, "the— Actually",
"ul.", "Jl.", "Dhr.", "kl. 9.30"), none after but one miss: "this project. pnpm is
faster" (a lowercase word after a full stop goes on: "approx. 3", "incl. tax")."""


HELDOUT_8 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-8.jsonl").read_text().splitlines()]
"""The eighth held-out set (travel, customer support, math in text, ratings, dialogue,
tables and nested lists, finance, doses, ranks and degrees; Spanish, German, French, Greek,
Turkish, Hebrew, Vietnamese, Japanese, Chinese, Czech, Finnish, Norwegian, Hungarian,
Ukrainian): 8 bad splits and 2 misses of 226 boundaries before the fixes it led to (a list
letter "a.", "Man. City", "tsp. Dijon", "Maj. Tom", "lun. 3", "env. 20", "dr. Kovács",
"Std. Nicht", "Oslo S. Det"), none after."""


HELDOUT_9 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                            "segmentation-heldout-9.jsonl").read_text().splitlines()]
"""The ninth held-out set (recipes and doses, CLI flags and versions, paths, ISO dates and
time zones, scores, addresses, quotes and brackets across sentences, abbreviations at a
sentence end, lettered lists, headings and tables, interrupted speech, no-break spaces;
German, French, Spanish, Japanese, Chinese, Danish, Romanian, Catalan, Armenian, Amharic,
Burmese, Swahili, Tagalog, Bengali, Georgian, Malay, Slovak): 1 bad split and 15 misses of
202 boundaries before the fixes it led to ("2 oz. Gouda", "Isle of Man. Douglas", "Lot C.
Reception", '—" "Don't', ։ ። ။, Georgian), none after but six misses: a sentence end inside
a quote or bracket that spans sentences ('"I'm tired. Let's go home."'), which the
segmenter never cuts (the module docstring)."""


HELDOUT_10 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                             "segmentation-heldout-10.jsonl").read_text().splitlines()]
"""The tenth held-out set (a home assistant's replies: weather ranges, alarms, calendar,
transit and flights, sports, finance, phone numbers, versions, smart home, conversions,
spelled letters, dotted acronyms at a sentence end, nested quotes, brackets, markdown, ZWJ,
flag, skin-tone and keycap emoji; Turkish, Greek, Hebrew, Thai, Vietnamese, Ukrainian, Czech,
Finnish, Hungarian, Romanian, Catalan, Tagalog, Swahili, Nepali, Khmer, Icelandic,
Croatian): 12 bad splits and 3 misses of 189 boundaries before the fixes it led to ("St.
Leave", "Sat. 14", "No. 7" after a statement, "Cad. No. 15", "κ.", "вул.", "kb.", "Dl.",
"str.", "Gng.", "Bw.", "pon. 5.", the Khmer ។), none after but one miss: an emoji before a
sentence that opens with a number ("logged 🏃 | 5.2 km in 27 min."), which goes on as
"I ate 🍕 3 slices" must."""


HELDOUT_11 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                             "segmentation-heldout-11.jsonl").read_text().splitlines()]
"""The eleventh held-out set (long how-tos, recipes and comparisons, inline code and shell,
math and science, citations, legal and medical abbreviations, ordinal dates, interjections,
quoted questions, mixed scripts; Korean, Indonesian, Malay, Polish, Dutch, Danish, Norwegian,
Slovak, Croatian, Serbian Cyrillic, Bengali, Tamil, Persian, Urdu): 6 bad splits and no miss
of 214 boundaries before the fixes it led to ("max. 24", "ok. 50 zł", "s.d. Jumat", "napr.
Visa", "ডা. রহমান", "J. Appl. Phys.,"), none after."""


HELDOUT_12 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                             "segmentation-heldout-12.jsonl").read_text().splitlines()]
"""The twelfth held-out set (titles and brands with "!" or "?", scripture and statute
references, roman numerals and dotted acronyms at a sentence end, addresses, extensions,
Q:/A: transcripts, tables, block quotes, nested lists, poems, standings, forecasts, time
ranges; Tibetan, Sinhala, Lao, Gujarati, Telugu, Kannada, Malayalam, Punjabi, Odia, Marathi,
Amharic, Tigrinya, Armenian, Burmese, Khmer, Mongolian, Kazakh, Lithuanian, Latvian, Estonian,
Slovenian, Bulgarian, Albanian, Icelandic, Afrikaans, Yoruba, Zulu and eight more): 10 bad
splits and 5 misses of 147 boundaries before the fixes it led to ("Yahoo! Finance", "Lk.
6:20", "Cal. Civ. Code §", "Art. III,", "Bldg. C", "πλ.", "ක්‍රි.ව. 1505", the Tibetan །),
2 bad splits and 2 misses after, left on purpose (bench/SEGMENTATION.md): "Mamma Mia! | Here
We Go Again" (a title), the Lithuanian date "5 d. | Vilniuje" (as "5 d. Registracija" ends),
"Norfolk St. Tip-off" and "the U.S. Taxes are" (as "St. Louis" and "the U.S. Army" go on)."""


HELDOUT_13 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                             "segmentation-heldout-13.jsonl").read_text().splitlines()]
"""The thirteenth held-out set (recipes with fractions and units, play-by-play and scores,
chemical formulas and "approx.", other countries' case law and codes, lyrics, emoticons and
kaomoji, paths and versions at a sentence end, phone menus, ordinal dates, "…" and ". . .",
nested quotes and brackets, product names; Dhivehi, Santali, Javanese and Balinese scripts,
Vai, traditional Mongolian, Welsh, Irish, Basque, Galician, Maltese, Esperanto, Uzbek,
Azerbaijani, Belarusian, Macedonian, Hausa, Somali, Pashto, Sorani and Uyghur): 17 bad splits
and 8 misses of 114 boundaries before the fixes it led to ("Proc. Natl. Acad. Sci. U.S.A.",
"Nat. Commun.", "Angew. Chem. Int. Ed. 2019", "s. 1", "L'art. 1240", "taxm. 35", ". . .",
"^_^ Want", "(^o^)/", the shrug, the Ol Chiki, Javanese, Balinese, Vai and Mongolian full
stops), none after."""


HELDOUT_14 = [json.loads(line) for line in (Path(__file__).parent / "data" /
                                             "segmentation-heldout-14.jsonl").read_text().splitlines()]
"""The fourteenth held-out set (support replies with order, case and tracking codes, dose
shorthand, military and aviation times, coordinates, opus numbers, bibliographic "pp.",
"ibid.", "op. cit.", "n.b.", stacked German titles, apostrophe and thin-space thousands,
Korean, Japanese and Roman-month dates, tables and nested lists, two scripts in a sentence;
German, French, Spanish, Italian, Portuguese, Dutch, Polish and Turkish abbreviations): 25
bad splits and no miss of 111 boundaries before the fixes it led to ("Assoc. Prof.", "MM.",
"Exmo.", "dhr.", "Bros.", "bd.", "Dr. rer. nat.", "Univ.-Prof. Dipl.-Ing.", "dep. 07:15",
"lat. 27.9881, long. 86.9250", "aprox. 30", "blz. 14", "ref. KX-4410", "apr. J.-C.",
"excl. VAT", "2024. 3. 12."), none after."""


@pytest.mark.parametrize(("rows", "most_bad", "most_missed"), [
    (HELDOUT, HELDOUT_BAD, HELDOUT_MISSED), (HELDOUT_2, 0, 0), (HELDOUT_3, 0, 0),
    (HELDOUT_4, 0, 0), (HELDOUT_5, 0, 0), (HELDOUT_6, 0, 0), (HELDOUT_7, 0, 1),
    (HELDOUT_8, 0, 0), (HELDOUT_9, 0, 6), (HELDOUT_10, 0, 1), (HELDOUT_11, 0, 0),
    (HELDOUT_12, 2, 2), (HELDOUT_13, 0, 0), (HELDOUT_14, 0, 0)],
    ids=["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
         "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth"])
def test_heldout_corpus_does_not_get_worse(rows, most_bad, most_missed):
    assert len(rows) >= 100
    rng = random.Random(7)
    bad = missed = 0
    for row in rows:
        reply = row["reply"]
        got = [s.text for s in run(reply, chunks(reply, rng, 32), SENTENCES)]
        want, have = _starts(reply, row["segments"]), _starts(reply, got)
        bad += len(have - want)
        missed += len(want - have)
    assert bad <= most_bad and missed <= most_missed, (bad, missed)


@pytest.mark.parametrize(("text", "want"), [
    # the break came right after a sentence's end: the sentence is complete, so spoken
    ("First sentence is fine here. ", ["First sentence is fine here."]),
    ("First sentence is fine here.", ["First sentence is fine here."]),
    ("It costs $5. Then it", ["It costs $5."]),
    ("Plan B. ", ["Plan B."]),
    ("It opens at 3 p.m. ", ["It opens at 3 p.m."]),
    ("Done? Really! ", ["Done?", "Really!"]),  # short ones too: nothing follows to merge with
    ("Intro here.\n- first item\n", ["Intro here.", "- first item"]),
    ("会议在三点开始。", ["会议在三点开始。"]),
    # unfinished: dropped
    ("First one is done. And then we", ["First one is done."]),
    ("I met Dr. ", []),
    ("The total is 8.", []),  # "8." may go on as "8.4"
    ('He said "Go. ', []),  # inside an open quote
    ("Run this:\n```\nmake test.\n", ["Run this:"]),  # an open code block
])
def test_abandon_returns_what_the_text_completes(text, want):
    config = SegmenterConfig(first_min_words=0)
    for sizes in ([len(text)], [1] * len(text)):
        seg = Segmenter(config)
        got = []
        i = 0
        for n in sizes:
            got += seg.feed(text[i:i + n])
            i += n
        got += seg.abandon()
        assert [s.text for s in got] == want
        assert seg.abandon() == [] and seg.finish() == []  # spent


def test_abandon_after_finish_returns_nothing():
    seg = Segmenter()
    assert [s.text for s in seg.feed("One. Two")] == ["One."]
    assert [s.text for s in seg.finish()] == ["Two"]
    assert seg.abandon() == []


def test_abandon_returns_a_complete_short_sentence_whatever_min_chars():
    seg = Segmenter(SegmenterConfig(first_min_words=0, min_chars=40))
    assert [s.text for s in seg.feed("The first sentence is long enough to stand. Ok. ")] == [
        "The first sentence is long enough to stand."]
    assert [s.text for s in seg.abandon()] == ["Ok."]  # nothing follows to merge it with


@pytest.mark.parametrize("max_chars", [40, 400])
def test_abandon_never_speaks_the_sentence_it_makes_up(max_chars):
    """abandon feeds a made-up next sentence (" The next") to find where the text ends; an
    unfinished text a few characters short of max_chars was pushed past it and cut after
    "The": a word the LLM never wrote was spoken (core review)."""
    for length in range(max_chars - 12, max_chars + 1):
        text = ("blah " * max_chars)[:length]
        seg = Segmenter(SegmenterConfig(max_chars=max_chars))
        fed = seg.feed(text)
        assert "The" not in "".join(s.text for s in fed + seg.abandon()), length


@pytest.mark.parametrize(("text", "want"), [
    ("هل تريد الذهاب إلى الحديقة؟ سأكون هناك في الخامسة.",
     ["هل تريد الذهاب إلى الحديقة؟", "سأكون هناك في الخامسة."]),
    ("آپ کیسے ہیں۔ میں ٹھیک ہوں۔", ["آپ کیسے ہیں۔", "میں ٹھیک ہوں۔"]),
    ("मैं ठीक हूँ। आप कैसे हैं?", ["मैं ठीक हूँ।", "आप कैसे हैं?"]),
])
def test_arabic_urdu_and_devanagari_sentence_ends(text, want):
    # ؟ ۔ । were not sentence ends: an Arabic reply was one segment however long
    for sizes in ([len(text)], [1] * len(text)):
        assert [s.text for s in run(text, sizes, SENTENCES)] == want


# --- emoji ---------------------------------------------------------------------------------

@pytest.mark.parametrize("emoji", [
    "\U0001F000", "\u2600", "\u27BF", "\u2B00", "\u2BFF",  # the first and last of each block
    "\U0001F468\u200D\U0001F469\u200D\U0001F467",  # a family: joined by U+200D
])
def test_emoji_at_the_edges_of_their_blocks_stay_with_their_sentence(emoji):
    """After a sentence end or before a capital, an emoji run ends its sentence and is
    not said; a letter or math sign just outside the blocks is text ("Ⰰ", "⟀")."""
    for text in (f"Well done! {emoji} The next one.", f"Done {emoji} The next one."):
        first, rest = sentences(text)
        assert rest == "The next one." and first.endswith(emoji)
        assert emoji not in run(text)[0].spoken
    for sign in ("\u27C0", "\u2C00"):
        assert sentences(f"Done {sign} The next one.") == [f"Done {sign} The next one."]


@pytest.mark.parametrize("end", [" ", "\n", " \n "])
def test_a_reply_that_ends_with_an_emoji_and_a_space_ends_with_its_sentence(end):
    text = f"All done \u2705{end}"
    for sizes in ([len(text)], [1] * len(text)):
        got = run(text, sizes, SENTENCES)
        assert [(s.text, s.spoken) for s in got] == [("All done \u2705", "All done")]


def test_short_sentences_ended_by_an_emoji_merge_after_the_first():
    cfg = SegmenterConfig(first_min_words=0, min_chars=12)
    assert [s.text for s in run("Done \u2705 Next \u2705 The reminder is set now.", None,
                                cfg)] == ["Done \u2705", "Next \u2705 The reminder is set now."]
    assert [s.text for s in run("Ok. Done \u2705 Next one \u2705 The reminder is set.", None,
                                cfg)] == ["Ok.", "Done \u2705 Next one \u2705",
                                          "The reminder is set."]


def test_a_long_sentence_is_cut_after_a_number_that_ends_a_group_of_words():
    """Only a space between two digits is inside a number ("1 250 000"): "5 apples" is
    two words, and the cut may fall between them."""
    cfg = SegmenterConfig(first_min_words=0, max_chars=40)
    text = "We bought a lot of fruit and got 5 apples plus pears today."
    assert [s.text for s in run(text, None, cfg)][0] == "We bought a lot of fruit and got 5"
    # the space after the number is the 41st character: fed one at a time, the cut waits
    # for the next one to tell "1234567 8" (one number) from "1234567 apples"
    text = "We bought a lot of fruit and got 1234567 apples plus pears today."
    for sizes in ([len(text)], [1] * len(text)):
        assert [s.text for s in run(text, sizes, cfg)] == [
            "We bought a lot of fruit and got 1234567", "apples plus pears today."]


@pytest.mark.parametrize(("text", "want"), [
    ("Call at 9 a.m. Eastern time. Then wait.", ["Call at 9 a.m. Eastern time.", "Then wait."]),
    ("Die Firma heißt Müller GmbH & Co. OHG. Sie ist alt.",
     ["Die Firma heißt Müller GmbH & Co. OHG.", "Sie ist alt."]),
    ("Es ist die Bayer Co. KGaA. Sie ist alt.", ["Es ist die Bayer Co. KGaA.", "Sie ist alt."]),
    ("Er wohnt in der Hauptstr. 12 in Berlin. Gut.",
     ["Er wohnt in der Hauptstr. 12 in Berlin.", "Gut."]),
    ("Ho parlato con l\u2019avv. Rossi oggi. Bene.",
     ["Ho parlato con l\u2019avv. Rossi oggi.", "Bene."]),
    ("Ho visto dell\u2019Ing. Bianchi ieri. Bene.",
     ["Ho visto dell\u2019Ing. Bianchi ieri.", "Bene."]),
    ("Well... I'm not sure. Ok.", ["Well... I'm not sure.", "Ok."]),
    ("Hmm... I've seen it. Ok.", ["Hmm... I've seen it.", "Ok."]),
    ("So... I'd say yes. Ok.", ["So... I'd say yes.", "Ok."]),
    ("In 7th c. Rome it fell. Then it rose.", ["In 7th c. Rome it fell.", "Then it rose."]),
    ("It was written by J. A. Smith in 1950. Read it.",
     ["It was written by J. A. Smith in 1950.", "Read it."]),
])
def test_abbreviations_that_go_on_before_a_capital(text, want):
    """A time zone after "a.m.", a German company form after "Co.", a street before its
    number, an Italian title after an elided article (typographic apostrophe), the pronoun
    I after an ellipsis, "c." (circa) before a name, an initial before another one (even
    "A.", which opens sentences)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The build is done now \u2014 then we ship it today.",
     ["The build is done now \u2014", "then we ship it today."]),
    ("The build is done - then we ship it today.",
     ["The build is done -", "then we ship it today."]),
    ("The well-known fix is done now and we ship it today.",
     ["The well-known fix is done now and we ship it today."]),
    ("- The build is done now and we ship it.\n- Next.",
     ["- The build is done now and we ship it.", "- Next."]),
])
def test_the_eager_first_clause_ends_at_a_spaced_dash_only(text, want):
    """A spaced dash is a clause mark; a hyphen inside a word and a bullet opening a line
    are not."""
    assert [s.text for s in run(text)] == want


@pytest.mark.parametrize(("text", "want"), [
    ("Thanks to Mr. and Mrs. Smith for the help today.",
     ["Thanks to Mr. and Mrs. Smith", "for the help today."]),
    ("Pick a number between 3 and 5 for the test today.",
     ["Pick a number", "between 3 and 5 for the test today."]),
])
def test_a_first_phrase_never_ends_at_a_title_or_inside_a_range(text, want):
    assert phrase(text, 2) == want


# --- cases a second held-out set exposed (addresses, citations, time zones, camelCase) ---

@pytest.mark.parametrize(("text", "want"), [
    ("The number is 020 7946 0958. Ask for ext. 12. They pick up.",
     ["The number is 020 7946 0958.", "Ask for ext. 12.", "They pick up."]),
    ("The address is 221B Baker St., Apt. 4B, London. It's near the station.",
     ["The address is 221B Baker St., Apt. 4B, London.", "It's near the station."]),
    ("It's explained in ch. 4, sec. 2. Eq. 3 is the key formula. See also Sect. 5.",
     ["It's explained in ch. 4, sec. 2.", "Eq. 3 is the key formula.", "See also Sect. 5."]),
    ("It's in Bldg. 5, Rm. 204. Take the lift.", ["It's in Bldg. 5, Rm. 204.", "Take the lift."]),
    ("Smith et al. (2020) found the same effect. Jones et al. disagree.",
     ["Smith et al. (2020) found the same effect.", "Jones et al. disagree."]),
    ("It was shown by Smith et al. The effect is small.",
     ["It was shown by Smith et al.", "The effect is small."]),
])
def test_address_and_citation_abbreviations_before_a_number_go_on(text, want):
    """"ext. 12", "Apt. 4B", "Eq. 3", "Sect. 5", "et al. (2020)" were cut after the dot:
    the number was spoken as a sentence of its own ("12.")."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Send it to 1600 Pennsylvania Ave. NW, Washington, DC 20500. That's the White House.",
     ["Send it to 1600 Pennsylvania Ave. NW, Washington, DC 20500.", "That's the White House."]),
    ("It's on Sunset Blvd. West Hollywood has parking. Go early.",
     ["It's on Sunset Blvd. West Hollywood has parking.", "Go early."]),
    ("The shop is on Park Ave. The one on Mill Rd. It closes at 6.",
     ["The shop is on Park Ave.", "The one on Mill Rd.", "It closes at 6."]),
])
def test_a_street_abbreviation_goes_on_before_a_name_and_ends_before_a_sentence(text, want):
    """"Ave.", "Blvd.", "Rd." as "St.": a sentence end only before a word that opens one."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The call is at 9:30 a.m. EST. That's 14:30 GMT.",
     ["The call is at 9:30 a.m. EST.", "That's 14:30 GMT."]),
    ("The launch is at 10 a.m. PT on Tuesday. It'll stream live.",
     ["The launch is at 10 a.m. PT on Tuesday.", "It'll stream live."]),
    ("It starts at 8 p.m. ET. Doors open at 7 p.m. CT. Be early.",
     ["It starts at 8 p.m. ET.", "Doors open at 7 p.m. CT.", "Be early."]),
    ("The est. cost is $40. It may change.", ["The est. cost is $40.", "It may change."]),
])
def test_a_time_zone_goes_on_after_a_m_and_ends_a_sentence(text, want):
    """"EST." never ended a sentence (taken for "est.", estimated), and "a.m. PT" was cut
    before the zone ("PT on Tuesday." spoken alone)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Windows 11 23H2 is out. macOS Sonoma 14.1 is the latest.",
     ["Windows 11 23H2 is out.", "macOS Sonoma 14.1 is the latest."]),
    ("Update your phone. iOS 17.2 fixes it. (iPadOS too.) Done.",
     ["Update your phone.", "iOS 17.2 fixes it.", "(iPadOS too.)", "Done."]),
    ("Try a reseller... eBay has it for $40.", ["Try a reseller...", "eBay has it for $40."]),
    # an abbreviation before it still goes on; a lowercase word still goes on
    ("It runs on phones, e.g. iPhone 15 and Pixel 8.",
     ["It runs on phones, e.g. iPhone 15 and Pixel 8."]),
    ("It opens at 9 a.m. on weekdays.", ["It opens at 9 a.m. on weekdays."]),
    # a version too: "v0.3.1 of the SDK" was merged into the sentence before
    ("We shipped it last week. v0.3.1 of the SDK adds streaming.",
     ["We shipped it last week.", "v0.3.1 of the SDK adds streaming."]),
    ("Pin it, e.g. v2 or later. Use a v2 key.", ["Pin it, e.g. v2 or later.", "Use a v2 key."]),
])
def test_a_camel_case_name_opens_a_sentence(text, want):
    """A product name written in camelCase ("macOS", "iOS", "eBay") or a version ("v0.3.1")
    opens sentences in tech replies; its lowercase first letter kept the sentence before it
    going on."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("L'entr\u00e9e est au b\u00e2t. B. N'oublie pas ton badge.",
     ["L'entr\u00e9e est au b\u00e2t. B.", "N'oublie pas ton badge."]),
    ("Va au bloc C. C\u2019est \u00e0 droite.", ["Va au bloc C.", "C\u2019est \u00e0 droite."]),
    # a French label before it: any capital opens a sentence ("Merci" stayed with "bât. B.")
    ("Le colis est au b\u00e2t. B. Merci.", ["Le colis est au b\u00e2t. B.", "Merci."]),
    ("C'est la porte C. Bonne journ\u00e9e !", ["C'est la porte C.", "Bonne journ\u00e9e !"]),
    ("Le cours a lieu en salle D. Apportez vos notes.",
     ["Le cours a lieu en salle D.", "Apportez vos notes."]),
    ("Vive en el 2.\u00ba B. Ll\u00e1mala ma\u00f1ana.",
     ["Vive en el 2.\u00ba B.", "Ll\u00e1mala ma\u00f1ana."]),
    ("Mora no 3\u00aa A. Sim.", ["Mora no 3\u00aa A.", "Sim."]),
    # a name after an initial still goes on, an Irish or Italian one too
    ("Ask John D. D'Angelo or B. O'Brien now.", ["Ask John D. D'Angelo or B. O'Brien now."]),
    ("In 1990 B. Obama was a student.", ["In 1990 B. Obama was a student."]),
])
def test_a_single_capital_before_a_french_or_spanish_sentence_ends_it(text, want):
    """A flat or a building ("b\u00e2t. B", "2.\u00ba B") then a French or Spanish sentence
    was taken for an initial before a name; "b\u00e2t." itself ended a sentence."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Die Adresse ist Goethestr. 5, 3. OG. Klingel bei Meier.",
     ["Die Adresse ist Goethestr. 5, 3. OG.", "Klingel bei Meier."]),
    ("Das Büro liegt im Erdgeschoss, Praxis im 2. OG, Archiv im 1. UG. Gut.",
     ["Das Büro liegt im Erdgeschoss, Praxis im 2. OG, Archiv im 1. UG.", "Gut."]),
    ("Sie wohnt Hauptstr. 12, 4. Etage links. Gut.",
     ["Sie wohnt Hauptstr. 12, 4. Etage links.", "Gut."]),
    ("Go to step 2. Stock up on water first.", ["Go to step 2.", "Stock up on water first."]),
])
def test_a_german_floor_after_its_ordinal_goes_on(text, want):
    """A German address gives the floor as "3. OG" (3rd floor) after the house number: the
    ordinal was cut off from its floor ("OG." spoken alone)."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("\u2600\ufe0f Good morning, here is your forecast for today: sunny and 24 degrees.",
     ["\u2600\ufe0f Good morning, here is your forecast for today:", "sunny and 24 degrees."]),
    ("Done.\n\U0001F389 Tests pass. Ship it.", ["Done.", "\U0001F389 Tests pass.", "Ship it."]),
    ("Plan:\n1. \U0001F680 Launch it today. Then rest.",
     ["Plan:", "1. \U0001F680 Launch it today.", "Then rest."]),
])
def test_an_emoji_opening_a_reply_or_line_stays_with_the_sentence_after_it(text, want):
    """An emoji before a capital ends a sentence ("Done ✅ The reminder"), but with no
    text before it there is nothing to end: a reply opening with one made a silent first
    segment, and the eager first clause (index 0) went with it."""
    for sizes in ([len(text)], [1] * len(text)):
        got = run(text, sizes)
        assert [s.text for s in got] == want
        assert all(s.spoken for s in got)


@pytest.mark.parametrize(("text", "want"), [
    ("It opens at 9 a.m. Mon.–Sat. and at 11 a.m. on Sun. Holidays vary.",
     ["It opens at 9 a.m. Mon.–Sat. and at 11 a.m. on Sun.", "Holidays vary."]),
    ("Doors open at 8 p.m. Friday and Saturday. Bring ID.",
     ["Doors open at 8 p.m. Friday and Saturday.", "Bring ID."]),
    ("Das Angebot gilt bis einschl. 31.12. Danach kostet es mehr.",
     ["Das Angebot gilt bis einschl. 31.12.", "Danach kostet es mehr."]),
    ("It's from Hamlet, Act 3, Sc. 1. It's famous.",
     ["It's from Hamlet, Act 3, Sc. 1.", "It's famous."]),
])
def test_opening_hours_and_references_go_on(text, want):
    """A weekday after "a.m." (opening hours), German "einschl." (including) and "Sc. 1"
    (a scene) were cut after the dot."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("6 ft. 2 in. is about 1.88 m.", ["6 ft. 2 in. is about 1.88 m."]),
    ("The baby weighed 7 lb. 8 oz. at birth. Congrats!",
     ["The baby weighed 7 lb. 8 oz. at birth.", "Congrats!"]),
    ("It's 3 lbs. 4 oz. in all. Enough?", ["It's 3 lbs. 4 oz. in all.", "Enough?"]),
    ("The shelf is 2 ft. Measure twice.", ["The shelf is 2 ft.", "Measure twice."]),
])
def test_an_imperial_unit_before_the_smaller_one_goes_on(text, want):
    """A height or a weight in two units ("6 ft. 2 in.", "7 lb. 8 oz.") was cut after the
    first ("6 ft." spoken alone): like "1 hr. 15 min.", never before a digit."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Er hat ca. 10 Min. Verspätung. Sorry.", ["Er hat ca. 10 Min. Verspätung.", "Sorry."]),
    ("Berlin hat 3,7 Mio. Einwohner. Es ist die größte Stadt.",
     ["Berlin hat 3,7 Mio. Einwohner.", "Es ist die größte Stadt."]),
    ("Es sind 2 Std. 30 Min. Fahrt. Gute Reise!", ["Es sind 2 Std. 30 Min. Fahrt.", "Gute Reise!"]),
    # before a word that opens a sentence, it still ends one
    ("Der Bus kommt in 10 Min. Bitte warte hier.",
     ["Der Bus kommt in 10 Min.", "Bitte warte hier."]),
    ("Koche es 20 Min. Dann abgießen.", ["Koche es 20 Min.", "Dann abgießen."]),
    ("Wait 10 Min. Then go.", ["Wait 10 Min.", "Then go."]),
])
def test_a_german_count_before_its_noun_goes_on(text, want):
    """German capitalizes the noun after "Mio.", "Min.", "Std.": "ca. 10 Min. Verspätung"
    was cut before it ("Verspätung." spoken alone), "2 Mrd. Euro" too."""
    for sizes in ([len(text)], [1] * len(text)):
        assert [s.text for s in run(text, sizes, SENTENCES)] == want


# --- behaviours mutation testing found unheld ---------------------------------------------
# Each test below holds a behaviour that a one-change mutant of segmenter.py broke while
# every test above still passed (a dropped character of a set, a swapped comparison...).

@pytest.mark.parametrize("text", [
    "मैं ठीक हूँ॥ आप कैसे हैं॥",  # the double danda
    "It is done.\tThen we left.",  # a tab after the end
])
def test_a_double_danda_and_a_tab_part_sentences(text):
    assert len(sentences(text)) == 2


@pytest.mark.parametrize("mark", ["\uff0c", "\u3001", "\uff1b", "\uff1a"])
def test_each_full_width_clause_mark_gives_the_eager_first_cut(mark):
    text = f"今天北京的天气很好{mark}最高气温二十五度。"
    assert [s.text for s in run(text)] == [f"今天北京的天气很好{mark}", "最高气温二十五度。"]


@pytest.mark.parametrize(("opener", "closer"), [
    ("\u300c", "\u300d"), ("\u300e", "\u300f"), ("\uff08", "\uff09"), ("\u3010", "\u3011")])
def test_each_full_width_bracket_holds_the_ends_inside_it(opener, closer):
    text = f"{opener}今天很好。我们走吧。{closer}他说。明天见。"
    assert sentences(text) == [f"{opener}今天很好。我们走吧。{closer}他说。", "明天见。"]


@pytest.mark.parametrize("mark", [";", " \u2013", " \u2014", " -", ","])
def test_each_clause_mark_gives_the_eager_first_cut(mark):
    text = f"We checked the logs twice{mark} the error is gone now."
    assert [s.text for s in run(text)] == [f"We checked the logs twice{mark}",
                                           "the error is gone now."]


@pytest.mark.parametrize(("first", "rest"), [
    ("It was done [at last.]", "Then we left."),
    ("It is _done._", "Then we left."),
    ("It is *done.*", "Then we left."),
    ("It is **done.**", "Then we left."),
    ("He said \u2018done.\u2019", "Then we left."),
])
def test_a_closing_bracket_or_emphasis_after_the_end_stays_with_its_sentence(first, rest):
    assert sentences(f"{first} {rest}") == [first, rest]


@pytest.mark.parametrize(("opener", "closer"), [
    ("(", ")"), ("[", "]"), ('"', '"'), ("\u201c", "\u201d"), ("\u201e", "\u201c"),
    ("\u00ab", "\u00bb"), ("\u00bb", "\u00ab"), ("'", "'"), ("\u2018", "\u2019"), ("*", "*"),
    ("_", "_")])
def test_each_opening_mark_after_an_abbreviation_is_looked_through(opener, closer):
    """After "a.m." the next word's first letter decides; an opening bracket, quote or
    emphasis before it is looked through ("a.m. (It" ends, "a.m. (in" goes on)."""
    text = f"It opens at 9 a.m. {opener}It closes at noon.{closer}"
    assert sentences(text) == ["It opens at 9 a.m.", f"{opener}It closes at noon.{closer}"]
    text = f"It opens at 9 a.m. {opener}in winter{closer} only."
    assert sentences(text) == [text]


@pytest.mark.parametrize("text", [
    "It is made in the U.S. ",  # decided by the word after: a starter ("The") ends it
    "Take the bus to Downing St. ",
    "Ask for vitamin C. ",
])
def test_abandon_ends_a_sentence_that_only_a_starter_would_end(text):
    seg = Segmenter(SegmenterConfig(first_min_words=0))
    assert seg.feed(text) == []
    assert [s.text for s in seg.abandon()] == [text.strip()]


@pytest.mark.parametrize(("text", "want"), [
    ("It is **really good news** for us.", ["It is **really good news** for us."]),
    ("It is *really good news* for us.", ["It is *really good news* for us."]),
    ("It is __really good news__ for us.", ["It is __really good news__ for us."]),
    ("It is _really good news_ for us.", ["It is _really good news_ for us."]),
    ("Run the `make clean test` target first.", ["Run the `make clean test` target", "first."]),
    ("Take $x plus y$ as the new sum.", ["Take $x plus y$ as the new", "sum."]),
    ("Take $$x plus y$$ as the new sum.", ["Take $$x plus y$$ as the new", "sum."]),
    # closed spans and a dollar amount leave the cut where the words put it
    ("It is **good** news for us all.", ["It is **good** news", "for us all."]),
    ("It is *good* news for us all.", ["It is *good* news", "for us all."]),
    ("It costs $5 more per month.", ["It costs $5 more", "per month."]),
    ("It is `make` then tests for us.", ["It is `make` then", "tests for us."]),
    # a third mark opens a span again
    ("It is `a` or `make clean test` now.", ["It is `a` or `make clean test` now."]),
    ("Take $x$ or $y plus z$ now.", ["Take $x$ or $y plus z$ now."]),
])
def test_first_max_words_never_cuts_inside_an_open_span(text, want):
    assert words(text, 3, first_min_words=0) == want


@pytest.mark.parametrize("text", [
    "今天天气很好我们去公园散步吧" * 6 + "。",  # unified ideographs
    "きょうはとてもいいてんきですね" * 6 + "。",  # hiragana
    "コーヒーショップアンドレストラン" * 6 + "。",  # katakana
    "\u3400\u3401\u3402\u3403\u3404\u3405\u3406\u3407" * 9 + "。",  # extension A
])
def test_a_run_on_sentence_of_each_chinese_or_japanese_block_is_cut_between_characters(text):
    config = SegmenterConfig(first_min_words=0, max_chars=40)
    got = [s.text for s in run(text, config=config)]
    assert len(got) > 1 and all(len(s) <= 40 for s in got) and "".join(got) == text


@pytest.mark.parametrize("sign", ["\u25ff", "\u27c0", "\u2aff", "\u2c00", "\U0001efff"])
def test_a_sign_just_outside_the_emoji_blocks_is_not_a_trailing_emoji(sign):
    assert sentences(f"Well done! {sign} The next one.") == [
        "Well done!", f"{sign} The next one."]


def test_configs_and_segments_are_frozen_values():
    """A session shares its config and hands its segments to the scheduler: neither may
    change under them."""
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        SegmenterConfig().max_chars = 10  # type: ignore[misc]
    [seg] = run("Hi.")
    with pytest.raises(FrozenInstanceError):
        seg.text = "Bye."  # type: ignore[misc]


@pytest.mark.parametrize(("length", "pieces"), [(400, 1), (401, 2)])
def test_the_default_max_chars_is_400(length, pieces):
    text = ("word " * 100)[:length - 1] + "x"
    assert len(run(text)) == pieces


@pytest.mark.parametrize(("span", "whole"), [(150, True), (151, False)])
def test_the_default_quote_max_chars_is_150(span, whole):
    text = 'He said "' + ("so " * 60)[:span - 13] + ' stop. Now go." Then left.'
    assert text.index('." Then') - text.index('"') - 1 == span
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0))]
    assert (got[-1] == "Then left." and len(got) == 2) == whole


@pytest.mark.parametrize(("text", "want"), [
    ("It is done.\rThen we left.", ["It is done.", "Then we left."]),  # an old Mac newline
    ("\u00ab Tu viens demain\u202f?\u202f\u00bb Puis il est parti.",
     ["\u00ab Tu viens demain\u202f?\u202f\u00bb", "Puis il est parti."]),  # French spacing
])
def test_a_carriage_return_and_a_narrow_space_are_spaces(text, want):
    assert sentences(text) == want


def test_abandon_keeps_a_question_ending_in_a_digit():
    """Only a dot after a digit may go on ("8." then "8.4"); "Is it 8?" is complete."""
    seg = Segmenter(SegmenterConfig(first_min_words=0))
    assert seg.feed("Is it 8?") == []
    assert [s.text for s in seg.abandon()] == ["Is it 8?"]


def test_abandon_never_cuts_a_long_unfinished_sentence():
    seg = Segmenter(SegmenterConfig(first_min_words=0, max_chars=5000))
    assert seg.feed("and then we " * 100) == []
    assert seg.abandon() == []


def test_a_stray_quote_releases_the_sentences_after_it_in_the_same_feed():
    text = 'A stray " mark. ' + "Then one more sentence follows here. " * 3 + "End"
    seg = Segmenter(SegmenterConfig(first_min_words=0, quote_max_chars=20))
    got = [s.text for s in seg.feed(text)]
    assert got == ['A stray " mark.'] + ["Then one more sentence follows here."] * 3


def test_a_long_text_without_any_stop_is_cut_as_it_comes():
    text = "and then we " * 30
    seg = Segmenter(SegmenterConfig(first_min_words=0, max_chars=40))
    got = seg.feed(text)
    assert len(got) >= 7 and all(len(s.text) <= 40 for s in got)


def test_one_word_is_enough_for_the_opt_in_first_cuts():
    """1 is a setting like any other (0 is off): the first segment may be one word long."""
    assert words("Wait here and rest a while.", 1, first_min_words=0) == [
        "Wait", "here and rest a while."]
    config = SegmenterConfig(first_min_words=0, first_phrase_words=1)
    assert [s.text for s in run("Wait here and rest a while.", config=config)] == [
        "Wait here", "and rest a while."]


@pytest.mark.parametrize(("text", "want"), [
    ("You sure...? $42 is a lot.", ["You sure...?", "$42 is a lot."]),  # a question ends it
    ("It is run by Smith & Co. The firm grew.", ["It is run by Smith & Co.", "The firm grew."]),
    ("The rapper a.k.a. 2Pac sold millions.", ["The rapper a.k.a. 2Pac sold millions."]),
    ("Wir sehen uns am 3. November wieder.", ["Wir sehen uns am 3. November wieder."]),
    ("Am 3. Februar oder am 5. Dezember.", ["Am 3. Februar oder am 5. Dezember."]),
    ("Wir kommen am 4. September.", ["Wir kommen am 4. September."]),
    ("Die Praxis ist in der Hauptstr. 5, 1. UG links.",
     ["Die Praxis ist in der Hauptstr. 5, 1. UG links."]),
    ("Er kommt nicht. D. h. Anna kommt später.", ["Er kommt nicht.", "D. h. Anna kommt später."]),
    ("Ho parlato con l'avv. Rossi ieri.", ["Ho parlato con l'avv. Rossi ieri."]),
    ("Ho parlato con dell'Ing. Rossi ieri.", ["Ho parlato con dell'Ing. Rossi ieri."]),
    ("Das betrifft die EU. Die Regeln sind neu.", ["Das betrifft die EU.", "Die Regeln sind neu."]),
    ("He is a U.S. Army veteran.", ["He is a U.S. Army veteran."]),
    ("100. Sleep well tonight.", ["100. Sleep well tonight."]),  # a list number of three digits
])
def test_more_abbreviations_and_ends_each_rule_holds(text, want):
    assert sentences(text) == want


@pytest.mark.parametrize("text", ["It rose.[12", "Er ist im Verein e. V", "Это музей им. А"])
def test_a_reply_cut_off_right_after_a_mark_still_finishes(text):
    """The stream may end anywhere: a citation mark or a spaced abbreviation left open is
    said as it stands (a look past the end of the text raised IndexError)."""
    assert " ".join(sentences(text)) == text


def test_a_code_block_fenced_after_a_tab_is_one_silent_segment():
    text = "Run:\n\t```\nmake\n\t```\nDone."
    got = run(text, config=SegmenterConfig(first_min_words=0))
    assert [(s.text, s.spoken) for s in got] == [
        ("Run:", "Run:"), ("```\nmake\n\t```", ""), ("Done.", "Done.")]


@pytest.mark.parametrize(("opener", "closer"), [
    ("\u300c", "\u300d"), ("\u201c", "\u201d"), ('"', '"')])
def test_a_full_width_end_before_the_closing_mark_of_a_cut_sentence_stays_with_it(opener,
                                                                                   closer):
    """The cut at max_chars forgets the open bracket or quote; the mark closing right after
    the end still keeps the sentence going."""
    text = f"他说{opener}我们今天去了很多地方看了很多风景吃了饭。{closer}然后走了。明天见。"
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=20))]
    assert got[1].startswith(f"了饭。{closer}然后走了。")


def test_a_dash_after_a_word_is_no_clause_mark():
    text = "We handle pre- and post-processing steps today. Ok."
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=2))]
    assert got == ["We handle pre- and post-processing steps today.", "Ok."]


@pytest.mark.parametrize(("text", "want"), [
    ("The call (about rent money today) moved.", ["The call (about rent money today) moved."]),
    ("Sam ate apples 5 days ago.", ["Sam ate apples", "5 days ago."]),  # a digit may follow
    ("Final count today: 12 people came.", ["Final count today: 12 people", "came."]),
])
def test_first_max_words_inside_brackets_and_before_a_digit(text, want):
    assert words(text, 3, first_min_words=0) == want


def test_first_phrase_cuts_before_an_opener_after_a_number():
    """Only "and" and "or" after a number make a range ("3 and 5"); "at 5 | with" cuts."""
    assert phrase("We meet at 5 with the team.", 3, first_min_words=0) == [
        "We meet at 5", "with the team."]
    assert phrase("We meet at 5 and 6 today.", 3, first_min_words=0) == [
        "We meet at 5 and 6 today."]


@pytest.mark.parametrize(("text", "want"), [
    # a clause mark inside brackets cuts nothing
    ("We paid (for the big one, with extras) last week, I think.",
     ["We paid (for the big one, with extras) last week,", "I think."]),
    # only a comma before a digit joins a number ("Jan 1, 1980"); a colon still cuts
    ("The score at halftime: 3 to 1.", ["The score at halftime:", "3 to 1."]),
])
def test_the_eager_clause_inside_brackets_and_before_a_digit(text, want):
    assert [s.text for s in run(text, config=SegmenterConfig(first_min_words=2))] == want


def test_speakable_drops_underscore_emphasis():
    assert speakable("It is __very__ _good_ news.") == "It is very good news."


@pytest.mark.parametrize(("text", "want"), [
    ("Alles Gute zum 100. Geburtstag! Feiern wir.", ["Alles Gute zum 100. Geburtstag!",
                                                    "Feiern wir."]),
    ("Er feiert den 250. Jahrestag. Toll.", ["Er feiert den 250. Jahrestag.", "Toll."]),
    ("Du bist der 1000. Besucher. Gratuliere!", ["Du bist der 1000. Besucher.", "Gratuliere!"]),
    ("Wir sind im Jahr 2026. Die Zeit vergeht.", ["Wir sind im Jahr 2026.",
                                                 "Die Zeit vergeht."]),  # a year
])
def test_a_german_ordinal_past_99_after_an_article_goes_on(text, want):
    """Only ordinals of one or two digits went on after "zum", "den", "der"...: "zum 100.
    Geburtstag" was cut after "100." ("hundert" said with a final fall, the birthday alone).
    Found by mutation testing: dropping the length check was more right than the code."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("I ate at 𠮷野家. 𠮷野家 opens at nine.", ["I ate at 𠮷野家.", "𠮷野家 opens at nine."]),
    ("We met at 3 p.m. 𠵱家 I am home.", ["We met at 3 p.m.", "𠵱家 I am home."]),
    ("Well done! \U0001FAE0 The next one.", ["Well done! \U0001FAE0", "The next one."]),
])
def test_a_chinese_character_past_the_emoji_block_is_no_emoji(text, want):
    """Every code point from U+1F000 up was an emoji to the scanner, the CJK ideographs of
    plane 2 too ("𠮷", Japanese names; "𠵱家", Cantonese "now"): after a sentence end one was
    taken as a trailing emoji glued to the next word, and the sentence never ended there.
    Found by mutation testing of the emoji bounds."""
    assert sentences(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("Il part. \u00ab Bonjour \u00bb, dit-il.", ["Il part.", "\u00ab Bonjour \u00bb, dit-il."]),
    ("He met her (Dr. Smith) today.", ["He met her (Dr. Smith) today."]),
    ("It was **Dr. Smith** who came.", ["It was **Dr. Smith** who came."]),
    ("Let us go. J. Smith will drive.", ["Let us go.", "J. Smith will drive."]),
    ("Is 91 prime? No. 91 is 7 times 13.", ["Is 91 prime?", "No.", "91 is 7 times 13."]),
])
def test_sentence_ends_next_to_quotes_titles_initials_and_answers(text, want):
    assert sentences(text) == want


def test_first_phrase_never_cuts_inside_a_quote():
    assert phrase('He said "go home and rest now" to me.', 2, first_min_words=0) == [
        'He said "go home and rest now" to me.']


def test_first_max_words_never_cuts_between_et_and_al():
    assert words("Smith et al. found it.", 2, first_min_words=0) == [
        "Smith et al. found", "it."]


def test_a_reply_of_marks_alone_was_heard_as_nothing():
    """Emoji and marks are not said, so not heard: the prefix heard of a reply of nothing
    else is empty, whatever share of its (silent) audio played."""
    from gateway.core.segmenter import heard_prefix

    assert heard_prefix("\U0001F389 \u2705", 1.0) == ""
    assert heard_prefix("Done \U0001F389 \u2705", 1.0) == "Done"


# --- behaviours the second mutation run found unheld --------------------------------------
# The mutants a one-change mutator of segmenter.py left alive in session 38 (those the first
# run had not reached): each test below kills one or more of them, asserting what the module
# docstring or protocol.md says.

@pytest.mark.parametrize(("text", "first_min_words", "want"), [
    ("aaaa bbbb, cccc dddd.", 0, ["aaaa bbbb,", "cccc dddd."]),  # the long cut at a clause
    ("Aa bb cc, dddd eeee.", 3, ["Aa bb cc,", "dddd eeee."]),  # the eager first clause
    ("Aaaa bbbb.  Cccc dddd.", 0, ["Aaaa bbbb.", "Cccc dddd."]),  # two spaces
])
def test_the_spaces_after_a_cut_count_in_no_segment_length(text, first_min_words, want):
    """A cut at a clause mark left the space after it at the head of the next segment, where
    it counted in max_chars (10): "cccc dddd.", 10 characters, was cut in two. Found
    triaging a mutant of the second mutation run."""
    config = SegmenterConfig(first_min_words=first_min_words, max_chars=10)
    for sizes in (None, [1] * len(text), [3] * len(text)):
        assert [s.text for s in run(text, sizes, config)] == want


@pytest.mark.parametrize("number", ["1 250 000 000", "1 250 000 000 000"])
def test_a_number_in_groups_opening_a_long_segment_is_never_cut(number):
    """A space inside a number written in groups is no place to cut, the one after its first
    digit too: "1 | 250 000 000" was cut there when the number opened the pending text. A
    number longer than max_chars is cut after, as a long word is."""
    text = f"{number} euros were paid."
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=10))]
    assert got[0] == number


@pytest.mark.parametrize("text", [
    "Well done! \U0001F389 3 more to go.",
    "We are home! \U0001F468\u200d\U0001F469\u200d\U0001F467 3 kids came along.",  # ZWJ family
])
def test_a_trailing_emoji_stays_with_its_sentence_before_a_digit(text):
    """After an emoji a capital ends the sentence anyway (the emoji rule), so only a word
    the emoji rule does not cut before (a digit) shows that the sentence end took the emoji
    along: each one of a run, the zero-width joiner of a family inside it too."""
    head, tail = text.split(" 3 ")
    assert sentences(text) == [head, "3 " + tail]


@pytest.mark.parametrize(("text", "max_chars", "span", "want"), [
    # the cut reads 27 characters, the quote's count ends at 27 (9 + 18): the quote first
    ('He said "fine. It costs 12 dollars now." Then left.', 26, 18,
     ['He said "fine.', 'It costs 12 dollars now."', "Then left."]),
    # ... at 28: the cut first
    ('He said "fine. It costs 12 dollars now." Then left.', 26, 19,
     ['He said "fine. It costs 12', 'dollars now."', "Then left."]),
    ('He said "fine. It costs 5 dollars now." Then left.', 25, 17,
     ['He said "fine.', 'It costs 5 dollars now."', "Then left."]),
    # a cut at a clause mark reads max_chars + 1 characters, as the count does here: the cut
    ('Well, he said "fine. It costs ten dollars now." Then left.', 26, 12,
     ["Well,", 'he said "fine.', "It costs ten dollars now.\"", "Then left."]),
    # no digit before the space at max_chars: the cut reads nothing past it
    ('He said "fine. It costs 12 dollars now." Then left.', 23, 15,
     ['He said "fine. It costs', '12 dollars now."', "Then left."]),
])
def test_a_quote_count_and_a_long_cut_decided_on_the_same_text(text, max_chars, span, want):
    """A long cut at a space after a digit reads one character more (the number may go on:
    "12 500"); a quote whose count ends on that character is decided first, stray, as it
    is when the text comes in pieces (the count is checked before the cut); one whose
    count ends a character later is not."""
    config = SegmenterConfig(first_min_words=0, max_chars=max_chars, quote_max_chars=span)
    for sizes in (None, [1] * len(text)):
        assert [s.text for s in run(text, sizes, config)] == want


@pytest.mark.parametrize(("text", "want"), [
    ("Aaaa bbbb.  Cccc dddd.", ["Aaaa bbbb.", "Cccc dddd."]),
    ("Aa. Bbbb cccc. Dd.", ["Aa.", "Bbbb cccc.", "Dd."]),
    ("今天天气很好我们走。明天见。", ["今天天气很好我们走。", "明天见。"]),
    ("Aaaa bbb \U0001F389  Cccc dddd.", ["Aaaa bbb \U0001F389", "Cccc dddd."]),
    ("Aaaa bbbbb\nCccc dddd.", ["Aaaa bbbbb", "Cccc dddd."]),  # a line: its newline at 10
])
def test_a_sentence_of_exactly_max_chars_stands_whole(text, want):
    """max_chars is the longest a segment may be: a sentence of exactly that many characters
    (10) is not cut, before or after another (the spaces between them count in neither)."""
    config = SegmenterConfig(first_min_words=0, max_chars=10)
    assert [s.text for s in run(text, config=config)] == want


@pytest.mark.parametrize("second", ["Done.", "Yes \U0001F389"])
def test_a_later_sentence_of_exactly_min_chars_stands(second):
    """min_chars merges the sentences *shorter* than it (5): "Done." is not, nor a sentence
    an emoji ends."""
    got = [s.text for s in run(f"Hi. {second} Okay then.",
                               config=SegmenterConfig(first_min_words=0, min_chars=5))]
    assert got == ["Hi.", second, "Okay then."]


@pytest.mark.parametrize("dash", ["\u2013", "\u2014"])
def test_an_en_or_em_dash_after_a_word_is_no_clause_mark(dash):
    """As the hyphen ("pre- and post-processing"): only a spaced dash is a clause mark."""
    text = f"We handle pre{dash} and post{dash}processing steps today. Ok."
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=2))]
    assert got == [f"We handle pre{dash} and post{dash}processing steps today.", "Ok."]


def test_a_dash_opening_the_reply_or_a_bullet_is_no_clause_mark():
    """A dash with nothing before it on its line opens the line (a bullet, a reply in the
    form of a dialogue): no clause ends there, so a long cut never leaves it alone, whatever
    the chunking (the reply below came as "— " then the rest)."""
    config = SegmenterConfig(first_min_words=0, max_chars=10)
    seg = Segmenter(config)
    got = seg.feed("\u2014 ") + seg.feed("Aaaa bbbb cccc.") + seg.finish()
    assert [s.text for s in got] == ["\u2014 Aaaa", "bbbb cccc."]
    got = run("Intro:\n  - Aaaa bbbb cccc dddd.", config=config)
    assert [s.text for s in got] == ["Intro:", "- Aaaa", "bbbb cccc", "dddd."]


def test_a_comma_before_a_word_holding_a_digit_is_a_clause_mark():
    """Only a comma before a number joins it ("Jan 1, 1980"): before "v2" it is a clause."""
    assert [s.text for s in run("We tested the old build, v2 ships in May.")] == [
        "We tested the old build,", "v2 ships in May."]


def test_a_title_after_an_underscore_opening_emphasis_goes_on():
    """As after "**" ("It was **Dr. Smith** who came."): the marks before a word are not
    part of it when it is looked up."""
    assert sentences("It was _Dr. Smith_ who came.") == ["It was _Dr. Smith_ who came."]


@pytest.mark.parametrize(("text", "want"), [
    ("Calcium helps.[123] Most people get enough.",
     ["Calcium helps.[123]", "Most people get enough."]),  # three digits
    # seven numbers: no citation mark (six at most), so no sentence end before it either
    ("Calcium helps.[1, 2, 3, 4, 5, 6, 7] Most people get enough.",
     ["Calcium helps.[1, 2, 3, 4, 5, 6, 7] Most people get enough."]),
])
def test_the_bounds_of_a_citation_mark(text, want):
    assert sentences(text) == want


def test_a_french_quote_open_at_the_end_of_the_reply_finishes():
    """French spacing looks past the spaces after an end for the closing guillemet: at the
    end of the stream there is none."""
    assert sentences("Il a dit : \u00ab Je pars. ") == ["Il a dit : \u00ab Je pars."]


def test_a_reply_ending_in_a_comma_and_a_space_finishes():
    """The comma rule looks past the spaces for a digit ("Jan 1, 1980"): at the end of the
    stream there is none to look at."""
    assert [s.text for s in run("We checked it all, ", config=SegmenterConfig(
        first_min_words=2))] == ["We checked it all,"]


def test_a_reply_cut_off_after_a_bracket_decides_by_its_first_letter():
    """The stream may end right after the bracket's first letter: that letter decides, as
    it does when more follows ("9 a.m. (It opens" ends the sentence)."""
    assert sentences("We open at 9 a.m. (I") == ["We open at 9 a.m.", "(I"]


@pytest.mark.parametrize(("opener", "closer"), [("(", ")"), ("[", "]")])
def test_a_full_width_end_before_a_closing_bracket_of_a_cut_sentence_stays_with_it(opener,
                                                                                    closer):
    """As with 」, ” and " (the test above of the cut at max_chars): the cut forgot the open
    bracket, and the ASCII one closing right after 。 still keeps the sentence going."""
    text = f"他说{opener}我们今天去了很多地方看了很多风景吃了饭。{closer}然后走了。明天见。"
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=20))]
    assert got[1:] == [f"了饭。{closer}然后走了。", "明天见。"]


def test_the_sentence_after_a_run_on_chinese_cut_ends_at_its_full_stop():
    """A cut between two Chinese characters leaves no quote or bracket open behind it."""
    text = ("我们今天去了很多地方看了很多风景吃了很多好吃的东西"
            "也认识了很多新朋友大家都非常开心。明天见。")
    got = [s.text for s in run(text, config=SegmenterConfig(first_min_words=0, max_chars=40))]
    assert got[-2:] == ["心。", "明天见。"]  # cut at 40: "...非常开 | 心。"


def cuts(text: str, **kw) -> list[str]:
    """The segments' text with these settings; the same whatever the chunking."""
    config = SegmenterConfig(**kw)
    got = [s.text for s in run(text, config=config)]
    rng = random.Random(text)
    for hi in (1, 3, 7):
        assert [s.text for s in run(text, chunks(text, rng, hi), config)] == got
    return got


@pytest.mark.parametrize(("text", "want"), [
    # square brackets hold their sentences as round ones do
    ("[Note: this is old. See the docs.] Then go on with it.",
     ["[Note: this is old. See the docs.]", "Then go on with it."]),
    # a bracket inside a bracket: closing the inner one leaves the outer one open
    ("(See the notes (page 4). They help a lot.) Then go on.",
     ["(See the notes (page 4). They help a lot.)", "Then go on."]),
    # a quote after a Hebrew word closes (a gershayim stands between two letters: ד"ר)
    ('הוא אמר "שלום" והלך הביתה. אחר כך ישנו.', ['הוא אמר "שלום" והלך הביתה.', "אחר כך ישנו."]),
    # an inch mark opening the reply opens no quote
    ('8" pizzas are small. Order a bigger one today.',
     ['8" pizzas are small.', "Order a bigger one today."]),
    # a German quote (»…«) closed after a space, as French spacing writes it
    ("Er sagte: »Ja. « Dann ging er.", ["Er sagte: »Ja. «", "Dann ging er."]),
    # a quote opened curly and closed straight is closed
    ('He said “fine" and left. Then we went home together.',
     ['He said “fine" and left.', "Then we went home together."]),
])
def test_brackets_and_quotes_open_and_close_in_pairs(text, want):
    assert cuts(text, first_min_words=0) == want


def test_a_greek_question_mark_after_a_one_letter_word_ends_the_sentence():
    assert cuts("Ποιο θες, το Α ή το Β; Πες μου τώρα.", first_min_words=0) == [
        "Ποιο θες, το Α ή το Β;", "Πες μου τώρα."]


def test_the_sentences_after_an_emoji_that_ended_one_are_cut_too():
    assert cuts("Done ✅ Hi. Go on then.") == ["Done ✅", "Hi.", "Go on then."]


@pytest.mark.parametrize(("text", "want"), [
    ('He said "it might be in the— Actually, no" and left. Then he went home.',
     ['He said "it might be in the— Actually, no" and left.', "Then he went home."]),
    ("It might be in the (big— Actually, no) box. Then go.",
     ["It might be in the (big— Actually, no) box.", "Then go."]),
])
def test_a_sentence_broken_off_inside_a_quote_or_brackets_is_not_cut(text, want):
    assert cuts(text) == want


@pytest.mark.parametrize("mark", ['"', "“", "„", "«", "»"])
def test_a_title_after_a_stray_opening_quote_goes_on(mark):
    """A quote left open past quote_max_chars is taken as a stray mark: the sentences after
    it are cut, but not after the title it stands before."""
    text = f"We saw {mark}Dr. Smith at the clinic today. It went well."
    assert cuts(text, first_min_words=0, quote_max_chars=10) == [
        f"We saw {mark}Dr. Smith at the clinic today.", "It went well."]


@pytest.mark.parametrize(("text", "want"), [
    # a citation mark inside brackets: the bracket still holds the next sentence
    ("(It rose.[1] Then it fell.) Okay.", ["(It rose.[1] Then it fell.)", "Okay."]),
    # a bracket closing right after the mark closes one bracket, not two
    ("(We met (twice.) It was fun.) Then go.", ["(We met (twice.) It was fun.)", "Then go."]),
    # an ellipsis character is a pause before a lowercase word, a digit or a sign, and
    # before "I" (as "..." is)
    ("It comes to… $42 in all. Thanks.", ["It comes to… $42 in all.", "Thanks."]),
    ("Well… I think so. Yes.", ["Well… I think so.", "Yes."]),
    # an empty code block is one silent segment; what follows it is cut as usual
    ("```\n```\nThen it ends. Okay go.", ["```\n```", "Then it ends.", "Okay go."]),
])
def test_marks_after_a_sentence_end_decide_as_they_should(text, want):
    assert cuts(text, first_min_words=0) == want


def test_a_code_block_left_open_at_the_end_of_a_reply_is_one_silent_segment():
    """A reply cut off inside a code block opening it: the opt-in first cuts stay out of it
    (its words are no phrase), and none of it is said."""
    text = "```bash\nls -la in the home dir and then\ncd to it"
    seg = Segmenter(SegmenterConfig(first_phrase_words=3))
    got = seg.feed(text) + seg.finish()
    assert [(s.text, s.spoken) for s in got] == [(text, "")]


@pytest.mark.parametrize(("text", "want"), [
    ('It was made in the U.S. "The best," they said.',
     ["It was made in the U.S.", '"The best," they said.']),
    ('It is on Downing St. “That one,” he said.', ["It is on Downing St.", "“That one,” he said."]),
    ("It was made in the U.S. (The rest came later.) Okay.",
     ["It was made in the U.S.", "(The rest came later.)", "Okay."]),
    ('It was J. "Jim" Smith who came.', ['It was J. "Jim" Smith who came.']),  # a nickname
    ("It was made in the U.S. Don't worry.", ["It was made in the U.S.", "Don't worry."]),
])
def test_a_sentence_opening_with_a_quote_or_bracket_after_a_name_or_end_abbreviation(text, want):
    """After "U.S." or "St.", a word that opens sentences ends the one before, also when it
    opens a quote or a bracket (the mark's first letter decides, as after any sentence)."""
    assert cuts(text, first_min_words=0) == want


def test_a_clause_mark_ending_right_at_max_chars_is_where_a_long_sentence_is_cut():
    text = "Well, the home team won the final match, and the fans cheered loudly for them."
    assert len("Well, the home team won the final match,") == 40
    assert cuts(text, max_chars=40, first_min_words=0) == [
        "Well, the home team won the final match,", "and the fans cheered loudly for them."]


def test_first_max_words_never_cuts_before_a_word_opening_with_a_mark():
    """The word after the cut starts with a letter or digit: a quote or bracket opening
    after a cut would be said apart from the words it holds."""
    assert cuts('He told "Bob" all of it today.', first_max_words=2) == [
        'He told "Bob" all', "of it today."]
    assert cuts("He told (Bob) all of it today.", first_max_words=2) == [
        "He told (Bob) all", "of it today."]
    # a carriage return after a space is part of the gap (it is a space), before a mark too
    assert cuts("We went \r(to) the shop and then home.", first_max_words=2) == [
        "We went \r(to) the shop", "and then home."]
    assert cuts("We went \rto the shop and home.", first_max_words=2) == [
        "We went", "to the shop and home."]


@pytest.mark.parametrize(("text", "n", "want"), [
    ("1. Open settings and wait.", 2, ["1. Open settings", "and wait."]),  # "1." is no word
    ("We need the flour; 2 eggs go in next.", 3, ["We need the flour; 2 eggs", "go in next."]),
    ("I am here now.", 1, ["I", "am here now."]),  # a one-letter first word is one
])
def test_first_max_words_counts_words_not_marks_and_keeps_a_number_after_a_semicolon(
        text, n, want):
    assert cuts(text, first_max_words=n, first_min_words=0) == want


@pytest.mark.parametrize(("text", "want"), [
    # an attic floor closes an address as "3. OG" does
    ("Die Wohnung ist in der Hauptstr. 5, 3. DG links. Gut.",
     ["Die Wohnung ist in der Hauptstr. 5, 3. DG links.", "Gut."]),
    # a year opening a line is no list number (those have up to three digits)
    ("Intro here.\n2024. It was a good year.", ["Intro here.", "2024.", "It was a good year."]),
    # a word ending in "tr" is no street ("Hauptstr. 5"): before a number, it ends one
    ("I met Petr. 5 of us went. Okay.", ["I met Petr.", "5 of us went.", "Okay."]),
])
def test_numbers_after_a_dot_in_addresses_lists_and_names(text, want):
    assert cuts(text, first_min_words=0) == want


def test_the_sentences_after_a_word_longer_than_max_chars_are_cut_as_usual():
    url = "https://example.com/" + "a" * 50 + "/b"
    assert cuts(f"See {url} for it. Then go. Okay then.", max_chars=40, first_min_words=0) == [
        "See", url, "for it.", "Then go.", "Okay then."]


@pytest.mark.parametrize(("text", "want"), [
    # a ";" is a Greek question mark after a letter of polytonic Greek too, not after Hindi
    ("Ποῦ εἶ; Ἐνταῦθα εἰμί.", ["Ποῦ εἶ;", "Ἐνταῦθα εἰμί."]),
    ("यह अच्छा है; वह भी ठीक है।", ["यह अच्छा है; वह भी ठीक है।"]),
    # a Roman century with a V is a German ordinal
    ("Es wurde im XV. Jahrhundert gebaut. Schön.",
     ["Es wurde im XV. Jahrhundert gebaut.", "Schön."]),
    # inline code does not run over a newline
    ("Use the `make\nThen` target. Okay.", ["Use the `make", "Then` target.", "Okay."]),
    # a CJK ideograph of plane 2 is no emoji, from its first one on
    ("Well done! \U00020000 is rare. Okay.", ["Well done!", "\U00020000 is rare.", "Okay."]),
    # emoticons stay with the sentence before, a newline after them too
    ("Thanks a lot! =) See you soon.", ["Thanks a lot! =)", "See you soon."]),
    ("Thanks a lot! XD See you soon.", ["Thanks a lot! XD", "See you soon."]),
    ("Thanks a lot! <3 See you soon.", ["Thanks a lot! <3", "See you soon."]),
    ("Thanks a lot! ^_^ See you soon.", ["Thanks a lot! ^_^", "See you soon."]),
    ("That hurt. :'-( See you soon.", ["That hurt. :'-(", "See you soon."]),
    ("Thanks a lot! :)\nSee you soon.", ["Thanks a lot! :)", "See you soon."]),
    # chess: a king's or a rook's move after a move number, a move's "!" or a mark after
    # a check or a mate before the next number end no sentence
    ("1. e4 e5 2. Ke2 Ke7 3. Kd3 draws.", ["1. e4 e5 2. Ke2 Ke7 3. Kd3 draws."]),
    ("1. e4 e5 2. Rf1 Nf6 3. Ra1 draws.", ["1. e4 e5 2. Rf1 Nf6 3. Ra1 draws."]),
    ("It went 3. Nf3 Nf6! 4. Qxf7 mate.", ["It went 3. Nf3 Nf6! 4. Qxf7 mate."]),
    ("It went 3. Bc4 Qxf7+?? 4. Kxf7 mate.", ["It went 3. Bc4 Qxf7+?? 4. Kxf7 mate."]),
    ("It went 3. Bc4 Qxf7#! 4. Kxf7 mate.", ["It went 3. Bc4 Qxf7#! 4. Kxf7 mate."]),
    # a move asked about, then a count that no full stop makes a move number: it ends
    ("Should I play Qe7? 3 of my pieces hang then.",
     ["Should I play Qe7?", "3 of my pieces hang then."]),
    # a citation mark of six numbers is one still
    ("Calcium helps.[1, 2, 3, 4, 5, 6] Most people get enough.",
     ["Calcium helps.[1, 2, 3, 4, 5, 6]", "Most people get enough."]),
])
def test_more_scripts_marks_and_notations_each_rule_holds(text, want):
    assert cuts(text, first_min_words=0) == want


def test_a_newline_right_after_a_word_longer_than_max_chars_cuts_there():
    text = "See " + "x" * 45 + "\nNext line here. Okay."
    assert cuts(text, max_chars=40, first_min_words=0) == [
        "See", "x" * 45, "Next line here.", "Okay."]


def test_a_citation_mark_of_six_numbers_is_not_said_and_one_of_seven_is():
    assert speakable("Calcium helps.[1, 2, 3, 4, 5, 6] Most.") == "Calcium helps. Most."
    text = "Calcium helps.[1, 2, 3, 4, 5, 6, 7] Most."
    assert speakable(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("Well - we went home to the shop.", ["Well - we went", "home to the shop."]),  # "-"
    ("He said ‘go home right now’ and left it.", ["He said ‘go home right now’", "and left it."]),
])
def test_first_max_words_counts_no_dash_and_never_cuts_inside_curly_single_quotes(text, want):
    assert cuts(text, first_max_words=3, first_min_words=0) == want


def test_the_prefix_heard_weighs_each_word_by_the_words_it_is_read_as():
    """``heard_prefix``: "$1,234.56" is read as nine words, "example.org" as three ("example
    dot org"); an emoji is not heard."""
    from gateway.core.segmenter import heard_prefix

    text = "It cost $1,234.56 in total."
    got = [heard_prefix(text, share) for share in (0.1, 0.8, 0.9, 1.0)]
    assert got == ["It", "It cost", "It cost $1,234.56", text]
    assert heard_prefix("See example.org for it.", 0.5) == "See"
    assert heard_prefix("See example.org for it.", 0.8) == "See example.org"
    assert heard_prefix("Hi there now \U0001F389", 1.0) == "Hi there now"
    assert heard_prefix("Hi there now \U0001F389", 0.8) == "Hi there"


@pytest.mark.parametrize(("text", "kw", "want"), [
    # a reply ending right after the dash finishes
    ("It might be in the—", {}, ["It might be in the—"]),
    # the word after may be written with a curly apostrophe
    ("It might be in the— It’s fine, really. Tell me.", {},
     ["It might be in the—", "It’s fine, really.", "Tell me."]),
    # a later piece shorter than min_chars merges with the next, as a short sentence does
    ("Okay. It might be in the— Actually, no.", {"min_chars": 30},
     ["Okay.", "It might be in the— Actually, no."]),
    # a piece ending right at max_chars stands
    ("Well, it might be in the big room— Actually, no. Fine.", {"max_chars": 34},
     ["Well, it might be in the big room—", "Actually, no.", "Fine."]),
    # a winking emoticon after a word is no clause mark: the sentence after it is cut
    ("Sure ;-) That is it. Okay.", {}, ["Sure ;-)", "That is it.", "Okay."]),
])
def test_a_sentence_broken_off_at_an_em_dash_or_after_an_emoticon(text, kw, want):
    assert cuts(text, first_min_words=0, **kw) == want


# --- the eager first cut at a comma inside a name, address or reference ------------------
# (bench/SEGMENTATION.md, "Eager cuts inside a unit": 69 of the 251 eager first cuts of the
# corpus, the fourteen held-out sets and the replay sets fell there)

@pytest.mark.parametrize(("text", "want"), [
    # city, state; street, city; a place and its country
    ("Your parcel is at the depot in Memphis, TN. Expected delivery: Thursday.",
     ["Your parcel is at the depot in Memphis, TN.", "Expected delivery: Thursday."]),
    ("Send it to 221B Baker St., London NW1 6XE. Mark it fragile.",
     ["Send it to 221B Baker St., London NW1 6XE.", "Mark it fragile."]),
    ("The treaty was signed in Washington, D.C. It took effect later.",
     ["The treaty was signed in Washington, D.C.", "It took effect later."]),
    # a name and its title, a weekday and its date, a score
    ("Your appointment is with Dr. Okafor, M.D., on Wed. at 10:15 a.m.",
     ["Your appointment is with Dr. Okafor, M.D.,", "on Wed. at 10:15 a.m."]),
    ("The meeting moved to Wed., Nov. 12 at noon.",
     ["The meeting moved to Wed., Nov. 12 at noon."]),
    ("Final score: Celtics 112, Heat 108. Tatum had 41.",
     ["Final score: Celtics 112, Heat 108.", "Tatum had 41."]),
])
def test_an_eager_comma_before_a_capitalised_word_does_not_cut(text, want):
    """A capitalised word after the comma goes on the name, place or date the comma is
    inside: the first segment ends at the next clause mark or sentence end instead."""
    assert cuts(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("The flight is AA 1402, dep. 07:15, arr. 10:40. The gate closes at 06:55.",
     ["The flight is AA 1402, dep. 07:15, arr. 10:40.", "The gate closes at 06:55."]),
    ("Call us at (555) 010-0199, ext. 204. Ask for Dana.",
     ["Call us at (555) 010-0199, ext. 204.", "Ask for Dana."]),
    ("The figures are in vol. 3, ch. 7, pp. 201–5. Footnote 12 cites it.",
     ["The figures are in vol. 3, ch. 7, pp. 201–5.", "Footnote 12 cites it."]),
    ("Vive en la C/ Mayor, n.º 5, 2.º B. Llámala antes.",
     ["Vive en la C/ Mayor, n.º 5, 2.º B.", "Llámala antes."]),
])
def test_an_eager_comma_before_an_abbreviation_and_a_number_does_not_cut(text, want):
    """An abbreviation of six characters at most, then a number: an extension, a page, a
    house number, a departure time."""
    assert cuts(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("I'm not a lawyer, but here's the idea.", ["I'm not a lawyer,", "but here's the idea."]),
    ("We looked at it last week, I think.", ["We looked at it last week,", "I think."]),
    ("We looked at it last week, I'm sure.", ["We looked at it last week,", "I'm sure."]),
    ("Use the short form, i.e. the one without a dash.",
     ["Use the short form,", "i.e. the one without a dash."]),
    ("Soak the beans overnight, approx. 8 hours.",
     ["Soak the beans overnight,", "approx. 8 hours."]),
    ("Bring pens, paper, chargers, etc. We'll provide lunch.",
     ["Bring pens, paper, chargers,", "etc.", "We'll provide lunch."]),
])
def test_an_eager_comma_before_a_clause_still_cuts(text, want):
    """Lowercase words, "I", an abbreviation before no number, one longer than six
    characters ("approx."): the clause boundary stands."""
    assert cuts(text) == want


def test_the_eager_comma_waits_for_the_word_after_it():
    """The word after the comma decides as soon as its letters can begin no abbreviation of
    a unit ("b" of "bldg." waits, "bu" cuts) and at once when it is capitalised ("T"; "I"
    waits for the next letter). An abbreviation waits for the number after it."""
    seg = Segmenter()
    assert seg.feed("The parcel is in Memphis, ") == []
    assert seg.feed("b") == []
    assert [s.text for s in seg.feed("u")] == ["The parcel is in Memphis,"]
    seg = Segmenter()
    assert seg.feed("The parcel is in Memphis, ") == []
    assert seg.feed("I") == []
    assert [s.text for s in seg.feed(" ")] == ["The parcel is in Memphis,"]
    seg = Segmenter()
    assert seg.feed("Call the front desk on (555) 201-3344, ext.") == []
    assert [s.text for s in seg.feed(" 12. Thanks.") + seg.finish()] == [
        "Call the front desk on (555) 201-3344, ext. 12.", "Thanks."]
    seg = Segmenter()
    assert seg.feed("The parcel is in Memphis, ") == []
    assert seg.feed("T") == []
    assert [s.text for s in seg.feed("N. Exp")] == ["The parcel is in Memphis, TN."]
    assert [s.text for s in seg.feed("ected today.") + seg.finish()] == ["Expected today."]


def test_first_max_words_keeps_its_cut_at_a_units_comma():
    """Kept whole by the comma, the unit would be cut one word later by the word count
    ("Celtics 112, Heat | 108"): with first_max_words the comma's cut stands."""
    assert cuts("Final score: Celtics 112, Heat 108.", first_max_words=4) == [
        "Final score: Celtics 112,", "Heat 108."]
    assert cuts("Final score: Celtics 112, Heat 108.", first_phrase_words=3) == [
        "Final score: Celtics 112, Heat 108."]
