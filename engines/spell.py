"""Text for engines that read digits and abbreviations badly (``reads_digits = False``):
numbers, currency, percentages, times, dates, ordinals and common abbreviations written
out as English words ("$184.50" -> "one hundred eighty-four dollars and fifty cents").

Pure text in, text out. The gateway's segmenter applies it when every engine that may speak
needs it; a fallback engine that needs it while the primary does not applies it to the
segments it takes over (``engines.fallback``).
"""

from __future__ import annotations

import re
from collections.abc import Callable


def spell_out(text: str) -> str:
    """``text`` with its numbers and abbreviations as words (idempotent)."""
    for pattern, repl in _ABBREVIATIONS:
        text = pattern.sub(repl, text)
    return _numbers_to_words(text)


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
]



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
    if lo == 0:
        return _int_words(hi) + " hundred"
    if hi % 10 == 0 and lo < 10:  # 2005 -> two thousand five
        return _int_words(n)
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


def _digits(s: str) -> str:
    return " ".join(_ONES[int(d)] for d in s)


def _number(m: re.Match[str]) -> str:
    whole = m.group(0)
    cur, body, pct = m.group("cur"), m.group("num"), m.group("pct")
    body = body.replace(",", "")
    if "." in body and body.count(".") > 1:  # 2.4.1, 192.168.1.1
        return " dot ".join(_int_words(int(p)) if len(p) < 4 else _digits(p)
                            for p in body.split("."))
    ip, _, fp = body.partition(".")
    if len(ip) > 15:
        return _digits(ip)
    n = int(ip)
    if cur:
        words = _int_words(n) + (" dollar" if n == 1 else " dollars")
        if fp:
            cents = int((fp + "0")[:2])
            words += f" and {_int_words(cents)} cent" + ("" if cents == 1 else "s")
        return words
    if fp:
        words = _int_words(n) + " point " + _digits(fp)
    elif len(ip) == 4 and 1100 <= n <= 2099 and "," not in whole and not pct:
        words = _year_words(n)
    else:
        words = _int_words(n)
    return words + (" percent" if pct else "")


_NUMBER = re.compile(r"(?P<cur>\$)?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)*)"
                     r"(?P<pct>\s?%)?")
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\b")
_ORD = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")


def _time(m: re.Match[str]) -> str:
    h, mi = int(m.group(1)), int(m.group(2))
    if mi == 0:
        return _int_words(h) + (" o'clock" if h <= 12 else " hundred")
    return _int_words(h) + " " + ("oh " + _ONES[mi] if mi < 10 else _int_words(mi))


_MONTH_DAY = re.compile(
    r"\b((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?\s)(\d{1,2})\b(?![:.]\d)"
)


def _numbers_to_words(s: str) -> str:
    s = _MONTH_DAY.sub(lambda m: m.group(1) + _ordinal_words(int(m.group(2))), s)
    s = _TIME.sub(_time, s)
    s = _ORD.sub(lambda m: _ordinal_words(int(m.group(1))), s)
    return _NUMBER.sub(_number, s)
