"""finalize: closes a turn with `TurnCompleted`, whose metadata the gateway sends to the
browser in the `complete` event.

It runs on the turn's `SuggestionsGenerated` (the last step after a reply) and waits, at
most `FINALIZE_WAIT_S`, for the turn's dialog state, form fields and enrichment, so a slow
or missing one delays the close a little and never blocks it.
"""

from __future__ import annotations

import msgspec

from services.responder.booking import booking_url
from shared import citations, segments
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node, Wait
from shared.site_config import SiteConfig
from shared.state import ConversationState

NAME = "finalize"
GATHERED = ("dialog_state_extracted", "form_fields_extracted", "enrichment_completed")


def cta_overrides(state: ConversationState, config: SiteConfig, base: str = "") -> dict[str, str]:
    """The booking link (`base`: the visitor's segment's, else the site's) with what the
    visitor gave us (form fields and booking answers) as query parameters, for the widget's
    CTA button; empty when there is nothing to add."""
    values = {k: v for k, v in {**state.form.values, **state.booking.collected}.items()
              if k in {f.name for f in config.booking.fields} | {"email", "name", "company", "phone"}}
    if not values or not (base or config.cta.booking_url or config.cta.url):
        return {}
    return {"booking_url": booking_url(config, values, base)}


def cta(state: ConversationState, config: SiteConfig) -> dict | None:
    """The call to action the widget shows: the visitor's segment's (shared/segments.py) when
    it has one, else the site's; None without a link."""
    label, url = segments.for_visitor(config, state.visitor_profile).cta(config)
    return {"label": label, "url": url} if url else None


def metadata(state: ConversationState, turn: int, suggestions: ev.SuggestionsGenerated,
             config: SiteConfig | None = None) -> dict:
    record = state.turns.get(turn)
    config = config or SiteConfig()
    action = cta(state, config)
    return {
        "route": record.route if record else None,
        "branch": record.branch if record else None,
        "intent": record.intent if record else None,
        "fallback_used": bool(record and record.fallback_used),
        "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        "suggested_follow_ups": suggestions.suggestions if suggestions.kind == "follow_up" else [],
        "suggested_answers": suggestions.suggestions if suggestions.kind == "answers" else [],
        "form_values": dict(state.form.values),
        "cta_url_overrides": cta_overrides(state, config, action["url"] if action else ""),
        "cta": action,
        "skill_selection_state": {
            "selected": (record.skills_selected if record else None) or [],
            "applied": (record.skills if record else None) or [],
            "qualification_question": record.qualification_question if record else None,
        },
        "booking": {"active": state.booking.active, "pending_field": state.booking.pending_field,
                    "lead_captured": state.booking.lead_captured},
        "dialog_flags": dict(state.dialog.latest) if state.dialog.latest_turn == turn else {},
        "handoff": state.handoff.status,  # "" | waiting | held: the widget listens for the team while not ""
        "sources": sources(state, turn),
    }


def sources(state: ConversationState, turn: int) -> list[dict]:
    """The sources the answer was given, each marked `cited` when the answer's text cites
    it (checked here, whatever wrote the answer: shared/citations.py)."""
    record = state.turns.get(turn)
    if record is None:
        return []
    answer = next((m.content for m in reversed(state.messages) if m.turn == turn and m.role == "assistant"), "")
    given = [d for d in (record.sources or []) if d.n in record.sources_cited]
    quoted = set(citations.cited(answer, [d.n for d in given]))
    return [{**public, "cited": public["n"] in quoted} for public in ev.public_sources(given)]


async def close_turn(event: ev.SuggestionsGenerated, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    return [ctx.follow(ev.TurnCompleted, metadata=metadata(inputs.state, event.turn, event, inputs.config))]


def make_node(wait_s: float = 0.5) -> Node:
    """`wait_s` (FINALIZE_WAIT_S): how long to wait for each of the turn's `GATHERED` events."""
    return Node(name=NAME, consumes=("suggestions_generated",), handle=close_turn,
                needs=Needs(config=True, waits=(Wait(GATHERED, wait_s),)))
