"""Extractive answers (pure, on the demo knowledge base's real text) and the server's citation audit."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import msgspec
import pytest

from services.responder import answer_audit, extractive, finalize
from services.retriever import documents as kb_documents
from services.retriever import extraction
from shared import citations, glossary, language
from shared import events as ev
from shared import kb_vectors
from shared.embeddings import shared_embedder
from shared.site_config import CTA, Redirects, SiteConfig
from shared.state import ConversationState, Message, TurnRecord

DEMO = Path(__file__).resolve().parent.parent / "knowledge" / "demo"
CONFIG = SiteConfig(name="Tidewise", cta=CTA(label="Book a 30-minute demo", url="https://tidewise.example/demo"),
                    redirects=Redirects(support="https://help.tidewise.example"))


def embed(texts):
    return shared_embedder().embed(texts)


@lru_cache(maxsize=1)
def demo_chunks():
    """The demo KB chunked as the retriever chunks it, titled as retrieval titles them."""
    chunks = []
    for path in sorted(DEMO.glob("*.md")):
        doc = kb_documents.read("demo", path)
        for chunk in extraction.chunk(doc, lambda text: len(text.split())):
            head, _, body = chunk.content.partition("\n")
            section = f" — {head.split(' — ', 1)[1]}" if " — " in head else ""
            chunks.append((doc.title + section, doc.source, body or head))
    return chunks, embed([f"{title}\n{body}" for title, _, body in chunks])


def retrieved(question: str, k: int = 6) -> list[ev.RetrievedDocument]:
    """A stand-in retrieval: the k chunks most similar to the question, numbered from 1."""
    chunks, vectors = demo_chunks()
    order = (vectors @ embed([question])[0]).argsort()[::-1][:k]
    return [ev.RetrievedDocument(n=i, document_type="chunk", title=chunks[j][0], source=chunks[j][1],
                                 snippet=chunks[j][2][:80], content=chunks[j][2]) for i, j in enumerate(order, 1)]


def answer(message: str, documents: list[ev.RetrievedDocument], **kw) -> str:
    picked = extractive.compose(message, documents, embed)
    return extractive.reply(picked, documents, skills=kw.get("skills", []), question=kw.get("question"),
                            lang=kw.get("lang", "en"), config=CONFIG, site="demo")


def test_quickbooks_question_is_answered_with_the_quickbooks_and_xero_sentence_cited():
    documents = retrieved("Do you integrate with QuickBooks?")
    n = next(d.n for d in documents if d.title == "Integrations — Accounting")
    text = answer("Do you integrate with QuickBooks?", documents)
    assert (f"QuickBooks Online and Xero: invoices, payments and customers are synchronised every 10 minutes "
            f"in both directions [{n}].") in text
    assert "does not integrate" not in text and len(citations.cited(text)) >= 1


def test_eu_data_question_is_answered_with_the_frankfurt_and_virginia_sentence():
    documents = retrieved("Is my data stored in the EU?")
    n = next(d.n for d in documents if d.title == "Security and compliance — GDPR and data residency")
    picked = extractive.compose("Is my data stored in the EU?", documents, embed)
    assert picked[0].n == n and any(p.n == n and "(Frankfurt)" in p.text and "(Virginia)" in p.text for p in picked)
    assert 1 <= len(picked) <= 4


@pytest.mark.parametrize("question", ["What is the capital of Peru?", "Can you write me a poem about cats?",
                                      "Who won the 2018 football World Cup?"])
def test_an_unrelated_question_gets_the_plain_not_found_reply_with_the_sites_contact(question):
    documents = retrieved(question)
    assert extractive.compose(question, documents, embed) == []
    text = answer(question, documents)
    assert text == ("I couldn't find that in Tidewise's documentation, and I'd rather not guess. "
                    "The team can answer it: Book a 30-minute demo, https://tidewise.example/demo "
                    "For help with your account: https://help.tidewise.example")
    sentences = {s for d in documents for s in extractive.sentences(d)}
    assert not any(s[:40] in text for s in sentences) and not citations.cited(text)


def test_near_duplicates_are_said_once():
    sentence = "QuickBooks Online and Xero: invoices, payments and customers are synchronised every 10 minutes in both directions."
    documents = [
        ev.RetrievedDocument(n=1, document_type="entity", title="QuickBooks Online", source="s", snippet="",
                             content=f"QuickBooks Online (Integrations): {sentence}"),
        ev.RetrievedDocument(n=2, document_type="chunk", title="Integrations — Accounting", source="s", snippet="",
                             content=f"{sentence} Sage Intacct is available on the Enterprise plan."),
        ev.RetrievedDocument(n=3, document_type="chunk", title="Integrations — Sync", source="s", snippet="",
                             content="QuickBooks Online and Xero: invoices, payments and customers sync every ten "
                                     "minutes in both directions."),
    ]
    pool = extractive.candidates(documents)
    assert [(c.n, c.text[:20]) for c in pool].count((2, "QuickBooks Online an")) == 1
    assert all(c.n != 1 for c in pool)  # the entity's copy of a chunk sentence is cited to the chunk
    picked = extractive.compose("Do you integrate with QuickBooks?", documents, embed)
    quickbooks = [p for p in picked if "QuickBooks" in p.text]
    assert len(quickbooks) == 1, picked
    without_mmr = extractive.compose("Do you integrate with QuickBooks?", documents, embed, duplicate=1.01,
                                     diversity=0.0)
    assert len([p for p in without_mmr if "QuickBooks" in p.text]) == 2  # the test can fail


def test_sentences_lose_markdown_and_keep_what_they_refer_to():
    doc = ev.RetrievedDocument(n=1, document_type="chunk", title="t", source="s", snippet="", content=(
        "## Plans\nYes. The **Growth** plan costs $59 per technician per month. It adds the "
        "[Smart Scheduler](https://x.example/s).\n- Insights: reports and dashboards on revenue\n"
        "1. Import your customers from a spreadsheet."))
    assert extractive.sentences(doc) == [
        "The Growth plan costs $59 per technician per month. It adds the Smart Scheduler.",
        "Insights: reports and dashboards on revenue",
        "Import your customers from a spreadsheet.",
    ]
    assert extractive.cite("Insights: reports and dashboards on revenue", 3) == (
        "Insights: reports and dashboards on revenue [3].")


def test_a_hard_wrapped_paragraph_is_quoted_in_whole_sentences():
    """Docs wrapped at a fixed width (as real products' Markdown often is): a sentence cut by
    the wrap is one sentence, a list item's wrapped line stays with its item, while a short
    label line, a heading, a table row and code stay lines of their own."""
    doc = ev.RetrievedDocument(n=1, document_type="chunk", title="t", source="s", snippet="", content=(
        "Software updates on any app can be a chore, taking developer energy away from core business\n"
        "logic. Cloud Projects are updated every two weeks in rolling releases, done with no downtime. Updates keep\n"
        "your Project on the latest version and fully up to date with its\n"
        "security patches.\n"
        "Pricing\n"
        "The Growth plan costs $59 per month.\n"
        "- Exports: every report can be downloaded as a CSV file or as a spreadsheet for Excel\n"
        "  and shared with your whole team.\n"
        "| Plan | Seats |\n| Growth | 5 seats included |\n"
        "```\nnpm install the-widget-package\nthen-run-the-widget-build\n```"))
    assert extractive.sentences(doc) == [
        "Software updates on any app can be a chore, taking developer energy away from core business logic.",
        "Cloud Projects are updated every two weeks in rolling releases, done with no downtime.",
        "Updates keep your Project on the latest version and fully up to date with its security patches.",
        "The Growth plan costs $59 per month.",  # "Pricing" a label of its own (too short to quote)
        "Exports: every report can be downloaded as a CSV file or as a spreadsheet for Excel and shared with "
        "your whole team.",
        "Plan: Seats",
        "Growth: 5 seats included",
        "npm install the-widget-package",
        "then-run-the-widget-build",
    ]


def test_a_page_read_whole_titles_each_sentence_with_its_own_section():
    """The retriever appends the rest of a page under headings naming each section in full:
    a sentence is about its own section, not the one the page was found by; a heading of
    the page's own text ("## Plans") leaves the document's title."""
    doc = ev.RetrievedDocument(n=1, document_type="chunk", title="Pricing — Free trial", source="s", snippet="",
                               content=("Every plan can be tried free for 14 days.\n## Plans\nThe Growth plan costs $59."
                                        "\n## Pricing — Office users\nOffice users are free on every plan."))
    assert [(c.text, c.title) for c in extractive.candidates([doc])] == [
        ("Every plan can be tried free for 14 days.", "Pricing — Free trial"),
        ("The Growth plan costs $59.", "Pricing — Free trial"),
        ("Office users are free on every plan.", "Pricing — Office users")]
    # kb_vectors prepares what the answer embeds: the section's title among them.
    assert "Pricing — Office users" in kb_vectors.texts([doc], "Tidewise")


def test_an_elliptical_follow_up_is_read_with_the_previous_message():
    assert extractive.elliptical("And Xero?") and extractive.elliptical("What about the price?")
    assert not extractive.elliptical("Do you integrate with Salesforce for field jobs?")
    documents = retrieved("Tell me about the Growth plan") + retrieved("Does the mobile app work offline?", 2)
    documents = [msgspec.structs.replace(d, n=i) for i, d in enumerate(documents, 1)]
    followed = extractive.compose("And the price?", documents, embed, previous="Tell me about the Growth plan")
    assert followed and "Growth plan costs $59" in followed[0].text, followed
    alone = extractive.compose("And the price?", documents, embed)
    assert [p.text for p in alone] != [p.text for p in followed]  # the previous message changed the choice


def test_skills_end_the_answer_in_the_visitors_language():
    documents = retrieved("Do you integrate with QuickBooks?")
    text = answer("Proposez-vous une intégration QuickBooks ?", documents, skills=["propose_demo", "collect_email"],
                  lang="fr")
    assert text.endswith("Voulez-vous le voir lors d'une courte démonstration avec l'équipe ? 📅\n\n"
                         "Si vous laissez votre e-mail professionnel, l'équipe vous recontactera. ✉️")
    text = answer("Do you integrate with QuickBooks?", documents, skills=["ask_qualifying_question"],
                  question="Which tool do you use today for scheduling?")
    assert text.endswith("\n\nWhich tool do you use today for scheduling? ❓")
    for lang in ("en", "fr", "de", "es"):
        assert set(extractive.TEMPLATES[lang]) == set(extractive.TEMPLATES["en"])


def test_the_audit_flags_an_uncited_answer_and_an_invented_number():
    documents = retrieved("How much does the Growth plan cost?")
    uncited, unsupported = answer_audit.audit("The Growth plan costs $49 per technician per month.", documents,
                                              ["How much does the Growth plan cost?"])
    assert uncited and unsupported == ["49"]
    n = next(d.n for d in documents if d.title == "Pricing — Growth plan")
    uncited, unsupported = answer_audit.audit(f"The Growth plan costs $59 per technician per month [{n}], "
                                              f"so 12 technicians cost $708.", documents,
                                              ["We have 12 technicians. How much does the Growth plan cost?"])
    assert not uncited and unsupported == ["708"]  # 12 came from the visitor, 59 from the source
    assert answer_audit.audit("1. Starter\n2. Growth [1]", documents, [])[1] == []  # list numbering is no figure
    assert answer_audit.audit("I couldn't find that.", documents, [], declined=True) == (False, [])


def test_the_sites_words_a_reply_repeats_support_its_figures():
    documents = retrieved("Which operating system versions does the mobile app need?")
    declined = extractive.reply([], documents, skills=[], question=None, lang="en", config=CONFIG, site="demo")
    assert "Book a 30-minute demo" in declined
    assert answer_audit.audit(declined, documents, [], declined=True) == (False, ["30"])
    words = answer_audit.site_words(CONFIG, "Do you have more than 10 technicians?")
    assert words == ["Book a 30-minute demo", "Do you have more than 10 technicians?"]
    assert answer_audit.audit(declined, documents, words, declined=True) == (False, [])
    assert answer_audit.site_words(SiteConfig(cta=CTA(label="Book a 30-minute demo")), None) == []  # no link: never said


def test_metadata_marks_the_sources_the_answer_cited():
    documents = retrieved("Do you integrate with QuickBooks?", 3)
    state = ConversationState(
        messages=[Message(role="user", content="Do you integrate with QuickBooks?", turn=1),
                  Message(role="assistant", content="QuickBooks Online and Xero sync every 10 minutes [2].", turn=1)],
        turns={1: TurnRecord(turn=1, sources=documents, sources_cited=[1, 2, 3])})
    marked = finalize.sources(state, 1)
    assert [(s["n"], s["cited"]) for s in marked] == [(1, False), (2, True), (3, False)]
    assert "content" not in marked[0]


def test_the_sites_name_is_masked_so_a_generic_sentence_about_the_company_does_not_win():
    about = retrieved("Who is Tidewise and what does the company do?", 5)
    payments = [d for d in retrieved("Stripe card payments") if d.title == "Integrations — Payments"]
    documents = [msgspec.structs.replace(d, n=i) for i, d in enumerate(about + payments, 1)]
    question = "Which company powers Tidewise Pay?"
    best = max(extractive.compose(question, documents, embed, name="Tidewise", lexical_weight=0), key=lambda p: p.score)
    assert best.text.startswith("Stripe powers Tidewise Pay")
    unmasked = max(extractive.compose(question, documents, embed, lexical_weight=0), key=lambda p: p.score)
    assert not unmasked.text.startswith("Stripe")  # "Tidewise" in every sentence outweighs "powers ... Pay"
    assert extractive.masked("Tidewise's mission: Tidewise Pay.", "Tidewise") == "mission: Pay."


def test_a_french_question_is_answered_from_the_ranked_english_sources_by_shared_words_and_rank():
    documents = retrieved("How much does the Starter plan cost?")  # the retriever ranks by its keywords
    picked = extractive.compose("Combien coûte le plan Starter ?", documents, embed, name="Tidewise")
    assert picked and "$29 per technician" in picked[0].text, picked
    text = answer("Combien coûte le plan Starter ?", documents, lang="fr")
    assert citations.cited(text)
    # The sentence model alone (English only) does not find it: the test can fail.
    assert extractive.compose("Combien coûte le plan Starter ?", documents, embed, name="Tidewise",
                              lexical_weight=0, prior_weight=0) == []


@pytest.mark.parametrize("question", ["Quelle est la capitale du Pérou ?", "Wer hat die Fußball-WM 2018 gewonnen?",
                                      "Do you have a plan for world peace?", "What's the weather like in Rotterdam today?"])
def test_shared_words_and_rank_alone_do_not_make_an_answer_to_an_unrelated_question(question):
    assert extractive.compose(question, retrieved(question), embed, name="Tidewise") == []


def test_a_short_question_pointing_back_is_read_with_the_previous_message():
    assert extractive.follows_up("How much does it cost per month?")
    assert not extractive.follows_up("How much does the Starter plan cost per technician per month?")
    # Longer, opening pointing back or asking "also": read with the previous message too.
    assert extractive.follows_up("does that also work for the surveys we show inside our React Native app?")
    assert extractive.follows_up("it won't let me. we still have two projects in it, is that why?")
    assert extractive.follows_up("Gibt es für die Mitarbeiter in der Zentrale auch eine Anmeldung per SSO?")
    assert not extractive.follows_up("Est-ce que les boutons et les messages d'erreur sont traduits automatiquement ?")
    assert not extractive.follows_up("Ist das Dashboard für unsere Kunden ohne Anmeldung sichtbar, wenn wir es teilen?")
    assert not extractive.follows_up("We need a tool for our field technicians; what does the Growth plan include and "
                                     "how does it compare with Starter when the team has more than ten people?")
    documents = retrieved("How much do the plans cost per month?")
    growth = "The Growth plan costs $59"
    followed = extractive.compose("How much does it cost per month?", documents, embed, name="Tidewise",
                                  previous="What does the Growth plan include?")
    assert followed and max(followed, key=lambda p: p.score).text.startswith(growth), followed
    started = extractive.compose("How much does it cost per month?", documents, embed, name="Tidewise",
                                 previous="What does the Starter plan include?")
    assert not max(started, key=lambda p: p.score).text.startswith(growth)


def test_content_words_match_across_forms_and_languages():
    assert extractive.terms("Combien coûte le plan Starter ?") == {"coute", "plan", "starter"}
    assert extractive.terms("Which company powers Tidewise Pay?", "Tidewise") == {"company", "powers", "pay"}
    assert "600" in extractive.terms("The API allows 600 requests per minute.")
    for a, b in [("plan", "plans"), ("integrez", "integrate"), ("synchronisation", "synchronised"),
                 ("technicien", "technician"), ("crm", "crm")]:
        assert extractive.same_word(a, b), (a, b)
    for a, b in [("plan", "planning"), ("data", "date"), ("15", "150"), ("contract", "control")]:
        assert not extractive.same_word(a, b), (a, b)


def test_an_entitys_description_does_not_quote_a_sentence_without_what_it_refers_to():
    entity = ev.RetrievedDocument(n=1, document_type="entity", title="Enterprise", source="s", snippet="", content=(
        "Enterprise (Security): Enterprise customers get a 99.95% uptime SLA with service credits. "
        "It adds single sign-on (SSO), a dedicated customer success manager.\n"
        "Enterprise (Pricing): Sage Intacct is available on the Enterprise plan."))
    assert extractive.sentences(entity) == ["Enterprise customers get a 99.95% uptime SLA with service credits.",
                                            "Sage Intacct is available on the Enterprise plan."]


@pytest.mark.parametrize("question, sentence", [
    ("Les données sont-elles chiffrées ?", "Data is encrypted in transit with TLS 1.3 and at rest with AES-256."),
    ("Combien de jours de congés payés ont les salariés ?", "Employees get 28 days of paid holiday"),
])
def test_a_french_question_picks_the_english_sentence_through_the_glossary(question, sentence):
    documents = retrieved(glossary.expand(question, "fr"))  # the retriever searches with the expansion too
    picked = extractive.compose(question, documents, embed, name="Tidewise", lang="fr")
    assert picked and picked[0].text.startswith(sentence), picked
    # Without the expansion neither the sentence model nor the shared words find it: the test can fail.
    assert not any(p.text.startswith(sentence) for p in extractive.compose(question, documents, embed, name="Tidewise"))


@pytest.mark.parametrize("question", ["Quelle est la capitale du Pérou ?", "Wer hat die Fußball-WM 2018 gewonnen?"])
def test_an_unrelated_question_in_another_language_is_still_not_answered(question):
    lang = language.guess(question)
    assert lang != "en"
    assert extractive.compose(question, retrieved(glossary.expand(question, lang)), embed, name="Tidewise",
                              lang=lang) == []


# --- issue 51: an answer to the question, whole, or a decline ---------------------------------

def _doc(n: int, title: str, content: str, document_type: str = "chunk") -> ev.RetrievedDocument:
    return ev.RetrievedDocument(n=n, document_type=document_type, title=title, source=f"https://docs.example/{n}",
                                snippet="", content=content)


SCROLL = _doc(1, "Scroll depth — Where to find it", (
    "Scroll depth shows how far down a page visitors read.\n"
    "You can find scroll depth data in:\n"
    "- the Top Pages report, in its own column\n"
    "- the page details view of each page\n"
    "- the Stats API as a metric\n"
    "Scroll depth is collected without cookies."))
BILLING = _doc(2, "Billing — Payment", (
    "We accept credit cards and PayPal for monthly plans.\n"
    "Annual plans can also be paid by wire transfer against an invoice."))
CANCEL = _doc(3, "Cancel your subscription — Access and data", (
    "**What happens next**\n"
    "You keep access to your dashboards until the end of your billing period.\n"
    "Your data is not deleted when you cancel: it is kept for 60 days, then removed."))
PLANS = _doc(4, "Plans — Limits", (
    "| Plan | Sites | Team members |\n|---|---|---|\n| Starter | 1 | 3 |\n| Business | 50 | 10 |"))


def test_a_sentence_introducing_a_list_is_said_with_the_list_and_an_item_with_its_introduction():
    units = extractive.units(SCROLL)
    assert [role for _, role in units] == ["", "intro", "item", "item", "item", ""]
    picked = extractive.compose("Where can I find the scroll depth data?", [SCROLL, BILLING], embed)
    texts = [p.text for p in picked]
    assert "You can find scroll depth data in:" in texts
    at = texts.index("You can find scroll depth data in:")
    assert texts[at + 1:at + 4] == ["the Top Pages report, in its own column", "the page details view of each page",
                                    "the Stats API as a metric"]
    item = extractive.compose("Is scroll depth available as a metric in the Stats API?", [SCROLL, BILLING], embed)
    assert "You can find scroll depth data in:" in [p.text for p in item]  # an item never said alone
    assert all(p.n == 1 for p in item)  # nothing from the billing section padded on


def test_an_introduction_whose_list_was_not_retrieved_is_not_said():
    cut = _doc(1, "Support — Response times", "Response times depend on the support channel and plan:")
    other = _doc(2, "Support — Channels", "Paid plans are answered by e-mail within one business day.")
    picked = extractive.compose("How quickly does support answer on paid plans?", [cut, other], embed)
    assert picked and all(not p.text.endswith(":") for p in picked)


def test_each_part_of_a_two_part_question_is_answered():
    asked = extractive.Question(text="If I cancel today, do we lose access straight away? And does our data get wiped?")
    assert len(asked.parts) == 2
    assert extractive.Question(text="Can I pay by PayPal and what about wire transfers?").parts == [
        "Can I pay by PayPal", "what about wire transfers?"]
    assert extractive.Question(text="How do I cancel?").parts == []
    picked = extractive.compose(asked.text, [CANCEL, BILLING, SCROLL], embed)
    text = " ".join(p.text for p in picked)
    assert "until the end of your billing period" in text and "not deleted when you cancel" in text
    assert "What happens next" not in text  # a line all bold is a heading, not a sentence


def test_a_tables_rows_are_a_list():
    assert [role for _, role in extractive.units(PLANS)] == ["item", "item", "item"]
    picked = extractive.compose("How many sites does the Business plan allow?", [PLANS, BILLING], embed)
    assert any("Business: 50: 10" == p.text for p in picked), picked


def test_a_chosen_sentence_comes_with_the_sentences_around_it_in_its_section():
    """The fact a visitor needs is often next to the sentence closest to the question (the
    plan it needs, said after what it does): within the margin, the neighbours come too;
    a sentence far from the question does not."""
    doc = ev.RetrievedDocument(n=1, document_type="chunk", title="Documents — Recipient authentication", source="s",
                               snippet="", content=(
        "Recipient authentication lets you require a passkey or 2FA before a recipient signs a document. "
        "Recipient authentication is an Enterprise feature. "
        "The colour of the signing page follows your brand settings."))
    question = "Can signers confirm with a passkey before their signature is applied?"
    texts = [p.text for p in extractive.compose(question, [doc], embed)]
    assert "Recipient authentication is an Enterprise feature." in texts
    assert not any("colour" in t for t in texts)
    alone = [p.text for p in extractive.compose(question, [doc], embed, neighbour_margin=-1.0)]
    assert "Recipient authentication is an Enterprise feature." not in alone  # the test can fail


def test_the_best_sentences_section_says_what_it_adds_near_the_question():
    """A short FAQ answer's condition comes a few sentences after the sentence closest to the
    question: the anchor's section's sentences within the margin that share a word with the
    question come too, while the answer has room; the section's others do not."""
    doc = ev.RetrievedDocument(n=1, document_type="chunk", title="Billing FAQ — Nonprofits", source="s", snippet="",
                               content=(
        "We offer a 15% introductory discount to nonprofits, educational institutions and open-source projects. "
        "Our team reviews every request by hand. "
        "Reviews take about two working days, longer in August. "
        "The discount applies to Business plans on annual billing only."))
    other = ev.RetrievedDocument(n=2, document_type="chunk", title="Plans — Starter", source="t", snippet="",
                                 content="The Starter plan includes one site and three team members.")
    question = "Any discount for nonprofits? We're a small registered charity."
    texts = [p.text for p in extractive.compose(question, [doc, other], embed)]
    assert texts == ["We offer a 15% introductory discount to nonprofits, educational institutions and open-source "
                     "projects.", "The discount applies to Business plans on annual billing only."]
    alone = [p.text for p in extractive.compose(question, [doc, other], embed, section_margin=-1.0)]
    assert "The discount applies to Business plans on annual billing only." not in alone  # the test can fail
