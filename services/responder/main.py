"""Responder service: replies to each turn by its route (answer_writer, redirect_handler,
booking_handler), post-processes the reply (dialog state, form fields, suggestions),
notifies about captured leads and closes the turn."""

from shared import service
from shared.llm import LLMClient
from shared.site_config import SiteConfigs
from services.responder import (answer_writer, booking_handler, finalize, lead_notifier, post_processing,
                                redirect_handler, suggesters)
from services.responder.lead_claims import LeadClaims


async def nodes(bus):
    llm = LLMClient.from_env(("answer", "redirect", "suggestions"))
    configs = SiteConfigs(bus)
    return [
        answer_writer.make_node(llm, configs),
        redirect_handler.make_node(llm, configs),
        booking_handler.make_node(llm, configs),
        post_processing.dialog_state_extractor,
        post_processing.form_field_extractor,
        post_processing.suggestion_router,
        suggesters.make_node("follow_up", llm, configs),
        suggesters.make_node("answers", llm, configs),
        lead_notifier.make_node(configs, LeadClaims(bus)),
        finalize.make_node(configs),
    ]


def main() -> None:
    service.main("responder", nodes)


if __name__ == "__main__":
    main()
