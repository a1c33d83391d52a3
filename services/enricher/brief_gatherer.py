"""brief_gatherer: everything a lead's brief may say, gathered once.

Takes `BriefRequested` work items from the BRIEFS work queue (each item to one replica; the
gathering runs in parallel, unlike the model calls after it) and stores a `BriefGathered`
in the lead's log: the conversation, the visitor profile and enrichment, the interest
signals (each: did any turn show it) and score, the captured form fields, the
knowledge-base sections the conversation retrieved (numbered for citing) and the site's
similar earlier leads (other open leads' latest briefs, those of the same sector first). A conversation without a captured lead fails the
item (`BriefFailed`): there is no one to brief about.
"""

from __future__ import annotations

from shared import events as ev
from shared import subjects
from shared.node import Context, Inputs, Needs, Node, PermanentError
from shared.state import ConversationState
from services.enricher.briefs.failure import brief_failed

NAME = "brief_gatherer"
MAX_MESSAGES = 40  # the conversation's last messages; a brief is about what they asked lately
MAX_SOURCES = 8
SOURCE_CHARS = 800
MAX_SIMILAR = 3


def sources_of(retrievals: list[ev.RetrievalCompleted]) -> list[ev.BriefSource]:
    """The conversation's retrieved sections (from the log: the state keeps only the last
    turn's text), each once, in the order they were first found."""
    seen: dict[tuple[str, str], ev.RetrievedDocument] = {}
    for retrieval in sorted(retrievals, key=lambda r: r.turn):
        for doc in retrieval.documents:
            if doc.document_type == "chunk":
                seen.setdefault((doc.title, doc.source), doc)
    return [ev.BriefSource(number=i, title=doc.title, url=doc.source, text=doc.content[:SOURCE_CHARS])
            for i, doc in enumerate(list(seen.values())[:MAX_SOURCES], start=1)]


def similar(state: ConversationState, earlier: list[ev.BriefCompleted]) -> list[ev.SimilarLead]:
    """Other open leads' latest briefs, those of the same sector first, the newest first."""
    sector = state.visitor_profile.sector
    others = [b for b in earlier if b.session_id != state.session_id]
    others.sort(key=lambda b: (sector != ev.UNKNOWN and sector in b.summary, b.ts), reverse=True)
    return [ev.SimilarLead(session_id=b.session_id, stage=b.metadata.stage, priority=b.metadata.priority,
                           summary=b.summary) for b in others[:MAX_SIMILAR]]


def signals_of(detected: list[ev.InterestSignalsDetected]) -> dict[str, bool]:
    """Each buying signal, and whether any turn showed it (the state keeps the last turn's)."""
    out: dict[str, bool] = {}
    for event in detected:
        for name, on in event.signals.items():
            out[name] = out.get(name, False) or on
    return out


def gathered(state: ConversationState, lead: ev.LeadCaptured, site_name: str, retrievals: list[ev.RetrievalCompleted],
             detected: list[ev.InterestSignalsDetected], earlier: list[ev.BriefCompleted]) -> ev.BriefInputs:
    languages = [t.language for _, t in sorted(state.turns.items()) if t.language]
    return ev.BriefInputs(
        site_name=site_name, email=lead.email, capture_context=lead.capture_context,
        language=languages[-1] if languages else "",
        transcript=[ev.BriefMessage(role=m.role, content=m.content, turn=m.turn) for m in state.messages[-MAX_MESSAGES:]],
        profile=state.visitor_profile, interest_signals=signals_of(detected),
        interest_score=round(state.interest.score, 2),
        form_fields={**state.form.values, **state.booking.collected},
        sources=sources_of(retrievals), similar_leads=similar(state, earlier),
    )


async def gather(event: ev.BriefRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    leads = inputs.log["lead_captured"]
    if not leads:
        raise PermanentError(f"no lead was captured in conversation {event.site}/{event.session_id}")
    data = gathered(inputs.state, leads[0], inputs.config.name or event.site, list(inputs.log["retrieval_completed"]),
                    list(inputs.log["interest_signals_detected"]), list(inputs.open_briefs))
    return [ctx.follow(ev.BriefGathered, request_id=event.request_id, inputs=data)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("brief_requested",), handle=gather,
                needs=Needs(state=True, config=True, open_briefs=True,
                            log=("lead_captured", "retrieval_completed", "interest_signals_detected")),
                stream=subjects.BRIEFS_STREAM, failure=brief_failed)
