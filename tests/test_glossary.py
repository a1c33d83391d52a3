"""Cross-language expansion (shared/glossary.py) on general phrases of each language, not on
the evaluation's questions."""

from __future__ import annotations

import tomllib

import pytest

from shared import glossary
from shared.language import LANGUAGES


@pytest.mark.parametrize("lang, message, expected", [
    ("fr", "Proposez-vous une période d'essai ?", ["trial"]),
    ("fr", "Les données sont-elles chiffrées ?", ["data", "encryption"]),
    ("de", "Gibt es Rabatte für Schulen?", ["discount", "education"]),
    ("de", "Wo finde ich die Rechnungsvorlagen?", ["invoice", "template"]),  # a compound, split
    ("de", "Wie lang ist die Kündigungsfrist?", ["how long", "cancel"]),  # "Frist" is not listed: ignored
    ("es", "¿Puedo exportar mis datos a una hoja de cálculo?", ["export", "data", "spreadsheet"]),
    ("it", "Qual è il periodo di prova gratuito?", ["trial", "free"]),
    ("pt", "Vocês têm suporte por telefone aos fins de semana?", ["support", "phone", "weekend"]),
    ("nl", "Kan ik mijn abonnement maandelijks opzeggen?", ["subscription", "monthly", "cancel"]),
    ("nl", "Welke beveiligingscertificaten hebben jullie?", ["security", "certification"]),
])
def test_a_messages_glossary_terms_are_appended_in_english(lang, message, expected):
    expanded = glossary.expand(message, lang)
    assert expanded.startswith(f"{message} ")
    found = glossary.terms(message, lang)
    assert all(term in found for term in expected), found
    assert [t for t in found if t in expected] == expected  # in the order of the message


def test_the_longest_phrase_wins_and_its_words_are_not_matched_again():
    assert glossary.terms("Y a-t-il une version d'essai gratuite ?", "fr") == ["trial", "free"]
    assert glossary.terms("Avez-vous un essai gratuit ?", "fr") == ["free trial"]
    assert glossary.terms("¿Hacéis copias de seguridad diarias?", "es") == ["backups"]  # not "security"


def test_forms_match_without_accents_and_across_close_forms():
    assert glossary.terms("Ou sont hebergees les donnees ?", "fr") == ["hosted", "data"]
    assert glossary.terms("Welche Zertifizierungen habt ihr?", "de") == ["certification"]


def test_short_words_match_only_as_written():
    assert glossary.expand("Tu viens ou pas ?", "fr") == "Tu viens ou pas ?"  # "ou" is not "où"
    assert "press" not in glossary.terms("Wat kost het per gebruiker?", "nl")  # "per" is not "pers"
    assert glossary.terms("Combien de devises ?", "fr") == ["how many", "currency"]  # not "devis" + "es"


@pytest.mark.parametrize("message", ["Is there a free trial?", "Do you offer a discount for non-profits?",
                                     "Où sont les données ?"])
def test_english_is_left_unchanged(message):
    assert glossary.expand(message, "en") == message


@pytest.mark.parametrize("lang, message", [("sv", "Finns det en gratis provperiod?"), ("ja", "無料トライアルはありますか？"),
                                           ("", "Y a-t-il un essai gratuit ?")])
def test_a_language_the_glossary_lacks_is_left_unchanged(lang, message):
    assert glossary.expand(message, lang) == message


@pytest.mark.parametrize("lang, message", [("fr", "Quelle est la capitale du Pérou ?"),
                                           ("de", "Wer hat die Fußball-WM 2018 gewonnen?")])
def test_a_message_without_glossary_terms_is_left_unchanged(lang, message):
    assert glossary.expand(message, lang) == message


def test_english_already_in_the_message_is_not_repeated():
    assert glossary.terms("Avez-vous une API ?", "fr") == []


def test_every_term_has_every_language_the_language_guess_knows():
    table = tomllib.loads(glossary.GLOSSARY.read_text(encoding="utf-8"))
    assert 150 <= len(table) <= 300
    for english, languages in table.items():
        assert set(languages) == set(LANGUAGES) - {"en"}, english
        assert all(f.strip() for listed in languages.values() for f in listed.split(",")), english
