"""Responder service: replies to each turn by its route, post-processes the reply, notifies
about captured leads and handoff requests and closes the turn. Its nodes, by the event that
wakes them:

    route_decided          answer_writer (ANSWER)              → ResponseCompleted
                           redirect_handler (REDIRECT)         → ResponseCompleted
                           booking_handler (BOOKING)           → BookingProgressed, LeadCaptured,
                                                                 ResponseCompleted
                           handoff_handler (HANDOFF)           → HandoffRequested, HandoffEnded (out of
                                                                 hours), LeadCaptured (an e-mail left),
                                                                 ResponseCompleted
    handoff_requested      handoff_timer (after the maximum wait) → HandoffEnded (nobody joined)
    response_completed     dialog_state_extractor              → DialogStateExtracted
                           form_field_extractor                → FormFieldsExtracted
                           suggestion_router                   → SuggestionsRouted
    suggestions_routed     follow_up_suggester (follow_up)     → SuggestionsGenerated
                           answer_suggester (answers)          → SuggestionsGenerated
    lead_captured          lead_notifier                       → WebhookRecorded, AnalyticsRecorded
    handoff_requested      handoff_notifier                    → WebhookRecorded
    eval_run_completed     eval_notifier (cases newly failing) → WebhookRecorded (eval.regressed)
    suggestions_generated  finalize                            → TurnCompleted
"""

from shared import service
from shared.bus import Bus
from shared.llm import LLMClient
from shared.node import Node
from services.responder import (answer_suggester, answer_writer, booking_handler, dialog_state_extractor,
                                eval_notifier, finalize, follow_up_suggester, form_field_extractor, handoff_handler,
                                handoff_notifier, handoff_timer, lead_notifier, redirect_handler, suggestion_router,
                                webhook_claims)
from services.responder.settings import ResponderSettings


async def nodes(bus, settings: ResponderSettings):
    return responder_nodes(LLMClient(settings.llm).prepare(), bus, settings)


def responder_nodes(llm: LLMClient, bus: Bus | None, settings: ResponderSettings) -> list[Node]:
    """The responder's nodes (also what a replay runs, with no bus: its notifiers, whose
    webhook claims are on the bus, are never run there)."""
    leads = webhook_claims.for_leads(bus) if bus is not None else None
    handoffs = webhook_claims.for_handoffs(bus) if bus is not None else None
    return [
        answer_writer.make_node(llm, settings.answer, settings.embeddings, settings.token_batch_s),
        redirect_handler.make_node(llm, settings.token_batch_s),
        booking_handler.make_node(llm, settings.token_batch_s),
        handoff_handler.make_node(),
        handoff_timer.make_node(),
        dialog_state_extractor.make_node(),
        form_field_extractor.make_node(),
        suggestion_router.make_node(),
        follow_up_suggester.make_node(llm),
        answer_suggester.make_node(llm),
        lead_notifier.make_node(leads, settings.lead),
        handoff_notifier.make_node(handoffs, settings.lead),
        *([eval_notifier.make_node(handoffs, bus, settings.lead)] if bus is not None else []),
        finalize.make_node(settings.finalize_wait_s),
    ]


def main() -> None:
    service.main("responder", ResponderSettings.from_env, nodes, follow_log=True)


if __name__ == "__main__":
    main()
