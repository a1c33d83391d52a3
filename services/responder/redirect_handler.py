"""redirect_handler: replies to REDIRECT turns (SUPPORT, OFFTOPIC, OTHER, HACK, and EXIT
from a booking flow) without waiting for any background work.

The reply comes from the fast `redirect` LLM role and points to the site's configured
target (support portal, careers page, press, partnerships or investors contact). When that
role has no endpoint, the reply is a localized template (data/replies.toml) naming the
same targets, `ResponseCompleted.backend = "template"`. A HACK turn gets a fixed,
localized reply that names nothing: no prompt, configuration or other visitor's data can
leak through a model that never sees the request.
"""

from __future__ import annotations

from pathlib import Path

from services.responder import replies
from services.responder.settings import ROLES
from services.responder.streaming import TOKEN_BATCH_S, stream_llm, stream_text
from shared import events as ev
from shared import history, prompts
from shared.llm import LLMClient, role_records
from shared.node import Context, Inputs, Needs, Node
from shared.site_config import SiteConfig

NAME = "redirect_handler"
PROMPT = Path(__file__).parent / "prompts" / "redirect.md"
REASONS = {
    "SUPPORT": "an existing customer's support request",
    "OTHER": "jobs, press, partnerships or investors",
    "OFFTOPIC": "a topic unrelated to the company",
}


def targets(intent: str, config: SiteConfig) -> str:
    lines = [f"- {name}: {getattr(config.redirects, name)}" for name in replies.TARGETS.get(intent, ())
             if getattr(config.redirects, name)]
    return "Where to point them:\n" + "\n".join(lines) if lines else "There is no page to point them to."


def hack_reply(lang: str, config: SiteConfig, site: str) -> str:
    return replies.text("hack", lang, site_name=config.name or site)


def template_reply(intent: str, message: str, config: SiteConfig, site: str, lang: str) -> str:
    """The redirect reply without a model: where to go (or that this chat cannot help),
    then the offer to answer questions about the site."""
    lines = replies.contacts(intent, message, config, lang) or [replies.text("redirect.outside", lang)]
    return "\n".join(lines + [replies.text("redirect.offer", lang, site_name=config.name or site)])


def make_node(llm: LLMClient, token_batch_s: float = TOKEN_BATCH_S) -> Node:
    roles = role_records(llm, ROLES)  # recorded on the reply: what a replay re-runs it with

    async def handle(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config = inputs.state, inputs.config
        message = history.message_of(state, event.turn)
        if event.intent == "HACK":
            lang = replies.visitor_language(state, event.turn)
            return [await stream_text(ctx, NAME, hack_reply(lang, config, event.site), llm_roles=roles)]
        if not llm.configured("redirect"):
            lang = replies.visitor_language(state, event.turn)
            return [await stream_text(ctx, NAME, template_reply(event.intent, message, config, event.site, lang),
                                      llm_roles=roles)]
        system = prompts.compose(PROMPT, event.site, config, reason=REASONS.get(event.intent, event.reason),
                                 targets=targets(event.intent, config))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": message}]
        return [await stream_llm(ctx, llm, "redirect", NAME, messages, temperature=0.3, max_tokens=160,
                                 batch_s=token_batch_s, llm_roles=roles)]

    return Node(name=NAME, consumes=("route_decided",), handle=handle,
                needs=Needs(state=True, config=True, when=lambda event: event.route == "REDIRECT"))
