"""answer_writer: streams the answer to an ANSWER turn.

History comes from the conversation log, so turn N sees the earlier exchanges, as many as
the `answer` role's token budget holds, HACK turns' text withheld (shared/history.py). Before
answering it waits for the turn's retrieval and the skills to apply (`SkillsApplied`), up to
`ANSWER_RETRIEVAL_WAIT_S`, and can wait, up to `ANSWER_WAIT_S`, for the turn's background
results (the visitor's enrichment and profile); what is not there is left out of the prompt and named in
`ResponseCompleted.late_inputs`, it never blocks the answer. Tokens go to
`tokens.<site>.<session>.<turn>` as they arrive; the full text is stored once, as
`ResponseCompleted`.

Two backends (`ANSWER_BACKEND`): `llm` streams the `answer` role's model; `extractive`
(the default when that role has no endpoint) writes the answer from the retrieved
sources' own sentences, each cited, with no model at all (extractive.py). Either way the
answer is audited (answer_audit.py): `ResponseCompleted.uncited` when sources were given and
none was cited, `unsupported_numbers` for figures that no source, no message of the visitor
and none of the site's words the reply repeats hold (shared/citations.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import numpy as np

from services.responder import answer_audit, extractive, replies
from services.responder.streaming import TOKEN_BATCH_S, publish_sources, stream_llm, stream_text
from shared import citations, history, kb_vectors, language, persona, prompts, segments
from shared import events as ev
from services.responder.settings import ANSWER_BACKENDS, ROLES, AnswerSettings
from shared.config import ConfigError
from shared.embeddings import EmbeddingSettings, shared_embedder
from shared.llm import LLMClient, role_records
from shared.node import NOT_WAITED, Context, Inputs, Needs, Node, Wait
from shared.site_config import SiteConfig
from shared.state import ConversationState

NAME = "answer_writer"
PROMPT = Path(__file__).parent / "prompts" / "answer.md"
AWAITED = ("enrichment_completed", "profile_inferred")
SOURCE_CHARS = 700
PROFILE_FIELDS = ("company_name", "company_description", "sector", "sub_sector", "job_to_be_done", "feature_list")
SKILL_TEXT = {
    "propose_demo": "End by offering a short demo with the team, marked with 📅.",
    "collect_email": "Ask for their work e-mail so the team can follow up, marked with ✉️.",
    "ask_qualifying_question": "End with one short question about their business (team size, current tools or needs), marked with ❓.",
    "share_resource": "Point to the relevant page if the sources give one, marked with 🔗.",
    "suggest_follow_up": "You may mention one related topic they could ask about next.",
}


def visitor_context(state: ConversationState) -> str:
    """What we know about the visitor, for the system prompt; empty when nothing is known."""
    profile = msgspec.structs.asdict(state.visitor_profile)
    known = {k: profile[k] for k in PROFILE_FIELDS if profile[k] not in ("", ev.UNKNOWN)}
    if not known:
        return ""
    lines = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in known.items())
    return f"\nWhat we know about the visitor (use it to make the answer relevant; do not recite it):\n{lines}\n"


def audience_context(audience: segments.ForVisitor, said: list[str], config: SiteConfig) -> str:
    """The site's words for the visitor's audience (shared/segments.py), for the system
    prompt: an example and an offer not said yet in the conversation; empty when none."""
    lines = []
    if audience.example and not segments.said_before(audience.example, said):
        lines.append(f"- Where it fits, give this example from the site, in these words: {audience.example}")
    if audience.offer and not segments.said_before(audience.offer, said):
        lines.append(f"- Recommend this, in these words: {audience.offer}")
    if audience.cta_url:
        label, url = audience.cta(config)
        lines.append(f"- If you offer a next step, it is \"{label}\": {url}")
    if not lines:
        return ""
    return "\nFor this visitor's kind of company (the site's own words):\n" + "\n".join(lines) + "\n"


def audience_lines(audience: segments.ForVisitor, said: list[str]) -> list[str]:
    """What an extractive answer adds for the visitor's audience: the site's example and
    offer, each once per conversation."""
    return [text for text in (audience.example, audience.offer) if text and not segments.said_before(text, said)]


def skills_context(skills: list[str], question: str | None) -> str:
    lines = []
    for skill in skills:
        if skill == "ask_qualifying_question" and question:
            lines.append(f"End by asking exactly this question, marked with ❓: {question}")
        elif skill in SKILL_TEXT:
            lines.append(SKILL_TEXT[skill])
    return "\n".join(f"- {line}" for line in lines) if lines else "- End plainly, with no call to action."


def sources_context(documents: list[ev.RetrievedDocument], contacts: list[tuple[str, str]] = (),
                    unknown: list[str] = ()) -> str:
    """`contacts`: the site's (kind, address) for what the visitor may need its team for
    (a support request: its support page), named when the sources do not answer; `unknown`:
    what the visitor names that the site's knowledge never mentions."""
    targets = "".join(f"\n- {kind}: {url}" for kind, url in contacts)
    never = (f"\nThe site's knowledge never mentions {', '.join(unknown)}: do not say anything about "
             f"{'it' if len(unknown) == 1 else 'them'} beyond that." if unknown else "")
    if not documents:
        return ("\n## Sources\nNo knowledge-base documents were found for this question. Do not guess facts about "
                "the company; say you are not sure and "
                + (f"point the visitor to:{targets}" if targets else "offer to connect the visitor with the team.")
                + "\n")
    lines = [f"[{d.n}] {d.title}: {' '.join(d.content.split())[:SOURCE_CHARS]}" for d in documents]
    where = f"\nIf they do not answer it, say so and point the visitor to:{targets}" if targets else ""
    return ("\n## Sources\nAnswer from these sources only, and cite the ones you use as [n] right after the "
            "sentence they support:\n" + "\n".join(lines) + where + never + "\n")


def build_messages(state: ConversationState, turn: int, system_prompt: str, budget_tokens: int) -> list[dict]:
    """The system prompt, then the exchanges before `turn` that fit the budget, then this
    turn's message (always)."""
    messages = [{"role": "system", "content": system_prompt}]
    for message in history.window(state, turn, budget_tokens):
        if message.turn < turn or message.role == "user":
            messages.append({"role": message.role, "content": message.content})
    return messages


def backend(llm: LLMClient, chosen: str = "") -> str:
    """The answer backend this process uses: `chosen` (ANSWER_BACKEND), else by whether the
    answer role has an endpoint. `llm` without an endpoint is a configuration error."""
    chosen = chosen or ("llm" if llm.configured("answer") else "extractive")
    if chosen not in ANSWER_BACKENDS:
        raise ConfigError(f"ANSWER_BACKEND={chosen!r}: use {' or '.join(ANSWER_BACKENDS)}")
    if chosen == "llm" and not llm.configured("answer"):
        raise ConfigError("ANSWER_BACKEND=llm needs LLM_BASE_URL or LLM_ANSWER_BASE_URL")
    return chosen


async def extractive_answer(ctx: Context, knowledge: kb_vectors.KnowledgeVectors, kb_bucket,
                            settings: AnswerSettings, event: ev.RouteDecided,
                            state: ConversationState, documents: list[ev.RetrievedDocument], config: SiteConfig,
                            skills: list[str], question: str | None, late: list[str],
                            audience: list[str] = (), cta: tuple[str, str] | None = None) -> ev.ResponseCompleted:
    """The answer from the sources' sentences (extractive.py), streamed a sentence at a time
    after the sources, as an LLM answer would be. The question is embedded here; the
    sources' sentences and titles mostly come ready from the `kb_vectors` bucket
    (kb_vectors.py), both at once. `audience`: the site's sentences for the visitor's
    segment, said after the sources' when the answer found something."""
    message, previous = history.message_of(state, event.turn), history.previous_message(state, event.turn)
    record = state.turns.get(event.turn)
    lang = language.guess(message, {"language": record.language} if record and record.language else None)
    # A question naming what the site never mentions ("Do you integrate with Salesforce?" on
    # a site without a word of it) is declined, whatever sentences come close.
    unknown = bool(record and record.unknown_names)
    pool = [] if unknown else extractive.candidates(documents[:settings.extractive_documents])
    picked: list[extractive.Picked] = []
    if pool:
        asked = extractive.Question(text=message, previous=previous, name=config.name or event.site, lang=lang)
        texts, _, titles = extractive.texts_to_embed(asked, pool)
        visitors = extractive.asked_rows(asked)
        asked_vectors, source_vectors = await asyncio.gather(
            knowledge.embedder.aembed_all(texts[:visitors]),
            knowledge.vectors(kb_bucket, event.site, texts[visitors:]))
        vectors = np.vstack([asked_vectors, source_vectors])
        picked = extractive.choose_from(vectors, asked, titles, pool, threshold=settings.extractive_threshold,
                                        max_sentences=settings.extractive_max_sentences)
    text = extractive.reply(picked, documents, skills=skills, question=question, lang=lang, config=config,
                            site=event.site, audience=list(audience), cta=cta,
                            contacts=replies.contacts(event.intent, message, config, lang))
    await publish_sources(ctx, documents)
    completed = await stream_text(ctx, NAME, text)
    return msgspec.structs.replace(completed, backend="extractive", late_inputs=late,
                                   sources=[d.n for d in documents], embedding_version=knowledge.embedder.version)


def audited(completed: ev.ResponseCompleted, state: ConversationState, documents: list[ev.RetrievedDocument],
            site_words: list[str], declined: bool) -> ev.ResponseCompleted:
    """`completed` with the citation audit's flags; flagged answers are counted and logged."""
    said = [m.content for m in state.messages if m.role == "user"]
    uncited, unsupported = answer_audit.audit(completed.text, documents, said + site_words, declined=declined)
    completed = msgspec.structs.replace(completed, uncited=uncited, unsupported_numbers=unsupported)
    answer_audit.count(completed)
    return completed


def profile_budget(config: SiteConfig, state: ConversationState) -> float | None:
    """How long the answer waits for this turn's enrichment and profile, in seconds: not at
    all once an earlier turn named the company (its profile is in the state already; this
    turn's would only refresh it), else the site's budget (None: the deployment's)."""
    if state.turn > 1 and state.visitor_profile.status == "completed":
        return NOT_WAITED
    budget = config.enrichment.budget_ms
    return None if budget is None else budget / 1000


def make_node(llm: LLMClient, settings: AnswerSettings = AnswerSettings(),
              embeddings: EmbeddingSettings | None = None, token_batch_s: float = TOKEN_BATCH_S) -> Node:
    """`embeddings`: the process's embedder's settings, for the extractive backend (None: read
    from the environment when the process's embedder is made); `token_batch_s`: how a
    model's deltas are batched into token events (streaming.TokenBatcher)."""
    mode = backend(llm, settings.backend)
    roles = role_records(llm, ROLES)  # recorded on the reply: what a replay re-runs it with
    language.load()  # the replies that come from no model guess the visitor's language with it
    if mode == "extractive":
        knowledge = kb_vectors.KnowledgeVectors(shared_embedder(embeddings))
        knowledge.embedder.embed(["warm-up"])  # load the model at start, not on the first question

    async def handle(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config, late = inputs.state, inputs.config, list(inputs.late)
        record = state.turns.get(event.turn)
        if record and record.contact_page and not config.redirects.support:
            # A site that names no support page: its own contact page, found among its pages.
            config = msgspec.structs.replace(config, redirects=msgspec.structs.replace(
                config.redirects, support=record.contact_page))
        documents = (record.sources or [])[:settings.max_sources] if record else []
        # The router's SkillsApplied, stored before its route (awaited all the same); late, no skills.
        skills, question = (record.skills or [], record.qualification_question) if record else ([], None)
        audience = segments.for_visitor(config, state.visitor_profile)
        said = [m.content for m in state.messages if m.role == "assistant" and m.turn < event.turn]
        label, _ = audience.cta(config)
        site_words = [*answer_audit.site_words(config, question), audience.example, audience.offer, label]
        if mode == "extractive":
            completed = await extractive_answer(ctx, knowledge, inputs.kb_vectors, settings, event, state, documents, config, skills,
                                                question, late, audience_lines(audience, said), audience.cta(config))
            completed = msgspec.structs.replace(completed, llm_roles=roles, segments=list(audience.segments))
            return [audited(completed, state, documents, site_words,
                            declined=not citations.cited(completed.text))]
        voice = msgspec.structs.replace(config.persona, tone=audience.tone) if audience.tone else config.persona
        system = prompts.compose(PROMPT, event.site, config, visitor=visitor_context(state),
                                 audience=audience_context(audience, said, config),
                                 skills=skills_context(skills, question), persona=persona.block(voice),
                                 sources=sources_context(documents, replies.chosen_targets(
                                     event.intent, history.message_of(state, event.turn), config),
                                     record.unknown_names if record else []))
        messages = build_messages(state, event.turn, system, llm.history_tokens("answer"))
        completed = await stream_llm(ctx, llm, "answer", NAME, messages, late_inputs=late, sources=documents,
                                     batch_s=token_batch_s, llm_roles=roles,
                                     temperature=persona.temperature(voice))
        completed = msgspec.structs.replace(completed, segments=list(audience.segments))
        return [audited(completed, state, documents, site_words, declined=False)]

    # Retrieval and the skills to apply first, on the retrieval's deadline (the router stores
    # the skills before the route, so they are there); then the visitor's enrichment
    # and profile, on the site's budget (`enrichment.budget_ms`, else ANSWER_WAIT_S; counted
    # from the same start; not waited for once the company is known). Whatever is missing
    # then is `late`, named in the answer, never waited for longer.
    waits = (Wait(("retrieval_completed", "skills_applied"), settings.retrieval_wait_s),
             Wait(AWAITED, settings.wait_s, per_site=profile_budget))
    return Node(name=NAME, consumes=("route_decided",), handle=handle,
                needs=Needs(config=True, waits=waits, kb_vectors=mode == "extractive",
                            when=lambda event: event.route == "ANSWER"))
