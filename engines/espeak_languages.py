"""What espeak-ng should be given in German, French, Spanish, Italian and Portuguese.

espeak reads digits itself (``reads_digits = True``), and each language's voice reads
plain numbers, decimal commas and thousands dots right ("3,5 km", "1.000 €"). Some forms a
reply in those languages writes every day it reads wrongly, heard with libespeak-ng's
phoneme trace (what ``espeak-ng -q -x`` prints) and the length of its audio:

* times: German "14:30 Uhr" was "vierzehn Uhr dreißig Uhr" (its own "Uhr" for the colon,
  then the written one), "9:00" "neun Uhr null null", "14.30 Uhr" "vierzehn Punkt dreißig
  Uhr"; French "14h30" "quatorze ache trente"; Portuguese "14h30" "catorze agá trinta";
  Spanish "14 h" "catorce hache"; Italian "alle 14.30" "quattordici punto trenta"; and
  every voice read a minute's leading zero ("9:05": "neun Uhr null fünf", "nueve cero
  cinco", "nove e zero cinque").
* German ordinals: espeak takes "3." for an ordinal only before a lower-case word, and
  German nouns are capitalized, so "am 3. Oktober" was "am drei. Oktober" (a sentence end
  in the middle: 0.3 s longer than "am dritten Oktober"), "im 19. Jahrhundert" "im
  neunzehn. Jahrhundert"; a numeric date "am 02.12.2026" was "am null zwei Punkt zwölf
  Punkt zweitausendsechsundzwanzig".
* Roman numerals: the French voice adds "romain" ("Louis XIV" "Louis quatorze romain",
  "chapitre IV" "chapitre quatre romain"), the German one "römisch" ("Ludwig XIV."
  "Ludwig römisch vierzehn"); French ordinals were letters: "au XIXe siècle" "au ixe
  siècle", "le 2e étage" "le deux e étage".
* dates with slashes: "le 02/12/2026" was "zéro deux douze deux mille vingt-six", "el
  02/12/2026" "cero dos barra doce barra dos mil veintiséis", Italian "zero due barra
  dodici barra ...", Portuguese "zero dois doze dois mil e vinte e seis".
* German prices: "5,99 €" was "fünf Komma neun neun Euro" (a decimal's digits one by one),
  "12,50 EUR" "zwölf Komma fünf null Ör", "€5" "Euro fünf".
* ranges: every voice skipped an en dash between numbers ("20–22 Grad" "zwanzig
  zweiundzwanzig Grad", "20–22 degrés" "vingt vingt-deux degrés"), and read a hyphen as
  "Strich" (German), "menos" (Portuguese: "10-15 minutos" "dez menos quinze minutos") or
  not at all (French, Spanish, Italian).
* abbreviations it spells or cuts: German "z. B." "zet be", "d. h." "de ha", "bzw." "be zet
  we", "usw." "usf", "Nr. 5" "en er fünf", "Dr. Müller" "de er Müller", "ca." "ka";
  Spanish and Portuguese "1.º", "2.ª" "uno punto o", "um ordinal masculino", "n.º"
  "ene o"; Portuguese "Sr. Silva" "esse erre Silva"; French "M. Dupont" "em Dupont", "p.
  ex." "pe ex", "n° 5" "en cinq"; Italian "Sig. Rossi" "sig Rossi", "dott." "dot", "ecc."
  "ek", "pag." "pag"; and the Roman numeral VI, a word in all three ("Felipe VI" "Felipe
  vi", "Carlo VI", "o capítulo VI").

``for_language`` rewrites those into the words a speaker of the language uses, leaving
digits for espeak to read ("14 Uhr 30", "14 heures 30", "14 y 30", "14 e 30"), and German
ordinals and dates into words ("am dritten Oktober", "am zweiten Dezember 2026"), and
those abbreviations into their words ("zum Beispiel", "1º", "número", "Monsieur"); a range
reads "bis", "à", "a"; a German price "5 Euro 99"; a date DD/MM/YYYY its month's name
("2 de diciembre de 2026"); a Roman numeral a number ("Louis 14", "Ludwig der vierzehnte")
and a French ordinal its word ("dix-neuvième"). Other
languages, English among them (``espeak_text``'s business), are returned unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from engines.spell import roman_value

_HOUR = r"(?<![\d.,:])([01]?\d|2[0-3])"
_COLON_TIME = re.compile(_HOUR + r":([0-5]\d)(?![\d:])")
"""14:30, 9:05 (not 14:30:15; a ratio's "3:1" has no two-digit minutes)."""
_UHR = re.compile(_HOUR + r"[:.]([0-5]\d)(?![\d:])\s*Uhr\b")
"""German "14:30 Uhr", "14.30 Uhr"."""
_UM_DOT = re.compile(r"\b(um|gegen|ab) " + _HOUR + r"\.([0-5]\d)(?![\d.:,]\d|\d)")
"""German "um 14.30": a dot time after "um" (a date rarely follows it)."""
_H_TIME = re.compile(_HOUR + r" ?h(?: ?([0-5]\d))?\b")
"""French, Portuguese, Spanish "14h30", "14 h 30", "14h", "9 h" (not "km/h": a digit leads)."""
_DOT_TIME = re.compile(_HOUR + r"\.([0-5]\d)(?![\d.:,]\d|\d)")
"""Italian "alle 14.30": thousands have three digits after the dot, decimals a comma."""


def _hm(m: re.Match[str], at: int = 1) -> tuple[int, int]:
    """Hour and minutes of a time matched at groups ``at`` and ``at + 1`` (minutes may be
    absent: 0)."""
    return int(m.group(at)), int(m.group(at + 1) or 0)


_ONES_DE = "null ein zwei drei vier fünf sechs sieben acht neun".split()
_TEENS_DE = "zehn elf zwölf dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn".split()
_TENS_DE = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()
_ORDINAL_STEMS_DE = {1: "erst", 3: "dritt", 7: "siebt", 8: "acht"}
_MONTHS_DE = ("Januar Februar März April Mai Juni Juli August September Oktober November "
              "Dezember").split()
GERMAN_MONTH_WORDS = frozenset(_MONTHS_DE) | frozenset(
    "Jänner Jan Feb Mär Apr Jun Jul Aug Sep Sept Okt Nov Dez".split())
"""German months and their short forms (the segmenter's German dates use them too)."""
_ORDINAL_AFTER_DE = frozenset("am im vom zum zur beim der den dem des die das".split())
"""Words before a day or another ordinal ("der 1. FC", "im 19. Jahrhundert")."""
_ENDING_DE = {"der": "e", "die": "e", "das": "e"}
"""The ordinal's ending after the word before it: "der dritte", else the dative of "am
dritten", "vom dritten", "bis zum dritten" (the common case in a reply)."""
_DAY_DE = re.compile(r"(?<![\d.,])(\d{1,2})\.(?=[ \u00a0]+(\w+))")
_DATE_DE = re.compile(r"(?<![\d.,])(\d{1,2})\.(\d{1,2})\.(?:(\d{4})(?![\d.,]\d|\d)|(?!\d))")
"""02.12.2026, 2.12.2026, 2.12. (a day and a month; not a version "2.4.1")."""


def _ordinal_de(n: int, before: str) -> str:
    """``n`` (1-99) as a German ordinal with the ending the word ``before`` it asks for."""
    if n < 20:
        stem = _ORDINAL_STEMS_DE.get(n) or (_TEENS_DE[n - 10] if n >= 10 else _ONES_DE[n]) + "t"
    else:
        tens, ones = divmod(n, 10)
        stem = (f"{_ONES_DE[ones]}und" if ones else "") + _TENS_DE[tens] + "st"
    return stem + _ENDING_DE.get(before.lower(), "en")


def _word_before(text: str, at: int) -> str:
    """The word right before position ``at`` ("" after punctuation or at the start)."""
    m = re.search(r"(\w+)\s+\Z", text[max(0, at - 40):at])
    return m.group(1) if m else ""


_AMOUNT = r"(\d{1,3}(?:\.\d{3})+|\d+)(?:,(\d\d|-{1,2}))?"
_PRICE_DE = re.compile(r"(?<![\d.,])" + _AMOUNT + r"[ \u00a0]?(?:€|EUR\b)"
                       r"|(?:€|\bEUR)[ \u00a0]?" + _AMOUNT + r"(?![\d,])")
"""A price in euros, the sign or code after it ("5,99 €", "1.000 EUR") or before ("€5")."""


def _price_de(m: re.Match[str]) -> str:
    euros, cents = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    cents = "" if not cents or cents.startswith("-") or cents == "00" else str(int(cents))
    if euros == "0" and cents:
        return f"{cents} Cent"
    said = "ein Euro" if euros == "1" else f"{euros} Euro"
    return f"{said} {cents}" if cents else said


_ROMAN = re.compile(r"(?<![\w.\-'’])(X{0,3}(?:IX|IV|V?I{0,3}))(?![\w\-'’])")
"""A Roman numeral of I, V and X (1-39: kings, popes, centuries, chapters); not with L, C,
D or M, which spell acronyms ("CV", "CD", "MD", "XL")."""


def _roman(numeral: str) -> int:
    """The value of a numeral ``_ROMAN`` found (well formed, 1-39)."""
    n = roman_value(numeral)
    assert n is not None, numeral
    return n


def _romans(text: str, pattern: re.Pattern[str], said: Callable[[re.Match[str]], str]) -> str:
    """``said`` for each Roman numeral ``pattern`` finds (two letters at least, or any
    numeral followed by a suffix the pattern asks for: a lone "I" or "V" is a letter)."""
    return pattern.sub(lambda m: said(m) if m.group(1) else m.group(), text)


_ROMAN_DE = re.compile(_ROMAN.pattern.replace(r"(?![\w\-'’])", r"(\.)?(?![\w\-'’])"))
_NAME_BEFORE = re.compile(r"[A-ZÄÖÜ][a-zäöüß]+[ \u00a0]\Z")
_LOWER_AFTER = re.compile(r"[ \u00a0]+[a-zäöüß]")


def _german_roman(m: re.Match[str]) -> str:
    numeral, dot = m.group(1), m.group(2)
    if len(numeral) < 2 and not dot:
        return m.group()
    n = _roman(numeral)
    if dot and _NAME_BEFORE.search(m.string, 0, m.start()) and _LOWER_AFTER.match(
            m.string, m.end()):
        return f"der {_ordinal_de(n, 'der')}"  # "Ludwig XIV. war": "Ludwig der vierzehnte"
    return f"{n}." if dot else str(n)  # "im XIX. Jahrhundert" is then an ordinal


def _german(text: str) -> str:
    def said(h: int, mm: int) -> str:
        return f"{h} Uhr {mm}" if mm else f"{h} Uhr"

    def date(m: re.Match[str]) -> str:
        day, month = int(m.group(1)), int(m.group(2))
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m.group()
        words = f"{_ordinal_de(day, _word_before(m.string, m.start()))} {_MONTHS_DE[month - 1]}"
        return f"{words} {m.group(3)}" if m.group(3) else words

    def day(m: re.Match[str]) -> str:
        n, before = int(m.group(1)), _word_before(m.string, m.start())
        if n and (m.group(2) in GERMAN_MONTH_WORDS or before.lower() in _ORDINAL_AFTER_DE):
            return _ordinal_de(n, before)
        return m.group()

    text = _romans(text, _ROMAN_DE, _german_roman)
    text = _PRICE_DE.sub(_price_de, text)
    text = _DATE_DE.sub(date, text)
    text = _DAY_DE.sub(day, text)
    text = _UHR.sub(lambda m: said(*_hm(m)), text)
    text = _UM_DOT.sub(lambda m: f"{m.group(1)} {said(*_hm(m, 2))}", text)
    return _COLON_TIME.sub(lambda m: said(*_hm(m)), text)


_UNITS_FR = ("zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize "
             "quatorze quinze seize").split()
_TENS_FR = "_ dix vingt trente quarante cinquante soixante".split()
_ROMAN_FR = re.compile(_ROMAN.pattern.replace(r"(?![\w\-'’])", r"(er|re|e|ème)?(?![\w\-'’])"))
_ORDINAL_FR = re.compile(r"(?<![\w.,])(\d{1,2})(er|re|e|ème)(?![\w'’])")
"""2e, 3ème, 21e, 1er, 1re (espeak reads 1er and 1re itself, not "XIXe" or "2e")."""


def _cardinal_fr(n: int) -> str:
    """``n`` (0-99) in French words."""
    if n <= 16:
        return _UNITS_FR[n]
    if n < 20:
        return f"dix-{_UNITS_FR[n - 10]}"
    if n >= 80:
        rest = n - 80
        return "quatre-vingts" if not rest else f"quatre-vingt-{_cardinal_fr(rest)}"
    tens, ones = divmod(n, 10)
    if tens == 7:
        tens, ones = 6, ones + 10
    if ones == 0:
        return _TENS_FR[tens]
    return f"{_TENS_FR[tens]}{' et ' if ones in (1, 11) else '-'}{_cardinal_fr(ones)}"


def _ordinal_fr(n: int, suffix: str) -> str:
    """``n`` (1-99) as a French ordinal: "premier", "première", "deuxième", "vingt et
    unième", "dix-neuvième"."""
    if n == 1:
        return "première" if suffix == "re" else "premier"
    word = _cardinal_fr(n)
    if word.endswith("cinq"):
        return word + "uième"
    if word.endswith("neuf"):
        return word[:-1] + "vième"
    if word == "quatre-vingts":
        return "quatre-vingtième"
    return word.removesuffix("e") + "ième"


def _french_roman(m: re.Match[str]) -> str:
    numeral, suffix = m.group(1), m.group(2)
    if suffix:
        return _ordinal_fr(_roman(numeral), suffix)  # "XIXe siècle", "François Ier"
    return str(_roman(numeral)) if len(numeral) >= 2 else m.group()  # "Louis XIV"


def _french(text: str) -> str:
    def said(m: re.Match[str]) -> str:
        h, mm = _hm(m)
        hours = "une heure" if h == 1 else f"{h} heure" if h == 0 else f"{h} heures"
        return f"{hours} {mm}" if mm else hours

    text = _romans(text, _ROMAN_FR, _french_roman)
    text = _ORDINAL_FR.sub(lambda m: _ordinal_fr(int(m.group(1)), m.group(2))
                           if int(m.group(1)) else m.group(), text)
    return _COLON_TIME.sub(said, _H_TIME.sub(said, text))


def _spanish(text: str) -> str:
    def clock(m: re.Match[str]) -> str:  # "a las 9:05": "a las 9 y 5"
        h, mm = _hm(m)
        return f"{h} y {mm}" if mm else str(h)

    def hours(m: re.Match[str]) -> str:  # "a las 14 h": "a las 14 horas"
        h, mm = _hm(m)
        said = "una hora" if h == 1 else f"{h} horas"
        return f"{said} y {mm}" if mm else said

    return _COLON_TIME.sub(clock, _H_TIME.sub(hours, text))


def _portuguese(text: str) -> str:
    def said(m: re.Match[str]) -> str:
        h, mm = _hm(m)
        if mm:
            return f"{h} e {mm}"
        return "uma hora" if h == 1 else f"{h} horas"

    return _COLON_TIME.sub(said, _H_TIME.sub(said, text))


def _italian(text: str) -> str:
    def said(m: re.Match[str]) -> str:
        h, mm = _hm(m)
        return f"{h} e {mm}" if mm else str(h)

    return _COLON_TIME.sub(said, _DOT_TIME.sub(said, text))


_ABBREVIATIONS: dict[str, list[tuple[str, str]]] = {
    "de": [
        (r"z\. ?B\.", "zum Beispiel"), (r"u\. ?a\.", "unter anderem"),
        (r"d\. ?h\.", "das heißt"), (r"bzw\.", "beziehungsweise"), (r"usw\.", "und so weiter"),
        (r"etc\.", "et cetera"), (r"ca\.", "circa"), (r"inkl\.", "inklusive"),
        (r"ggf\.", "gegebenenfalls"), (r"evtl\.", "eventuell"), (r"vgl\.", "vergleiche"),
        (r"bspw\.", "beispielsweise"), (r"zzgl\.", "zuzüglich"), (r"max\.", "maximal"),
        (r"Nr\.(?= ?\d)", "Nummer"), (r"S\.(?= ?\d)", "Seite"), (r"Dr\.", "Doktor"),
        (r"Prof\.", "Professor"), (r"Hr\.", "Herr"), (r"Mio\.", "Millionen"),
        (r"Mrd\.", "Milliarden"), (r"Std\.", "Stunden"), (r"Min\.", "Minuten"),
        (r"Tel\.", "Telefon"), (r"Jh\.", "Jahrhundert"), (r"Abs\.", "Absatz"),
    ],
    "es": [
        (r"n\.?º", "número"), (r"1\.?er", "primer"), (r"3\.?er", "tercer"),
        (r"págs\.", "páginas"), (r"pág\.", "página"), (r"EE\. ?UU\.", "Estados Unidos"),
        (r"VI(?![\w'’])", "6"),
    ],
    "pt": [
        (r"n\.?º", "número"), (r"Sr\.", "senhor"), (r"Sra\.", "senhora"),
        (r"Dr\.ª", "doutora"), (r"pág\.", "página"), (r"V\. ?Ex\.ª", "Vossa Excelência"),
        (r"p\. ?ex\.", "por exemplo"), (r"VI(?![\w'’])", "6"),
    ],
    "fr": [
        (r"M\.(?= [A-ZÀ-Ý])", "Monsieur"), (r"MM\.(?= [A-ZÀ-Ý])", "Messieurs"),
        (r"p\. ?ex\.", "par exemple"), (r"env\.", "environ"),
        (r"n°(?= ?\d)", "numéro"), (r"av\. ?J\.-C\.", "avant Jésus-Christ"),
        (r"apr\. ?J\.-C\.", "après Jésus-Christ"),
    ],
    "it": [
        (r"Sig\.ra", "signora"), (r"Sig\.na", "signorina"), (r"Sig\.", "signor"),
        (r"[Dd]ott\.ssa", "dottoressa"), (r"[Dd]ott\.", "dottor"),
        (r"[Pp]rof\.ssa", "professoressa"), (r"[Pp]rof\.", "professor"),
        (r"[Aa]vv\.", "avvocato"), (r"[Ii]ng\.", "ingegner"), (r"pag\.", "pagina"),
        (r"ecc\.", "eccetera"), (r"ca\.", "circa"), (r"n[°º.](?= ?\d)", "numero"),
        (r"VI(?![\w'’])", "sesto"),
    ],
}
"""What each voice should say for an abbreviation it reads badly (module docstring)."""
_ABBREVIATION = {
    language: (re.compile(r"(?<![\w.])(?:" + "|".join(f"({p})" for p, _ in table) + ")"),
               [words for _, words in table])
    for language, table in _ABBREVIATIONS.items()
}
_ORDINAL_DOT = re.compile(r"(?<=\d)\.(?=[ºª])")
"""Spanish and Portuguese "1.º", "2.ª": espeak reads "1º" as "primero", "primeiro"."""
_CLOSING = re.compile(r"[\s\"'»“”)\]]*\Z")


def _abbreviations(text: str, language: str) -> str:
    """The words for ``language``'s abbreviations (``_ABBREVIATIONS``); one that ends the
    text keeps a full stop ("und so weiter.")."""
    found = _ABBREVIATION.get(language)
    if found is None:
        return text
    pattern, words = found

    def said(m: re.Match[str]) -> str:
        spoken = words[m.lastindex - 1] if m.lastindex else m.group()
        ends = m.group().endswith(".") and _CLOSING.match(m.string, m.end()) is not None
        return spoken + "." if ends else spoken

    if language in ("es", "pt"):
        text = _ORDINAL_DOT.sub("", text)
    return pattern.sub(said, text)


_RANGE_WORD = {"de": "bis", "fr": "à", "es": "a", "it": "a", "pt": "a"}
_EN_DASH_RANGE = re.compile(r"(?<=[\d%°])[ \u00a0]?\u2013[ \u00a0]?(?=[$€£]?\d)")
"""An en dash between two numbers ("20–22", "5 % – 7 %")."""
_HYPHEN_RANGE = re.compile(r"(?<![\w.,:/\u2212-])([1-9]\d{0,3})-(\d{1,4})(?![\w,:/-]|\.\d)")
"""A hyphen between two numbers, the second the larger ("10-15 Minuten"), no other number
joined to them: not a date (2024-05-01), a phone number (030-1234), a score (2-1)."""


def _ranges(text: str, language: str) -> str:
    """A range between two numbers read with the language's word (``_RANGE_WORD``)."""
    word = _RANGE_WORD[language]
    text = _EN_DASH_RANGE.sub(f" {word} ", text)

    def hyphen(m: re.Match[str]) -> str:
        low, high = m.group(1), m.group(2)
        return f"{low} {word} {high}" if int(high) > int(low) else m.group()

    return _HYPHEN_RANGE.sub(hyphen, text)


_MONTHS = {
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre "
          "décembre",
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre "
          "diciembre",
    "it": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre "
          "novembre dicembre",
    "pt": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro "
          "dezembro",
}
_SLASH_DATE = re.compile(r"(?<![\d/.,])(\d{1,2})/(\d{1,2})/(\d{4})(?![\d/])")
"""DD/MM/YYYY (the year is required: "3/4" is a fraction)."""


def _slash_dates(text: str, language: str) -> str:
    """A DD/MM/YYYY date as the language says it, with the month's name."""
    months = _MONTHS.get(language)
    if months is None:
        return text
    names = months.split()

    def date(m: re.Match[str]) -> str:
        day, month, year = int(m.group(1)), int(m.group(2)), m.group(3)
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m.group()
        name = names[month - 1]
        if language in ("es", "pt"):
            return f"{day} de {name} de {year}"
        first = {"fr": "1er", "it": "1º"}[language]
        return f"{first if day == 1 else day} {name} {year}"

    return _SLASH_DATE.sub(date, text)


_BY_LANGUAGE: dict[str, Callable[[str], str]] = {
    "de": _german, "fr": _french, "es": _spanish, "pt": _portuguese, "it": _italian,
}


def for_language(text: str, language: str) -> str:
    """``text`` as the espeak voice of ``language`` (an espeak voice or language name:
    "de", "fr-be", "pt-br", "es-419") should be given it; unchanged for other languages."""
    language = language.lower().partition("-")[0]
    rewrite = _BY_LANGUAGE.get(language)
    if rewrite is None:
        return text
    return rewrite(_ranges(_slash_dates(_abbreviations(text, language), language), language))
