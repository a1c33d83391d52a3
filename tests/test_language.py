"""shared/language.py: the visitor's language on replies that come from no model."""

from __future__ import annotations

import pytest

from shared import language


@pytest.mark.parametrize("lang, text", [
    ("en", "Who founded it?"), ("en", "When was Tidewise founded? Who founded it?"), ("en", "And Xero?"),
    ("en", "Is there a free trial?"), ("en", "Hi"), ("en", "Pricing?"),
    ("fr", "Y a-t-il un essai gratuit ?"), ("fr", "Où sont hébergées nos données ?"), ("fr", "Et Xero ?"),
    ("fr", "Merci"), ("fr", "Combien coûte le plan Starter ?"),
    ("de", "Welche CRM-Systeme werden unterstützt?"), ("de", "Und der Starter-Plan?"), ("de", "Danke"),
    ("de", "Gibt es eine Testversion?"),
    ("es", "¿La API tiene un límite de solicitudes?"), ("es", "¿Y Xero?"), ("es", "Gracias"),
    ("it", "Quanto costa il piano Growth?"), ("it", "C'è una prova gratuita?"), ("it", "Grazie"),
    ("pt", "Quanto custa o plano Starter?"), ("pt", "Existe um teste grátis?"), ("pt", "Obrigado"),
    ("nl", "Welke Android-versie heeft de app nodig?"), ("nl", "Is er een gratis proefperiode?"), ("nl", "Bedankt"),
])
def test_short_messages_are_guessed_right(lang, text):
    assert language.guess(text) == lang


def test_the_widgets_language_wins_and_no_evidence_means_english():
    assert language.guess("Combien coûte le plan Starter ?", {"language": "de-CH"}) == "de"
    assert language.guess("Combien coûte le plan Starter ?", {"language": "ja"}) == "fr"
    assert language.guess("") == language.guess("42 ?!") == "en"
    assert language.guess("Xero") == "en"


def test_function_words_decide_where_the_ngram_model_hesitates():
    probability, hits = language.evidence("Et Xero ?")
    assert max(probability, key=probability.get) != "fr"  # the n-gram model alone gets it wrong
    assert hits["fr"] == 1 and language.guess("Et Xero ?") == "fr"
