"""Post-processing rules: dialog flags, form values, suggestion routing and cleaning."""

from __future__ import annotations

from services.responder.post_processing import dialog_flags, ends_with_question, form_values
from services.responder.suggesters import clean


def test_form_values_from_the_visitors_message():
    got = form_values("Hi, my name is Ada Lovelace, I work at Analytical Engines Ltd. "
                      "Mail ada@ae.io or call +44 20 7946 0958")
    assert got == {"email": "ada@ae.io", "phone": "+442079460958", "name": "Ada Lovelace",
                   "company": "Analytical Engines Ltd"}
    assert form_values("je m'appelle Marie, je travaille chez Fromagerie Dupont") == {
        "name": "Marie", "company": "Fromagerie Dupont"}
    assert form_values("i am interested in the pricing for 20 seats") == {}


def test_dialog_flags_read_markers_email_and_questions():
    flags = dialog_flags("sure, it's bob@corp.example", "Thanks! Shall I book a demo for you? 📅")
    assert flags["demo_proposed"] and flags["email_captured"] and flags["asked_visitor"]
    assert not flags["email_requested"]
    flags = dialog_flags("what is it?", "It is a chat assistant. ✉️")
    assert flags["email_requested"] and not flags["asked_visitor"] and not flags["email_captured"]


def test_answers_mode_only_when_the_reply_ends_with_a_question():
    assert ends_with_question("Which CRM do you use?")
    assert ends_with_question("Which CRM do you use? 📅 ")
    assert not ends_with_question("Is it good? Yes, very.")


def test_suggestions_are_cleaned_deduplicated_and_capped():
    assert clean(["  What   does it cost? ", "what does it cost?", "", "SSO?", "Trial?", "Fourth?"]) == [
        "What does it cost?", "SSO?", "Trial?"]
    assert len(clean(["x" * 500])[0]) == 120
