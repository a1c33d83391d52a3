"""answer_writer: streams the answer to an ANSWER turn.

History comes from the conversation log, so turn N sees the earlier exchanges, as many as
the `answer` role's token budget holds, HACK turns' text withheld (shared/history.py). Before
answering it can wait, up to `ANSWER_WAIT_S`, for the turn's background results (the
visitor's enrichment and profile); what is not there is left out of the prompt and named in
`ResponseCompleted.late_inputs`, it never blocks the answer. Tokens go to
`tokens.<site>.<session>.<turn>` as they arrive; the full text is stored once, as
`ResponseCompleted`.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from services.responder.streaming import stream_llm
from shared import awaiter, history, persona, prompts
from shared import skills as sk
from shared import events as ev
from shared.config import env_float, env_int
from shared.consumer import Context, Node
from shared.llm import LLMClient
from shared.site_config import SiteConfig, SiteConfigs
from shared.state import ConversationState

NAME = "answer_writer"
PROMPT = Path(__file__).parent / "prompts" / "answer.md"
# Off by default: waiting for the profile (two hops after the turn starts) costs ~8-10 ms of
# time to first token at p50 under `make bench`; a deployment that wants the profile in every
# first answer sets it (e.g. 0.3). Late inputs are named in ResponseCompleted either way.
WAIT_S = env_float("ANSWER_WAIT_S", 0.0)
AWAITED = ("enrichment_completed", "profile_inferred")
# Retrieval has its own deadline: an answer without the knowledge base is a poor answer, so
# it is worth waiting for (mix mode takes tens of milliseconds), but never for ever.
RETRIEVAL_WAIT_S = env_float("ANSWER_RETRIEVAL_WAIT_S", 2.0)
MAX_SOURCES = env_int("ANSWER_MAX_SOURCES", 10)  # the first N retrieved documents go into the prompt
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


def applied_skills(state: ConversationState, route: ev.RouteDecided, config: SiteConfig) -> tuple[list[str], str | None]:
    """The turn's SkillsApplied when stored; otherwise the same deterministic rules run
    here (shared/skills.py), so the answer does not wait one more hop for them."""
    record = state.turns.get(route.turn)
    if record is not None and record.skills is not None:
        return record.skills, record.qualification_question
    skills, _, question = sk.apply_for_turn(state, route, config)
    return skills, question


def skills_context(skills: list[str], question: str | None) -> str:
    lines = []
    for skill in skills:
        if skill == "ask_qualifying_question" and question:
            lines.append(f"End by asking exactly this question, marked with ❓: {question}")
        elif skill in SKILL_TEXT:
            lines.append(SKILL_TEXT[skill])
    return "\n".join(f"- {line}" for line in lines) if lines else "- End plainly, with no call to action."


def sources_context(documents: list[ev.RetrievedDocument]) -> str:
    if not documents:
        return ("\n## Sources\nNo knowledge-base documents were found for this question. Do not guess facts about "
                "the company; say you are not sure and offer to connect the visitor with the team.\n")
    lines = [f"[{d.n}] {d.title}: {' '.join(d.content.split())[:SOURCE_CHARS]}" for d in documents]
    return ("\n## Sources\nAnswer from these sources only, and cite the ones you use as [n] right after the "
            "sentence they support:\n" + "\n".join(lines) + "\n")


def build_messages(state: ConversationState, turn: int, system_prompt: str, budget_tokens: int) -> list[dict]:
    """The system prompt, then the exchanges before `turn` that fit the budget, then this
    turn's message (always)."""
    messages = [{"role": "system", "content": system_prompt}]
    for message in history.window(state, turn, budget_tokens):
        if message.turn < turn or message.role == "user":
            messages.append({"role": message.role, "content": message.content})
    return messages


def make_node(llm: LLMClient, configs: SiteConfigs | None = None) -> Node:
    async def handle(event: ev.RouteDecided, ctx: Context) -> list[ev.Envelope]:
        if event.route != "ANSWER":
            return []
        started = time.monotonic()
        state = await awaiter.turn_state(ctx.bus, event.site, event.session_id, event.turn,
                                         {"retrieval_completed"}, RETRIEVAL_WAIT_S)
        if WAIT_S > 0:  # the visitor's enrichment and profile, on their own deadline
            state = await awaiter.turn_state(ctx.bus, event.site, event.session_id, event.turn, set(AWAITED),
                                             max(0.0, WAIT_S - (time.monotonic() - started)))
        record_of_turn = state.turns.get(event.turn)
        seen = set(record_of_turn.seen) if record_of_turn else set()
        late = [kind for kind in ("retrieval_completed", *AWAITED) if kind not in seen]
        documents = (record_of_turn.sources or [])[:MAX_SOURCES] if record_of_turn else []
        config = await configs.get(event.site) if configs else SiteConfig()
        skills, question = applied_skills(state, event, config)
        system = prompts.compose(PROMPT, event.site, config, visitor=visitor_context(state),
                                 skills=skills_context(skills, question), persona=persona.block(config.persona),
                                 sources=sources_context(documents))
        messages = build_messages(state, event.turn, system, llm.history_tokens("answer"))
        return [await stream_llm(ctx, llm, "answer", NAME, messages, late_inputs=late, sources=documents,
                                 temperature=persona.temperature(config.persona))]

    return Node(name=NAME, consumes=("route_decided",), handle=handle)
