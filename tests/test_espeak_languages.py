"""espeak in German, French, Spanish, Italian and Portuguese: what the voice is given and
what it says (real libespeak-ng: the audio of a reply against the audio of the words a
speaker of the language would use)."""

from __future__ import annotations

import pytest

from engines import espeak
from engines.espeak_languages import for_language
from tests.conftest import synthesized


def same_speech(engine: espeak.EspeakEngine, voice: str, a: str, b: str) -> bool:
    """Whether the voice says ``a`` as it says ``b``: the same length of audio (exactly,
    where espeak is deterministic; else within a few pitch periods). Not the same bytes:
    some voices (pt) vary their waveform, not their length, from one call to the next."""
    x, y = len(synthesized(engine, a, voice)), len(synthesized(engine, b, voice))
    return x == y if engine.deterministic else abs(x - y) < 2 * 1000


@pytest.mark.parametrize(("voice", "text", "spoken"), [
    # "vierzehn Uhr dreißig Uhr": espeak's own Uhr for the colon, then the written one
    ("de", "Wir treffen uns um 14:30 Uhr.", "Wir treffen uns um 14 Uhr 30."),
    ("de", "Der Laden öffnet um 9:00 Uhr.", "Der Laden öffnet um 9 Uhr."),  # "null null"
    ("de", "Um 14.30 Uhr geht es los.", "Um 14 Uhr 30 geht es los."),  # "Punkt"
    ("de", "Komm um 9:05.", "Komm um 9 Uhr 5."),  # "null fünf"
    ("fr", "Rendez-vous à 14h30.", "Rendez-vous à 14 heures 30."),  # "quatorze ache trente"
    ("fr", "Ouvert de 9h à 17h.", "Ouvert de 9 heures à 17 heures."),
    ("fr", "On se voit à 1h.", "On se voit à une heure."),
    ("es", "La reunión es a las 9:05.", "La reunión es a las 9 y 5."),  # "cero cinco"
    ("es", "Abre a las 14:00.", "Abre a las 14."),  # "cero cero"
    ("es", "Cierra a las 20 h.", "Cierra a las 20 horas."),  # "hache"
    ("pt", "A consulta é às 14h30.", "A consulta é às 14 e 30."),  # "agá"
    ("pt", "Abre às 9h.", "Abre às 9 horas."),
    ("it", "Ci vediamo alle 14.30.", "Ci vediamo alle 14 e 30."),  # "punto"
    ("it", "Il treno parte alle 9:05.", "Il treno parte alle 9 e 5."),  # "zero cinque"
])
def test_times_are_read_as_a_speaker_of_the_language_says_them(espeak_engine, voice, text, spoken):
    assert for_language(text, voice) == spoken
    assert same_speech(espeak_engine, voice, text, spoken)


@pytest.mark.parametrize(("text", "spoken"), [
    # "am drei. Oktober": espeak takes "3." for an ordinal only before a lower-case word
    ("Das Konzert ist am 3. Oktober.", "Das Konzert ist am dritten Oktober."),
    ("Heute ist der 3. Oktober.", "Heute ist der dritte Oktober."),
    ("Wir sind vom 3. bis 24. Dezember weg.", "Wir sind vom dritten bis vierundzwanzigsten "
                                              "Dezember weg."),
    ("Das Schloss ist aus dem 19. Jahrhundert.", "Das Schloss ist aus dem neunzehnten "
                                                 "Jahrhundert."),
    # "null zwei Punkt zwölf Punkt zweitausendsechsundzwanzig"
    ("Dein Termin ist am 02.12.2026 um 14:30 Uhr.",
     "Dein Termin ist am zweiten Dezember 2026 um 14 Uhr 30."),
    ("Geöffnet bis 31.12.", "Geöffnet bis einunddreißigsten Dezember"),
])
def test_german_ordinals_and_dates_are_words(espeak_engine, text, spoken):
    assert for_language(text, "de") == spoken
    assert same_speech(espeak_engine, "de", text, spoken)


@pytest.mark.parametrize(("voice", "text", "spoken"), [
    # "zet be", "be zet we", "en er fünf", "de er Müller", "ka", "usf"
    ("de", "Es gibt viele Sorten, z. B. Äpfel.", "Es gibt viele Sorten, zum Beispiel Äpfel."),
    ("de", "Das kostet 5 bzw. 6 Euro.", "Das kostet 5 beziehungsweise 6 Euro."),
    ("de", "Siehe Nr. 5 auf S. 12.", "Siehe Nummer 5 auf Seite 12."),
    ("de", "Dr. Müller kommt ca. 20 Minuten später.",
     "Doktor Müller kommt circa 20 Minuten später."),
    ("de", "Du brauchst Mehl, Eier usw.", "Du brauchst Mehl, Eier und so weiter."),
    # "uno punto o", "tres punto er", "ene o"
    ("es", "Vivo en el 1.º piso, n.º 5.", "Vivo en el 1º piso, número 5."),
    ("es", "Es el 3.er piso.", "Es el tercer piso."),
    ("es", "Mira la pág. 12.", "Mira la página 12."),
    # "um ordinal masculino", "esse erre Silva", "doutor ordinal feminino Costa"
    ("pt", "Moro no 1.º andar, n.º 5.", "Moro no 1º andar, número 5."),
    ("pt", "Falei com o Sr. Silva e a Dr.ª Costa.", "Falei com o senhor Silva e a doutora Costa."),
    # "em Dupont", "pe ex", "en cinq"
    ("fr", "J'ai vu M. Dupont.", "J'ai vu Monsieur Dupont."),
    ("fr", "Prends des fruits, p. ex. des pommes.", "Prends des fruits, par exemple des pommes."),
    ("fr", "Il habite au n° 5.", "Il habite au numéro 5."),
    # "sig Rossi", "dot ssa", "ek", "pag", "enne"
    ("it", "Ho parlato con il Sig. Rossi e la Sig.ra Bianchi.",
     "Ho parlato con il signor Rossi e la signora Bianchi."),
    ("it", "La Dott.ssa Neri arriva.", "La dottoressa Neri arriva."),
    ("it", "Vedi pag. 12, n. 5, ecc.", "Vedi pagina 12, numero 5, eccetera."),
    # "vi", a word: the other numerals are read as numbers ("Felipe II": "Felipe dos")
    ("es", "El rey Felipe VI habló ayer.", "El rey Felipe 6 habló ayer."),
    ("pt", "Lê o capítulo VI.", "Lê o capítulo 6."),
    ("it", "Carlo VI era imperatore.", "Carlo sesto era imperatore."),
])
def test_abbreviations_are_said_as_words(espeak_engine, voice, text, spoken):
    assert for_language(text, voice) == spoken
    assert same_speech(espeak_engine, voice, text, spoken)


@pytest.mark.parametrize(("voice", "text", "spoken"), [
    # "zéro deux douze deux mille vingt-six", "cero dos barra doce barra ..."
    ("fr", "Le rendez-vous est le 02/12/2026.", "Le rendez-vous est le 2 décembre 2026."),
    ("fr", "Le 01/01/2027 est férié.", "Le premier janvier 2027 est férié."),
    ("es", "La cita es el 02/12/2026.", "La cita es el 2 de diciembre de 2026."),
    ("it", "Il 02/12/2026 è martedì.", "Il 2 dicembre 2026 è martedì."),
    ("pt", "A consulta é em 02/12/2026.", "A consulta é em 2 de dezembro de 2026."),
])
def test_a_date_with_slashes_names_its_month(espeak_engine, voice, text, spoken):
    assert for_language(text, voice) == spoken
    assert same_speech(espeak_engine, voice, text, spoken)


@pytest.mark.parametrize(("voice", "text", "spoken"), [
    # "Louis quatorze romain", "chapitre quatre romain"
    ("fr", "Louis XIV a régné longtemps.", "Louis 14 a régné longtemps."),
    ("fr", "Lis le chapitre IV.", "Lis le chapitre 4."),
    # "au ixe siècle", "au deux e étage", "François i"
    ("fr", "Au XIXe siècle, Paris grandit.", "Au dix-neuvième siècle, Paris grandit."),
    ("fr", "Il habite au 2e étage, la 1re porte.", "Il habite au deuxième étage, la première "
                                                   "porte."),
    ("fr", "François Ier est né au XVe siècle.", "François premier est né au quinzième siècle."),
    ("fr", "C'est le 21e jour.", "C'est le vingt et unième jour."),
    # "Ludwig römisch vierzehn"
    ("de", "Ludwig XIV. war König.", "Ludwig der vierzehnte war König."),
    ("de", "Lies Kapitel IV bis VI.", "Lies Kapitel 4 bis 6."),
    ("de", "Im XIX. Jahrhundert war das so.", "Im neunzehnten Jahrhundert war das so."),
])
def test_roman_numerals_and_french_ordinals(espeak_engine, voice, text, spoken):
    assert for_language(text, voice) == spoken
    assert same_speech(espeak_engine, voice, text, spoken)


def test_french_ordinal_words():
    from engines.espeak_languages import _ordinal_fr

    assert [_ordinal_fr(n, "e") for n in (2, 3, 5, 9, 17, 21, 71, 80, 81, 99)] == [
        "deuxième", "troisième", "cinquième", "neuvième", "dix-septième", "vingt et unième",
        "soixante et onzième", "quatre-vingtième", "quatre-vingt-unième",
        "quatre-vingt-dix-neuvième"]


@pytest.mark.parametrize(("text", "spoken"), [
    # "fünf Komma neun neun Euro": a decimal's digits one by one
    ("Das kostet 5,99 €.", "Das kostet 5 Euro 99."),
    ("Der Fernseher kostet 1.000,50 €.", "Der Fernseher kostet 1.000 Euro 50."),
    ("Nur 0,99 €!", "Nur 99 Cent!"),
    ("Es kostet 12,50 EUR.", "Es kostet 12 Euro 50."),  # "zwölf Komma fünf null e u er"
    ("Es kostet €5.", "Es kostet 5 Euro."),  # "Euro fünf"
    ("Es kostet 1,00 €.", "Es kostet ein Euro."),
])
def test_german_prices_are_said_as_euros_and_cents(espeak_engine, text, spoken):
    assert for_language(text, "de") == spoken
    assert same_speech(espeak_engine, "de", text, spoken)


@pytest.mark.parametrize(("voice", "text", "spoken"), [
    # the en dash was skipped ("zwanzig zweiundzwanzig Grad"), a hyphen "Strich" / "menos"
    ("de", "Morgen werden es 20–22 Grad.", "Morgen werden es 20 bis 22 Grad."),
    ("de", "Das dauert 10-15 Minuten.", "Das dauert 10 bis 15 Minuten."),
    ("de", "Geöffnet von 9:00–17:00 Uhr.", "Geöffnet von 9 Uhr bis 17 Uhr."),
    ("fr", "Il fera 20–22 degrés.", "Il fera 20 à 22 degrés."),
    ("fr", "Lisez les pages 3-5.", "Lisez les pages 3 à 5."),
    ("es", "Tarda 10-15 minutos.", "Tarda 10 a 15 minutos."),
    ("it", "Ci saranno 20–22 gradi.", "Ci saranno 20 a 22 gradi."),
    ("pt", "Demora 10-15 minutos.", "Demora 10 a 15 minutos."),
])
def test_a_range_is_read_with_the_languages_word(espeak_engine, voice, text, spoken):
    assert for_language(text, voice) == spoken
    assert same_speech(espeak_engine, voice, text, spoken)


@pytest.mark.parametrize(("voice", "text"), [
    # a hyphen that joins no range: a date, a score, a phone number
    ("de", "Am 2024-05-01 stand es 2-1, ruf 030-1234 an."),
    ("pt", "A partida ficou 3-1."),
    ("es", "Añade 3/4 de taza."),  # a fraction, not a date: the year is required
    ("fr", "Il a un CV et un CD, I love it."),  # acronyms, a lone I: no Roman numerals
    ("de", "Er war Mitglied der CDU, ich und du."),
    ("de", "Die Straße heißt Nr. Zwei."),  # no number after it: not "Nummer"
    ("fr", "M. le maire arrive."),  # not before a name
    ("es", "Sr. García y la Dra. López llegan."),  # espeak says these itself
    ("de", "Platz 1. Der zweite Platz geht an Anna."),  # a sentence ends after "1."
    ("de", "Ich zähle bis 3. Dann geht es los."),
    ("de", "Version 2.4.1 läuft auf 10.1.1.1."),
    ("de", "Es wiegt 3,5 kg und kostet 1.000 Euro."),  # espeak reads these right
    ("de", "Es steht 2:1 nach 90 Minuten."),
    ("fr", "Il roule à 50 km/h et il fait 3,5 degrés."),
    ("it", "Costa 1.000 euro, cioè 3,50 al giorno."),
    ("es", "Son 1.000 € al mes."),
    # other languages are not these rules' business: English has its own (espeak_text)
    ("en-us", "Meet me at 14h30 or 9:05."),
    ("nl", "Om 14.30 uur."),
])
def test_what_each_voice_reads_right_is_left_alone(voice, text):
    assert for_language(text, voice) == text


def test_a_voice_variant_and_a_regional_voice_pick_the_language(espeak_engine):
    assert for_language("à 14h30", "fr-be") == "à 14 heures 30"
    assert for_language("às 14h30", "pt-br") == "às 14 e 30"
    assert same_speech(espeak_engine, "de+f3", "um 14:30 Uhr", "um 14 Uhr 30")
