"""answer_writer. Given-when-then, no server: the extractive answer it decides from the
turn's given sources (cited), "not found" without any, nothing for a turn routed elsewhere,
and the previous message read as a follow-up's context unless it was a HACK turn's.
Through the bus: it waits for the turn's background results, but never past its deadline;
the prompt it gives the `answer` role (profile, persona, sources, history within budget);
the streaming and the citation audit."""

from __future__ import annotations

import time

import msgspec
import pytest

from shared import events as ev
from shared import subjects
from shared.config import LLMRoleConfig
from shared.consumer import ConsumerRunner
from shared.events import VisitorProfile
from shared.llm import LLMClient
from shared.site_config import CTA, Enrichment, Persona, Redirects, Segment, SiteConfig
from shared.state import ConversationState, fold
from services.responder import answer_writer
from services.responder.settings import AnswerSettings
from tests.helpers import FixedConfigs, decide, fast, isolated, records_of, turn, wait_for


async def run_turn(bus, site, llm, background=(), config=None, earlier=(), history_tokens=8000,
                   message="What do you do?", answer_url=None, settings=AnswerSettings()):
    """One ANSWER turn through a consumer runner, after the `earlier` (message, reply) turns.
    `answer_url=""`: the answer role has no LLM endpoint."""
    base_url = llm.base_url if answer_url is None else answer_url
    client = LLMClient({"answer": LLMRoleConfig(role="answer", base_url=base_url, api_key="k", model="m",
                                                history_tokens=history_tokens)})
    node = answer_writer.make_node(client, settings)
    runner = ConsumerRunner(bus, isolated(node, site), fast(), configs=FixedConfigs(config) if config else None,
                            start_lookback_s=5)
    await runner.start()
    try:
        for number, (text, reply) in enumerate(earlier, start=1):
            before = turn(site, "a1", number, text)
            await bus.publish(before)
            await bus.publish(ev.follow(before, ev.ResponseCompleted, "answer_writer", node="answer_writer",
                                        text=reply, token_count=1))
            await bus.publish(ev.follow(before, ev.TurnCompleted, "finalize"))
        req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="a1", turn=len(earlier) + 1, ts=ev.now(),
                               producer="test", message=message)
        await bus.publish(req)
        for event in background:
            await bus.publish(ev.follow(req, *event[:2], **event[2]))
        started = time.monotonic()
        await bus.publish(ev.follow(req, ev.RouteDecided, "router", route="ANSWER", reason="t"))

        async def done():
            return [r.event for r in await bus.read(subjects.conv(site, "a1", "response_completed"))
                    if r.event.turn == req.turn]

        (completed,) = await wait_for(done)
        return completed, time.monotonic() - started
    finally:
        await runner.stop()


async def test_late_background_results_are_named_and_do_not_block(bus, site, llm):
    llm.clear()
    completed, elapsed = await run_turn(bus, site, llm, settings=AnswerSettings(wait_s=0.3, retrieval_wait_s=0.2))
    assert completed.late_inputs == ["retrieval_completed", "skills_applied", "enrichment_completed", "profile_inferred"]
    assert elapsed < 0.3 + 2.0
    assert completed.sources == [] and "No knowledge-base documents were found" in llm.requests()[-1]["messages"][0]["content"]
    assert "What we know about the visitor" not in llm.requests()[-1]["messages"][0]["content"]


async def test_profile_reaches_the_prompt_when_ready(bus, site, llm):
    llm.clear()
    completed, _ = await run_turn(bus, site, llm, background=[
        (ev.RetrievalCompleted, "retrieval", {"documents": []}),
        (ev.EnrichmentCompleted, "enrichment", {"profile": VisitorProfile(company_name="Globex", sector="Manufacturing")}),
        (ev.ProfileInferred, "visitor_profiler", {"profile": VisitorProfile(job_to_be_done="Automate quotes")}),
        (ev.SkillsApplied, "intent_router", {"skills": []}),
    ])
    assert completed.late_inputs == []
    system = llm.requests()[-1]["messages"][0]["content"]
    assert "company name: Globex" in system and "job to be done: Automate quotes" in system


async def test_site_persona_shapes_the_prompt_and_temperature(bus, site, llm):
    llm.clear()
    config = SiteConfig(name="Tidewise", instructions="Mention the free trial when relevant.",
                        persona=Persona(weight=0.85, name="Captain Ada", tone="warm", vocabulary=["crew"]))
    await run_turn(bus, site, llm, config=config)
    request = llm.requests()[-1]
    system = request["messages"][0]["content"]
    assert "Speak in Captain Ada's voice" in system and "crew" in system
    assert "Mention the free trial" in system and "Tidewise" in system
    assert request["temperature"] == 0.47


async def test_retrieved_sources_are_numbered_in_the_prompt_and_sent_before_the_first_token(bus, site, llm):
    llm.clear()
    docs = [ev.RetrievedDocument(n=1, document_type="chunk", title="Pricing — Plans", source="https://x.example/pricing",
                                 snippet="Starter costs $29", content="The Starter plan costs $29 per technician."),
            ev.RetrievedDocument(n=2, document_type="entity", title="QuickBooks", source="https://x.example/integrations",
                                 snippet="QuickBooks sync", content="QuickBooks: invoices sync every 10 minutes.")]
    heard = []

    async def on_token(msg):
        heard.append(ev.decode(msg.data))

    sub = await bus.nc.subscribe(subjects.tokens(site, "a1", 1), cb=on_token)
    try:
        completed, _ = await run_turn(bus, site, llm, background=[(ev.RetrievalCompleted, "retrieval", {"documents": docs})])
    finally:
        await sub.unsubscribe()
    system = llm.requests()[-1]["messages"][0]["content"]
    assert "[1] Pricing — Plans: The Starter plan costs $29" in system and "[2] QuickBooks:" in system
    assert "cite the ones you use as [n]" in system
    assert completed.sources == [1, 2] and "retrieval_completed" not in completed.late_inputs
    assert isinstance(heard[0], ev.SourcesAttached) and all(isinstance(e, ev.TokenChunk) for e in heard[1:])
    assert [s["n"] for s in heard[0].sources] == [1, 2] and heard[0].sources[0]["url"] == "https://x.example/pricing"
    assert "content" not in heard[0].sources[0]


async def test_history_is_cut_to_the_roles_budget_oldest_turns_first(bus, site, llm):
    llm.clear()
    earlier = [("first " + "a" * 4000, "reply one"), ("second " + "b" * 4000, "reply two"),
               ("third " + "c" * 400, "reply three")]
    await run_turn(bus, site, llm, earlier=earlier, history_tokens=1500)
    sent = [(m["role"], m["content"][:6]) for m in llm.requests()[-1]["messages"]]
    assert sent == [("system", sent[0][1]), ("user", "second"), ("assistant", "reply "), ("user", "third "),
                    ("assistant", "reply "), ("user", "What d")]


async def test_the_current_message_is_sent_even_when_it_alone_is_over_the_budget(bus, site, llm):
    llm.clear()
    message = "Tell me everything. " * 700  # 14,000 characters, ~3,500 tokens
    await run_turn(bus, site, llm, earlier=[("hello", "hi")], history_tokens=100, message=message)
    sent = llm.requests()[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user"] and sent[1]["content"] == message


async def test_a_call_too_big_for_the_bus_is_recorded_truncated_and_the_turn_completes(bus, site, llm):
    """Measured before: a multi-megabyte prompt made the call record exceed NATS's max
    payload, the handler failed on storing it, was retried (the prompt sent again) and the
    turn failed. A budget this large lets such a prompt through on purpose."""
    llm.clear()
    earlier = [(f"q{n} " + "x" * 120_000, f"a{n}") for n in range(1, 11)]
    completed, _ = await run_turn(bus, site, llm, earlier=earlier, history_tokens=10_000_000)
    assert completed.text.startswith("You said: What do you do?")
    assert len(llm.requests()) == 1  # sent once: no retry
    (recorded,) = [r for r in await bus.read(subjects.conv(site, "a1", "llm_call_recorded"))]
    assert recorded.event.call.truncated > 0 and len(ev.encode(recorded.event)) <= bus.max_event_bytes
    assert any("…[truncated " in m["content"] for m in recorded.event.call.messages)
    assert recorded.event.call.messages[-1]["content"] == "What do you do?"
    assert not await bus.read(subjects.conv(site, "a1", "turn_failed"))


DEMO_DOCS = [
    ev.RetrievedDocument(n=1, document_type="chunk", title="Integrations — Accounting",
                         source="https://tidewise.example/integrations", snippet="QuickBooks Online and Xero",
                         content="QuickBooks Online and Xero: invoices, payments and customers are synchronised every "
                                 "10 minutes in both directions. Sage Intacct is available on the Enterprise plan."),
    ev.RetrievedDocument(n=2, document_type="chunk", title="Pricing — Growth plan", source="https://tidewise.example/pricing",
                         snippet="The Growth plan costs $59",
                         content="The Growth plan costs $59 per technician per month, billed annually ($69 billed "
                                 "monthly). It adds the Smart Scheduler, route optimisation, inventory, the Customer "
                                 "Portal and all standard integrations (QuickBooks, Xero, Salesforce, HubSpot)."),
]


async def heard_on_tokens(bus, site, turn_coro):
    heard = []

    async def on_token(msg):
        heard.append(ev.decode(msg.data))

    sub = await bus.nc.subscribe(subjects.tokens(site, "a1", 1), cb=on_token)
    try:
        completed, _ = await turn_coro
    finally:
        await sub.unsubscribe()
    return completed, heard


async def test_without_an_answer_llm_the_answer_is_the_sources_sentences_cited_and_streamed(bus, site, llm):
    llm.clear()  # the default ANSWER_BACKEND with no endpoint for the answer role: extractive
    completed, heard = await heard_on_tokens(bus, site, run_turn(
        bus, site, llm, answer_url="", message="Do you integrate with QuickBooks?",
        background=[(ev.RetrievalCompleted, "retrieval", {"documents": DEMO_DOCS})]))
    assert completed.backend == "extractive" and completed.node == "answer_writer"
    assert completed.text.startswith("QuickBooks Online and Xero: invoices, payments and customers are synchronised "
                                     "every 10 minutes in both directions [1].")
    assert completed.sources == [1, 2] and not completed.uncited and completed.unsupported_numbers == []
    assert isinstance(heard[0], ev.SourcesAttached) and [s["n"] for s in heard[0].sources] == [1, 2]
    tokens = [e for e in heard[1:] if isinstance(e, ev.TokenChunk)]
    assert len(tokens) == len(heard) - 1 and len(tokens) == completed.token_count >= 1  # a sentence a token
    assert "".join(t.content for t in sorted(tokens, key=lambda t: t.index)) == completed.text
    assert llm.requests() == []  # no model was asked
    assert await bus.read(subjects.conv(site, "a1", "llm_call_recorded")) == []


async def test_extractive_answer_with_nothing_relevant_says_so_and_gives_the_contact(bus, site, llm):
    llm.clear()
    config = SiteConfig(name="Tidewise", cta=CTA(label="Book a demo", url="https://tidewise.example/demo"))
    completed, _ = await run_turn(bus, site, llm, config=config, message="Who won the 2018 football World Cup?",
                                  background=[(ev.RetrievalCompleted, "retrieval", {"documents": DEMO_DOCS})],
                                  settings=AnswerSettings(backend="extractive"))
    assert completed.backend == "extractive" and llm.requests() == []
    assert completed.text == ("I couldn't find that in Tidewise's documentation, and I'd rather not guess. "
                              "The team can answer it: Book a demo, https://tidewise.example/demo")
    assert not completed.uncited  # it declined: it claims nothing


async def test_an_llm_answer_without_citations_and_with_an_invented_number_is_flagged(bus, site, llm):
    llm.clear()
    llm.fail_next({"reply": "Yes, we sync with QuickBooks every 5 minutes."})
    completed, _ = await run_turn(bus, site, llm, message="Do you integrate with QuickBooks?",
                                  background=[(ev.RetrievalCompleted, "retrieval", {"documents": DEMO_DOCS})])
    assert completed.backend == "llm" and completed.uncited and completed.unsupported_numbers == ["5"]
    (stored,) = [r.event for r in await bus.read(subjects.conv(site, "a1", "response_completed"))]
    assert stored.uncited and stored.unsupported_numbers == ["5"]  # recorded in the log, not only returned


async def test_ANSWER_BACKEND_llm_without_an_endpoint_stops_at_start():
    from shared.config import ConfigError
    client = LLMClient({"answer": LLMRoleConfig(role="answer", base_url="", api_key="k", model="m")})
    with pytest.raises(ConfigError, match="LLM_ANSWER_BASE_URL"):
        answer_writer.make_node(client, AnswerSettings(backend="llm"))


# --- the extractive answer, given-when-then -------------------------------------------------



@pytest.fixture
def extractive():
    """The node with no endpoint for the answer role: the extractive backend."""
    return answer_writer.make_node(LLMClient({}))


TIDEWISE = SiteConfig(name="Tidewise", cta=CTA(label="Book a demo", url="https://tidewise.example/demo"))


def asked(session: str, *messages: str, hack_first: bool = False, documents=DEMO_DOCS) -> tuple[ev.RouteDecided, list]:
    """The visitor's `messages`, one turn each (the earlier ones answered; the first a HACK
    turn when `hack_first`); the last one's retrieval given, then routed to ANSWER."""
    given = []
    for number, message in enumerate(messages[:-1], start=1):
        request = turn("s", session, number, message)
        route, intent = ("REDIRECT", "HACK") if hack_first and number == 1 else ("ANSWER", "LEARN")
        given += [request, ev.follow(request, ev.RouteDecided, "intent_router", route=route, intent=intent, reason="t"),
                  ev.follow(request, ev.ResponseCompleted, "test", node="test", text="ok", token_count=1)]
    request = turn("s", session, len(messages), messages[-1])
    given.append(request)
    if documents is not None:
        given.append(ev.follow(request, ev.RetrievalCompleted, "retrieval", documents=documents))
    return ev.follow(request, ev.RouteDecided, "intent_router", route="ANSWER", intent="LEARN", reason="t"), given


async def test_the_answer_is_the_given_sources_sentence_cited(extractive):
    routed, given = asked("e1", "How much is the Growth plan?")
    decision = await decide(extractive, routed, *given, config=TIDEWISE)
    (completed,) = decision.events
    assert completed.backend == "extractive" and completed.causation_id == routed.event_id
    assert completed.text.startswith("The Growth plan costs $59 per technician per month") and "[2]" in completed.text
    assert completed.sources == [1, 2] and not completed.uncited and completed.unsupported_numbers == []
    sources, *tokens = decision.tokens  # the sources go out before the first token
    assert isinstance(sources, ev.SourcesAttached) and [s["n"] for s in sources.sources] == [1, 2]
    assert "".join(t.content for t in tokens) == completed.text and len(tokens) == completed.token_count


async def test_the_turns_skills_end_the_answer_its_qualifying_question_last(extractive):
    routed, given = asked("e6", "How much is the Growth plan?")
    given.append(ev.follow(given[0], ev.SkillsApplied, "intent_router", skills=["ask_qualifying_question"],
                           qualification_question="How many technicians do you have?"))
    (completed,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert completed.text.startswith("The Growth plan costs $59")
    assert completed.text.endswith("\n\nHow many technicians do you have? ❓")


async def test_without_sources_it_says_it_did_not_find_it_and_names_what_was_late(extractive):
    routed, given = asked("e2", "How much is the Growth plan?", documents=None)
    late = ("retrieval_completed", "enrichment_completed", "profile_inferred")
    decision = await decide(extractive, routed, *given, config=TIDEWISE, late=late)
    (completed,) = decision.events
    assert completed.text == ("I couldn't find that in Tidewise's documentation, and I'd rather not guess. "
                              "The team can answer it: Book a demo, https://tidewise.example/demo")
    assert completed.sources == [] and completed.late_inputs == list(late)
    assert not any(isinstance(t, ev.SourcesAttached) for t in decision.tokens)


async def test_a_follow_up_is_read_with_the_previous_message_but_never_a_hack_turns(extractive):
    routed, given = asked("e3", "Pricing?", "And Xero?")
    (after_pricing,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert after_pricing.text.startswith("The Growth plan costs $59") and "[2]" in after_pricing.text
    routed, given = asked("e4", "Pricing?", "And Xero?", hack_first=True)
    (after_hack,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert after_hack.text.startswith("QuickBooks Online and Xero") and "[1]" in after_hack.text


async def test_a_turn_routed_elsewhere_is_not_its_to_answer(extractive):
    routed, given = asked("e5", "How much is the Growth plan?")
    for route in ("REDIRECT", "BOOKING"):
        other = ev.follow(given[0], ev.RouteDecided, "intent_router", route=route, intent="SUPPORT", reason="t")
        assert (await decide(extractive, other, *given, config=TIDEWISE)).events == []


def test_it_waits_for_retrieval_then_for_the_visitors_profile_each_on_its_deadline():
    client = LLMClient({"answer": LLMRoleConfig(role="answer", base_url="http://127.0.0.1:9", api_key="k", model="m")})
    settings = AnswerSettings(retrieval_wait_s=1.5, wait_s=0.3, backend="llm")
    waits = answer_writer.make_node(client, settings).needs.waits
    assert [(w.kinds, w.deadline_s) for w in waits] == [(("retrieval_completed", "skills_applied"), 1.5),
                                                        (("enrichment_completed", "profile_inferred"), 0.3)]
    per_site = waits[1]
    first, known = ConversationState(turn=1), ConversationState(turn=2, visitor_profile=NORTHWIND_KNOWN)
    assert per_site.deadline(SiteConfig(), first) == 0.3  # a site without a budget: the deployment's
    assert per_site.deadline(SiteConfig(enrichment=Enrichment(budget_ms=80)), first) == 0.08
    assert per_site.deadline(SiteConfig(enrichment=Enrichment(budget_ms=0)), first) == 0.0
    # A later turn of a visitor whose company an earlier turn named: that profile, no wait.
    assert per_site.deadline(SiteConfig(enrichment=Enrichment(budget_ms=80)), known) == answer_writer.NOT_WAITED
    unknown = ConversationState(turn=2)
    assert per_site.deadline(SiteConfig(enrichment=Enrichment(budget_ms=80)), unknown) == 0.08


# --- who is asking: the site's segments -----------------------------------------------------

SEGMENTED = msgspec.structs.replace(TIDEWISE, segments=[
    Segment(name="logistics", sectors=["Logistics"],
            example="Logistics companies use Tidewise to plan their depot technicians' rounds."),
    Segment(name="growing", employees="51-1000", offer="For a company of your size, the Growth plan fits.",
            cta_label="Start a Growth trial", cta_url="https://tidewise.example/signup?plan=growth"),
    Segment(name="enterprise", employees="1001+", offer="For your size, the Enterprise plan fits.",
            cta_label="Talk to us", cta_url="https://tidewise.example/enterprise"),
])
NORTHWIND = VisitorProfile(company_name="Northwind", sector="Logistics", company_size="51-200")
NORTHWIND_KNOWN = msgspec.structs.replace(NORTHWIND, status="completed")


async def test_the_visitors_industry_gives_the_example_and_its_size_the_offer_once(extractive):
    routed, given = asked("g1", "How much is the Growth plan?")
    enriched = ev.follow(given[0], ev.EnrichmentCompleted, "enrichment", profile=NORTHWIND)
    (completed,) = (await decide(extractive, routed, *given, enriched, config=SEGMENTED)).events
    answer, personal = completed.text.split("\n\n")[:2]
    assert answer.startswith("The Growth plan costs $59") and "[2]" in answer
    assert personal == ("Logistics companies use Tidewise to plan their depot technicians' rounds. "
                        "For a company of your size, the Growth plan fits.")
    assert completed.segments == ["logistics", "growing"] and completed.unsupported_numbers == []
    # Said once: the next answer in the conversation does not repeat them.
    later = turn("s", "g1", 2, "And the Starter plan?")
    said = ev.follow(given[0], ev.ResponseCompleted, "answer_writer", node="answer_writer", text=completed.text,
                     token_count=1)
    again = ev.follow(later, ev.RouteDecided, "intent_router", route="ANSWER", intent="LEARN", reason="t")
    (second,) = (await decide(extractive, again, *given, enriched, said, later,
                              ev.follow(later, ev.RetrievalCompleted, "retrieval", documents=DEMO_DOCS),
                              config=SEGMENTED)).events
    assert "Logistics companies" not in second.text and "Growth plan fits" not in second.text
    assert second.segments == ["logistics", "growing"]
    # Another size, another plan; no profile, none of it.
    big = ev.follow(given[0], ev.EnrichmentCompleted, "enrichment",
                    profile=VisitorProfile(company_name="Globex", sector="Manufacturing", company_size="1001-5000"))
    (enterprise,) = (await decide(extractive, routed, *given, big, config=SEGMENTED)).events
    assert "For your size, the Enterprise plan fits." in enterprise.text and "Logistics" not in enterprise.text
    (plain,) = (await decide(extractive, routed, *given, config=SEGMENTED)).events
    assert plain.segments == [] and len(plain.text.split("\n\n")) == 1


def test_the_call_to_action_and_the_booking_link_follow_the_visitors_segment():
    from services.responder import finalize
    request = turn("s", "g2", 1, "Pricing?")
    records = records_of(request, ev.follow(request, ev.EnrichmentCompleted, "enrichment", profile=NORTHWIND),
                         ev.follow(request, ev.FormFieldsExtracted, "form_field_extractor",
                                   values={"email": "ada@northwind.example"}))
    state = fold(records)
    suggestions = ev.follow(request, ev.SuggestionsGenerated, "follow_up_suggester", suggestions=[], kind="follow_up")
    meta = finalize.metadata(state, 1, suggestions, SEGMENTED)
    assert meta["cta"] == {"label": "Start a Growth trial", "url": "https://tidewise.example/signup?plan=growth"}
    assert meta["cta_url_overrides"]["booking_url"].startswith("https://tidewise.example/signup?plan=growth&email=")
    unknown = finalize.metadata(fold(records_of(request)), 1, suggestions, SEGMENTED)
    assert unknown["cta"] == {"label": "Book a demo", "url": "https://tidewise.example/demo"}


async def test_a_models_answer_is_told_the_segments_words_and_tone(bus, site, llm):
    llm.clear()
    config = msgspec.structs.replace(SEGMENTED, persona=Persona(weight=0.3, name="Ada", tone="warm"),
                                     segments=[msgspec.structs.replace(SEGMENTED.segments[0], tone="plain and exact"),
                                               *SEGMENTED.segments[1:]])
    completed, _ = await run_turn(bus, site, llm, config=config, background=[
        (ev.RetrievalCompleted, "retrieval", {"documents": []}), (ev.SkillsApplied, "intent_router", {"skills": []}),
        (ev.EnrichmentCompleted, "enrichment", {"profile": NORTHWIND}),
        (ev.ProfileInferred, "visitor_profiler", {"profile": VisitorProfile(job_to_be_done="Plan rounds")})])
    system = llm.requests()[-1]["messages"][0]["content"]
    assert "give this example from the site, in these words: Logistics companies use Tidewise" in system
    assert "Recommend this, in these words: For a company of your size, the Growth plan fits." in system
    assert '"Start a Growth trial": https://tidewise.example/signup?plan=growth' in system
    assert "Tone: plain and exact." in system and "Tone: warm." not in system
    assert completed.segments == ["logistics", "growing"]


async def test_nothing_found_points_to_the_visitors_call_to_action(extractive):
    routed, given = asked("g3", "How much is the Growth plan?", documents=None)
    enriched = ev.follow(given[0], ev.EnrichmentCompleted, "enrichment", profile=NORTHWIND)
    (completed,) = (await decide(extractive, routed, *given, enriched, config=SEGMENTED)).events
    assert completed.text.endswith("The team can answer it: Start a Growth trial, "
                                   "https://tidewise.example/signup?plan=growth")
    assert "Logistics companies" not in completed.text  # no example or offer without an answer


async def test_a_question_naming_what_the_site_never_mentions_is_declined_with_its_contact(extractive):
    """Issue 51: the retriever found close sentences, but the visitor names something the
    site's knowledge never mentions: "not found", nothing cited, never the closest sentence."""
    routed, given = asked("e7", "How much is the Growth plan with a Salesforce sync?")
    given[-1] = msgspec.structs.replace(given[-1], unknown_names=["Salesforce"])
    (completed,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert completed.text.startswith("I couldn't find that in Tidewise's documentation") and "[" not in completed.text
    routed, given = asked("e8", "How much is the Growth plan with a Salesforce sync?")
    (answered_,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert answered_.text.startswith("The Growth plan costs $59")  # the test can fail


async def test_a_support_request_the_sources_do_not_answer_names_the_sites_support_page(extractive):
    """Issue 51: SUPPORT is answered from the site's knowledge (route ANSWER, branch
    ANSWER_SUPPORT); with nothing relevant the reply names the site's support page, not
    its sales call to action."""
    config = msgspec.structs.replace(TIDEWISE, redirects=Redirects(support="https://help.tidewise.example"))
    routed, given = asked("e9", "My password reset e-mail never arrives", documents=[])
    routed = msgspec.structs.replace(routed, intent="SUPPORT", branch="ANSWER_SUPPORT")
    (completed,) = (await decide(extractive, routed, *given, config=config)).events
    assert completed.text == ("I couldn't find that in Tidewise's documentation, and I'd rather not guess. "
                              "For help with your account or an issue with the product, please contact our support "
                              "team: https://help.tidewise.example")


async def test_a_site_without_a_support_page_in_its_config_names_its_own_contact_page(extractive):
    """Issue 51: nothing found for a support request on a site whose config names no support
    page: the contact page the retriever found among its pages is named instead."""
    routed, given = asked("e10", "My password reset e-mail never arrives", documents=[])
    given[-1] = msgspec.structs.replace(given[-1], contact_page="https://tidewise.example/contact")
    routed = msgspec.structs.replace(routed, intent="SUPPORT", branch="ANSWER_SUPPORT")
    (completed,) = (await decide(extractive, routed, *given, config=TIDEWISE)).events
    assert completed.text.endswith("please contact our support team: https://tidewise.example/contact")
