"""Incremental speech segmenter: LLM text in (any chunking), speakable segments out.

Pure and synchronous. ``feed`` returns the segments that became certain with that chunk;
``finish`` flushes the rest at end of stream.

How a boundary is decided
-------------------------
The scanner walks the reply once, left to right, and jumps between the few characters that
can matter (terminators, clause marks, quotes, brackets, newlines, backticks). A decision
that needs text not yet received *waits* instead of guessing, so the result never depends
on how the stream was chunked:

* A sentence ends at ``.``, ``!``, ``?``, ``...`` (or ``. . .``, decided at its last dot),
  ``…`` or a Greek ``;`` (after a Greek
  letter: ``Τι ώρα είναι; Είναι``; also ``؟ ۔ । ॥``, the Armenian ``։``, the Amharic ``።``
  and ``፧``, the Burmese ``။``, the Khmer ``។`` and ``៕``, the Tibetan ``།`` and ``༎`` (not
  between a verse's ``། །``), the Santali ``᱾``, the Javanese ``꧉``, the Balinese ``᭟``,
  the Vai ``꘎`` and ``꘏``, the Mongolian ``᠃``; a Georgian letter counts as a capital)
  (plus closing quotes,
  brackets, markdown emphasis, citation marks, ``.[1]``,
  ``.[1, 2]``, ``.[1–3]``, and trailing emoji or emoticons: ``Nice try. ;-)``,
  ``Done! :)``, ``xD``) followed by whitespace;
  the first character of the next word decides the ambiguous cases. ``8.`` + ``4`` never
  splits (no whitespace), neither do ``192.168.1.1``, ``example.org``, ``a@b.io``,
  ``11:15``. A lowercase next word means the sentence goes on (``3 p.m. in``,
  ``e.g. this``, ``well... maybe``), unless it is written in camelCase or a version
  (``is out. macOS``, ``week. v0.3.1``, decided as a
  capital); so does an ellipsis before a digit or symbol (``is... $42``) or the pronoun
  ``I`` (``Well... I think``). Titles (``Dr.``, ``Mr.``, ``Maj.``, the Hungarian ``dr.``)
  never end a sentence; ``a.m.``
  and ``etc.`` end one only before a capital (``a.m.`` not before a time zone or a weekday:
  ``10 a.m. PT``, ``9 a.m. Mon.–Sat.``); a single capital
  (``Plan B.``, ``J.``), an all-caps dotted abbreviation (``U.S.``), ``St.`` (``Ave.``,
  ``Blvd.``, ``Rd.``), a name's ``Sr.`` and ``Jr.`` and the Vietnamese ``TP.`` (city) end
  one only before a word that opens sentences (``Then``, ``It's``..., a French elided word:
  ``B. N'oublie``; also inside an opening quote or bracket: ``U.S. "The``), or after a
  label word or an ordinal (``option A.``, ``bât. B.``,
  ``2.º B.``), so ``the U.S. Army``, ``John F. Kennedy``, ``Pennsylvania Ave. NW``,
  ``King Jr. Day``, ``TP. Hồ Chí Minh`` and ``Man. City`` go on, while ``Griffey Sr. He hit``
  and ``Isle of Man. Douglas`` end; (labels: ``Lot C.``, ``Track B.``);
  ``No. 5``, ``Jan. 3``, ``Sat. 14``, ``fig. 2``, ``ext. 12``, ``Apt. 4B``, ``1 hr. 35``,
  ``6 ft. 2``, Hungarian ``kb. 12`` (about), Croatian ``pon. 5.`` (Monday) never before a digit,
  except ``No.`` opening the reply or a line, or after ``?`` or ``!`` (the answer: ``Prime?
  No. 91 is``; after a full stop it numbers: ``holds 250. No. 7 is``); ``et al.`` only
  before a capital (``Smith et al. (2020) found``). A Bible book goes on before a chapter
  and verse (``Lk. 6:20``, ``1 Tim. 3:16``), a statute's abbreviations before the capitalized
  words that lead to its ``§`` (``Cal. Civ. Code § 1542``, ``Fla. Stat. §``), a division
  before its roman numeral (``Art. III``, ``Vol. II``; ``Art. I`` only before a comma), a
  building's, room's or suite's letter after its word (``Bldg. C``, ``Ste. B2``; not ``A``
  or ``I``), and the brand ``Yahoo!`` before its products (``Yahoo! Finance``). German,
  French, Spanish, Italian and Portuguese replies: ``z. B.``, ``u. a.``, ``bzw.``,
  ``p. ex.``, ``bât.`` and titles (``Sra.``,
  ``Dra.``, ``Sig.``, ``dott.``) never end one; ``Nr. 5``, ``pág. 12``,
  ``Hauptstr. 12``, ``lun. 3`` (Monday), ``env. 20`` (about) never before a digit;
  a kitchen unit before a capital ends one only before a word that opens sentences, a
  recipe verb or an -ly adverb (``2 lbs. Dice``, ``tsp. Honestly``), not before an
  ingredient (``1/2 tsp. Dijon``, ``2 oz. Gouda``); ``Mio.``,
  ``Min.``, ``Std.`` after a number end one only before a word that opens sentences
  (``3,7 Mio. Einwohner``, ``10 Min. Bitte``, ``12 Std. Nicht``); a day or an ordinal
  before a month or after an article (``am 3. Oktober``, ``im 19. Jahrhundert``, ``der 1.
  FC``, ``im XIX. Jahrhundert``) or before a floor (``5, 3. OG``) is not a sentence end,
  while ``Platz 1. Der`` is; nor are ``EE. UU.``, ``av. J.-C.``, ``Co. KG`` and a century
  (``séc. XX``, ``sec. XIX``). Russian and Hindi: ``ул.``, ``проф.`` and ``डॉ.`` never end
  one, nor ``им.`` before a name (``музей им. Пушкина``; the pronoun ends one: ``позвонил
  им. Они``); ``д. 12``, ``ауд. 305``, ``रु. 450`` never before a digit;
  ``г.`` only after a number (a year: ``2026 г. Потом``, while ``в г. Москве`` goes on).
  A letter of a script without case is a capital after ``a.m.`` or ``etc.``
  (``3 p.m. 김``), but a dot after one to three Thai consonants (Thai writes no full
  stop) or a lone Arabic letter abbreviates: ``พ.ศ. 2569``, ``ดร. สมชาย``, ``د. أحمد``
  (Dr.) never end one, while a full stop after a Thai word does (``ขอบคุณค่ะ. พรุ่งนี้``).
  Titles: ``Assoc. Prof.``, ``Asst. Prof.``, the French ``MM.``, the Portuguese ``Exmo.``
  and the Dutch ``dhr.`` never end one; ``Bros.`` and the French ``bd.`` go on as ``St.``
  does (``Warner Bros. Discovery``, ``12 bd. Voltaire``).
  Nor a title joined to another by a hyphen (``Univ.-Prof.``, ``Dipl.-Ing.``) or a
  doctorate's field after ``Dr.`` or ``Prof.`` (``Dr. rer. nat.``, ``Prof. em. Dr.``).
  ``incl.`` and ``excl.`` never end one; ``dep. 07:15``, ``arr. 10:40``, ``lat. 27.9``,
  ``long. 86.9`` (after a latitude's comma), ``aprox. 30``, Dutch ``blz. 14`` never before
  a digit, nor ``ref.`` or ``No.`` before a code (``ref. KX-4410``), nor ``apr.`` before
  ``J.-C.``.
  A date written year, month, day with a full stop after each (``2024. 3. 12.``, Korean)
  ends at its last one only.
  Citations and more languages: ``v.`` (versus: ``Brown v. Board``), Polish ``ul.``,
  Indonesian ``Jl.`` (street) and the Dutch ``Dhr.`` never end one; ``op. 27`` (opus),
  ``Ps. 23``, ``1 Cor. 13``, Swedish ``kl. 9.30`` and Polish ``godz. 15.00`` (o'clock)
  never before a digit; a citation's ``Fed.``, ``Civ.``, ``Cir.``, ``Supp.`` go on before
  an initial, another of them or a number (``Fed. R. Civ. P. 12(b)(6)``, ``9th Cir.
  2010``); ``Ln.``, ``Sq.``, ``Ct.`` as ``St.``; a journal-title word (``Appl.``, ``Phys.``,
  ``Proc.``) goes on before more abbreviations that end in a comma or a number (``J. Appl.
  Phys., Vol. 2``, ``Phys. Rev. Lett. 105``), or, all of them journal-title words, before
  a word without a full stop or at the reply's end (``Nat. Commun. in 2021``, ``Proc. Natl.
  Acad. Sci. U.S.A. The paper``). ``max. 24``, Polish ``ok. 50 zł`` (about)
  never before a digit, nor a section's ``s. 1`` (not after a number: ``9.58 s. 12``
  ends), ``art.`` elided (``L'art. 1240``) or the Uzbek ``taxm. 35`` (about);
  Indonesian ``s.d.`` (until), Slovak ``napr.`` (e.g.) and Bengali
  ``ডা.`` (Dr.) never end one. Chess: a move number before a piece's move
  (``1. e4 e5 2. Nf3``, ``3... Qe7``) and a move's ``??`` or ``!`` before the next number
  (``Nf6?? 4. Qxf7#``) end none.
  A Spanish ``¿`` or ``¡`` after a sentence end always opens a new sentence (``etc.
  ¿Quieres``, ``p. m. ¡Hasta``). An opening bracket or quote is looked through (``a.m. (It``).
  A straight ``"`` right after a digit is an inch mark, not a quote; between two Hebrew
  letters, a gershayim (``ד"ר``, Dr.).
* Nothing splits inside an open quote or bracket: ``"…"``, ``“…”``, German ``„…“`` and
  ``»…«``, and ``«…»`` (French spaces it, ``« Je viens. » Puis``: the closing mark stays
  with its sentence). A double quote still open ``quote_max_chars`` after it opened is
  taken as unmatched (a stray ``"`` in the reply): the text after it is scanned again as
  if it were not there, so one stray mark cannot turn the rest of a paragraph into one
  segment (unless ``max_chars`` cut the sentence before that: the count restarts at the
  cut, whether the reply came at once or in pieces). Nor inside inline code
  (```Hello. World.```), closed on its line within ``quote_max_chars`` (else a stray
  backtick).
* An emoji or an emoticon (``:D``, ``:(``, ``^_^``, a face in brackets ``(^o^)/``, ``(T_T)``
  (not a name: ``(x_y)``) or the shrug ``¯\\_(ツ)_/¯``, written as a word; ``:)``, ``;)``,
  ``:(`` also glued to one: ``great:)``) before a capitalized word (or a Georgian one) ends
  a sentence (``got me there :D That one's``, ``Sorry:( I was``, ``დღეს 🎂 ეს``); an emoticon's
  bracket opens or closes none (a glued ``:)`` closes a bracket that is open:
  ``(mostly:)``). An em dash right after a word, then a space and a word that opens
  sentences, ends one broken off (``might be in the— Actually, ...``; not ``the—wait``),
  after the quote or bracket it closes too (``"I was about to—" "Don't,"``).
* A newline ends a segment (list items, headings, table rows); a fenced code block is one
  segment whose spoken form is empty. A letter or Roman number opening a line numbers its
  item as ``1.`` does and ends no sentence (``   a. Product: $1.2B``, ``ii.``, ``IV.``).
* The first segment of a turn may end at a clause mark (``,`` ``;`` ``:`` spaced dash)
  once it holds ``first_min_words`` words: the engine can start speaking sooner. Not at a
  comma inside a name, an address or a reference: before a capitalised word other than
  "I" ("Memphis, TN", "Baker St., London", "Thu., Oct. 9", "Celtics 112, Heat 108") or
  before a unit's abbreviation and a number ("ext. 204", "dep. 07:15", "vol. 3, ch. 7",
  ``_UNIT_ABBREVIATIONS``); the sentence goes on to its next clause mark or end
  (``first_max_words`` keeps its cut at that comma: it would cut one word later instead).
* Opt-in (``first_phrase_words`` > 0): the first segment may also end right before a
  lowercase phrase-opening function word (``and``, ``but``, ``because``, ``which``,
  ``in``, ``with``...) once it holds that many words, inside no quote or bracket, with the
  function word complete (whitespace after it), no no-break space before it (``65\u00a0in``)
  and the piece before it not ending in an
  article, a determiner or another function word (``the``, ``my``, ``of``...; a quote or
  bracket closed on it promises nothing: ``"Over The" | in``). It is
  decided at the whitespace after the function word, so a sentence that ends before that
  goes whole, and the result does not depend on the chunking.
* Opt-in (``first_max_words`` > 0), prosody-blind: the first segment may also end at the
  first space after that many words (those holding a letter or digit; a list marker is
  none; never a no-break space, U+00A0 or U+202F: ``10\u00a0km``, ``M.\u202fDupont``),
  wherever the phrase is, when nothing above cut it sooner. Only between two plain
  words: the word before is letters (with their combining marks: a Hindi vowel sign, an
  accent written apart; an inner apostrophe or hyphen, a trailing ``,`` ``;``
  ``:`` allowed, but not before a digit: "June, 2024"), not a title or "et", nor a word
  that promises more (``_NO_PHRASE_END``: "the", "at", "and", "is"...); the word after
  starts with a letter or digit; inside no quote, bracket, emphasis, strike-through, inline
  code or math. So never inside a number, an abbreviation, a URL or a markdown span.
  Decided once the next word's first character arrives (a word is whole only when the
  space after it is there), so the result does not depend on the chunking. Chinese and
  Japanese, written without spaces, give it no place.
* Later sentences shorter than ``min_chars`` are merged with the next (never across a
  newline); a sentence longer than ``max_chars`` is cut at its last clause mark (else its
  last space that is not inside a number written in groups, "1 250 000", or between two
  Chinese or Japanese characters) before ``max_chars``, so no segment is longer (a sentence
  end or clause mark one past it does not stand). A single word longer than that (a long
  URL) is never cut, but the text after it starts the next segment.

``text`` is the exact substring of the reply; ``spoken`` is what the TTS engine receives
(see ``speakable``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace

from engines.espeak_languages import GERMAN_MONTH_WORDS
from engines.spell import spell_out

ONE_STEP_MAX_CHARS = 150
"""``max_chars`` for a voice that may make a segment in one step (chatterbox, itself or as
a fallback; ``engines.base.streams_always``): about 10 s of speech instead of 400
characters' 25 s. Such a step holds its lane to the end, and a live turn arriving meanwhile
waits for all of it (5.3 -> 9.1 s live TTFA on tiny models behind 400-character HTTP
segments); the listener of the segment waits for all of it too."""


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    first_min_words: int = 4
    """The first segment of a turn may end at a clause mark once it has this many words
    (0 disables the eager first clause). 4 measured in bench/SEGMENTATION.md."""
    first_phrase_words: int = 0
    """Opt-in (0 = off): the first segment of a turn may also end right before a
    phrase-opening function word (``and``, ``because``, ``in``, ``with``... see
    ``_PHRASE_OPENERS``) once it holds this many words. Trades some prosody for latency;
    measured in bench/SEGMENTATION.md."""
    first_max_words: int = 0
    """Opt-in (0 = off): the first segment of a turn may also end at the first word
    boundary after this many words, wherever the phrase is, when no sentence end, eager
    clause or phrase cut came first (stream2sentence's "fast first fragment"). Prosody-blind:
    never inside a protected token (number, abbreviation, URL, quote, bracket, markdown
    span) nor right after "the", "at", "and"..., but mid-phrase; measured in
    bench/SEGMENTATION.md."""
    min_chars: int = 0
    """Sentences after the first shorter than this are merged with the next one."""
    max_chars: int = 400
    """A sentence longer than this is cut at its best clause boundary before this length: no
    segment is longer, but for a single longer word (never cut)."""
    quote_max_chars: int = 150
    """A double quote still open this many characters after it opened is unmatched: the
    sentence ends inside it count (0: a quote holds until it closes, a newline or
    ``max_chars``). Quoted speech in the corpora spans at most 28 characters."""


@dataclass(frozen=True, slots=True)
class Segment:
    index: int
    text: str
    """Exact substring of the reply (``reply[start:start+len(text)]``), stripped."""
    start: int
    spoken: str
    """What the engine receives. May be empty (a code block, an emoji-only line): then
    there is nothing to synthesize."""


_TERMINATORS = frozenset(
    ".!?\u2026\u061f\u06d4\u0964\u0965\u037e\u0589\u1362\u1367\u104b\u17d4\u17d5"
    "\u0f0d\u0f0e\u1c7e\u1c7f\ua9c9\u1b5f\ua60e\ua60f\u1803\u1809")
"""Sentence ends followed by a space: . ! ? …, the Arabic question mark ؟, the Urdu full
stop ۔, the Devanagari dandas । ॥ (Bengali's too), the Greek question mark U+037E (which
LLMs write as ";": after a Greek letter that one is a question mark too, ``_GREEK``), the
Armenian full stop ։ (U+0589, not a colon), the Ethiopic full stop ። and question mark ፧
(Amharic), the Myanmar full stop ။, the Khmer full stops ។ and ៕ (U+17D4, U+17D5) and the
Tibetan shad and double shad ། ༎ (U+0F0D, U+0F0E; a verse's "། །" pair, whose second shad
opens the next line, is not cut: ``_TIBETAN_SHADS``), the Ol Chiki (Santali) full stops ᱾ ᱿
(U+1C7E, U+1C7F), the Javanese pada lungsi ꧉ (U+A9C9), the Balinese carik pareren ᭟ (U+1B5F),
the Vai full stop and question mark ꘎ ꘏ (U+A60E, U+A60F) and the Mongolian and Manchu full
stops ᠃ ᠉ (U+1803, U+1809)."""
_TIBETAN_SHADS = frozenset("\u0f0d\u0f0e")
_GEORGIAN = re.compile("[\u10d0-\u10ff]")
"""Georgian letters (Mkhedruli): Unicode calls them lowercase, but the script has no case in
use, so the first letter of a sentence is one of them ("გამარჯობა! ხვალ")."""


def _capital(ch: str) -> bool:
    """``ch`` opens a sentence as a capital does: an uppercase letter, or a Georgian one."""
    return ch.isupper() or _GEORGIAN.match(ch) is not None


_GREEK = re.compile("[\u0370-\u03ff\u1f00-\u1fff]")
"""Greek letters: a ";" right after one asks a question ("Τι ώρα είναι; Είναι τρεις."); Greek
writes its semicolon as a raised dot (·)."""
_CJK_TERMINATORS = frozenset("\u3002\uff01\uff1f")
"""。！？: Chinese and Japanese sentence ends (Qwen3-TTS speaks both). No space follows
them and nothing abbreviates with them, so each ends its sentence, unless a lowercase word
follows (an English sentence quoting one goes on: "行きます。means 'I go'")."""
_CJK_CLAUSE = frozenset("\uff0c\u3001\uff1b\uff1a")
"""，、；：: clause marks with no space after them. They give the eager first segment its cut
and an over-long sentence its best break (a Chinese sentence has no space to break at)."""
_CJK_OPENERS = frozenset("\u300c\u300e\uff08\u3010")
_CJK_CLOSERS = frozenset("\u300d\u300f\uff09\u3011")
"""「『（【 ... 」』）】: a full-width end inside them, or right before the closing one, does
not end the sentence (「本当？」と聞いた is one sentence)."""
_CLAUSE = frozenset(",;:\u2014\u2013-")
_QUOTES_AND_BRACKETS = frozenset("\"\u201c\u201d\u201e\u00ab\u00bb()[]")
_EMOJI_RANGES = "\U0001F000-\U0001FFFF\u2600-\u27BF\u2B00-\u2BFF"
"""The emoji blocks the scanner stops at to ask ``_is_emoji`` (which holds them too)."""
# Characters the scanner stops at; everything else is skipped with one regex search.
_STOP = re.compile("[" + re.escape("".join(sorted(
    _TERMINATORS | _CLAUSE | _QUOTES_AND_BRACKETS | _CJK_TERMINATORS | _CJK_CLAUSE
    | _CJK_OPENERS | _CJK_CLOSERS | {"\n", "`", "^", "\u00af"}))) + _EMOJI_RANGES + "]")
_CLOSERS = frozenset("\"'\u201d\u2019)]*_")
_QUOTE_CLOSERS = frozenset("\u201c\u00ab\u00bb")
"""“ « »: they close a quote that is open (German „…“ and »…«, French, Spanish, Italian
and Portuguese «…»), and open one otherwise (English “…”, «…»)."""
_SPACE = frozenset(" \t\r\u00a0\u202f")
_AFTER_MARKS = "\"'\u201d\u2019\u00bb)]*_"
"""What may close a sentence after its mark ('"Stop."', "(It's 5.)"): left out when the next
segment asks how the last one ended."""

# "Dr. Smith": titles (as written) and these lowercase forms never end a sentence.
_TITLES = frozenset(
    "Mr Mrs Ms Dr Prof St Sr Sen Rep Gov Gen Col Capt Lt Sgt Rev Hon Mt Ft MR MRS MS DR "
    "Maj Cpl Pvt Adm Cmdr Brig Msgr "  # "Maj. Tom Hale", "Adm. Nimitz"
    "dr "  # Hungarian writes the title in lower case: "dr. Kovács Anna"
    "Hr Hrn Sra Srta Sres Dra Dres Lic Sig Sigg Dott Avv Ing "
    "Dhr Mevr dhr mevr "  # Dutch: "Dhr. Jansen", "dhr. Jansen" (Mr.), "Mevr. de Vries" (Mrs.)
    "MM Exmo Exma Excmo Excma "  # French "MM. Blanc" (Messrs.), Portuguese "Exmo. Sr."
    "Dl Dna Dlui Dnei "  # Romanian: "Dl. Popescu" (Mr.), "Dna. Ionescu" (Mrs.)
    "Gng Bb "  # Tagalog: "Gng. Santos" (Mrs.), "Bb. Cruz" (Miss)
    "Bw".split()  # Swahili: "Bw. Otieno" (Mr.); "Bi." (Mrs.) is in _NAME_OR_END
)
_NEVER_END = frozenset(
    "vs v e.g i.e cf approx dept est "  # "Brown v. Board": versus
    "incl excl "  # "$89.99 excl. VAT"
    "z.b u.a d.h v.a o.ä u.u i.d.r s.o s.u bzw vgl ggf evtl bspw inkl einschl ausschl zzgl "
    "bzgl sog "  # German
    "p.ex p.ej sig dott avv prof av avda b\u00e2t "  # French, Spanish, Italian
    "ul jl "  # Polish "ul. Długa" and Indonesian "Jl. Sudirman" (street)
    "s.d napr "  # Indonesian "Senin s.d. Jumat" (until), Slovak and Czech "napr." (e.g.)
    "ул просп пер пл наб св проф акад доц "  # Russian
    "вул пров бульв ім "  # Ukrainian: "вул. Хрещатик" (street), "ім. Шевченка" (named after)
    "κ κα καθ δρ οδ λεωφ πλ "  # Greek: "κ. Παπαδόπουλος" (Mr.), "οδ. Ερμού" (street),
    # "πλ. Συντάγματος" (square)
    "şos șos "  # Romanian: "șos. Kiseleff" (road; "str." is in _NAME_OR_END)
    "डॉ प्रो "  # Hindi
    "ডা".split()  # Bengali "ডা. রহমান" (Dr.)
)
"""Never end a sentence; the German, French and Spanish ones also spaced: "z. B.", "u. a.",
"p. ex.", "p. ej." (German nouns are capitalized: "z. B. Äpfel", "u. a. Anna"). Russian
streets and titles before a name: "ул. Тверская", "проф. Иванов"; Hindi "डॉ. शर्मा" and
Bengali "ডা. রহমান" (Dr.); Ukrainian "вул. Хрещатик", Greek "κ. Παπαδόπουλος" (Mr.) and
Romanian "șos. Kiseleff" likewise.
(Not "им.", "named after", which is the pronoun "them" too: ``_RUSSIAN_STARTERS``.)"""
_SPACED_ABBR = re.compile(
    r"(?<![^\s(\"'\u201e\u201c\u00ab\u00bb])(?:[^\W\d_]{1,2}\. )+[^\W\d_]{1,2}\Z")
"""A spaced abbreviation ending right before a dot: "z. B", "u. a", "i. d. R", "p. ex"."""
_BEFORE_ROMAN = frozenset("séc sec s sig jh art ch vol pt bk".split())
"""Before a roman numeral: a century ("séc. XX") or a division ("Art. III", "Vol. II"); "I"
only before a comma ("Art. I, § 8"), as "sec. I think" ends."""
_ROMAN = re.compile(r"[IVXLC]+")
_DOUBLED = re.compile(r"([A-Z])\1")
"""Spanish doubles a letter for a plural: "EE. UU." (Estados Unidos), "FF. AA."."""
_MONTHS_ALSO_ENGLISH = frozenset(
    "April August September November Jan Feb Apr Jun Jul Aug Sep Sept Nov".split())
"""German months that English has too: "is 12. August is hot" ends a sentence, so these
need a German word before the day ("am 3. April", ``_DAY_AFTER``)."""
_DAY_AFTER = frozenset("am vom bis zum ab seit und".split())
_ORDINAL_AFTER = frozenset("im vom zum zur beim der den dem des die das".split())
"""German words before a day or an ordinal number ("der 1. FC", "im 19. Jahrhundert"):
"3." after them (or before a month: "am 3. Oktober") is an ordinal, not a sentence end."""
_FLOORS = frozenset("OG UG EG DG Obergeschoss Untergeschoss Etage".split())
"""German floors: "3. OG" (3rd floor) closes an address ("Goethestr. 5, 3. OG"). Not "Stock",
which opens English sentences ("step 2. Stock up")."""
_WEEKDAYS = frozenset(
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday Mon Tue Tues Wed Thu Thur Thurs "
    "Fri Sat Sun".split()
)
"""After "a.m." or "p.m.", opening hours go on: "9 a.m. Mon.–Sat.", "8 p.m. Friday"."""
# "3 p.m. Eastern", "10 a.m. PT": a time zone goes on the sentence; "at 9 a.m. EST. That's"
# ends it (not "est.", estimated).
_ZONES = frozenset(
    "Eastern Central Mountain Pacific UTC GMT EST EDT CST CDT MST MDT PST PDT ET CT MT PT "
    "HST AKST AKDT AST ADT CET CEST BST WET WEST EET EEST MSK IST SGT HKT JST KST AEST AEDT "
    "NZST NZDT".split()
)
# "in the U.S. The": end a sentence only before a capital.
_CAPITAL_END = frozenset(
    "a.m p.m etc inc ltd co corp u.s u.k u.n ph.d b.c a.d st al".split()
)
"""("al": "Smith et al. (2020) found", "by Smith et al. The effect".)"""
# "No. 5", "Jan. 3", "ext. 12", "Apt. 4B", "Eq. 3", "Nr. 5", "pág. 12" (and "Hauptstr. 12"),
# "6 ft. 2 in.", "7 lb. 8 oz.": never before a digit.
_BEFORE_NUMBER = frozenset(
    "no nos vol fig figs p pp ch sec secs min mins hr hrs art jan feb mar apr jun jul aug sep "
    "sept oct nov dec approx tel ext apt ste bldg rm eq eqs sect sects para ref refs sc nr bd abs "
    "kap str abb tab pág págs pag núm num cap n ft lb lbs "
    "op godz kl "  # "op. 27 no. 2" (opus); Polish "godz. 15.00", Swedish "kl. 9.30" (o'clock)
    "max maks "  # "max. 24 months", as "min. 30 days"; Danish, Norwegian, Polish "maks. 5"
    "lun mié mie jue vie sáb sab dom env "  # Spanish "el lun. 3 de nov."; French "env. 20 min"
    "pon uto sri čet pet sub ned "  # Croatian weekdays: "u pon. 5. svibnja"
    "kb "  # Hungarian "kb. 12 000 Ft" (about)
    "dep arr lat "  # "dep. 07:15, arr. 10:40", "lat. 27.9881" (latitude)
    "aprox blz "  # Spanish and Portuguese "aprox. 30 km" (about), Dutch "blz. 14" (page)
    "taxm "  # Uzbek "taxm. 35 °C" (taxminan, about)
    "ps psa prov isa matt rom cor eph deut exod "  # Bible books: "Ps. 23", "1 Cor. 13"
    # Sinhala "ක්‍රි.ව. 1505" (AD) and "ක්‍රි.පූ. 250" (BC)
    "\u0d9a\u0dca\u200d\u0dbb\u0dd2.\u0dc0 \u0d9a\u0dca\u200d\u0dbb\u0dd2.\u0db4\u0dd6 "
    "д кв корп стр ауд рис табл гл т с тел "  # Russian: "д. 12", "ауд. 305", "с. 45"
    "रु".split()  # Hindi: "रु. 450" (rupees)
)
_BIBLE_BOOKS = frozenset(
    "gen exod lev num deut josh judg sam kgs chr neh esth ps pss prov eccl eccles "
    "isa jer ezek dan hos obad mic nah hab zeph hag zech mal matt mt mk "
    "lk jn jhn rom cor gal eph phil col thess tim tit philem heb jas jud rev".split())
"""Bible books as references abbreviate them: before a chapter and verse ("Lk. 6:20", "1 Tim.
3:16") one goes on; before a bare number only those in ``_BEFORE_NUMBER`` do, since "Tim.",
"Dan." and "Phil." are names too ("I called Tim. 3 days later"). Not the books written in
full ("Ruth", "Job") nor words ("song", "pet"): "I called Ruth. 9:30 works" ends."""
_STATUTE_ABBR = frozenset(
    "Cal Calif Fla Tex Ariz Colo Conn Mass Mich Minn Okla Tenn Wash Wis Ala Ark Kan Ky Md Neb "
    "Nev Va Ga Ill Stat Ann Pen Bus Prof Fam Veh Ins Lab".split())
"""States and code words of a statute's citation ("Cal. Civ. Code § 1542", "Fla. Stat. §
768.81", "Tex. Penal Code Ann. § 22.01"): with ``_CITE_ABBR``, they go on when capitalized
words lead from them to a section sign (``_reaches_section``)."""
_UNIT_LETTER = re.compile(r"[B-HJ-Z]\d{0,3}")
"""A building's, room's or suite's letter ("Bldg. C, Rm. 204", "Ste. B2"): after "Bldg.",
"Rm.", "Ste." or "Apt." it goes on, as a number does; not "A" nor "I", which open sentences."""
_UNITS_BEFORE_LETTER = frozenset("bldg rm ste apt".split())
_YAHOO = frozenset(
    "Finance Mail News Sports Answers Japan Search Groups Messenger Maps Weather Music "
    "Games Travel Shopping Autos Health Entertainment Life Tech Style".split())
"""The brand writes its "!": "Yahoo! Finance" goes on (any other word after it ends)."""
_DEGREE_FIELDS = frozenset(
    "med rer nat techn phil jur oec dent vet habil theol pol sc em mult".split())
_DEGREE_BEFORE = frozenset(("dr", "prof", *_DEGREE_FIELDS))
"""A German or Austrian doctorate's field and an emeritus after "Dr." or "Prof." (or another of
them): "Dr. med. Keller", "Dr. rer. nat. Anna Vogt", "Prof. em. Dr. Lang" go on, as the title
does, while "take your med. Then" ends."""
_CODE = re.compile(r"[A-Z][A-Z0-9]*(?:[-/][A-Z0-9]+)*[-/]?\d[A-Z0-9-/]*")
"""An order, case or reference code in capitals with a digit ("KX-4410", "RMA-77812", "A1")."""
_TOKEN_MOST = 24
"""How far ``_next_token`` reads: a code or a date's part is shorter."""
_DAY = re.compile(r"(?:[1-9]|[12]\d|3[01])\.")
_DATE_REST = re.compile(r"(?:[1-9]|1[0-2])\. (?:[1-9]|[12]\d|3[01])\.")
"""A month and a day, each with its full stop, after a year's ("2024. 3. 12.")."""
_CHAIN_MOST = 6
"""How many abbreviations ``_abbreviation_chain`` reads ahead ("Natl. Acad. Sci. U. S. A.,")."""
_SECTION_WORDS_MOST = 4
"""How many capitalized words ``_reaches_section`` reads before a ``§`` ("Civ. Code §")."""
_JOURNAL_WORDS = frozenset(
    "Acad Adv Am Anal Angew Ann Annu Appl Arch Astron Astrophys Behav Biochem Biol Br Bull Can "
    "Chem Clin Cogn Commun Comput Curr Ecol Econ Ed Educ Eng Environ Eur Evol Exp Genet Geophys "
    "Immunol Ind Inf Int Lett Mater Math Mech Med Microbiol Mol Nat Natl Neurosci Nucl Opt "
    "Pharmacol Philos Phys Physiol Proc Psychol Res Rev Sci Soc Stat Struct Syst Technol "
    "Theor Trans".split()
)
"""Words of journal titles as citations abbreviate them (ISO 4): only after one of these does
a sentence end wait for the abbreviations that may follow it (``_abbreviation_chain``), so
that "8.4 seconds. Then" ends at once."""
_GERMAN_COUNTS = frozenset("Mio Mrd Tsd Min Std Sek".split())
"""German abbreviations after a number, before a noun, which German capitalizes: "3,7 Mio.
Einwohner", "10 Min. Verspätung", "2 Std. 30 Min.". They end a sentence only before a
word that opens one (``_STARTERS``, ``_GERMAN_STARTERS``): "in 10 Min. Bitte warten"."""
_GERMAN_STARTERS = frozenset(
    "Der Die Das Den Dem Des Ein Eine Einen Einem Einer Er Sie Es Ich Du Wir Ihr Man Mein "
    "Meine Dein Deine Sein Seine Ihre Unser Unsere Dies Diese Dieser Dieses Dann Danach Dabei "
    "Dazu Damit Deshalb Daher Dort Da Hier Jetzt Nun Heute Bitte Danke Vielen Gute Guten "
    "Also Aber Und Oder Doch Denn Wenn Falls Ob Als Wie Was Wer Wo Wann Warum Welche Welcher "
    "Soll Sollen Möchtest Möchten Willst Kann Kannst Können Ist Sind War Hat Haben Gibt Ja "
    "Nein Auch Noch Nur Zum Zur Im Am Um Auf Mit Nach Vor Bei Ab Bis Seit Insgesamt Leider "
    "Außerdem Zudem Allerdings Alles Viel Viele Nicht Kein Keine Keinen Sehr Gern Gerne "
    "Immer Nie Bald Zuerst Erst Sonst Trotzdem Dafür Deswegen Übrigens Natürlich "
    "Vielleicht".split()  # "alle 12 Std. Nicht mit Alkohol"
)
_KITCHEN_UNITS = frozenset("tsp tbsp tbs oz lb lbs pt qt gal pkg".split())
_KITCHEN_VERBS = frozenset(
    "Add Stir Mix Whisk Beat Bake Roast Serve Season Top Pour Cook Heat Preheat Combine Fold "
    "Place Put Remove Sprinkle Garnish Simmer Boil Chill Cover Drain Melt Transfer Use Keep "
    "Store Repeat Taste Adjust Reduce Bring Cut Chop Slice Dice Mince Grill Fry Toss Blend "
    "Knead Roll Spread Brush Freeze Refrigerate Mash Grate Squeeze Dissolve Sift Measure "
    "Rinse Peel Soak Marinate Set Turn Cool Rest Spoon Divide Drizzle Scatter Makes Yields "
    "Serves Plus Note Tip".split()
)
"""After a kitchen unit and a capital, a recipe's new sentence mostly opens with one of these
(or a ``_STARTERS`` word, or an adverb in -ly: "1/16 tsp. Honestly", "2 lbs. Dice them");
any other capital is an ingredient's name and the unit goes on ("1/2 tsp. Dijon", "2 oz.
Gouda"): a list of names is never complete, the verbs that open a step nearly are."""
_RUSSIAN_STARTERS = frozenset(
    "Я Ты Он Она Оно Мы Вы Они Это Эта Этот Эти Там Тут Здесь Тогда Потом Затем Теперь "
    "Сейчас Сегодня Завтра Вчера Но А И Да Нет Так Если Когда Пока Все Всё Вот Спасибо "
    "Ещё Еще Может Можно Нужно Надо Как Что Кто Где Почему Зачем Не После Перед В На С По "
    "Из За Для Однако Поэтому Также Кроме Только Хорошо Конечно Их Его Её Ее Мой Моя Наш "
    "Ваш Ваша Итак Сначала Наконец Хотя Ведь Например Давайте Пожалуйста".split()
)
"""Words that open Russian sentences far more often than they are a name: after "им."
("named after", and the pronoun "them") one of these means the pronoun ended a sentence
("Я позвонил им. Они не ответили"), any other capital a name ("музей им. Пушкина")."""
# "St. Louis", "Pennsylvania Ave. NW", "7th c. B.C.": these go on before a capital that does
# not open a sentence (``_STARTERS``), as an initial does. So do a name's "Sr." and "Jr."
# ("Ken Griffey Sr. He hit" ends, "Martin Luther King Jr. Day" goes on; the Spanish title
# "Sr. García" too) and the Vietnamese "TP." (city: "TP. Hồ Chí Minh").
_NAME_OR_END = frozenset(
    "St Ave Blvd Rd Ln Sq Ct Hwy Pkwy Univ c ca Sr Jr TP Tp "  # "Oxford Univ. Press"
    "Man "  # "drew 1-1 with Man. City" (Manchester); "Isle of Man. The ferry" ends
    "Cad Sok Mah Bul "  # Turkish, after the name: "Atatürk Cad. No. 15"
    "Assoc Asst "  # "Assoc. Prof. Tan", while "the Bar Assoc. It" ends
    "Bros bd "  # "Warner Bros. Discovery" ("Warner Bros. The film" ends), French "12 bd. Voltaire"
    "str Str Bi".split())  # Romanian "str. Lipscani", Swahili "Bi. Amina"; "a str. Then" ends
_STREETS = frozenset("St Ave Blvd Rd Ln Sq Ct Hwy Pkwy".split())
_DIRECTIONS = frozenset(
    "Leave Turn Take Go Head Walk Drive Enter Exit Meet Look Follow Continue Keep Get Ring "
    "Press Use Expect Allow Arrive Ask Parking Entrance".split()
)
"""After a street ("221 E. 57th St. Leave by 3:30"), directions open the next sentence with
one of these verbs: no saint or street is named so ("Cross" and "Park" are: "St. Cross",
"Mill St. Park"), so they end it as a ``_STARTERS`` word does."""
# Words that open sentences far more often than they continue a proper name: after
# "Plan B.", "the U.S." or "Downing St." one of these means a new sentence, any other
# capital ("the U.S. Army", "John F. Kennedy", "St. Louis") a name that goes on.
_STARTERS = frozenset(
    "The A An This That These Those It Its It's That's There There's Here Here's Then Now "
    "Next So But And Or If When While After Before Also However Still Yet Please Let Let's "
    "I I'm I've I'll I'd We We're We'll We've You You're You'll You've He He's She She's "
    "They They're They'll His Her Their Our My Your Don't Do Does Did Is Are Was Were Will "
    "Would Can Could Should What Who Where Why How Which Yes No Not Some All Most Many Each "
    "Every Both In On At For From To With By As Just Only Once Otherwise Finally Meanwhile "
    "Instead Overall Thanks Sure Okay OK Great Good Last Today Tomorrow Yesterday Later "
    "Since Because Although Even Other Another One Two Three Either Neither Actually Anyway "
    "Well Oh Sorry "
    "Det Jeg Jag Vi Hun Hon".split()  # Norwegian, Danish, Swedish: "fra Oslo S. Det er"
)
# "Plan B.", "vitamin C.", "Row F.", "an A.", "au b\u00e2t. B.": a single capital after these
# is a label, not an initial, so it ends a sentence before any capital.
_LABELS = frozenset(
    "a an plan option vitamin type grade row seat gate terminal zone group class section "
    "part step level size block building platform exit route channel category model hall room "
    "appendix exhibit figure letter lot wing pier bay track phase tier suite unit "  # "Lot C."
    "b\u00e2t. b\u00e2timent porte salle".split()  # French
)
# A phrase may open at these (first_phrase_words): conjunctions and prepositions that
# begin a constituent of their own, so a pause before them is one a speaker makes. Left
# out on purpose: "to" (mostly the infinitive marker: "you need | to restart"), "of"
# (binds to the noun before: "most | of them"), "that" ("is | that right", "so | that"),
# "so" and "as" (mostly intensifier/comparative: "it's | so good", "as big | as"),
# "than" ("more | than").
# What ``abandon`` supposes comes next: a capital starter and a word after it, enough for
# every decision that looks ahead ("Plan B. The", "at 3 p.m. The").
_NEXT_SENTENCE = " The next"
_PHRASE_OPENERS = frozenset(
    "and but or because while when whenever if unless although though whereas which who "
    "whom whose where until since in at on for with from about after before by during "
    "through without within into across between".split()
)
_PHRASE = re.compile(
    r"(?<=[ \t])(?:" + "|".join(sorted(_PHRASE_OPENERS, key=len, reverse=True))
    + r")(?=[ \t\u00a0])"
)
_PHRASE_LONGEST = max(map(len, _PHRASE_OPENERS))
# The piece before a phrase cut never ends in one of these: it would promise a word that
# is not there ("the | in", "my | and", "of | with", "Mr. | and"), or leave a predicate
# without its complement ("The docs are | at", "It must be | at least").
_NO_PHRASE_END = _PHRASE_OPENERS | frozenset(
    "a an the my your his her its our their this these those some any no every each "
    "of to than as so that not very is are was were be been being am do does did has have "
    "had will would can could should shall may might must".split()
)
_GAP = re.compile("[ \t\u00a0\u202f]+")
_GAP_OR_LINE = re.compile("[ \n]")
"""Where a word longer than max_chars ends: the long cut is made at a space."""
_WORD = re.compile(r"[^\W_]\S*")
"""From a word's first letter or digit to its end: one match per word holding one (as
``str.isalnum`` and ``str.split`` have them)."""
_PLAIN_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*['\u2019]?[,;:]?")
"""A word the first_max_words cut may follow: letters, an inner apostrophe or hyphen
("it's", "well-known"), a plural possessive ("students'"), a clause mark ("Paris,")."""


def _plain_word(word: str) -> bool:
    """``word`` is a ``_PLAIN_WORD`` once its combining marks are left out: a Hindi vowel
    sign ("बहुत") or an accent written apart ("e" + U+0301) is part of a letter."""
    if _PLAIN_WORD.fullmatch(word):
        return True
    return not word.isascii() and _PLAIN_WORD.fullmatch(
        "".join(c for c in word if not unicodedata.category(c).startswith("M"))) is not None

_MATH_DOLLAR = re.compile(r"\$(?!\d)")
"""A ``$`` that may delimit math (not "$5")."""
_SPAN_MARK = re.compile("[*_$~`'\u2018]")
"""What can open a span ``_open_span`` sees (a closing ’ alone opens none)."""
_OPEN_SINGLE = re.compile("(?<![^\\s])['\u2018]")
_CLOSE_SINGLE = re.compile("['\u2019](?![^\\s,;:.!?])")


def _open_span(text: str) -> bool:
    """``text`` ends inside a markdown span (``**…**``, ``*…*``, ``__…__``, ``_…_``,
    ``~~…~~``, inline code, ``$…$`` math) or a single-quoted phrase: a first_max_words cut
    there would split what ``speakable`` reads as one (counted, so conservative: an odd
    ``_`` in "my_var" keeps the cut off)."""
    if _SPAN_MARK.search(text) is None:
        return False  # (most heads: plain prose; the counts below cost several passes)
    for pair, single in (("**", "*"), ("__", "_"), ("$$", None), ("~~", None)):
        if text.count(pair) % 2:
            return True
        if single and text.replace(pair, "").count(single) % 2:
            return True
    return (text.count("`") % 2 == 1
            or len(_MATH_DOLLAR.findall(text.replace("$$", ""))) % 2 == 1
            or len(_OPEN_SINGLE.findall(text)) > len(_CLOSE_SINGLE.findall(text)))


_CITE_ABBR = frozenset("Fed Civ Crim Evid App Bankr Cir Supp".split())
"""Abbreviations of legal citations, which go on before an initial, another of them or a
number: "Fed. R. Civ. P. 12(b)(6)", "F. Supp. 2d", "9th Cir. 2010" (not "the Fed. Markets")."""
_SAN = re.compile(r"[KQRBN][a-h]?[1-8]?x?[a-h][1-8]")
"""A chess piece's move in algebraic notation ("Nf3", "Qxf7", "Rae1"): after a move number
("2. Nf3", "3... Qe7") it is no sentence; a pawn's ("1. e4") is lowercase already."""
_EMOTICON = re.compile(r"[:;=]'?-?[()\[\]DPpOo3/\\|*]|[xX]D|<3|\^_?\^")
"""An emoticon written as a word of its own (":)", ";-)", ":'(", "xD", "<3"): it stays with
the sentence before it, as an emoji does, and its bracket opens or closes none."""
_KAOMOJI = re.compile(
    "\\((?=[^()\\s]*[\\^_\u00b0\u25bd\u03c9\u2267\u2266\u00b4\u25d5\u203f\u30c4\u25a1\u256f\uff3e])"
    "(?![^()\\s]*(?:\\d|[^\\W\\d_]{2}))[^()\\s]{1,7}\\)[/\\\\\u30ce\uff89\u256f]*"
    "|\u00af\\\\{1,2}_\\(\u30c4\\)_/\u00af")
"""A face in brackets written as a word ("(^o^)/", "(T_T)", "(＾▽＾)", "(╯°□°)╯") or the shrug
"¯\\_(ツ)_/¯": as an emoticon, it stays with the sentence before it and opens no bracket.
Inside the brackets no digit and no two letters in a row ("(1/2)", "(n_max)", "(e.g.)" are
none), and one of the marks faces are drawn with."""


def _face(word: str) -> bool:
    """A ``_KAOMOJI`` match is a face, not a bracketed name: letters joined by underscores
    are a face only when they are one letter ("(T_T)", "(x_x)", "(o_O)"); "(x_y)" and
    "(a_b_c)" are variables."""
    letters = word[1:word.find(")")].replace("_", "")
    return not letters.isalpha() or len(set(letters.casefold())) == 1


_GLUED_FACE = re.compile(r"[:;]-?[()]")
"""An emoticon glued to the word before it ("great:)", "Sorry:("): only these, since
"Answer:D" may be a choice."""
_CAMEL = re.compile(r"[a-z]{1,5}[A-Z][A-Za-z0-9]*|v\d+")
"""A name written in camelCase ("macOS", "iOS", "iPhone", "eBay") or a version ("v0.3.1"):
it opens sentences though its first letter is lowercase."""
_LATIN_WORD = re.compile("[A-Za-z0-9]*")
"""The Latin start of a word, which Chinese writes joined to the next ("iPhone也")."""
_ELIDED = re.compile(r"(?:[CDJLMNST]|Qu)['\u2019][a-z\u00e0-\u00ff\u0153]")
"""A French word elided before a vowel ("N'oublie", "C'est", "J'ai"): it opens sentences,
while a name after an initial keeps its capital ("D. D'Angelo", "B. O'Brien")."""
_ORDINAL_SIGN = re.compile(r"\d+\.?[\u00ba\u00aa]")
"""A Spanish, Portuguese or Italian ordinal ("2.\u00ba", "3\u00aa"): a single capital after it
is a door or a flat ("2.\u00ba B"), not an initial."""
_OPENERS = frozenset("([\"\u201c\u201e\u00ab\u00bb'\u2018*_")
_DOTTED_ABBR = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")
_CODE_STOP = re.compile("[`\n]")
_HEADING_MARK = re.compile(r"#{1,6}|>")
"""What may stand before a number that starts a line ("### 2. Install", "> 3. Stir"): a
heading's or a block quote's mark; the number still numbers, it ends no sentence."""
_LIST_LETTER = re.compile(r"[^\W\d_]|(?i:i{2,3}|iv|vi{1,3}|ix|xi{1,3})")
"""A list's letter or Roman number opening a line ("   a. Product", "ii. Services", "IV.
Results"): it numbers the item, as "1." does; no sentence is one letter long."""


_CJK_CHAR = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
"""Chinese and Japanese characters (kana and CJK ideographs): scripts without case or
spaces, where a sentence can start right after an English one ("at 3 p.m. 会议...")."""
_CJK = re.compile(f"[{_CJK_CHAR}]")
_CJK_PAIR = re.compile(f"[{_CJK_CHAR}](?=[{_CJK_CHAR}])")
"""A Chinese or Japanese character followed by another: a place to cut a run-on sentence."""


_THAI = re.compile("[\u0e00-\u0e7f]")
"""Thai, which writes no full stop (a space parts its sentences): a dot after a Thai letter
abbreviates ("พ.ศ. 2569", the Buddhist year; "14.00 น.", o'clock) when the letters before it
are ``_THAI_ABBR``'s; after a word, it is a full stop an LLM put in ("ข้าวผัด. คุณ...")."""
_THAI_ABBR = re.compile("[\u0e01-\u0e2e]{1,3}")
"""The end of a Thai abbreviation, after its last inner dot: one to three consonants ("น",
"ดร", "รพ", "กทม", "พ.ศ", "มี.ค"). A Thai word (a run of them, written without spaces)
has a vowel or tone mark or more letters: "ค่ะ", "ครับ", "กะเพรา"."""
_HEBREW = re.compile("[\u05d0-\u05ea]")
"""Hebrew letters: a straight double quote between two of them is a gershayim, the mark of an
abbreviation ("ד"ר", Dr.; "צה"ל"), not a quote."""
_ARABIC = re.compile("[\u0600-\u06ff]")
"""Arabic script, whose one-letter words ("و", and; "ب", by) are written joined to the next
word: a letter alone before a dot abbreviates ("د. أحمد", Dr. Ahmad; "م." engineer)."""


def _bare(word: str) -> str:
    """``word`` as the look-back rules compare it: lower case, without quotes, brackets or
    a clause mark."""
    return word.strip("(\"'\u201c\u201e\u00ab\u00bb*_[,;:").lower()


def _words(text: str) -> int:
    """Words in ``text`` for the eager first clause: spaced words, plus one per two Chinese
    or Japanese characters (written without spaces; a word is one to three of them)."""
    return len(text.split()) + len(_CJK.findall(text)) // 2


_UNIT_ABBREVIATIONS = frozenset(
    "ext tel no nos nr n núm num vol ch chap sec pp p op fig eq dep arr lat long apt ste rm fl "
    "bldg д кв стр".split())
"""Abbreviations a number follows inside a unit: after a comma, one of them, its full stop
(or a number sign's "º", "°": "n.º 5", "n° 12") and a number go on what the comma is inside
("(555) 010-0199, ext. 204", "vol. 3, ch. 7", "AA 1402, dep. 07:15", "Avda. de la Paz,
núm. 7", "ул. Тверская, д. 7"). A closed list, not any short word and a full stop: the
word after the comma decides at its first letter that begins none of them (only "b" of
"but" waits, for the "u"), so the cut is not put off to the next chunk; "approx. 8 hours"
after a comma is a clause."""
_UNIT_ABBR_PREFIXES = frozenset(a[:n] for a in _UNIT_ABBREVIATIONS for n in range(1, len(a) + 1))


_UNIT = re.compile(f"[{_CJK_CHAR}]|[^\\s{_CJK_CHAR}]+")
"""What a listener hears one at a time: a spaced word, or one Chinese or Japanese character."""


_INNER_MARK = re.compile(r"(?<=[^\W_])[./@](?=[^\W_])")
"""A dot, slash or at sign inside a word, which is read as a word of its own ("example dot
org slash a")."""
_READ_AS_ONE = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*[,;:.!?]?")
"""A word read as one: letters (an inner apostrophe or hyphen), maybe a mark after them."""


def heard_prefix(text: str, share: float) -> str:
    """The start of ``text`` a listener heard after ``share`` (0-1) of its audio: its words
    said whole within that share of all it says ("" if none), a Chinese or Japanese
    character counting as one word. Each word weighs the words it is read as
    (``_read_as``): counted as one, "$1,234.56" in "It cost $1,234.56 in total." was kept
    at 80 % of the audio, while the listener was still hearing its nine words."""
    units = list(_UNIT.finditer(text))
    weights = [_read_as(unit.group()) for unit in units]
    budget = sum(weights) * min(1.0, max(0.0, share))
    keep = said = 0
    for weight in weights:
        if said + weight > budget:
            break
        said += weight
        keep += 1
    while keep and not weights[keep - 1]:  # (a mark read as nothing is not heard either)
        keep -= 1
    return text[:units[keep - 1].end()] if keep else ""


def _read_as(word: str) -> int:
    """How many words a listener hears for ``word``: those of its spelled-out form
    (``speakable`` with ``reads_digits=False``: "$1,234.56" is nine, and an engine that reads
    digits itself says as many), and two more for each dot, slash or at sign inside it
    ("example dot org"); none for a mark, an emoji or markdown, which are not read."""
    if _READ_AS_ONE.fullmatch(word):  # (most are: speakable() takes 40 times as long)
        return 1
    said = speakable(word, reads_digits=False)
    return len(_UNIT.findall(said)) + 2 * len(_INNER_MARK.findall(said))


def _is_emoji(ch: str) -> bool:
    o = ord(ch)
    return (
        0x1F000 <= o <= 0x1FFFF  # (not the CJK ideographs of plane 2: "𠮷野家")
        or 0x2600 <= o <= 0x27BF
        or 0x2B00 <= o <= 0x2BFF
        or o in (0xFE0F, 0x200D, 0x20E3)
    )


class _Wait(Exception):
    """Internal: the decision at this position needs text that has not arrived yet."""


class Segmenter:
    """Turns a stream of LLM text deltas into segments ready for speech.

    Call ``feed`` with each delta (any size, even one character) and send the segments it
    returns in order; call ``finish`` once at the end of the stream for the remainder.
    """

    def __init__(self, config: SegmenterConfig | None = None, *, reads_digits: bool = True):
        self.config = config or SegmenterConfig()
        self.reads_digits = reads_digits
        self._buf = ""  # the pending segment and what follows it: _emit trims the rest
        self._offset = 0  # offset of _buf[0] in the reply
        self._index = 0
        self._pos = 0  # scanner position in _buf
        self._quote = 0  # open straight/curly double quotes (0 or 1)
        self._paren = 0  # open brackets
        self._fence = False  # inside a ``` code block
        self._fresh_line = True  # the pending segment starts a line
        # the last character of the segment before the pending one on its line, closing
        # marks left out ("." or "?"; "" at the start of a line or after a cut inside a
        # sentence): "No." after a full stop is a number sign, not the answer
        self._after = ""
        self._clause: tuple[int, int, int, int] | None = None  # (end, resume, quote, paren)
        # while a quote is open: the scanner's state right after it opened (pos, paren,
        # clause, phrase_pos, word_pos), to scan again from there if it turns out unmatched
        self._quote_from: tuple[
            int, int, tuple[int, int, int, int] | None, int, int] | None = None
        self._phrase_pos = 0  # phrase openers before this are decided (first segment only)
        self._word_pos = 0  # first_max_words cuts before this are decided (first segment)
        # the words counted so far for first_max_words (``_head_words``): (head start, gap,
        # words before the gap, last word); None until _emit starts a new buffer
        self._words_at: tuple[int, int, int, str] | None = None
        # the word before the pending segment when a cut inside a sentence (eager clause,
        # phrase, word count, long sentence) made it, for the rules that look back ("im | XIX.");
        # None when the pending segment opens a sentence
        self._carry: str | None = None
        self._final = False

    # --- public --------------------------------------------------------------------------

    def feed(self, text: str) -> list[Segment]:
        """Add a delta; return the segments that are now certain (often none)."""
        if self._final:
            raise RuntimeError("feed() after finish()")
        if not self._buf:  # the spaces before a segment count in no max_chars (``_emit``)
            start = text.lstrip("".join(_SPACE))
            self._offset += len(text) - len(start)
            text = start
        if not text:
            return []
        self._buf += text
        return self._scan()

    def finish(self) -> list[Segment]:
        """End of stream: return the remaining segments. The segmenter is then spent."""
        if self._final:
            return []
        self._final = True
        out = self._scan()
        out.extend(self._emit(len(self._buf), len(self._buf)))
        return out

    def abandon(self) -> list[Segment]:
        """The stream broke: return the segments its text completes, those ``feed`` would
        return if a new sentence began next ("It costs $5. " gives "It costs $5."), even a
        short one; drop the unfinished rest ("and then we", "I met Dr.", "It is 8."). The
        segmenter is then spent."""
        if self._final:
            return []
        # No length cut either: the text kept was within max_chars (feed cuts at it), and
        # only the made-up next sentence could push it past, to be cut inside it ("... The").
        # Nor a first_max_words cut: it could end the first segment inside the made-up
        # sentence, or at the unfinished text's last word ("and then we").
        self.config = replace(self.config, min_chars=0, max_chars=len(self._buf) + 1024,
                              first_max_words=0)
        # never part of a segment: nothing cuts after it. A number's dot at the very end
        # ("is 8.") may have been "8.4": no sentence end there.
        out = [] if self._buf[-2:-1].isdigit() and self._buf.endswith(".") else (
            self.feed(_NEXT_SENTENCE))
        self._final = True
        return out

    # --- scanner -------------------------------------------------------------------------

    def _scan(self) -> list[Segment]:
        out: list[Segment] = []
        buf = self._buf
        try:
            while True:
                if self._fence:
                    if not self._scan_fence(out):
                        break
                    buf = self._buf
                    continue
                m = _STOP.search(buf, self._pos)
                if not self._quote:
                    self._quote_from = None
                elif self._quote_unmatched(m.start() if m else len(buf)):
                    continue
                limit = self.config.max_chars
                if (self._index == 0 and (self.config.first_phrase_words > 0
                                          or self.config.first_max_words > 0)
                        and self._first_cut(min(m.start() if m else len(buf), limit), out)):
                    buf = self._buf
                    continue
                if m is None or m.start() > limit:
                    if (m is not None or len(buf) > limit) and self._cut_long(out):
                        buf = self._buf
                        continue
                    if m is None:
                        self._pos = len(buf)
                        break
                i = m.start()
                c = buf[i]
                if c in _TERMINATORS or c == ";" and i and _GREEK.match(buf[i - 1]):
                    if self._terminator(i, out):  # sets _pos either way
                        buf = self._buf
                    continue
                elif c in _CJK_TERMINATORS:
                    if self._cjk_terminator(i, out):  # sets _pos either way
                        buf = self._buf
                    continue
                elif c == "\n":
                    self._quote = self._paren = 0
                    self._clause = None
                    out.extend(self._emit(i, i + 1))
                    buf = self._buf
                    continue
                elif c in _CLAUSE:
                    if self._clause_mark(i, out):
                        buf = self._buf
                    continue
                elif c in _CJK_CLAUSE:
                    if self._cjk_clause_mark(i, out):
                        buf = self._buf
                    continue
                elif c == '"':
                    if i and _HEBREW.match(buf[i - 1]) and self._need(i + 1) and (
                            _HEBREW.match(buf[i + 1])):
                        pass  # a gershayim: 'ד"ר' (Dr.), 'צה"ל', as LLMs write it
                    elif self._quote or i == 0 or not buf[i - 1].isdigit():
                        self._quote ^= 1  # else an inch mark: 'a 6.1" screen'
                elif c in _QUOTE_CLOSERS:
                    self._quote ^= 1  # “ opens, or closes „…“; « and » as " does
                elif c == "\u201e":
                    self._quote = 1
                elif c == "\u201d":
                    self._quote = 0
                elif c in "(^\u00af" and (i == 0 or buf[i - 1] in _SPACE) and (
                        e := self._emoticon(i) if c == "^" else self._kaomoji(i)) > 0:
                    # a face as a word: "good one ^_^ Want", "(^o^)/", "¯\_(ツ)_/¯ Maybe"
                    if self._ends_after(i, e, out):  # sets _pos either way
                        buf = self._buf
                    continue
                elif c in "([" or c in _CJK_OPENERS:
                    self._paren += 1
                elif c in ")]" or c in _CJK_CLOSERS:
                    self._paren = max(0, self._paren - 1)
                elif _is_emoji(c):
                    if self._emoji(i, out):  # sets _pos either way
                        buf = self._buf
                    continue
                elif c == "`":
                    if self._at_fence(i):
                        self._fence = True
                        self._pos = i + 3
                        continue
                    self._pos = self._code_span(i)
                    continue
                self._pos = i + 1
        except _Wait:
            pass
        return out

    def _quote_unmatched(self, reach: int) -> bool:
        """The scanner is about to move to ``reach`` inside an open quote. True (and the
        scan rewound to right after the quote, as if it were not there) when that is more
        than ``quote_max_chars`` past the quote. Decided on the text alone: the same for any
        chunking."""
        if self._quote_from is None:  # the scan is right after the quote: decide already,
            # or a reply fed whole would step to a far stop the chunked one stops short of
            self._quote_from = (self._pos, self._paren, self._clause, self._phrase_pos,
                                self._word_pos)
        span = self.config.quote_max_chars
        if not span or reach - self._quote_from[0] <= span:
            return False
        if reach > self.config.max_chars and self.config.max_chars < self._quote_from[0] + span:
            # The long cut may come first: fed piece by piece, it does when it is decided on
            # less text than the quote's count (and the count then restarts at the cut), so
            # it must when the text comes at once. (It reads no further than max_chars + 2 <=
            # reach, or to the end of a word longer than max_chars, waiting for it as the
            # long cut does.)
            place = self._long_cut()
            if place is not None and place[4] - self._quote_from[0] <= span:
                return False
        (self._pos, self._paren, self._clause, self._phrase_pos,
         self._word_pos) = self._quote_from
        self._quote, self._quote_from = 0, None
        return True

    def _need(self, j: int) -> bool:
        """True when ``_buf[j]`` exists; at the end of the stream False; else wait."""
        if j < len(self._buf):
            return True
        if self._final:
            return False
        raise _Wait

    def _at_fence(self, i: int) -> bool:
        """A code block opens at ``i``: three or more backticks start the line, and the rest
        of it (the info string, "python") has none. "```x``` See ..." is inline code, to be
        said, as Markdown takes it (waits for the end of the line to tell)."""
        if i:  # the buffer opens on no space and holds no newline (``_starts_line``)
            return False
        buf = self._buf
        self._need(i + 2)
        if not buf.startswith("```", i):
            return False
        j = i + 3
        while self._need(j) and buf[j] != "\n":
            j += 1
        return _FENCE.match(buf, i) is not None  # (speakable's rule too)

    def _code_span(self, i: int) -> int:
        """Inline code opens at ``i``: where the scan goes on, right after the backticks
        that close it (nothing inside ends a sentence or opens a quote: "prints `Hi. Bye.`
        and") or, when none close it on its line within ``quote_max_chars``, right after
        the opening ones (a stray mark). Waits until it can tell."""
        buf = self._buf
        j = i
        while self._need(j) and buf[j] == "`":
            j += 1
        span = self.config.quote_max_chars or len(buf) + 1
        k = j
        while True:
            m = _CODE_STOP.search(buf, k, j + span + 1)
            if m is None:
                if len(buf) <= j + span:
                    self._need(len(buf))  # waits, unless the stream has ended
                return j
            k = m.start()
            if buf[k] == "\n":
                return j
            e = k
            while self._need(e) and buf[e] == "`":
                e += 1
            if e - k == j - i:
                return e
            k = e

    def _scan_fence(self, out: list[Segment]) -> bool:
        """Inside a code block: find the closing fence line. False when waiting."""
        buf = self._buf
        close = _CLOSING_FENCE.search(buf, self._pos)
        if close is None:
            if self._final:
                self._pos = len(buf)
                self._fence = False
                return False
            self._pos = max(self._pos, buf.rfind("\n"))  # the last line may still close it
            return False
        eol = buf.find("\n", close.end())
        if eol < 0:
            if not self._final:
                self._pos = close.start()
                return False
            eol = len(buf)
        self._fence = False
        out.extend(self._emit(eol, min(eol + 1, len(buf)), code=True))
        return True

    def _skip_closers(self, j: int) -> tuple[int, int, int]:
        """Step over closing quotes/brackets/emphasis and citation marks (``_FOOTNOTE``'s,
        which ``speakable`` drops) after a mark; returns (j, quote, paren)."""
        buf = self._buf
        quote, paren = self._quote, self._paren
        while self._need(j):
            c = buf[j]
            if c in _SPACE and quote:
                k = j  # French spacing: 'demain. » Puis', 'demain\u202f!\u202f»'
                k = self._past_spaces(k)
                if not (k < len(buf) and buf[k] in "\u00ab\u00bb") or (
                        self._need(k + 1) and buf[k + 1].isalnum()):
                    break  # '. «Bonjour': the next quote opens
                j = k
                continue
            if c == "[":  # a citation or footnote mark: "calcium.[1] Most", "end.[^2]"
                k = self._citation_end(j)
                if k < 0:
                    break
                j = k
                continue
            if c not in _CLOSERS and not (quote and c in _QUOTE_CLOSERS):
                break
            if c == '"' or c == "\u201d" or c in _QUOTE_CLOSERS:
                quote = 0
            elif c in ")]":
                paren = max(0, paren - 1)
            j += 1
        return j, quote, paren

    def _citation_end(self, j: int) -> int:
        """Right after the citation mark opening at ``j`` (``_FOOTNOTE``'s: "[1]", "[^2]",
        "[1, 2]", "[1–3]"), or -1 when none opens there."""
        buf = self._buf
        k = j + 1 + (self._need(j + 1) and buf[j + 1] == "^")
        for _ in range(_CITED_MAX):
            d = k
            while self._need(k) and buf[k].isdigit() and k - d < 3:
                k += 1
            if k == d or not self._need(k):
                return -1
            if buf[k] == "]":
                return k + 1
            if buf[k] == ",":
                k += 1 + (self._need(k + 1) and buf[k + 1] == " ")
            elif buf[k] in "-\u2013":
                k += 1
            else:
                return -1
        return -1

    def _terminator(self, i: int, out: list[Segment]) -> bool:
        """Decide at a terminator run starting at ``i`` (a Greek ";" there is one too). True
        if a segment was cut."""
        buf = self._buf
        j = i + 1
        while self._need(j) and buf[j] in _TERMINATORS:
            j += 1
        run = buf[i:j]
        end, quote, paren = self._skip_closers(j)
        # Trailing emoji belong to the sentence they follow ("Well done! 🎉"), and so do
        # emoticons ("Nice try. ;-)", "Glad it works! :)").
        while True:
            k = end
            k = self._past_spaces(k)
            if k < len(buf) and _is_emoji(buf[k]):
                while self._need(k) and _is_emoji(buf[k]):
                    k += 1
                end = k
                continue
            if k > end and k < len(buf) and buf[k] in ":;=xX<^":
                e = self._emoticon(k)
                if e > 0:
                    end = e
                    continue
            if k > end and k < len(buf) and buf[k] in "(\u00af":
                e = self._kaomoji(k)  # "All right! (^o^)/ That's"
                if e > 0:
                    end = e
                    continue
            break
        if end < len(buf) and buf[end] not in _SPACE and buf[end] != "\n":
            self._pos = j  # "8.4", "example.org", "?q=1": not a boundary
            return False
        if end > self.config.max_chars:  # too long to stand: the long cut parts it
            self._pos, self._quote, self._paren = end, quote, paren  # (its marks with it)
            return False
        # Next visible character (None at the end of the stream or at a newline).
        k = end
        k = self._past_spaces(k)
        nxt = buf[k] if k < len(buf) else None
        if nxt is None or nxt == "\n":
            # The newline (or the end) cuts anyway; keep the marks with this sentence.
            self._pos = max(end, i + 1) if nxt == "\n" else len(buf)
            self._quote, self._paren = quote, paren
            return False
        if run == "." and nxt == "." and end == j and (
                not self._need(k + 1) or buf[k + 1] in _SPACE or buf[k + 1] == "."):
            self._pos = j  # "I waited . . . and": a spaced ellipsis, decided at its last dot
            return False
        if run == "." and i >= 4 and buf[i - 4:i] == ". . ":
            i, run = i - 4, ". . ."  # its last dot: decided as "..." is ("and" goes on)
        while nxt in _OPENERS and self._need(k + 1) and buf[k + 1] not in _SPACE:
            k += 1  # "9 a.m. (It closes": the bracket's first letter decides
            nxt = buf[k]
        if nxt.islower() and (_CAMEL.fullmatch(self._next_word(k)) or _capital(nxt)):
            nxt = nxt.upper()  # "is out. macOS Sonoma", "week. v0.3.1 adds": as a capital
        if quote or paren or not self._ends_sentence(i, run, nxt):
            self._pos = j
            return False
        self._quote, self._paren = quote, paren
        if self._index > 0 and end < self.config.min_chars:
            self._pos = end  # merge a short sentence with the next one
            self._clause = None
            return False
        out.extend(self._emit(end, end))  # (_emit steps over the spaces after it)
        return True

    def _cjk_terminator(self, i: int, out: list[Segment]) -> bool:
        """At a full-width end (``_CJK_TERMINATORS``): the sentence ends after the run,
        unless a bracket or quote is open or closes right after it (the sentence goes on
        past the quote)."""
        buf = self._buf
        j = i
        while self._need(j) and buf[j] in _CJK_TERMINATORS:
            j += 1
        closing = self._need(j) and (buf[j] in _CJK_CLOSERS or buf[j] in '"\u201d)]')
        k = j
        k = self._past_spaces(k)
        closing = closing or k < len(buf) and buf[k] == "|"  # "| 好的。 |": a table's cell
        # "行きます。means ...": the English sentence quoting it goes on; not before a name in
        # camelCase, which opens one as after "." ("发布。iOS 18", "很好！iPhone也")
        goes_on = k < len(buf) and buf[k].islower() and not _CAMEL.fullmatch(
            _LATIN_WORD.match(self._next_word(k)).group())  # type: ignore[union-attr]
        self._pos = j  # only once nothing is left to wait for
        if goes_on:
            return False
        if self._quote or self._paren or closing or j > self.config.max_chars or (
                self._index > 0 and j < self.config.min_chars):
            return False
        out.extend(self._emit(j, k))
        return True

    def _emoji(self, i: int, out: list[Segment]) -> bool:
        """An emoji run then a capitalized word ends a sentence ("Done ✅ The reminder..."),
        unless nothing is said before it ("🎉 Congrats!" opening a reply or a line: a silent
        segment would have taken the eager first clause's place)."""
        buf = self._buf
        end = i
        while self._need(end) and _is_emoji(buf[end]):
            end += 1
        return self._ends_after(i, end, out)

    def _ends_after(self, i: int, end: int, out: list[Segment]) -> bool:
        """After an emoji or an emoticon at ``i:end``: a capitalized word after it opens a
        new sentence (the module docstring); True if a segment was cut."""
        buf = self._buf
        k = end
        k = self._past_spaces(k)
        self._pos = end  # only once nothing is left to wait for
        if (k == end or k >= len(buf) or self._quote or self._paren
                or not _capital(buf[k])  # (as after ".")
                or end > self.config.max_chars):
            return False
        if not any(c.isalnum() for c in _LINE_MARK.sub("", buf[:i])):
            return False  # "1. 🎉 Launch day" too
        if self._index > 0 and end < self.config.min_chars:
            return False
        out.extend(self._emit(end, k))
        return True

    def _emoticon(self, k: int) -> int:
        """The end of an emoticon (``_EMOTICON``) written as a word at ``k``, or -1 (waits
        for the space after it)."""
        buf = self._buf
        e = k
        while self._need(e) and buf[e] not in _SPACE and buf[e] != "\n":
            e += 1
            if e - k > 4:
                return -1  # longer than any emoticon ("xylophone")
        return e if _EMOTICON.fullmatch(buf, k, e) else -1

    def _kaomoji(self, k: int) -> int:
        """The end of a face in brackets or a shrug (``_KAOMOJI``) written as a word at ``k``,
        or -1 (waits for the space after it)."""
        buf = self._buf
        if self._need(k + 2) and buf[k + 1].isalnum() and buf[k + 2].isalnum():
            return -1  # "(the", "(2024": most brackets, told at once
        e = k
        while self._need(e) and buf[e] not in _SPACE and buf[e] != "\n":
            e += 1
            if e - k > 12:
                return -1  # longer than any face
        return e if _KAOMOJI.fullmatch(buf, k, e) and _face(buf[k:e]) else -1

    def _ends_sentence(self, i: int, run: str, nxt: str) -> bool:
        if nxt == "|":
            return False  # "| $5/mo. |": a table's cell closes, its row goes on
        if nxt in "\u00bf\u00a1":
            return True  # Spanish "¿" and "¡" open a sentence: "etc. ¿Quieres", "p. m. ¡Hasta"
        if nxt.islower():
            return False  # "3 p.m. in", "e.g. this", "well... maybe"
        buf = self._buf
        ws = buf.rfind(" ", 0, i) + 1
        if nxt in "KQRBN" and buf[ws:i].isdigit() and run in (".", "...", "\u2026") and (
                _SAN.fullmatch(self._next_word(i + len(run)))):
            return False  # a move number: "1. e4 e5 2. Nf3", "3... Qe7"
        if run != ".":
            if nxt.isdigit() and run[-1] in "?!" and _SAN.fullmatch(buf[ws:i].rstrip("+#")):
                j = i + len(run)
                j = self._past_spaces(j)
                num = self._next_word(j)
                if self._need(j + len(num)) and buf[j + len(num)] == ".":
                    return False  # a move's mark: "Nf6?? 4. Qxf7#"
            if run[-1] in ".\u2026" and not nxt.isupper():
                return False  # "the total is... $42.17": a pause, not an end
            if nxt in _TIBETAN_SHADS:
                return False  # "། །": a verse's head shad opens the next line, not a sentence
            if run == "!" and buf[ws:i] == "Yahoo" and self._next_word(i + 1) in _YAHOO:
                return False  # "Yahoo! Finance": the brand's own mark
            # "Well... I think": an ellipsis before the pronoun I goes on.
            return not (nxt == "I" and run[0] in ".\u2026"
                        and self._next_word(i + len(run)) in ("I", "I'm", "I've", "I'd"))
        word = buf[ws:i].lstrip("(\"'\u201c\u201e\u00ab\u00bb*_[")
        low = word.lower()
        if _THAI.match(word[-1:]) and _THAI_ABBR.fullmatch(word.rsplit(".", 1)[-1]) or (
                len(word) == 1 and word.isalpha() and _ARABIC.match(word)):
            return False  # "พ.ศ. 2569", "14.00 น. ที่", "د. أحمد" (Dr. Ahmad): abbreviations
        if len(word) <= 2 and word.isalpha():
            spaced = _SPACED_ABBR.search(buf, max(0, i - 16), i)
            if spaced is not None:  # "z. B", "u. a": the whole abbreviation decides
                low = spaced.group().replace(" ", "").lower()
            if low in _NEVER_END:
                return False
            if word == "им":  # "музей им. Пушкина", "им. А. П. Чехова", "им. 26 ...", while
                j = i + 1  # the pronoun ends one: "Я позвонил им. Они не ответили."
                j = self._past_spaces(j)
                after = self._next_word(j)
                return after in _RUSSIAN_STARTERS and not (
                    len(after) == 1 and self._need(j + 1) and buf[j + 1] == ".")
            if len(word) == 1 and word.islower() and len(self._next_word(i + 1)) == 1 and (
                    self._need(i + 3) and buf[i + 3] == "."):
                return False  # "z. B.", "e. V.": the abbreviation goes on
        if len(word) <= 4 and _LIST_LETTER.fullmatch(word) and word.lower() != word.upper() and (
                self._starts_line(ws, _HEADING_MARK)):
            return False  # "   a. Product: $1.2B", "ii. Services": a list marker
        if (len(word) == 1 and word.isupper()) or word in _NAME_OR_END or (
                "." in word and word.isupper() and _DOTTED_ABBR.fullmatch(word)):
            return self._name_or_end(i, ws, word)
        if word == "No" and not buf[:ws].strip() and self._carry is None and self._after != ".":
            return True  # "No. 91 isn't prime.", "Prime? No. 91 is": the answer, not "No. 5"
        if word in _ZONES:
            return True  # "at 9 a.m. EST. That's": not "est." (estimated)
        if word in _CITE_ABBR:  # "Fed. R. Civ. P. 12(b)(6)", "F. Supp. 2d", "9th Cir. 2010"
            j = i + 1
            j = self._past_spaces(j)
            after = self._next_word(j)
            if nxt.isdigit() or (len(after) == 1 or after in _CITE_ABBR) and (
                    self._need(j + len(after)) and buf[j + len(after)] == "."):
                return False
        if (word in _CITE_ABBR or word in _STATUTE_ABBR) and self._reaches_section(i + 1):
            return False  # "Cal. Civ. Code § 1542", "Fla. Stat. § 768.81"
        base = word.rsplit("'", 1)[-1].rsplit("\u2019", 1)[-1]  # "l'avv.", "dell'Ing."
        if word in _TITLES or low in _NEVER_END or base in _TITLES or base.lower() in _NEVER_END:
            return False
        if ".-" in word and word.rsplit("-", 1)[-1] in _TITLES:
            return False  # "Univ.-Prof. Huber", "Dipl.-Ing. Dr.", "Dr.-Ing. Lang"
        if word in _DEGREE_FIELDS and self._prev_word(ws).rstrip(".") in _DEGREE_BEFORE:
            return False  # "Prof. Dr. med. Keller", "Dr. rer. nat. Anna", "Prof. em. Dr."
        if low in ("ref", "refs", "no", "nr") and nxt.isupper() and _CODE.fullmatch(
                self._next_token(i + 1).rstrip(".,;:!?)")):
            return False  # "quote ref. KX-4410 when": a reference's code, as "ref. 12" is
        if low in ("av", "apr") and nxt == "J" and self._need(i + 6) and (
                buf.startswith("J.-C.", self._past_spaces(i + 1))):
            return False  # "14 apr. J.-C.", "63 av. J.-C." (après, avant Jésus-Christ)
        if low in ("long", "lon", "lng") and nxt.isdigit():
            p = self._end_before(ws)  # "lat. 27.9881, long. 86.9250": after a latitude's
            if p > 0 and buf[p] == "," and buf[p - 1].isdigit() or (  # not "was long. 20"
                    p < 0 and (self._carry or "")[:1].isdigit()):  # (or cut at its comma)
                return False
        if low in ("a.m", "p.m") and self._next_word(i + 1) in _ZONES | _WEEKDAYS:
            return False  # "10 a.m. PT", "9 a.m. Mon.–Fri."
        if low in _BIBLE_BOOKS and nxt.isdigit() and self._chapter_verse(i + 1):
            return False  # "Lk. 6:20", "1 Tim. 3:16"
        if low in _UNITS_BEFORE_LETTER and nxt.isupper() and (
                _UNIT_LETTER.fullmatch(self._next_word(i + 1))):
            return False  # "Bldg. C, Rm. 204", "Ste. B2"
        if nxt.isdigit() and (
                word.lower() in _BEFORE_NUMBER or low.endswith("str") or word in _WEEKDAYS
                or word == "ok" or base.lower() in _BEFORE_NUMBER  # "L'art. 1240", "d'env. 20"
                or low in ("s", "ss") and not self._prev_word(ws)[-1:].isdigit()):
            # (a weekday as written: "on Sat. 14
            # June", not "the sun. 3"; the Polish "ok. 50 zł" (about) as written: "OK. 3";
            # a section as "under s. 1 of the Charter", not seconds: "in 9.58 s. 12 more")
            # (the word itself, not a spaced abbreviation ending in it: "см. с. 45", see p.)
            return False
        if low in ("г", "гг") and not any(c.isdigit() for c in self._prev_word(ws)):
            return False  # "в г. Москве" (the city of), while "в 2026 г. Потом" (year) ends
        if low in _KITCHEN_UNITS and nxt.isupper():
            after = self._next_word(i + 1)  # "1/2 tsp. Dijon", "2 oz. Gouda" go on
            return (after in _STARTERS or after.replace("\u2019", "'") in _STARTERS
                    or after in _KITCHEN_VERBS or after.endswith("ly"))
        if word in _GERMAN_COUNTS and self._prev_word(ws)[-1:].isdigit():
            after = self._next_word(i + 1)  # "10 Min. Verspätung" goes on
            return nxt.isupper() and (after in _STARTERS or after in _GERMAN_STARTERS)
        if nxt.isupper() and (low in _BEFORE_ROMAN or _DOUBLED.fullmatch(word) or low == "co"):
            after = self._next_word(i + 1)
            if low in _BEFORE_ROMAN and _ROMAN.fullmatch(after) and (
                    after != "I" or self._roman_listed(i + 1)):
                return False  # "séc. XX", "sec. XIX", "s. XIX": a century; "Art. III,"
            if low == "co" and after in ("KG", "OHG", "KGaA"):
                return False  # "GmbH & Co. KG"
            if _DOUBLED.fullmatch(word) and _DOUBLED.fullmatch(after) and (
                    self._need(i + 2 + len(after)) and buf[i + 2 + len(after)] == "."):
                return False  # "EE. UU.", "FF. AA.": a Spanish plural abbreviation goes on
        if low in _CAPITAL_END or _DOTTED_ABBR.fullmatch(word):
            # a capital, or a letter of a script without case: "at 3 p.m. The", "at 3 p.m.
            # 会议", "at 3 p.m. 김 박사님" (lowercase returned above)
            return nxt.isalpha()
        if word.isdigit() and len(word) <= 3 and self._starts_line(ws, _HEADING_MARK):
            return False  # "1. " list marker at the start of a line, "### 2. Install"
        if word.isdigit() and nxt.isdigit() and self._korean_date(i, word, ws):
            return False  # "2024. 3. 12.": a date written year, month, day
        if word.isdigit() and self._prev_word(ws) in _ORDINAL_AFTER:
            return False  # "zum 100. Geburtstag", "der 1000. Besucher": past 99 too
        if (word.isdigit() and len(word) <= 2 or _ROMAN.fullmatch(word)) and (
                self._prev_word(ws) in _ORDINAL_AFTER or (
                nxt in "JFMASOND" and self._german_month(i + 1, ws)) or (
                nxt in "OUED" and self._next_word(i + 1) in _FLOORS)):
            return False  # German ordinal: "am 3. Oktober", "im 19. Jahrhundert", "5, 3. OG"
        if word in _JOURNAL_WORDS and (nxt.isdigit() or nxt.isupper()):
            p = self._end_before(ws)  # "Phys. Rev. Lett. 105": the chain's last word before
            chained = p >= 0 and buf[p] == "."  # its volume
            return not chained if nxt.isdigit() else not self._abbreviation_chain(i + 1, chained)
        return True

    def _abbreviation_chain(self, j: int, chained: bool) -> bool:
        """From ``j``, capitalized words each with a full stop, the last one's followed by a
        comma (a semicolon, a colon) or a number: "J. Appl. Phys., Vol. 2", "Proc. Natl.
        Acad. Sci., 2019", "Phys. Rev. Lett. 105", "Phys. Rev.; it". A sentence is never one
        word and then a comma, so the word before them was an abbreviation too. A dotted
        acronym is one word of it ("Sci. U.S.A. 116"), and once it is a chain (``chained``:
        an abbreviation stands before ``j``'s), its last word may be capitals without a
        full stop ("Proc. Natl. Acad. Sci. USA 116", "Phys. Rev. B 105"): each of "Proc.",
        "Natl.", "Acad." and "Sci." ended a sentence there, said as four. Words of journal
        titles alone (``_JOURNAL_WORDS``, or "U.S.A.") are a chain too before a word without a
        full stop or at the reply's end ("Nat. Commun. in 2021", "Proc. Natl. Acad. Sci.
        U.S.A. The paper", "... Sci. U.S.A."): the last of them decides on its own."""
        buf = self._buf
        words, journal = 0, True  # how many words read; all a journal title's ("U.S.A." too)
        for _ in range(_CHAIN_MOST):
            j = self._past_spaces(j)
            word = self._next_word(j)
            k = j + len(word)
            if chained and word.isupper() and word.isalpha() and self._need(k) and buf[k] != ".":
                if buf[k] in ",;:":
                    return True
                k = self._past_spaces(k)
                return k < len(buf) and buf[k].isdigit()
            while len(word) == 1 and word.isupper() and self._need(k + 1) and buf[k] == "." and (
                    buf[k + 1].isupper() and self._need(k + 2) and buf[k + 2] == "."):
                k += 2  # "U.S.A.": to its last full stop
            if not (word[:1].isupper() and word.isalpha() and self._need(k) and buf[k] == "."):
                return words > 0 and journal  # "Nat. Commun. in 2021", "Sci. U.S.A. The"
            words += 1
            journal = journal and (word in _JOURNAL_WORDS or k >= j + 5)  # (not "U.S. Army")
            if not self._need(k + 1):
                return journal  # the reply ends on a title: "in Proc. Natl. Acad. Sci. U.S.A."
            if buf[k + 1] in ",;:":
                return True
            if buf[k + 1] not in _SPACE:
                return False
            j = k + 1
            j = self._past_spaces(j)
            if j < len(buf) and buf[j].isdigit():
                return True
            chained = True
        return False

    def _next_token(self, j: int) -> str:
        """Everything after position ``j`` up to the next white space (waits for it)."""
        buf = self._buf
        j = self._past_spaces(j)
        k = j
        while k - j < _TOKEN_MOST and self._need(k) and not buf[k].isspace():
            k += 1
        return buf[j:k]

    def _korean_date(self, i: int, word: str, ws: int) -> bool:
        """The full stop at ``i`` after ``word`` is inside a date written year, month, day
        with a full stop after each ("2024. 3. 12.", Korean): a year before a month and a
        day, or a month after a year and before a day."""
        if len(word) == 4:
            j = self._past_spaces(i + 1)
            month = self._next_token(j)
            return _DATE_REST.fullmatch(f"{month} {self._next_token(j + len(month))}") is not None
        prev = self._prev_word(ws)
        return (len(word) <= 2 and word.isascii() and 1 <= int(word) <= 12 and len(prev) == 5
                and prev[:4].isdigit() and prev[4] == "." and _DAY.fullmatch(
                    self._next_token(i + 1)) is not None)

    def _reaches_section(self, j: int) -> bool:
        """From ``j``, at most ``_SECTION_WORDS_MOST`` capitalized words (each may end in a full
        stop) and then a section sign: "Civ. Code § 1542", "Stat. § 768.81". A sentence
        never opens so, so the word before them was a statute's abbreviation."""
        buf = self._buf
        for _ in range(_SECTION_WORDS_MOST + 1):
            j = self._past_spaces(j)
            if j < len(buf) and buf[j] == "\u00a7":
                return True
            word = self._next_word(j)
            if not (word[:1].isupper() and word.isalpha()):
                return False
            j += len(word)
            if self._need(j) and buf[j] == ".":
                j += 1
        return False

    def _chapter_verse(self, j: int) -> bool:
        """A chapter and verse at ``j`` (after spaces): digits, ":", a digit ("6:20")."""
        buf = self._buf
        j = self._past_spaces(j)
        k = j
        while self._need(k) and buf[k].isdigit():
            k += 1
        return k > j and self._need(k + 1) and buf[k] == ":" and buf[k + 1].isdigit()

    def _roman_listed(self, j: int) -> bool:
        """The roman numeral "I" at ``j`` (after spaces) is followed by a comma: "Art. I,"."""
        buf = self._buf
        j = self._past_spaces(j)
        return self._need(j + 1) and buf[j + 1] == ","

    def _german_month(self, j: int, ws: int) -> bool:
        """The word after ``j`` is a German month after the day that ends at the word
        starting at ``ws`` ("am 3. Oktober", "3. Mai"; not "is 12. August is hot")."""
        month = self._next_word(j)
        return month in GERMAN_MONTH_WORDS and (
            month not in _MONTHS_ALSO_ENGLISH or self._prev_word(ws) in _DAY_AFTER)

    def _prev_word(self, ws: int) -> str:
        """The word before position ``ws`` (the start of a word), lower case, without
        quotes or brackets: in the pending segment, else the one a cut inside the sentence
        left before it ("" if none)."""
        p = self._end_before(ws)
        if p < 0:
            return self._carry or ""
        q = self._buf.rfind(" ", 0, p) + 1
        return _bare(self._buf[q:p + 1])

    def _end_before(self, ws: int) -> int:
        """Where the text before position ``ws`` ends, past the spaces: -1 if none (in the
        pending segment)."""
        buf = self._buf
        p = ws - 1
        while p >= 0 and buf[p] in _SPACE:
            p -= 1
        return p

    def _name_or_end(self, i: int, ws: int, word: str) -> bool:
        """After "B.", "U.S." or "St." before a capital: a name going on or a new sentence.

        "John F. Kennedy", "the U.S. Army", "St. Louis", "Pennsylvania Ave. NW" go on;
        "Plan B. Then", "vitamin C. It's", "the U.S. Most", "Downing St. That's" end."""
        buf = self._buf
        j = self._skip_closers(i + 1)[0]  # 'him "Mister T." Then', '(the U.S.) Then'
        j = self._past_spaces(j)
        while self._need(j) and buf[j] in _OPENERS:
            j += 1  # 'the U.S. "The best," they said': the quote's first word decides
        nxt = self._next_word(j)
        k = j + len(nxt)
        if len(nxt) == 1 and self._need(k) and buf[k] == ".":
            return False  # another initial: "J. R. R. Tolkien", "7th c. B.C."
        if nxt == "No" and self._need(k) and buf[k] == "." and self._next_word(k + 1)[:1].isdigit():
            return False  # a house number: "Atatürk Cad. No. 15"
        if nxt in _STARTERS or nxt.replace("\u2019", "'") in _STARTERS or _ELIDED.match(nxt):
            return True
        if word in _STREETS and nxt in _DIRECTIONS:
            return True  # "57th St. Leave by 3:30", "Oak Ave. Turn left"
        if word == "Man" and self._prev_word(ws) == "of":
            return True  # "the Isle of Man. Douglas is": the island, not "Man. City"
        return len(word) == 1 and (self._prev_word(ws) in _LABELS
                                   or _ORDINAL_SIGN.fullmatch(self._prev_word(ws)) is not None)

    def _past_spaces(self, j: int) -> int:
        """Where the first character after the spaces at ``j`` is (or will be: the end of
        what has come, waiting for more); ``_end_before``'s twin forward."""
        buf = self._buf
        while self._need(j) and buf[j] in _SPACE:
            j += 1
        return j

    def _next_word(self, j: int) -> str:
        """The whole word after position ``j`` (waits until it is complete)."""
        buf = self._buf
        j = self._past_spaces(j)
        k = j
        while self._need(k) and (buf[k].isalnum() or buf[k] in "'\u2019"):
            k += 1
        return buf[j:k]

    def _starts_line(self, i: int, lead: re.Pattern[str] | None = None) -> bool:
        """True when only spaces (or what ``lead`` matches, then spaces) stand between the
        start of the line and ``i``. No newline stands before the scan: the scan cuts at
        each (``_scan``), so the buffer starts the line (``_fresh_line``) or holds none of it."""
        if not self._fresh_line:
            return False
        head = self._buf[:i].strip()
        return not head or lead is not None and lead.fullmatch(head) is not None

    def _interrupted(self, i: int, out: list[Segment]) -> bool:
        """An em dash right after a word, then a space and a word that opens sentences: the
        sentence broke off there ("might be in the— Actually, which OS?"); True if cut."""
        buf = self._buf
        end, quote, paren = self._skip_closers(i + 1)  # '"I was just about to—" "Don't,"'
        k = end
        if not (self._need(k) and buf[k] in _SPACE):
            return False  # "in the—wait, no": a dash inside the sentence
        k = self._past_spaces(k)
        if k >= len(buf) or quote or paren or end > self.config.max_chars or (
                self._index > 0 and end < self.config.min_chars):
            return False
        j = k
        while end > i + 1 and self._need(j) and buf[j] in _OPENERS:
            j += 1  # after a closed quote, the next one's first word decides
        word = self._next_word(j)
        if word not in _STARTERS and word.replace("\u2019", "'") not in _STARTERS:
            return False
        self._quote = self._paren = 0
        out.extend(self._emit(end, k))
        return True

    def _clause_mark(self, i: int, out: list[Segment]) -> bool:
        """Note a clause mark at ``i``; True if it cut the eager first segment."""
        buf = self._buf
        c = buf[i]
        if c in ":;" and (i == 0 or buf[i - 1] in _SPACE or buf[i - 1].isalpha() and (
                self._need(i + 1) and buf[i + 1] in "-()")):
            glued = i > 0 and buf[i - 1] not in _SPACE
            e = self._emoticon(i)
            if e > 0 and (not glued or _GLUED_FACE.fullmatch(buf, i, e) and not (
                    self._paren and buf[e - 1] == ")")):
                # ":D That's it", "sad :( but", "great:) See", "Sorry:( I": no clause mark,
                # no bracket (but "(mostly:)" closes its bracket)
                return self._ends_after(i, e, out)
        # (a bullet's "-" is at 0: a newline always cuts, and a segment opens on no space)
        if c in "-\u2013\u2014" and (i == 0 or buf[i - 1] not in _SPACE):
            if c == "\u2014" and i and buf[i - 1].isalpha() and self._interrupted(i, out):
                return True
            self._pos = i + 1
            return False  # only a spaced dash is a clause mark ("well - maybe", "now — then")
        end, quote, paren = self._skip_closers(i + 1)
        ok = self._need(end) and buf[end] in _SPACE and not quote and not paren
        unit = False
        if ok and c == ",":  # "Jan 1, 1980", "1, 2, 3": not a clause
            k = end
            k = self._past_spaces(k)
            ok = k >= len(buf) or not buf[k].isdigit()
            # (first_max_words would cut one word later instead, inside the unit: "Celtics
            # 112, Heat | 108"; its cut at the comma stands)
            unit = (ok and k < len(buf) and not self.config.first_max_words
                    and self._eager_here(end) and self._comma_unit(k))
        self._pos = i + 1  # only once nothing is left to wait for
        return ok and self._clause_at(end, out, eager=not unit)

    def _eager_here(self, end: int) -> bool:
        """A clause boundary at ``end`` would cut the eager first segment (``_clause_at``)."""
        fmw = self.config.first_min_words
        return (self._index == 0 and 0 < fmw <= _words(self._buf[:end])
                and end <= self.config.max_chars)

    def _comma_unit(self, k: int) -> bool:
        """The word at ``k``, after a comma, goes on a name, an address or a reference the
        comma is inside, so the eager first segment does not end at that comma: a capitalised
        word ("Memphis, TN", "Paris, France", "Baker St., London", "Dr. Okafor, M.D.", "Thu.,
        Oct. 9", "Celtics 112, Heat 108"; not "I", "I'm"), or one of ``_UNIT_ABBREVIATIONS``
        and a number ("ext. 204", "dep. 07:15", "n.º 5", "№ 3"). Waits only as long as the
        letters so far may still be one of those."""
        buf = self._buf
        c = buf[k]
        if c.isupper() and not _GEORGIAN.match(c):
            # "I", "I'm", "I’ll" cut; "IL 60611", "Iga", "Inc." go on
            return c != "I" or self._need(k + 1) and buf[k + 1].isalpha()
        j = k + 1 if c == "\u2116" else k
        while self._need(j) and buf[j].isalpha():
            j += 1
            if buf[k:j].lower() not in _UNIT_ABBR_PREFIXES:
                return False  # "but", "approx.", "the": no abbreviation of a unit
        if j > k and buf[k:j].lower() not in _UNIT_ABBREVIATIONS:
            return False
        m = j
        while self._need(j) and buf[j] in ".\u00ba\u00b0":
            j += 1
        if j == m and c != "\u2116":
            return False  # "no way", "p value": no full stop, no number sign
        j = self._past_spaces(j)
        return self._need(j) and buf[j].isdigit()

    def _clause_at(self, end: int, out: list[Segment], *, eager: bool = True) -> bool:
        """A clause boundary at ``end``, outside quotes and brackets: the long cut's place
        from now on, unless it is past ``max_chars`` (a segment ending there would be too
        long); cut the first segment there once it holds ``first_min_words`` words
        (``_words``). True if it did."""
        if end > self.config.max_chars:
            return False
        self._clause = (end, end, 0, 0)
        if eager and self._eager_here(end):
            # the quote or bracket a closing mark before ``end`` closed is closed ('"Best
            # pizza in town," one reviewer wrote.'): the scan resumes past that mark
            self._quote = self._paren = 0
            out.extend(self._emit(end, end, mid=True))
            return True
        return False

    def _cjk_clause_mark(self, i: int, out: list[Segment]) -> bool:
        """A full-width clause mark (``_CJK_CLAUSE``): a clause boundary right after it,
        outside quotes and brackets; True if it cut the eager first segment."""
        self._pos = i + 1
        return not (self._quote or self._paren) and self._clause_at(i + 1, out)

    def _first_cut(self, endpos: int, out: list[Segment]) -> bool:
        """The opt-in cuts of the first segment in ``_buf[:endpos]`` (no stop char in
        between): the earlier of a phrase cut and a word-count cut; True if one cut. Each
        decides a place only once the text after it is there, so the earlier one decided
        is the earlier one in the text whatever the chunking."""
        w = self._word_cut(endpos) if self.config.first_max_words > 0 else -1
        if self.config.first_phrase_words > 0 and self._phrase(
                endpos if w < 0 else w + 1, out):  # + 1: an opener right before w is whole
            return True
        if w < 0:
            return False
        out.extend(self._emit(w, w, mid=True))
        return True

    def _word_cut(self, endpos: int) -> int:
        """Where first_max_words cuts the first segment in ``_buf[:endpos]``: the first
        space after that many words between two plain words (the module docstring), or -1.
        A space with nothing after it yet waits."""
        buf = self._buf
        start = self._word_pos
        if endpos <= start:
            return -1
        if self._quote or self._paren:
            self._word_pos = endpos
            return -1
        for m in _GAP.finditer(buf, start, endpos):
            gap = m.group()
            if gap != " " and ("\u00a0" in gap or "\u202f" in gap):
                continue  # "10\u00a0km", "Mme\u202fDupont": the writer tied them
            w = m.start()
            k = m.end()
            while k < len(buf) and buf[k] in _SPACE:
                k += 1
            if k >= len(buf):
                if self._final:
                    break  # nothing follows: the rest goes whole anyway
                self._word_pos = w  # the next word decides: look again next time
                return -1
            if w == 0 or not buf[k].isalnum():
                continue
            head, words, prev = self._head_words(w)
            if words < self.config.first_max_words:
                continue
            if (not _plain_word(prev) or prev.rstrip(",;:") in _TITLES
                    or prev.lower() == "et" or _open_span(buf[head:w])
                    or prev[-1] in ",;:" and buf[k].isdigit()):
                continue  # "Mr | Smith", "et | al.", "June, | 2024": one token
            if prev.lower() in _NO_PHRASE_END:
                continue  # "won the | final", "is at | noon": a word that promises more
            return w
        self._word_pos = endpos
        return -1

    def _head_words(self, w: int) -> tuple[int, int, str]:
        """The head before the gap at ``w`` as first_max_words sees it: where it starts
        (past a list marker, ``_LINE_MARK``: it may move as the head grows, "- [x]" then
        "- [x] Buy"), how many of its words hold a letter or digit, and its last word.
        Counted on from the gap asked about before, not again from the start (that cost
        grew with each word before the cut: bench/segmentation.py's p99)."""
        buf = self._buf
        mark = _LINE_MARK.match(buf, 0, w)
        head = mark.end() if mark else 0
        at = self._words_at  # a gap is whitespace: the words before it are whole
        gap, words, prev = at[1:] if at and at[0] == head and at[1] <= w else (head, 0, "")
        tokens = buf[gap:w].split()
        if tokens:
            words += len(_WORD.findall(buf, gap, w))
            prev = tokens[-1]
        self._words_at = (head, w, words, prev)
        return head, words, prev

    def _phrase(self, endpos: int, out: list[Segment]) -> bool:
        """Cut the first segment before a phrase opener in ``_buf[:endpos]`` (no stop char
        in between); True if it did. Openers not yet followed by whitespace wait."""
        buf = self._buf
        start = self._phrase_pos
        if endpos <= start:
            return False
        if self._quote or self._paren:
            self._phrase_pos = endpos
            return False
        for m in _PHRASE.finditer(buf, start, endpos):
            p = m.start()
            words = [w for w in buf[:p].split() if any(c.isalnum() for c in w)]
            if len(words) < self.config.first_phrase_words:
                continue
            prev = words[-1]
            # (a word that closes a quote or bracket ends what it opened: '"Over The" | in')
            if prev.lower() in _NO_PHRASE_END or prev.rstrip(".") in _TITLES:
                continue
            if m.group() in ("and", "or") and any(c.isdigit() for c in prev):
                continue  # "between 3 | and 5", "2 | or 3"
            out.extend(self._emit(p, p, mid=True))
            return True
        # An opener that ends the region is not yet whole: look at it again next time.
        self._phrase_pos = max(start, endpos - _PHRASE_LONGEST)
        return False

    def _cut_long(self, out: list[Segment]) -> bool:
        """The pending segment passed max_chars without a sentence end: cut it."""
        place = self._long_cut()
        if place is None:
            return False  # one huge word up to a newline or the end: never cut inside it
        end, resume, self._quote, self._paren, _ = place
        out.extend(self._emit(end, resume, mid=True))
        return True

    def _long_cut(self) -> tuple[int, int, int, int, int] | None:
        """Where ``_cut_long`` cuts (end, resume, quote, paren) and how much of the text that
        decision reads (its length: ``max_chars`` + 1, or + 2 when a number may go on past
        it), or None when there is no place (one huge word up to a newline or the end).
        When a word (or a number in groups) runs past ``max_chars``, the cut is right after
        it: waits for its end."""
        buf = self._buf
        limit = self.config.max_chars
        if self._clause is not None and self._clause[0] > 0:
            return (*self._clause, limit + 1)
        sp = buf.rfind(" ", 1, limit + 1)
        # (the loop below looks at the character after a space at max_chars)
        seen = limit + 2 if sp == limit > 1 and buf[sp - 1].isdigit() else limit + 1
        while sp > 0 and buf[sp - 1].isdigit() and (
                self._need(sp + 1) and buf[sp + 1].isdigit()):
            sp = buf.rfind(" ", 1, sp)  # "1 250 000 €": one number
        cjk = self._cjk_break(max(sp, 1), limit)
        if cjk > sp:  # Chinese and Japanese have no spaces: cut between two characters
            return cjk, cjk, 0, 0, seen
        if sp >= 0:
            return sp, sp + 1, 0, 0, seen
        # A word longer than max_chars from the start (a long URL, "[here](<URL>)"): cut right
        # after it, or the rest of its sentence goes along, however long.
        sp = limit
        while True:
            gap = _GAP_OR_LINE.search(buf, sp + 1)
            if gap is None:
                self._need(len(buf))  # the word may go on
                return None
            sp = gap.start()
            if buf[sp] == "\n":
                return None  # the newline cuts right after the word
            if not (buf[sp - 1].isdigit() and self._need(sp + 1) and buf[sp + 1].isdigit()):
                return sp, sp + 1, 0, 0, sp + 1 + buf[sp - 1].isdigit()
            # "1 250 000 €": one number

    def _cjk_break(self, lo: int, hi: int) -> int:
        """The last position in ``(lo, hi]`` between two Chinese or Japanese characters
        (``_CJK_CHAR``), or -1. Both characters are in the buffer: ``hi`` < its length."""
        last = -1
        for m in _CJK_PAIR.finditer(self._buf, lo, hi + 1):
            last = m.end()
        return last

    def _emit(self, end: int, resume: int, *, code: bool = False,
              mid: bool = False) -> list[Segment]:
        """Cut the pending segment at ``end``, the next one starting at ``resume``; ``mid``
        when the cut is inside a sentence (the next piece goes on with it)."""
        buf = self._buf
        while resume < len(buf) and buf[resume] in _SPACE:
            resume += 1  # the spaces before the next segment: neither its text nor its length
        raw = buf[:end]
        stripped = raw.strip()
        self._carry = _bare(stripped.rsplit(None, 1)[-1]) if mid and stripped else None
        start = self._offset + (len(raw) - len(raw.lstrip()))
        # Trim the buffer so it never grows with the reply.
        self._buf = buf[resume:]
        self._offset += resume
        self._pos = 0
        self._phrase_pos = self._word_pos = 0
        self._words_at = None
        self._clause = None
        self._quote_from = None  # a quote still open restarts its count here
        self._fresh_line = "\n" in buf[end:resume]
        self._after = "" if mid or self._fresh_line else stripped.rstrip(_AFTER_MARKS)[-1:]
        if not stripped:
            return []
        spoken = "" if code else speakable(stripped, reads_digits=self.reads_digits)
        seg = Segment(self._index, stripped, start, spoken)
        self._index += 1
        return [seg]


# --- speakable text ----------------------------------------------------------------------

_URL = re.compile(r"\b(?:https?://|www\.)([^\s/<>()\"']*[^\s/<>()\"'.,;:!?])"
                  r"(?:[^\s<>()\"']*[^\s<>()\"'.,;:!?])?", re.I)
"""A URL, without the punctuation after it ("Is it www.example.com? Yes."): group 1 is
its host."""
_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]*)\)")
_EMPHASIS = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_STRUCK = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
"""Struck-out text: what the reply takes back is not said ("at ~~3pm~~ 4pm" said both)."""
_MATH = re.compile(r"\$\$(.+?)\$\$|\\\((.+?)\\\)|\\\[(.+?)\\\]"
                   r"|\$(?=[^\s$])([^$\n]*?[^\s$\\])\$(?![\d$])")
"""LaTeX math: its delimiters are no speech ("$x^2$" was "dollar x two dollar"). A single
``$`` pair only as pandoc reads one (no space inside either end, no digit after), holding a
single letter or a math sign, so amounts stay: "$5 and $10", "$5-$10", "US$ 5 ... S$"."""
_MATH_SIGN = re.compile(r"^[A-Za-z]$|[\^_\\=+{}<>]")


def _math(m: re.Match[str]) -> str:
    inner = next(g for g in m.groups() if g is not None)
    return inner if m.group(4) is None or _MATH_SIGN.search(inner) else m.group()


_CITED_MAX = 6
"""Numbers a citation mark lists at most ("[1, 2, 5]")."""
_FOOTNOTE = re.compile(
    r"(?<=[^\s\[])\[\^?\d{1,3}(?:(?:, ?|[-\u2013])\d{1,3}){0,"
    + str(_CITED_MAX - 1) + r"}\]")
"""A citation or footnote mark right after a word ("Reuters[1]", "end.[^2]", "calcium.[1, 2]",
"[1–3]"): espeak read "Reuters one"."""
_BREAK = re.compile(r"\s*<br\s*/?>\s*", re.I)
"""An HTML line break, which LLMs put in table cells: espeak read "B R"."""
_ITALIC = re.compile(r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_LINE_MARK = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+(?:\[[ xX]\]\s+)?|\d{1,3}[.)]\s+"
                        r"(?!(?:" + "|".join(sorted(GERMAN_MONTH_WORDS)) + r")\b))")
"""A heading, quote, bullet or list number opening a line; not the day of a German date
opening one ("3. Oktober: Feiertag", "1. Mai ist ..." lost the day)."""
_TABLE_RULE = re.compile(r"^\s*\|?[\s:|-]*-{3}[\s:|-]*$|^\s*(?:[-*_]\s*){3,}$")
_SPACES = re.compile(r"\s+")
_FENCE = re.compile(r"```+[^`\n]*(?:\n|$)")
"""A code block's opening line ("```python"); "```x``` and more" is inline code."""
_CLOSING_FENCE = re.compile(r"\n[ \t]*```")
"""A code block's closing fence line, indented as in a list item ("   ```") or not."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters: not speech, and a NUL ends a C engine's string (espeak stopped
speaking at it)."""
_EMOJI = re.compile(
    "(?:[^\\w\\s\uFE0F\u203C\u2049]|\u2139)\uFE0F"
    "|[\U0001F000-\U0001FFFF\u2600-\u27BF\u2B00-\u2BFF"
    "\u231A\u231B\u23E9-\u23F3\u23F8-\u23FA\uFE0F\u200D\u20E3]+"
)
"""Emoji: the emoji blocks, the clocks and media keys of Miscellaneous Technical that are
emoji by default (⌚ ⌛ ⏰ ⏲ ⏳ ⏩ ⏸), and any other symbol asking to be shown as an emoji
(U+FE0F: ▶️ ↩️ ℹ️ ©️). espeak read those out by their names ("⏳ Almost done." was
"hourglass not done, almost done"; "⏲️" "timer clock"). A symbol without U+FE0F (→ ©
▶) is text and stays; ‼️ and ⁉️ keep their mark (punctuation)."""
_EMOJI_BEFORE_MARK = re.compile(f"[ \t]*(?:{_EMOJI.pattern})(?=[.,!?;:\u2026])")
"""An emoji (and the space before it) right before a punctuation mark: dropped whole, so
"Great job 🎉!" says "Great job!", not "Great job !" with its mark cut off by a space."""
_FACE = r"(?:[:;]'?-?[()\[\]DPpOo3/\\|*]|=[()DP]|[xX]D|<3|\^_?\^)"
_SPOKEN_EMOTICON = re.compile(
    rf"[ \t]*(?<!\S){_FACE}(?=[.,!?;:\u2026])|(?<!\S){_FACE}(?!\S)"
    r"|(?<=[^\W\d_])[:;]-?[()](?![^\s.,!?\u2026])")
"""An emoticon written as a word (``_EMOTICON``; "=3" and "=/" left to math), or ":)",
";)", ":(" glued to a word ("great:)"): not said, as emoji are not. espeak-ng read ":)" and
":(" after a full stop as "colon", ":D" as "colon D", "xD" as "X D", "<3" as "three", ":P"
as "colon P", and made a pause of ";-)", "^_^" and "great:)" (0.23 s: "That's great:)"
1.20 s against 0.97 s for "That's great."). Glued, ":D" and ":P" stay ("great:D" says
"colon D"), as "Answer:D" may be a choice. Before a mark an emoticon goes with the space
before it, as an emoji does ("works :)." says "works.")."""

_SPOKEN_KAOMOJI = re.compile(
    rf"[ \t]*(?<!\S)({_KAOMOJI.pattern})(?=[.,!?;:\u2026])|(?<!\S)({_KAOMOJI.pattern})(?!\S)")
"""A face in brackets or the shrug written as a word (``_KAOMOJI``, ``_face``): not said, as
":)" is not (the engine read "(^o^)/" and "(T_T)" out as written, the shrug as "¯\\(ツ)/¯")."""


def _unsaid_face(m: re.Match[str]) -> str:
    return "" if _face(m.group(1) or m.group(2)) else m.group()


_FACE_HINT = re.compile(
    r"[:;=](?:(?<!\S[:;=])'?-?[()\[\]DPpOo3/\\|*]|(?<=[^\W\d_][:;])-?[()])"
    r"(?![^\s.,!?;:\u2026])")
"""What ``_SPOKEN_EMOTICON`` drops of a face made with ":", ";" or "=", looked for before
that pass by a search that starts at one of three characters (a tenth of its cost), so a
time ("3:30"), a URL ("https://") or a colon in prose pays little."""


def speakable(text: str, *, reads_digits: bool = True) -> str:
    """What to say for one segment of a reply.

    Drops markdown markers (emphasis, headings, list numbering and bullets, quote marks,
    table pipes and rules, code fences and inline-code backticks), struck-out text,
    footnote marks, control characters, U+FFFD (what an LLM's invalid UTF-8 decodes to:
    "caf\ufffd\ufffd" says "caf"), emoji and emoticons (":)", "xD", "great:)", "(^o^)/", the
    shrug); an HTML
    line break is a pause; a link says its label, a bare URL its host. With
    ``reads_digits=False`` (engines that read "3.5" or "$184.50" badly) numbers, currency,
    percentages, times, ordinals and common abbreviations are written out as words. LaTeX
    math says its content, not its delimiters.
    """
    s = _CONTROL.sub(" ", text).replace("\ufffd", "").strip()
    if _FENCE.match(s) or _TABLE_RULE.match(s):
        return ""
    s = _LINE_MARK.sub("", s)
    if "(" in s or "\u00af" in s:  # before the emphasis pass, which took the shrug's "_(ツ)_"
        s = _SPOKEN_KAOMOJI.sub(_unsaid_face, s)
    # Each pass below runs only when the text holds the character its pattern needs: the
    # same result, at a quarter of the cost for plain prose (this runs in the feed call that
    # completes a segment: those calls make the segmenter's p99, bench/segmentation.py).
    if "[" in s:
        s = _LINK.sub(lambda m: m.group(1), s)
        s = _FOOTNOTE.sub("", s)
    if "<" in s:
        s = _BREAK.sub(", ", s)
    if "://" in s or "www." in s.lower():
        s = _URL.sub(lambda m: m.group(1).removeprefix("www."), s)
    if "$" in s or "\\" in s:
        s = _MATH.sub(_math, s)
    if "~" in s:
        s = _STRUCK.sub("", s)
    if "*" in s or "_" in s:
        s = _EMPHASIS.sub(r"\2", s)
        s = _ITALIC.sub(r"\2", s)
    s = s.replace("`", "")
    if "|" in s:
        s = ", ".join(p.strip() for p in s.strip().strip("|").split("|") if p.strip())
    if "xD" in s or "XD" in s or "<3" in s or "^" in s or (
            ":" in s or ";" in s or "=" in s) and _FACE_HINT.search(s):
        s = _SPOKEN_EMOTICON.sub("", s)
    if not s.isascii():  # every emoji is outside ASCII
        s = _EMOJI.sub(" ", _EMOJI_BEFORE_MARK.sub("", s))
    if not reads_digits:
        s = spell_out(s)
    s = _SPACES.sub(" ", s).strip()
    return "" if not any(ch.isalnum() for ch in s) else s
