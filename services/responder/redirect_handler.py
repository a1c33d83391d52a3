"""redirect_handler: replies to REDIRECT turns (SUPPORT, OFFTOPIC, OTHER, HACK, and EXIT
from a booking flow) without waiting for any background work.

The reply comes from the fast `redirect` LLM role and points to the site's configured
target (support portal, careers page, press, partnerships or investors contact). A HACK
turn gets a fixed, localized reply that names nothing: no prompt, configuration or other
visitor's data can leak through a model that never sees the request.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from services.responder.streaming import stream_llm, stream_text
from shared import events as ev
from shared import language, loader, prompts
from shared.consumer import Context, Node
from shared.llm import LLMClient
from shared.site_config import SiteConfig, SiteConfigs
from shared.state import ConversationState

NAME = "redirect_handler"
PROMPT = Path(__file__).parent / "prompts" / "redirect.md"
REPLIES = tomllib.loads((Path(__file__).parent / "data" / "replies.toml").read_text(encoding="utf-8"))
TARGETS = {
    "SUPPORT": ("support",),
    "OTHER": ("careers", "press", "partnerships", "investors"),
    "OFFTOPIC": (),
}
REASONS = {
    "SUPPORT": "an existing customer's support request",
    "OTHER": "jobs, press, partnerships or investors",
    "OFFTOPIC": "a topic unrelated to the company",
}


def targets(intent: str, config: SiteConfig) -> str:
    lines = [f"- {name}: {getattr(config.redirects, name)}" for name in TARGETS.get(intent, ())
             if getattr(config.redirects, name)]
    return "Where to point them:\n" + "\n".join(lines) if lines else "There is no page to point them to."


def hack_reply(state: ConversationState, turn: int, message: str, visitor: dict | None, config: SiteConfig,
               site: str) -> str:
    lang = language.guess(message, visitor)
    return REPLIES["hack"].get(lang, REPLIES["hack"]["en"]).format(site_name=config.name or site)


def _message_of(state: ConversationState, turn: int) -> str:
    for m in reversed(state.messages):
        if m.turn == turn and m.role == "user":
            return m.content
    return ""


def make_node(llm: LLMClient, configs: SiteConfigs) -> Node:
    async def handle(event: ev.RouteDecided, ctx: Context) -> list[ev.Envelope]:
        if event.route != "REDIRECT":
            return []
        state = await loader.load(ctx.bus, event.site, event.session_id)
        config = await configs.get(event.site)
        message = _message_of(state, event.turn)
        if event.intent == "HACK":
            return [await stream_text(ctx, NAME, hack_reply(state, event.turn, message, None, config, event.site))]
        system = prompts.compose(PROMPT, event.site, config, reason=REASONS.get(event.intent, event.reason),
                                 targets=targets(event.intent, config))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": message}]
        return [await stream_llm(ctx, llm, "redirect", NAME, messages, temperature=0.3, max_tokens=160)]

    return Node(name=NAME, consumes=("route_decided",), handle=handle)
