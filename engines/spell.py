"""Text for engines that read digits and abbreviations badly (``reads_digits = False``):
numbers, currency ($ € £), percentages, times, dates, ordinals, units after a number
("5km", "20°C") and common abbreviations written out as English words ("$184.50" -> "one
hundred eighty-four dollars and fifty cents").

Pure text in, text out. The gateway's segmenter applies it when every engine that may speak
needs it; a fallback engine that needs it while the primary does not applies it to the
segments it takes over (``engines.fallback``).

``english_readings`` is the part every English voice needs, whether or not it reads digits:
notations no engine says right ("7 > 5" was "seven five"). ``spell_out`` starts with it,
and espeak's English voices get it too (``engines.espeak.espeak_text``); it leaves digits
as digits, so each engine reads the numbers its own way.
"""

from __future__ import annotations

import re
from collections.abc import Callable


def spell_out(text: str) -> str:
    """``text`` with its numbers and abbreviations as words (idempotent)."""
    text = english_readings(text)
    for pattern, repl in _ABBREVIATIONS:
        text = pattern.sub(repl, text)
    return _numbers_to_words(text)


_UNITS = {
    unit: (one, many)
    for names, one, many in (
        ("km", "kilometer", "kilometers"), ("cm", "centimeter", "centimeters"),
        ("mm", "millimeter", "millimeters"), ("kg", "kilogram", "kilograms"),
        ("g", "gram", "grams"), ("mg", "milligram", "milligrams"),
        ("ml mL", "milliliter", "milliliters"), ("TB", "terabyte", "terabytes"),
        ("GB", "gigabyte", "gigabytes"), ("MB", "megabyte", "megabytes"),
        ("KB kB", "kilobyte", "kilobytes"), ("GHz", "gigahertz", "gigahertz"),
        ("MHz", "megahertz", "megahertz"), ("kHz", "kilohertz", "kilohertz"),
        ("Hz", "hertz", "hertz"), ("mph", "mile per hour", "miles per hour"),
        ("kph", "kilometer per hour", "kilometers per hour"), ("lb lbs", "pound", "pounds"),
        ("oz", "ounce", "ounces"), ("ft", "foot", "feet"), ("ms", "millisecond", "milliseconds"),
        ("min mins", "minute", "minutes"), ("hr hrs", "hour", "hours"),
        ("sec secs", "second", "seconds"),
    )
    for unit in names.split()
}
"""Unit abbreviations after a number (as written: "5 Mb" is no megabyte), singular after 1."""

_ABBREVIATIONS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"\bDr\.(?=\s+[A-Z])"), "Doctor"),
    (re.compile(r"\bMr\.(?=\s)"), "Mister"),
    (re.compile(r"\bMrs\.(?=\s)"), "Missus"),
    (re.compile(r"\bMs\.(?=\s)"), "Miz"),
    (re.compile(r"\bProf\.(?=\s)"), "Professor"),
    (re.compile(r"\be\.g\.(?=\s|,)", re.I), "for example"),
    (re.compile(r"\bi\.e\.(?=\s|,)", re.I), "that is"),
    (re.compile(r"\betc\."), "et cetera."),
    (re.compile(r"\bvs\.?(?=\s)"), "versus"),
    (re.compile(r"\b([ap])\.m\.", re.I), lambda m: m.group(1).upper() + " M"),
    (re.compile(r"\bapprox\.(?=\s)"), "approximately"),
    (re.compile(r"\bU\.S\."), "U S"),
    (re.compile(r"&"), " and "),
    # a range: "20–22°C" was "twenty twenty-two", "1–2 hrs" "one two"
    (re.compile(r"(?<=[\d%M])\s?\u2013\s?(?=\$?\d)"), " to "),
    # glued to a number, these were one word: "3pm" was "threepm", "5km" "fivekm"
    (re.compile(r"(?<=\d)(?<!:\d\d)\s?([ap])\.?m\b(?!\.\w)", re.I),
     lambda m: " " + m.group(1).upper() + " M"),
    (re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)\s?(" + "|".join(
        sorted(map(re.escape, _UNITS), key=len, reverse=True)) + r")(?![\w/])"
        r"(?:\.(?=[,;:]|\s+[a-z\d]))?"),  # "5 min. ago": the abbreviation's dot goes too
     lambda m: m.group(1) + " " + _UNITS[m.group(2)][m.group(1) != "1"]),
    (re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)?)\s?\u00b0(?:\s?([CF])(?!\w))?"),
     lambda m: m.group(1) + (" degree" if m.group(1) == "1" else " degrees")
     + {"C": " Celsius", "F": " Fahrenheit", None: ""}[m.group(2)]),
    (re.compile(r"\s*\u00b1\s*"), lambda m: (" " if m.start() else "") + "plus or minus "),
    (re.compile(r"(?<![\w.,])(\d+(?:\.\d{1,2})?)\s?([\u20ac\u00a3])(?![\w\d])"),
     lambda m: m.group(2) + m.group(1)),  # "5€" as "€5"
]


# --- notations every English voice needs (espeak's too) ----------------------------------

_Rule = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]

_OPERAND = r"(?=[-\u2212+$\u20ac\u00a3(.]?\d)"
"""A comparison's right side is a number: "7 > 5", "<5%", "x >= -1"."""


_MENU_STEP = re.compile(r"\b[A-Z][a-z]+\s*$")
"""A capitalised word before ``>``: a step of a menu path ("Settings > Devices > Add",
"Wi-Fi > 5 GHz"), no comparison."""


def _spaced(words: str) -> Callable[[re.Match[str]], str]:
    """``words`` in place of the match, a space either side (none at the very start); an
    ASCII sign after a menu step (``_MENU_STEP``) stays."""
    def say(m: re.Match[str]) -> str:
        if m.group().strip() in "<>" and _MENU_STEP.search(m.string, 0, m.start()):
            return m.group()
        return (" " if m.start() else "") + words + " "
    return say


_COMPARISONS: list[_Rule] = [
    (re.compile(pattern), _spaced(words))
    for words, signs in (("less than or equal to", ("<=", "\u2264")),
                         ("greater than or equal to", (">=", "\u2265")),
                         ("not equal to", ("!=", "\u2260")),
                         ("less than", ("<",)), ("greater than", (">",)),
                         ("approximately", ("\u2248",)))
    for pattern in (
        # a sign of its own: only ever a comparison
        *(rf"\s*{sign}\s*" for sign in signs if not sign.isascii()),
        # ASCII: before a number, or spaced between two single letters ("x > y"), never in
        # an arrow or a tag ("->", "=>", "<div>", "<<")
        *(rf"\s*(?<![-=<>!]){sign}(?![-=<>])\s*(?:{_OPERAND}|(?<=\b\w\s{sign}\s)(?=\w\b))"
          for sign in signs if sign.isascii()),
    )
]
"""Comparison signs. espeak says nothing for ``<`` and ``>`` ("7 > 5" was "seven five") and
chatterbox nothing for any of them; espeak's own "less or equal to" is said the same way."""


_PHONE = re.compile(
    r"(?<![\w+.,/-])(?:"
    r"\+\d{1,3}(?:[-. ]\(?\d{1,4}\)?){2,5}"  # +1 415 555 0142, +44 20 7946 0958
    r"|(?:\+?1[-. ]?)?\(\d{3}\)[-. ]?\d{3}[-. ]\d{4}"  # (415) 555-0142
    r"|(?:1[-. ])?\d{3}([-.])\d{3}\1\d{4}"  # 415-555-0142, 1-800-555-0199, 415.555.0142
    r"|\d{3}-\d{4}"  # 555-0142
    r")(?![\w-]|[.,]\d)")
"""A phone number: espeak read it as amounts ("555-0142" was "five hundred fifty-five dash
zero one forty-two"), chatterbox too ("five hundred fifty-five-zero one four two")."""


def _phone(m: re.Match[str]) -> str:
    """Each digit apart, a pause between groups: "555-0142" -> "5 5 5, 0 1 4 2"."""
    whole = m.group()
    groups = re.findall(r"\d+", whole)
    if len(groups) == 2 and groups[0][-1] == groups[1][-1] == "0" and groups[1][0] != "0":
        return whole  # "100-1000", "500-1500 words": a range
    if whole[0] == "+" and not 8 <= sum(map(len, groups)) <= 15:
        return whole  # no international number (E.164: up to 15 digits)
    return ("plus " if whole[0] == "+" else "") + ", ".join(" ".join(g) for g in groups)


_ISO_DATE = re.compile(
    r"(?<![\w.,/-])(1\d{3}|20\d{2})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?![\w-]|[.,]\d)")
"""A date as ISO 8601 writes it: espeak read "2026-12-02" group by group ("two thousand
twenty-six dash twelve dash zero two"), chatterbox "twenty twenty-six-twelve-two"."""
_MONTH_NAMES = ("January February March April May June July August September October "
                "November December").split()


def _iso_date(m: re.Match[str]) -> str:
    """ "2026-12-02" -> "December 2nd, 2026"."""
    day = int(m.group(3))
    suffix = "th" if 10 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{_MONTH_NAMES[int(m.group(2)) - 1]} {day}{suffix}, {m.group(1)}"


_DOTTED_THOUSANDS = re.compile(r"(?<![\w.,])\d{1,3}(?:\.\d{3}){2,}(?![\w]|[.,]\d)")
"""A number grouped with dots, as German, Spanish or Italian write it: an English voice read
"1.000.000" as "one point zero zero zero point zero zero zero" (chatterbox "one dot zero dot
zero"). Two dots or more: "1.000" alone may be a decimal."""


def _dotted_thousands(m: re.Match[str]) -> str:
    """ "1.000.000" -> "1,000,000"; an IPv4 address ("10.100.100.100") stays."""
    parts = m.group().split(".")
    if len(parts) == 4 and all(p == "0" or p[0] != "0" and int(p) <= 255 for p in parts):
        return m.group()
    return ",".join(parts)


_FRACTION = re.compile(
    r"(?<![\w/.,:-])(?:(\d+) )?([1-9])/(2|3|4|6|8|16)(?![\w/]|[.,]\d)")
"""A common fraction, alone or after a whole number: espeak read "1/2 cup" as "one slash
two cup", chatterbox "one/two cup". The denominators recipes and measures use; not 5 or 10,
which are mostly ratings ("4/5 stars", "8/10")."""
_DENOMINATORS = {2: "half", 3: "third", 4: "quarter", 6: "sixth", 8: "eighth", 16: "sixteenth"}
_NO_FRACTION_AFTER = frozenset(
    "on by until till from since due before after page step part slide question item episode "
    "chapter round day week game".split())
"""A fraction after these is a date or a count ("due 3/4", "step 1/3"): it stays."""


def _fraction(m: re.Match[str]) -> str:
    """ "3/4" -> "three quarters", "1 1/2" -> "1 and a half"; "due 3/4" (a date) stays."""
    whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
    words = m.string[:m.start()].split()
    if num >= den or (words and words[-1].lower() in _NO_FRACTION_AFTER and not whole):
        return m.group()
    name = _DENOMINATORS[den]
    if num == 1:
        part = ("a " if whole else "one ") + name
    else:
        part = _ONES[num] + " " + ("halves" if den == 2 else name + "s")
    return f"{whole} and {part}" if whole else part


_PER = {"km/h": ("kilometer", "hour"), "m/s": ("meter", "second"), "km/s": ("kilometer", "second"),
        "ft/s": ("foot", "second"), "mi/h": ("mile", "hour"), "MB/s": ("megabyte", "second"),
        "GB/s": ("gigabyte", "second"), "kB/s": ("kilobyte", "second"),
        "Mb/s": ("megabit", "second"), "Gb/s": ("gigabit", "second")}
_UNIT_PER = re.compile(r"(?<![\w/])(?:(\d[\d,.]*)\s?)?(" + "|".join(map(re.escape, _PER))
                       + r")(?![\w/])")
"""A unit per unit: espeak read "60 km/h" as "sixty K M slash H". Without a number only
those that are no word ("km/h", not "m/s")."""


_ROUND_THE_CLOCK = re.compile(r"(?<![\w/.])24/7(?![\w/])")
"""espeak: "twenty-four slash seven"."""


def _unit_per(m: re.Match[str]) -> str:
    number, unit = m.group(1), m.group(2)
    if number is None and unit in ("m/s", "ft/s", "mi/h"):
        return m.group()
    one, per = _PER[unit]
    many = "feet" if one == "foot" else one + "s"
    return (f"{number} " if number else "") + f"{one if number == '1' else many} per {per}"


_RANGE = re.compile(r"(?<![\w.,:/\-–])(\d{1,3}(?:\.\d+)?|\d{4})[-–](\d{1,3}(?:\.\d+)?|\d{4})"
                    r"(?![\w\-–/]|[.,:]\d)")
"""A range of numbers: espeak's English voices read "3-5 business days" as "three dash
five" and "25–30 minutes" as "twenty five thirty". Up to three digits a side, or years
("1990-1995", "2023-24"); a phone number ("555-1234", read digit by digit before this) and
a name with a number ("COVID-19") are none."""
_RATIO = re.compile(r"(?<![\w.,:])(\d{1,3}):(\d|\d{3,}|\d{1,3}(?:,\d{3})+)(?![\w:]|[.,]\d)")
"""A ratio or a score with a colon: espeak read "16:9" and "won 2:1" as "sixteen colon nine",
"two colon one". One digit after the colon, or three or more ("1:100"): never a time."""
_REFERENCE_BEFORE = re.compile(r"[\w,;]\s+[A-Z][a-z]+\.?\s+$")
"""A name inside a sentence right before a ratio's digits: a chapter and verse ("in Genesis
1:1", "read Psalm 23:4"), read as written, not "one to one". A capitalised word opening the
sentence ("Use 16:9") is not taken for one."""


def _ratio(m: re.Match[str]) -> str:
    if _REFERENCE_BEFORE.search(m.string[max(0, m.start() - 40):m.start()]):
        return m.group(0)
    return f"{m.group(1)} to {m.group(2)}"


_SCORE = re.compile(
    r"\b((?:won|lost|beat|beaten|drew|tied|led|leading|trailed|trailing|ended|finished)"
    r"(?:\s+(?!(?:at|by|until|till|before|after|around|about|from|since|to)\b)[A-Za-z']+){0,3}"
    r"\s+)(\d{1,2})[-:](\d{1,2})(?![\w:-]|[.,]\d)"
    r"|(?<![\w.,:-])(\d{1,2})-(\d{1,2})(?=\s+(?:win|victory|defeat|loss|lead|draw|scoreline|"
    r"thrashing|comeback)\b)")
"""A score with a hyphen, or with a colon before two digits: after a verb of a match ("won
3-1", "beat them 21:19") or before what it was ("a 3-1 win"). espeak read "three dash one";
"9-5" elsewhere and a time ("ended at 10:30") stay."""


def _score(m: re.Match[str]) -> str:
    if m.group(1) is None:
        return f"{m.group(4)} to {m.group(5)}"
    return f"{m.group(1)}{m.group(2)} to {m.group(3)}"


_FEET_INCHES = re.compile(r"(?<![\w.,'\u2019])(\d{1,2})['\u2019\u2032]\s?(\d{1,2}(?:\.\d)?)"
                          r"(?:\"|''|\u201d|\u2033)?(?![\w'\"\u2019\u201d])")
"""A height in feet and inches: espeak read "5'11\"" as "five eleven", chatterbox
"five'eleven\""."""
_INCHES = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)\s?(\"|\u2033)(?![\w\"])")
"""A length in inches ("a 9\" pan", "15.6\u2033"): espeak said only "nine", chatterbox
"nine\""; not a number closing a quotation ("He said \"take 9\"")."""
_FEET = re.compile(r"(?<![\w.,'\u2019])(\d+(?:\.\d+)?)(['\u2032])(?![\w'\u2019])")
_ARTICLE_BEFORE = re.compile(r"\b(?:a|an|the)\s+$", re.I)
_NOUN_AFTER = re.compile(r"\s+(?!(?:and|or|by|to|x)\b)[^\W\d]")
"""A length between an article and its noun ("a 9\" pan", "the 6' fence"): it reads as
one word, "a 9-inch pan" ("a 9 inches pan" before)."""
_LENGTH = r"\d+(?:\.\d+)?\s?[\"\u2033'\u2032]"
_PAIR_AFTER = re.compile(
    rf"\s+(?:or|and|to|by)\s+(?:(?:a|an|the)\s+)?{_LENGTH}(?={_NOUN_AFTER.pattern})", re.I)
_PAIR_BEFORE = re.compile(rf"\b(?:a|an|the)\s+{_LENGTH}\s+(?:or|and|to|by)\s+$", re.I)
"""One of a pair between the article and the noun: "a 9\" or 10\" pan" is "a 9-inch or
10-inch pan" (was "a 9 inches or 10 inches pan"), "a 9\" and a 10\" pan" too."""


_QUOTE_MARK = re.compile(r'(?<![\d\s])"|(?<!\d)\s"|^"')
"""A quotation mark: no inch mark (after a number)."""


_SINGLE_QUOTE_OPENED = re.compile(r"(?:^|[\s(\[])'(?!\d0s\b)")
"""A single quote opening a quotation (not "'90s"): a foot mark after it may close it."""


def _feet_inches(m: re.Match[str]) -> str:
    feet, inches = m.group(1), m.group(2)
    return (f"{feet} {'foot' if feet == '1' else 'feet'} "
            f"{inches} {'inch' if inches == '1' else 'inches'}")


def _length(m: re.Match[str], one: str, many: str) -> str:
    text, start, end = m.string, m.start(), m.end()
    if (_ARTICLE_BEFORE.search(text, 0, start)
            and (_NOUN_AFTER.match(text, end) or _PAIR_AFTER.match(text, end))
            or _PAIR_BEFORE.search(text, 0, start) and _NOUN_AFTER.match(text, end)):
        return f"{m.group(1)}-{one}"
    return f"{m.group(1)} {one if m.group(1) == '1' else many}"


def _inches(m: re.Match[str]) -> str:
    if m.group(2) == '"' and len(_QUOTE_MARK.findall(m.string, 0, m.start())) % 2:
        return m.group()  # a quotation's closing mark
    return _length(m, "inch", "inches")


def _feet(m: re.Match[str]) -> str:
    if m.group(2) == "'" and _SINGLE_QUOTE_OPENED.search(m.string, 0, m.start()):
        return m.group()  # a quotation's closing mark
    return _length(m, "foot", "feet")


_NUMBER_SIGN = re.compile(r"(?<![\w#&/])#(?=\d+(?:st|nd|rd|th)?\b)")
"""A number sign: espeak read "#1" as "hash one", chatterbox "#one"."""
_HASHTAG = re.compile(r"(?<![\w#&/])#([A-Za-z_]\w+)")
_HEX_COLOUR = re.compile(r"(?=\D*\d)[\da-fA-F]{3}(?:[\da-fA-F]{3})?")


def _hashtag(m: re.Match[str]) -> str:
    """A hashtag without its mark: espeak read "#python" as "hash python". A hex colour
    ("#FF5733") and one letter ("#C") keep it."""
    return m.group() if _HEX_COLOUR.fullmatch(m.group(1)) else m.group(1)


_SHARP_FLAT = re.compile(r"(?<![\w#])([A-G])(?:([#\u266f])|\u266d)(?![\w#+])")
"""A note or a language: espeak read "C#" and "F#" as "C hash", chatterbox got the sign."""


_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10}
_NUMERAL = r"([IVX]{1,6})(?![\w-]|['\u2019](?!s\b))"
"""A Roman numeral up to 39 (I, V and X only: never "MIX", "CIVIC", "DC" or "MD"), not a
pronoun's contraction ("I'm")."""
_REGNAL_NAMES = (
    "Henry Edward Elizabeth George William Richard Charles James Mary Anne Stephen Harold "
    "Edmund Robert David Louis Philip Philippe Henri Francis Fran\u00e7ois Peter Catherine "
    "Frederick Frederik Napoleon John Paul Pius Leo Benedict Gregory Clement Boniface Sixtus "
    "Julius Adrian Alexander Nicholas Ivan Constantine Justinian Theodosius Basil Michael "
    "Manuel Otto Wilhelm Ludwig Friedrich Rudolf Carlos Juan Felipe Alfonso Ferdinand "
    "Isabella Umberto Haakon Olav Harald Gustav Christian Margrethe Willem Mehmed Suleiman "
    "Selim Murad Ramesses Ramses Rameses Thutmose Amenhotep Seti Ptolemy Darius Xerxes "
    "Artaxerxes Cyrus Antiochus Rama Kamehameha".split())
_REGNAL = re.compile(
    r"\b((?:(?:King|Queen|Pope|Tsar|Czar|Emperor|Empress|Kaiser|Pharaoh|Sultan|Shah|Prince|"
    r"Princess) [A-Z][a-z]+|" + "|".join(_REGNAL_NAMES) + r")) " + _NUMERAL)
"""A ruler's name and number: espeak said "Henry roman eight" for "Henry VIII" and the
pronoun for "Elizabeth I". Only the names of rulers, or any name after a title, so "Malcolm
X" and "Plan B" stay."""
_NUMBERED = re.compile(
    r"\b(World War|Chapter|Part|Act|Volume|Vol\.|Book|Section|Scene|Episode|Phase|Stage|"
    r"Level|Season|Article|Appendix|Round|Type|Class|Title|Psalm|Canto) " + _NUMERAL)
"""A numbered part or kind: espeak said "Chapter roman four", "World War roman two"."""
_NUMERAL_ONE = re.compile(r"['\u2019]s\b|\s*(?:[.,;:!?)\]]|$)|\s+(?:of|and)\b")
"""What follows a lone "I" that is a numeral: after a name or "Part", "I" is the pronoun
unless the sentence or phrase ends there ("Elizabeth I.", "Elizabeth I of England"); "told
Peter I loved it", "Part I don't get" stay."""


def roman_value(numeral: str) -> int | None:
    """The value of a well-formed numeral from 1 to 39, else None ("IIII", "VX", "IIX")."""
    values = [_ROMAN_VALUES[c] for c in numeral]
    n = sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))
    tens, ones = divmod(n, 10)
    canonical = "X" * tens + ("", "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX")[ones]
    return n if 0 < n < 40 and canonical == numeral else None


def _numeral(m: re.Match[str], ordinal: bool) -> str:
    """ "Henry VIII" -> "Henry the eighth", "Chapter IV" -> "Chapter 4"."""
    n = roman_value(m.group(2))
    pronoun_may_follow = ordinal or m.group(1) == "Part"  # a name, or "Part I think"
    if n is None or n == 1 and pronoun_may_follow and not _NUMERAL_ONE.match(m.string, m.end()):
        return m.group()
    return f"{m.group(1)} the {_ordinal_words(n)}" if ordinal else f"{m.group(1)} {n}"


_POWER = re.compile(r"(?<=[\w)])(?:\^\{?([-\u2212]?\d+)\}?(?!\w|[.,]\d)|([\u00b2\u00b3]))")
"""A power with a digit exponent: espeak was silent for "^" ("x^2" was "x two", "10^6" "ten
six") and read "x\u00b2" as "x two"."""


def _power(m: re.Match[str]) -> str:
    exponent = m.group(1) or {"\u00b2": "2", "\u00b3": "3"}[m.group(2)]
    return {"2": " squared", "3": " cubed"}.get(exponent, f" to the power of {exponent}")


def english_readings(text: str) -> str:
    """``text`` with the notations an English voice misreads written as it should say them:
    comparison signs ("7 > 5": "7 greater than 5"), phone numbers digit by digit ("555-0142":
    "5 5 5, 0 1 4 2"), ISO dates ("2026-12-02": "December 2nd, 2026"), numbers grouped with
    dots ("1.000.000": "1,000,000"), fractions and units per unit ("1/2": "one half",
    "km/h": "kilometers per hour", "24/7": "24 7"), sharps and flats ("C#": "C sharp"),
    Roman numerals after a ruler's name or a part ("Henry VIII": "Henry the eighth",
    "Chapter IV": "Chapter 4"), powers ("x^2": "x squared"), heights and lengths ("5'11\"":
    "5 feet 11 inches"), ratios, scores and ranges ("16:9", "won 3-1", "3-5 days": "16 to 9",
    "3 to 1", "3 to 5 days"), number signs ("#1": "number 1") and hashtags without their
    mark. Digits stay digits."""
    text = _ISO_DATE.sub(_iso_date, text)
    text = _PHONE.sub(_phone, text)
    text = _DOTTED_THOUSANDS.sub(_dotted_thousands, text)
    text = _FRACTION.sub(_fraction, text)
    text = _UNIT_PER.sub(_unit_per, text)
    text = _ROUND_THE_CLOCK.sub("24 7", text)
    text = _FEET_INCHES.sub(_feet_inches, text)
    text = _INCHES.sub(_inches, text)
    text = _FEET.sub(_feet, text)
    text = _SCORE.sub(_score, text)
    text = _RANGE.sub(r"\1 to \2", text)
    text = _RATIO.sub(_ratio, text)
    text = _NUMBER_SIGN.sub("number ", text)
    text = _HASHTAG.sub(_hashtag, text)
    text = _SHARP_FLAT.sub(lambda m: m.group(1) + (" sharp" if m.group(2) else " flat"), text)
    text = _REGNAL.sub(lambda m: _numeral(m, ordinal=True), text)
    text = _NUMBERED.sub(lambda m: _numeral(m, ordinal=False), text)
    text = _POWER.sub(_power, text)
    for pattern, repl in _COMPARISONS:
        text = pattern.sub(repl, text)
    return text


# --- numbers as words (for engines with reads_digits=False) ------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORDINAL = {"one": "first", "two": "second", "three": "third", "five": "fifth",
            "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}


def _int_words(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        t, o = divmod(n, 10)
        return _TENS[t] + ("-" + _ONES[o] if o else "")
    for size, name in ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"),
                       (1000, "thousand"), (100, "hundred")):
        if n >= size:
            q, r = divmod(n, size)
            return _int_words(q) + " " + name + (" " + _int_words(r) if r else "")
    raise AssertionError(n)


def _year_words(n: int) -> str:
    hi, lo = divmod(n, 100)
    if hi % 10 == 0 and lo < 10:  # 2000 -> two thousand, 2005 -> two thousand five
        return _int_words(n)
    if lo == 0:
        return _int_words(hi) + " hundred"
    return _int_words(hi) + " " + ("oh " + _ONES[lo] if lo < 10 else _int_words(lo))


def _ordinal_words(n: int) -> str:
    w = _int_words(n)
    head, _, last = w.rpartition(" ")
    sep = " " if head else ""
    if "-" in last:
        h2, _, last = last.rpartition("-")
        head, sep = (head + sep + h2), "-"
    if last in _ORDINAL:
        last = _ORDINAL[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def _plural(words: str) -> str:
    """'nineteen ninety' -> 'nineteen nineties' (the 1990s), 'eighty' -> 'eighties'."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _digits(s: str) -> str:
    return " ".join(_ONES[int(d)] for d in s)


def _number(m: re.Match[str]) -> str:
    # "MP3": digits glued to a word are read apart from it ("MP three"), and so is a word
    # glued to them ("5G": "five G", it was "fiveG")
    glued = " " if m.start() > 0 and m.string[m.start() - 1].isalpha() else ""
    words = _number_words(m, glued)
    after = m.string[m.end():m.end() + 1]
    return words + " " if after.isascii() and after.isalpha() else words


def _number_words(m: re.Match[str], glued: str) -> str:
    whole = m.group(0)
    sign, cur, body = m.group("sign"), m.group("cur"), m.group("num")
    pct, scale, decade = m.group("pct"), m.group("scale"), m.group("decade")
    abbr = m.group("abbr")
    after = scale or (" " + abbr if abbr else "")  # "4K" is "four K" (it was "fourK")
    minus = "minus " if sign else ""
    body = body.replace(",", "")
    if "." in body and body.count(".") > 1:  # 2.4.1, 192.168.1.1
        return glued + " dot ".join(_int_words(int(p)) if len(p) < 4 else _digits(p)
                                    for p in body.split("."))
    ip, _, fp = body.partition(".")
    if len(ip) > 15 or (len(ip) > 2 and ip[0] == "0" and not cur and not fp):
        # a long number, or one with a leading zero (a phone number's "0958", a code's
        # "007", a ZIP's "02139"), is read digit by digit: as an amount its zero was lost
        return glued + minus + _digits(ip) + (" percent" if pct else "") + after
    n = int(ip or "0")
    if cur:
        (unit, units), (sub, subs) = _CURRENCIES[cur]
    if cur and (scale or abbr):  # "$5 million", "$1.5 billion", "$85.8B": the unit after
        amount = _int_words(n) + (" point " + _digits(fp) if fp else "")
        return f"{minus}{amount} {scale.strip() if scale else _SCALES[abbr]} {units}"
    if cur:
        cents = int((fp + "0")[:2]) if fp else 0
        words = f"{_int_words(n)} " + (unit if n == 1 else units) if n or not cents else ""
        if cents:
            words += (" and " if words else "") + f"{_int_words(cents)} " + (
                sub if cents == 1 else subs)
        return minus + words
    if decade:  # "1990s", "80s"
        return glued + minus + _plural(_year_words(n) if len(ip) == 4 else _int_words(n))
    if fp:
        words = _int_words(n) + " point " + _digits(fp)
    elif len(ip) == 4 and 1100 <= n <= 2099 and "," not in whole and not pct:
        words = _year_words(n)
    else:
        words = _int_words(n)
    return glued + minus + words + (" percent" if pct else "") + after


_NUMBER = re.compile(
    r"(?P<sign>(?<![\w.,\d])-)?(?P<cur>[$\u20ac\u00a3\u00a5])?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)*|(?<=[$\u20ac\u00a3\u00a5])\.\d+)"
    r"(?:(?P<decade>(?<=0)s\b)|(?P<pct>\s?%)|(?P<scale>\s(?:thousand|million|billion|trillion)\b)"
    r"|(?P<abbr>(?:[kKMBT]|bn|mn)\b))?")
_CURRENCIES = {"$": (("dollar", "dollars"), ("cent", "cents")),
               "\u20ac": (("euro", "euros"), ("cent", "cents")),
               "\u00a3": (("pound", "pounds"), ("penny", "pence")),
               "\u00a5": (("yen", "yen"), ("sen", "sen"))}
"""Currency signs before an amount: chatterbox got "\u20acfive" for "\u20ac5", "\u00a5five
hundred" for "\u00a5500"."""
_SCALES = {"k": "thousand", "K": "thousand", "M": "million", "mn": "million", "B": "billion",
           "bn": "billion", "T": "trillion"}
"""A dollar amount's abbreviated scale: "$85.8B" is eighty-five point eight billion dollars
(it was "eighty-five dollars and eighty cents B"), "$85k" eighty-five thousand. Without a
dollar sign the letter stays as it was: "4K", "5K run", "a 7B model"."""
_DECIMAL_COMMA = re.compile(
    r"(?<![\w.])([$\u20ac\u00a3\u00a5])(\d{1,3}(?:,\d{3})+|\d+),(\d{2})(?!\d|[.,]\d)")
"""An amount with a decimal comma, two digits where a thousands group has three: given a
point, both readings of amounts take it (``amounts_in_words``: "\u20ac12,50" was "1 euro2,50";
``spell_out``: "twelve euros,fifty")."""
_AMOUNT = re.compile(
    r"(?<![\w.])([$\u20ac\u00a3\u00a5])(?=\.?\d)(\d{1,3}(?:,\d{3})+|\d*)"
    r"(?:\.(\d+))?"
    r"(\s(?:thousand|million|billion|trillion)\b|(?:[kKMBT]|bn|mn)\b)?(?!\d|[.,]\d)")
"""An amount: its whole part, its decimals after a point (a decimal comma is one by then:
``_DECIMAL_COMMA``), its scale. Nothing may follow but a number's end: "\u20ac1.234,56" was
"1 euro 23 cents4,56", the digits given back one by one until the rest no longer looked
like a number."""


def amounts_in_words(text: str) -> str:
    """``text`` with each amount after a currency sign ($ \u20ac \u00a3 \u00a5) as its number
    then its unit, digits kept: "$184.50" -> "184 dollars 50 cents" (no "and": espeak pauses before
    it; "\u20ac12,50" too), "$1.5 million" -> "1.5 million dollars". For an engine that
    reads digits but puts the sign first (espeak: "dollar one hundred eighty-four point five
    zero")."""
    def amount(m: re.Match[str]) -> str:
        cur, whole, frac, scale = m.groups()
        if not (whole or frac):
            return m.group()  # "$1.2.3": no amount
        (unit, units), (sub, subs) = _CURRENCIES[cur]
        if scale:  # "$1.5 million", "$85.8B"
            name = scale.strip() if scale[0].isspace() else _SCALES[scale]
            return f"{whole or '0'}{'.' + frac if frac else ''} {name} {units}"
        n = int(whole.replace(",", "") or "0")
        cents = int((frac + "0")[:2]) if frac else 0
        words = f"{whole} " + (unit if n == 1 else units) if n or not cents else ""
        if cents:
            words += (" " if words else "") + f"{cents} " + (sub if cents == 1 else subs)
        return words
    return _AMOUNT.sub(amount, _DECIMAL_COMMA.sub(r"\1\2.\3", text))


_TIME = re.compile(r"\b(\d{1,2}):(\d{2})(?:\s?([ap])\.?m\b)?(?![\w:])", re.I)
_ORD = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+)(?:st|nd|rd|th)\b")


def _time(m: re.Match[str]) -> str:
    h, mi, half = int(m.group(1)), int(m.group(2)), m.group(3)
    if half:  # "10:30pm" -> "ten thirty P M", "10:00 am" -> "ten A M"
        minutes = "" if mi == 0 else " " + ("oh " + _ONES[mi] if mi < 10 else _int_words(mi))
        return f"{_int_words(h)}{minutes} {half.upper()} M"
    if mi == 0:  # (the hour 0 of a 24-hour clock was "zero o'clock")
        return "midnight" if h == 0 else _int_words(h) + (" o'clock" if h <= 12 else " hundred")
    return _int_words(h) + " " + ("oh " + _ONES[mi] if mi < 10 else _int_words(mi))


_MONTHS = "|".join(_MONTH_NAMES) + (
    "|Jan\\.?|Feb\\.?|Mar\\.?|Apr\\.?|Jun\\.?|Jul\\.?|Aug\\.?|Sept?\\.?|Oct\\.?|Nov\\.?|Dec\\.?")
_MONTH_DAY = re.compile(rf"\b((?:{_MONTHS})\s)(\d{{1,2}})\b(?![:.]\d)")
"""A month's name, then its day: "July 4" -> "July fourth" (not "Mario 64", "Mark 12")."""


def _numbers_to_words(s: str) -> str:
    s = _DECIMAL_COMMA.sub(r"\1\2.\3", s)
    s = _MONTH_DAY.sub(lambda m: m.group(1) + _ordinal_words(int(m.group(2))), s)
    s = _TIME.sub(_time, s)
    s = _ORD.sub(lambda m: _ordinal_words(int(m.group(1).replace(",", ""))), s)
    return _NUMBER.sub(_number, s)
