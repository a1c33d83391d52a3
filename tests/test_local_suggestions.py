"""Suggestions without a model: follow-up questions from the demo knowledge base's headings,
answer options from the booking form or a yes/no question."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.responder.local_suggestions import answer_options, as_topic, follow_ups, is_yes_no, last_question
from services.retriever import documents
from shared import events as ev
from shared.site_config import Booking, FormField, SiteConfig
from shared.state import BookingState, ConversationState, Message, TurnRecord
from tests.servers import ROOT

DEMO = ROOT / "knowledge" / "demo"


def kb(*names: str) -> list[ev.RetrievedDocument]:
    """The demo files' sections as retrieval numbers them: "<title> — <heading>" chunks."""
    out: list[ev.RetrievedDocument] = []
    for name in names:
        doc = documents.read("demo", DEMO / f"{name}.md")
        for heading, text in doc.sections:
            out.append(ev.RetrievedDocument(n=len(out) + 1, document_type="chunk", source=doc.source,
                                            title=f"{doc.title} — {heading}" if heading else doc.title,
                                            snippet=text[:80], content=text))
    return out


def said(*exchanges: str) -> list[Message]:
    return [Message(role=("user", "assistant")[i % 2], content=text, turn=i // 2 + 1)
            for i, text in enumerate(exchanges)]


def faq_headings() -> set[str]:
    return {h for h, _ in documents.read("demo", DEMO / "faq.md").sections}


def test_faq_headings_are_offered_as_questions_except_the_one_asked():
    conversation = said("How long does it take to get started?",
                        "Most teams go live in two to four weeks, with the onboarding team's help.")
    got = follow_ups(kb("faq"), conversation, "en")
    assert len(got) == 3 and all(q.endswith("?") and q in faq_headings() for q in got)
    assert "How long does it take to get started?" not in got
    assert got == ["Can we migrate from another field-service tool?", "Is there a minimum contract length?",
                   "Does Tidewise work for one-person businesses?"]


def test_a_question_asked_in_other_words_or_already_answered_is_not_offered():
    conversation = said("can I migrate from another field service tool like Jobber?",
                        "Yes. Tidewise imports data from ServiceTitan, Jobber, Simpro and spreadsheets.",
                        "ok",
                        "No minimum on monthly billing. Annual billing is a 12-month commitment with a lower price.")
    got = follow_ups(kb("faq"), conversation, "en")
    assert "Can we migrate from another field-service tool?" not in got  # asked, in other words
    assert "Is there a minimum contract length?" not in got  # its answer was given
    assert got and all(q in faq_headings() for q in got)


def test_sections_not_yet_discussed_become_localized_questions():
    conversation = said("Which integrations do you offer?",
                        "Accounting with QuickBooks and Xero, and CRM with Salesforce and HubSpot [1][2].")
    assert follow_ups(kb("integrations"), conversation, "en") == [
        "Can you tell me about payments?", "Can you tell me about calendars and communication?",
        "Can you tell me about Zapier and the API?"]
    assert follow_ups(kb("integrations"), conversation, "de")[0] == "Können Sie mir mehr über payments sagen?"
    assert follow_ups(kb("integrations"), conversation, "fr")[0] == "Pouvez-vous m'en dire plus sur payments ?"


@pytest.mark.parametrize("heading, content, lang, asked", [
    # Written as the section's text writes it mid-sentence, with the "the" it takes there.
    ("Route optimisation", "Tidewise plans each day. Its route optimisation saves an hour.", "en", "route optimisation"),
    ("Growth plan", "Most teams pick the Growth plan for its reports.", "en", "the Growth plan"),
    # Not in the text: the first word lower case, but an acronym, a name the text
    # capitalizes mid-sentence, or any German noun stays as it is.
    ("Discounts", "Nonprofits get 20% off. Annual billing saves two months.", "en", "discounts"),
    ("CRM", "Contacts sync both ways.", "en", "CRM"),
    ("Zapier and the API", "Connect through Zapier or the REST API.", "en", "Zapier and the API"),
    ("Rabatte", "Gemeinnützige Organisationen erhalten 20 %.", "de", "Rabatte"),
    # The site's voice turned to the visitor's; a singular thing named bare takes "the".
    ("How we hire", "Two interviews and a paid trial day.", "en", "how you hire"),
    ("Status page", "Status page. Incidents are posted within minutes.", "en", "the status page"),
])
def test_a_sections_heading_is_asked_about_as_a_visitor_would_name_it(heading, content, lang, asked):
    assert as_topic(heading, content, lang) == asked


def test_the_sections_the_answer_cited_are_not_offered_again():
    docs = kb("integrations")
    accounting = next(d.n for d in docs if d.title.endswith("— Accounting"))
    conversation = said("Do you integrate with QuickBooks?",
                        f"QuickBooks Online and Xero sync every 10 minutes in both directions [{accounting}].")
    assert "Can you tell me about accounting?" in follow_ups(docs, conversation, "en", limit=8)
    assert "Can you tell me about accounting?" not in follow_ups(docs, conversation, "en", limit=8,
                                                                 cited=frozenset({accounting}))


def test_question_headings_come_before_sections_and_at_most_three_distinct():
    docs = kb("pricing", "faq") + kb("faq")  # the FAQ twice: offered once
    conversation = said("What does it cost?", "Starter is $29 per technician per month.")
    got = follow_ups(docs, conversation, "en")
    assert len(got) == 3 and len({q.lower() for q in got}) == 3 and all(q in faq_headings() for q in got)
    more = follow_ups(docs, conversation, "en", limit=8)
    assert set(more[:6]) == faq_headings() and more[6:] == ["Can you tell me about the Starter plan?",
                                                               "Can you tell me about the Growth plan?"]


def test_nothing_good_gives_nothing_never_a_placeholder():
    entity = ev.RetrievedDocument(n=1, document_type="entity", title="QuickBooks", source="s", snippet="", content="x")
    intro = ev.RetrievedDocument(n=2, document_type="chunk", title="Integrations", source="s", snippet="", content="x")
    page = ev.RetrievedDocument(n=3, document_type="chunk", title="Brochure — page 2", source="s", snippet="",
                                content="x")
    assert follow_ups([entity, intro, page], said("Hi", "Hello!"), "en") == []
    assert follow_ups([], said("Hi", "Hello!"), "en") == []
    # Everything discussed already: nothing left to offer.
    everything = said("Tell me about accounting, CRM, payments, calendars and communication, Zapier and the API")
    assert follow_ups(kb("integrations"), everything, "en") == []


def test_yes_no_questions_are_told_from_requests_choices_and_open_questions():
    assert is_yes_no(last_question("Great. Would you like to book a demo? 📅"), "en")
    assert is_yes_no("Souhaitez-vous une démo ?", "fr") and is_yes_no("Möchten Sie eine Demo sehen?", "de")
    assert not is_yes_no("Could you share your work email?", "en")  # asks for information
    assert not is_yes_no("Pouvez-vous m'indiquer votre e-mail ?", "fr")
    assert not is_yes_no("Do you use Salesforce or HubSpot?", "en")  # a choice
    assert not is_yes_no("How many technicians does your team have in the field?", "en")
    assert last_question("Is it good? Yes, it is.") == "Is it good?"


def booking_state(pending: str) -> ConversationState:
    return ConversationState(turns={2: TurnRecord(turn=2, route="BOOKING")},
                             booking=BookingState(active=True, pending_field=pending))


CONFIG = SiteConfig(booking=Booking(fields=[
    FormField(name="email", label="Work email", kind="email"),
    FormField(name="team_size", label="Number of technicians", kind="choice",
              choices=["1-10", "11-50", "51-200", "200+"]),
]))


def test_a_choice_field_offers_all_its_choices_other_fields_none():
    reply = "Which best describes your number of technicians: 1-10 / 11-50 / 51-200 / 200+?"
    assert answer_options(booking_state("team_size"), 2, reply, CONFIG, "en") == ["1-10", "11-50", "51-200", "200+"]
    assert answer_options(booking_state("email"), 2, "Could you give me your work email?", CONFIG, "en") == []


def test_other_questions_offer_yes_and_no_only_when_they_are_yes_no():
    answered = ConversationState(turns={3: TurnRecord(turn=3, route="ANSWER")})
    assert answer_options(answered, 3, "It syncs every 10 minutes. Do you use QuickBooks today?", CONFIG, "en") == [
        "Yes", "No"]
    assert answer_options(answered, 3, "Nutzen Sie heute QuickBooks?", CONFIG, "de") == ["Ja", "Nein"]
    assert answer_options(answered, 3, "Which tool do you use today for scheduling?", CONFIG, "en") == []
