"""What English voices are given for notations they misread (``engines.spell.english_readings``):
espeak's English voices (``espeak_text(english=True)``) and the engines that read digits
badly (``spell_out``, chatterbox). Other languages' espeak voices are given the text as it was.
"""

from __future__ import annotations

import pytest

from engines import espeak
from engines.spell import english_readings, spell_out
from gateway.core.segmenter import speakable
from tests.conftest import synthesized


def samples(engine, text: str, voice: str = "en-us") -> int:
    """How many samples espeak makes for ``text`` (``text`` as the gateway gives it)."""
    return len(synthesized(engine, text, voice)) // 2


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


# --- phone numbers ------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("Call 555-0142.", "Call 5 5 5, 0 1 4 2.", "Call five five five, zero one four two."),
    ("Dial (415) 555-0142 or +1 415 555 0142.",
     "Dial 4 1 5, 5 5 5, 0 1 4 2 or plus 1, 4 1 5, 5 5 5, 0 1 4 2.",
     "Dial four one five, five five five, zero one four two or plus one, four one five, "
     "five five five, zero one four two."),
    ("It's 1-800-555-0199 or 415.555.0142.",
     "It's 1, 8 0 0, 5 5 5, 0 1 9 9 or 4 1 5, 5 5 5, 0 1 4 2.",
     "It's one, eight zero zero, five five five, zero one nine nine or four one five, "
     "five five five, zero one four two."),
    ("London: +44 20 7946 0958", "London: plus 4 4, 2 0, 7 9 4 6, 0 9 5 8",
     "London: plus four four, two zero, seven nine four six, zero nine five eight"),
])
def test_phone_numbers_are_read_digit_by_digit(text, english, spelled) -> None:
    # espeak read amounts: "555-0142" was "five hundred fifty-five dash zero one forty-two"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "Take I-95.", "SSN 123-45-6789", "ZIP 02139-4307", "v1.555-0142", "Add +5 10 20.",
    "+1.5 2.3",
])
def test_dates_and_codes_are_no_phone_number(text) -> None:
    assert english_readings(text) == text


@pytest.mark.parametrize(("text", "english"), [
    ("Aim for 100-1000 words, or 500-1500.", "Aim for 100 to 1000 words, or 500 to 1500."),
    ("In 2019-2020.", "In 2019 to 2020."),
    ("A 9-5 job. Ages 3-5.", "A 9 to 5 job. Ages 3 to 5."),  # (no score either)
])
def test_ranges_are_no_phone_number(text, english) -> None:
    assert english_readings(text) == english


# --- ISO dates ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("On 2026-12-02 at 10.", "On December 2nd, 2026 at 10.",
     "On December second, twenty twenty-six at ten."),
    ("2024-05-01, 2023-11-11 and 1999-12-31.",
     "May 1st, 2024, November 11th, 2023 and December 31st, 1999.",
     "May first, twenty twenty-four, November eleventh, twenty twenty-three and December "
     "thirty-first, nineteen ninety-nine."),
])
def test_iso_dates_are_read_as_dates(text, english, spelled) -> None:
    # espeak: "two thousand twenty-six dash twelve dash zero two"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "2026-12-02T10:00Z", "2026-13-02", "12026-12-02", "2026-12-021", "build 2026-12-02.1",
])
def test_no_date_but_an_iso_date_is_read_as_one(text) -> None:
    assert english_readings(text) == text


# --- numbers grouped with dots -------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("It sold 1.000.000 copies.", "It sold 1,000,000 copies.", "It sold one million copies."),
    ("Between 1.234.567 and 1.000.000.000.", "Between 1,234,567 and 1,000,000,000.",
     "Between one million two hundred thirty-four thousand five hundred sixty-seven and one "
     "billion."),
])
def test_numbers_grouped_with_dots_are_read_as_numbers(text, english, spelled) -> None:
    # espeak: "one point zero zero zero point zero zero zero"; chatterbox "one dot zero dot zero"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "Ping 10.100.100.100 or 192.168.1.1.", "v1.2.3 and 2.4.1", "1.000", "1.000.000,50",
])
def test_addresses_versions_and_decimals_keep_their_dots(text) -> None:
    assert english_readings(text) == text


# --- fractions and units per unit ---------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("Add 1/2 cup and 3/4 tsp.", "Add one half cup and three quarters tsp.",
     "Add one half cup and three quarters tsp."),
    ("1 1/2 cups, 2 3/4 inches, 2/3 of it, 5/8 inch.",
     "1 and a half cups, 2 and three quarters inches, two thirds of it, five eighths inch.",
     "one and a half cups, two and three quarters inches, two thirds of it, five eighths "
     "inch."),
    ("At 60 km/h, 1 km/h or 3.5 m/s; speeds in km/h.",
     "At 60 kilometers per hour, 1 kilometer per hour or 3.5 meters per second; speeds in "
     "kilometers per hour.",
     "At sixty kilometers per hour, one kilometer per hour or three point five meters per "
     "second; speeds in kilometers per hour."),
    ("Open 24/7 at 100 MB/s.", "Open 24 7 at 100 megabytes per second.",
     "Open twenty-four seven at one hundred megabytes per second."),
])
def test_fractions_and_units_per_unit_are_said(text, english, spelled) -> None:
    # espeak: "one slash two cup", "sixty K M slash H"; chatterbox "one/two cup"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "Due 3/4, by 1/2.", "On 1/2/2026 or 12/25.", "9/11", "50/50", "Rated 4/5, 8/10.",
    "Step 1/3: mix.", "It is 2.5/4 or 1/2.5.", "and/or", "4/4 time", "in m/s",
])
def test_dates_ratings_and_counts_keep_their_slash(text) -> None:
    assert english_readings(text) == text


# --- sharps and flats ----------------------------------------------------------------------

def test_sharps_and_flats_are_said() -> None:
    # espeak: "C hash and F hash"
    check("Learn C# and F#; play C# minor, B\u266d and F\u266f.",
          "Learn C sharp and F sharp; play C sharp minor, B flat and F sharp.",
          "Learn C sharp and F sharp; play C sharp minor, B flat and F sharp.")


@pytest.mark.parametrize("text", ["#C", "F#m", "A#1", "Q#", "AB#", "C++", "#FF5733", "#1e90ff",
                                  "page#top", "&#39;"])
def test_codes_and_colours_keep_their_hash(text) -> None:
    assert english_readings(text) == text


def test_a_number_sign_is_said_and_a_hashtags_mark_is_not() -> None:
    # espeak: "hash one", "hash python"; chatterbox: "#one"
    check("The #1 pick, #2nd place: #python and #AI_news.",
          "The number 1 pick, number 2nd place: python and AI_news.",
          "The number one pick, number second place: python and AI_news.")


# --- ratios, scores, feet and inches ---------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("It takes 3-5 business days, or 25\u201330 minutes.",
     "It takes 3 to 5 business days, or 25 to 30 minutes.",
     "It takes three to five business days, or twenty-five to thirty minutes."),
    ("From 1990-1995, the 2023-24 season, 1.5-2.5 volts.",
     "From 1990 to 1995, the 2023 to 24 season, 1.5 to 2.5 volts.",
     "From nineteen ninety to nineteen ninety-five, the twenty twenty-three to twenty-four "
     "season, one point five to two point five volts."),
])
def test_a_range_of_numbers_is_said_with_to(text, english, spelled) -> None:
    check(text, english, spelled)


@pytest.mark.parametrize("text", ["COVID-19 and MP3-2 stay.", "A 3-4-5 triangle.",
                                  "It fell -5-3 today."])
def test_what_is_not_a_range_keeps_its_dash(text) -> None:
    assert english_readings(text) == text


@pytest.mark.parametrize("text", ["As it says in Genesis 1:1, light came first.",
                                  "Then read Psalm 23:4 and Ps. 1:3 again."])
def test_a_chapter_and_verse_is_not_a_ratio(text) -> None:
    """(A verse of one digit looked like a ratio: "Genesis 1 to 1".)"""
    assert english_readings(text) == text


def test_a_ratio_opening_a_sentence_after_a_capitalised_word_is_still_one() -> None:
    assert english_readings("Use 16:9 here.") == "Use 16 to 9 here."


@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("They won 2:1, a 16:9 screen at 1:100 or 1:50,000.",
     "They won 2 to 1, a 16 to 9 screen at 1 to 100 or 1 to 50,000.",
     "They won two to one, a sixteen to nine screen at one to one hundred or one to fifty "
     "thousand."),
    ("We won 3-1, Arsenal beat them 21:19 in a 2-0 win.",
     "We won 3 to 1, Arsenal beat them 21 to 19 in a 2 to 0 win.",
     "We won three to one, Arsenal beat them twenty-one to nineteen in a two to zero win."),
])
def test_ratios_and_scores_are_said(text, english, spelled) -> None:
    # espeak: "two colon one", "three dash one"; chatterbox: "two:one", "three-one"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "At 11:15 or 9:05.", "It ended at 10:30.", "They led by 9:45.", "John 3:16",
])
def test_times_and_verses_are_no_score(text) -> None:
    assert english_readings(text) == text


@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("He is 5'11\" and she 5\u2032 4\u2033, the door 7'.",
     "He is 5 feet 11 inches and she 5 feet 4 inches, the door 7 feet.",
     "He is five feet eleven inches and she five feet four inches, the door seven feet."),
    ("Use a 9\" pan or a 1\" strip; a 15.6\u2033 screen.",
     "Use a 9-inch pan or a 1-inch strip; a 15.6-inch screen.",
     "Use a nine-inch pan or a one-inch strip; a fifteen point six-inch screen."),
    ("An 8' ladder by a 6\u2032 fence, the 65\" TV; it is 9\" wide, a 9\" or 10\" pan.",
     "An 8-foot ladder by a 6-foot fence, the 65-inch TV; it is 9 inches wide, a 9-inch "
     "or 10-inch pan.",
     "An eight-foot ladder by a six-foot fence, the sixty-five-inch TV; it is nine inches "
     "wide, a nine-inch or ten-inch pan."),
    # a pair before its noun: each is one word ("a 9 inches or 10 inches pan" before)
    ("A 6' or 8' fence, the 9\" by 13\" pan and a 9\" and a 10\" pan; 9\" or 10\" wide.",
     "A 6-foot or 8-foot fence, the 9-inch by 13-inch pan and a 9-inch and a 10-inch pan; "
     "9 inches or 10 inches wide.",
     "A six-foot or eight-foot fence, the nine-inch by thirteen-inch pan and a nine-inch and "
     "a ten-inch pan; nine inches or ten inches wide."),
])
def test_feet_and_inches_are_said(text, english, spelled) -> None:
    # espeak: "five eleven", "nine" and a pause; chatterbox: "five'eleven\"", "nine\"";
    # before its noun, after "a", "an" or "the", a length says "a 9-inch pan" (was "a 9
    # inches pan")
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    'He said "take 9" and left.', "She said 'buy 6' then.", "In the '90s.", "It's 5'o",
])
def test_a_quotations_closing_mark_is_no_inch_or_foot(text) -> None:
    assert english_readings(text) == text


# --- Roman numerals ------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("Henry VIII's wives; Elizabeth I of England.",
     "Henry the eighth's wives; Elizabeth the first of England.",
     "Henry the eighth's wives; Elizabeth the first of England."),
    ("After Elizabeth I, King Charles III and Pope John Paul II.",
     "After Elizabeth the first, King Charles the third and Pope John Paul the second.",
     "After Elizabeth the first, King Charles the third and Pope John Paul the second."),
    ("World War I and World War II; Chapter IV, Part I, Act III, Volume XII; Type I error.",
     "World War 1 and World War 2; Chapter 4, Part 1, Act 3, Volume 12; Type 1 error.",
     "World War one and World War two; Chapter four, Part one, Act three, Volume twelve; "
     "Type one error."),
])
def test_roman_numerals_of_rulers_and_parts_are_said(text, english, spelled) -> None:
    # espeak: "Henry roman eight", "Elizabeth I" as the pronoun, "Chapter roman four"
    check(text, english, spelled)


@pytest.mark.parametrize("text", [
    "Robert I think so.", "I told Peter I loved it.", "Part I don't get is this.",
    "Elizabeth I'm sure.", "Elizabeth I was queen.", "Malcolm X spoke.", "Plan B", "MIX",
    "CIVIC", "DC", "MD", "Rocky IV", "Henry IIII", "Sorry I was late.", "Then I went.",
])
def test_no_numeral_but_a_rulers_or_a_parts(text) -> None:
    assert english_readings(text) == text


# --- powers -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english", "spelled"), [
    ("So x^2 grows, not 2^3.", "So x squared grows, not 2 cubed.",
     "So x squared grows, not two cubed."),
    ("10^6 and 2^{10}, e^-1, (a+b)^2", "10 to the power of 6 and 2 to the power of 10, e to "
     "the power of \u22121, (a+b) squared",
     "ten to the power of six and two to the power of ten, e to the power of minus one, (a+b) "
     "squared"),
    ("x\u00b2 and m\u00b3", "x squared and m cubed", "x squared and m cubed"),
])
def test_powers_with_a_digit_exponent_are_said(text, english, spelled) -> None:
    # espeak was silent for "^": "x^2" was "x two", "10^6" "ten six"
    assert espeak.espeak_text(text, english=True) == english
    assert spell_out(text) == spelled


@pytest.mark.parametrize("text", ["x^n", "x^2.5", "^2", "a ^ b"])
def test_other_carets_stay(text) -> None:
    assert english_readings(text) == text


def test_latex_power_reads_in_english() -> None:
    # "$x^2$" was "dollar x two dollar"; speakable drops the delimiters for every language
    assert espeak.espeak_text(speakable("So $x^2$ grows."), english=True) == "So x squared grows."


# --- units and signs for engines that read digits badly (chatterbox) -----------------------

@pytest.mark.parametrize(("text", "spelled"), [
    ("Meet at 3pm or 10 AM, not 10:30pm or 10:00 am.",
     "Meet at three P M or ten A M, not ten thirty P M or ten A M."),
    ("Meet me at 2 pm. Or at 9 a.m. then.", "Meet me at two P M. Or at nine A M then."),
    ("Run 5km, 1 km, lift 10kg, store 20GB or 2.5 GB, add 100g.",
     "Run five kilometers, one kilometer, lift ten kilograms, store twenty gigabytes or two "
     "point five gigabytes, add one hundred grams."),
    ("Wait 5 min, 2 hrs or 300 ms; it weighs 1 lb, 8 oz.",
     "Wait five minutes, two hours or three hundred milliseconds; it weighs one pound, eight "
     "ounces."),
    ("Done 10 min. ago, 5 min., in 1 hr. 35 min. Then 1 min.",
     "Done ten minutes ago, five minutes, in one hour thirty-five minutes. Then one minute."),
    ("It is 20\u00b0C (68\u00b0F), -5\u00b0C at night; a 90\u00b0 turn.",
     "It is twenty degrees Celsius (sixty-eight degrees Fahrenheit), minus five degrees "
     "Celsius at night; a ninety degrees turn."),
    ("\u20ac5, \u20ac5.50, \u00a320, \u00a31.01, 5\u20ac, \u20ac1.5 million, \u00a33bn.",
     "five euros, five euros and fifty cents, twenty pounds, one pound and one penny, five "
     "euros, one point five million euros, three billion pounds."),
    ("\u00b12% and 5 \u00b1 0.1",
     "plus or minus two percent and five plus or minus zero point one"),
    ("5G, 4K video, a 7B model, 3D, 1400\u4e07", "five G, four K video, a seven B model, "
     "three D, fourteen hundred\u4e07"),
    # a decimal comma, yen: they were "twelve euros,fifty", "\u00a5five hundred"
    ("\u20ac12,50, $3,99, \u00a31,250 and \u00a5500.",
     "twelve euros and fifty cents, three dollars and ninety-nine cents, one thousand two "
     "hundred fifty pounds and five hundred yen."),
])
def test_chatterbox_is_given_units_and_signs_as_words(text, spelled) -> None:
    # they were "threepm", "fivekm", "twenty\u00b0C", "\u20acfive", "\u00b1two", "fourK"
    assert spell_out(text) == spelled
    assert spell_out(spelled) == spelled


@pytest.mark.parametrize(("text", "spelled"), [
    ("It opens at 9:00 and shuts at 12:00.",
     "It opens at nine o'clock and shuts at twelve o'clock."),
    ("The train leaves at 14:00, the last at 23:00.",
     "The train leaves at fourteen hundred, the last at twenty-three hundred."),
    # the hour 0 of a 24-hour clock was "zero o'clock"
    ("The shop shuts at 0:00; the sale ends at 00:00.",
     "The shop shuts at midnight; the sale ends at midnight."),
])
def test_whole_hours_are_said_as_a_clock_says_them(text, spelled) -> None:
    assert spell_out(text) == spelled
    assert spell_out(spelled) == spelled


@pytest.mark.parametrize("text", ["Meet at 3pm.", "Run 5km.", "Store 20GB.", "It is 20\u00b0C."])
def test_espeak_reads_units_itself(text) -> None:
    # "three P M", "five K M", "twenty G B", "twenty degrees C": left to espeak
    assert espeak.espeak_text(text, english=True) == text


# --- amounts (espeak) ----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "english"), [
    ("It costs $184.50 today.", "It costs 184 dollars 50 cents today."),
    ("$5, $1.00, $.50, $0.01, $1,234.56",
     "5 dollars, 1 dollar, 50 cents, 1 cent, 1,234 dollars 56 cents"),
    ("$1.5 million, $85.8B, $85k, \u00a33bn, \u20ac2 billion",
     "1.5 million dollars, 85.8 billion dollars, 85 thousand dollars, 3 billion pounds, "
     "2 billion euros"),
    ("\u20ac5.50, \u00a320, \u00a31.01, \u00a5500",
     "5 euros 50 cents, 20 pounds, 1 pound 1 penny, 500 yen"),
    # a decimal comma (two digits: a thousands group has three): "€12,50" was "1 euro2,50"
    ("Lunch was \u20ac12,50, coffee \u20ac3,99 and rent \u20ac1,250.",
     "Lunch was 12 euros 50 cents, coffee 3 euros 99 cents and rent 1,250 euros."),
    ("From $5\u2013$8, less than $5, -$5.", "From 5 dollars to 8 dollars, less than 5 dollars, "
     "\u22125 dollars."),
])
def test_espeak_says_an_amounts_unit_after_its_number(text, english) -> None:
    # espeak put the sign first and read the cents as decimals: "$184.50" was "dollar one
    # hundred eighty-four point five zero"; chatterbox already had them right
    assert espeak.espeak_text(text, english=True) == english
    assert espeak.espeak_text(text) == text


@pytest.mark.parametrize("text", ["US$5", "$x$", "$ 5", "5$", "$1.2.3", "\u20ac1.234,56",
                                  "\u20ac1,5 Mio."])
def test_no_amount_but_a_sign_before_a_number(text) -> None:
    assert espeak.espeak_text(text, english=True) == text


# --- what espeak says (the real library) ----------------------------------------------

@pytest.mark.parametrize(("text", "reading"), [
    # was "seven five" with a pause: 1.26 s against 1.73 s for the words
    ("7 > 5.", "7 greater than 5."),
    # was "five hundred fifty-five dash zero one forty-two"
    ("Call 555-0142.", "Call 5 5 5, 0 1 4 2."),
    # was "two thousand twenty-six dash twelve dash zero two"
    ("On 2026-12-02.", "On December 2nd, 2026."),
    # was "one point zero zero zero point zero zero zero"
    ("It sold 1.000.000 copies.", "It sold 1,000,000 copies."),
    # was "one slash two cup", "sixty K M slash H"
    ("Add 1/2 cup at 60 km/h.", "Add one half cup at 60 kilometers per hour."),
    # was "C hash and F hash"
    ("C# and F#.", "C sharp and F sharp."),
    # was "Henry roman eight", "World War roman two"
    ("Henry VIII and World War II.", "Henry the eighth and World War 2."),
    # was "x two", "ten six"
    ("So x^2 or 10^6.", "So x squared or 10 to the power of 6."),
    # was "dollar one hundred eighty-four point five zero"
    ("It costs $184.50.", "It costs 184 dollars 50 cents."),
    # was "one euro two fifty"
    ("Lunch was \u20ac12,50.", "Lunch was 12 euros 50 cents."),
    # was "yen five hundred"
    ("It was \u00a5500.", "It was 500 yen."),
    # was "two colon one", "sixteen colon nine", "three dash one"
    ("Won 2:1 on a 16:9 screen; we lost 3-1.",
     "Won 2 to 1 on a 16 to 9 screen; we lost 3 to 1."),
    # was "hash one", "hash python"
    ("The #1 pick is #python.", "The number 1 pick is python."),
    # was "five eleven", "nine" and a pause
    ("He is 5'11\", with a 9\" pan.", "He is 5 feet 11 inches, with a 9-inch pan."),
    # was "three dash five", "twenty five thirty"
    ("It takes 3-5 days, or 25\u201330 minutes.", "It takes 3 to 5 days, or 25 to 30 minutes."),
], ids=["comparison", "phone", "iso date", "dotted thousands", "fraction", "sharp", "roman",
        "power", "amount", "decimal comma", "yen", "ratio and score", "number sign",
        "feet and inches", "range"])
def test_espeak_says_what_it_misread(espeak_engine, text, reading) -> None:
    # the same length as the reading written out (the German voice: ``check``)
    assert samples(espeak_engine, text) == pytest.approx(samples(espeak_engine, reading),
                                                       rel=0.02)
