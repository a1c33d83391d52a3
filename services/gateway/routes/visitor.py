"""What the widget reads besides the chat (`POST /v1/chat`, chat.py):

- `GET /v1/sites/{site}/widget`: the site's widget settings (its `[widget]` table and its
  languages: public, nothing else of the config), which widget.js applies when it loads, so
  a site changes its look without a deploy; shared caches may keep it a few seconds;

and the visitor's own conversation, for the holder of its session token (access.py):

- `GET /v1/sites/{site}/conversations/{session_id}`: what the widget shows of it
  (visitor_view.py), for a page that reloads;
- `GET /v1/sites/{site}/conversations/{session_id}/live`: what operators do in it (a
  handoff: handoffs.py), over server-sent events, from after `Last-Event-ID` and then live;
- `GET /v1/sites/{site}/conversations/{session_id}/turns/{turn}/stream`: a turn's stream
  again (streams.py), for a client that lost it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from services.gateway import frames, handoffs, streams, visitor_view
from services.gateway.access import configured_site, own_conversation
from services.gateway.errors import NotFound
from services.gateway.openapi import (LIVE_RESPONSES, RESUME_RESPONSES, VISITOR_READ_RESPONSES, WIDGET_RESPONSES,
                                      LastEventId, SiteId, Turn)
from shared.site_config import SiteConfig

router = APIRouter(tags=["visitor"])
Own = Annotated[tuple[str, str], Depends(own_conversation)]
WIDGET_MAX_AGE_S = 5  # how stale a page's widget settings may be: a change shows within seconds


async def served_site(request: Request, site: SiteId) -> SiteConfig:
    """`configured_site` for a path whose site id is checked first (422), so a malformed one
    never reaches the bucket as a key."""
    return await configured_site(request, site)


# A site that sets no greeting still greets, in its first language (its name filled in).
DEFAULT_GREETINGS = {
    "en": "Hi! Ask me anything about {name}.",
    "fr": "Bonjour ! Posez-moi vos questions sur {name}.",
    "de": "Hallo! Fragen Sie mich alles zu {name}.",
    "es": "¡Hola! Pregúnteme lo que quiera sobre {name}.",
    "it": "Ciao! Chiedimi qualsiasi cosa su {name}.",
    "pt": "Olá! Pergunte-me o que quiser sobre {name}.",
    "nl": "Hallo! Vraag me alles over {name}.",
}


def default_greeting(config: SiteConfig, site: str) -> str:
    lang = next((tag.split("-")[0].lower() for tag in config.languages
                 if tag.split("-")[0].lower() in DEFAULT_GREETINGS), "en")
    return DEFAULT_GREETINGS[lang].format(name=config.name or site)


@router.get("/v1/sites/{site}/widget", responses=WIDGET_RESPONSES)
async def widget_settings(site: SiteId, config: Annotated[SiteConfig, Depends(served_site)]):
    """The site's widget settings: colours, texts, position, logo, starter questions, whether
    sources are shown, and the site's languages."""
    widget = config.widget
    if not widget.greeting.strip():  # a new conversation never opens on an empty panel
        widget = msgspec.structs.replace(widget, greeting=default_greeting(config, site))
    body = {"site": site, "languages": config.languages, "widget": widget}
    # Public, the same for every visitor of the site: shared caches may keep it (per Origin:
    # the CORS header differs) for a few seconds.
    return Response(msgspec.json.encode(body), media_type="application/json",
                    headers={"Cache-Control": f"public, max-age={WIDGET_MAX_AGE_S}", "Vary": "Origin",
                             "ETag": f'"{config.version}"'})


@router.get("/v1/sites/{site}/conversations/{session_id}", responses=VISITOR_READ_RESPONSES)
async def visitor_conversation(request: Request, conversation: Own):
    """The visitor's own conversation, as the widget shows it (X-Session-Token required)."""
    site, session_id = conversation
    state = await request.app.state.store.state(site, session_id)
    if state.event_count == 0:
        raise NotFound(f"no conversation {site}/{session_id}")
    # Private to the token's holder: no shared cache may keep it under the URL alone.
    written = await handoffs.written_between(request.app.state.store, site, session_id)
    return Response(msgspec.json.encode(visitor_view.conversation(state, written)), media_type="application/json",
                    headers={"Cache-Control": "no-store, private", "Vary": "X-Session-Token, Origin"})


@router.get("/v1/sites/{site}/conversations/{session_id}/turns/{turn}/stream", responses=RESUME_RESPONSES,
            response_class=StreamingResponse)
async def resume_turn(request: Request, conversation: Own, turn: Turn, last_event_id: LastEventId = None):
    """A turn's stream again (X-Session-Token required): the frames after the one named by
    `Last-Event-ID` (`<turn>:<n>`; without it, from `start`), then live until `complete` or
    `error`. A finished turn replays from the log."""
    site, session_id = conversation
    return await streams.resumed(request, site, session_id, turn, frames.last_event_id(last_event_id, turn))


@router.get("/v1/sites/{site}/conversations/{session_id}/live", responses=LIVE_RESPONSES,
            response_class=StreamingResponse)
async def live_channel(request: Request, conversation: Own, last_event_id: LastEventId = None):
    """What operators do in the conversation (X-Session-Token required): `operator_joined`,
    `operator_message`, `operator_left`, `handoff_ended` frames, each with its log sequence as
    its id; those stored after `Last-Event-ID` (without it, all), then live until the client
    goes. Keep-alive comments while nothing happens."""
    site, session_id = conversation
    after = handoffs.last_seq(last_event_id)
    body = handoffs.live(request.app.state.bus, site, session_id, after)
    return frames.response(body, {"X-Session-Id": session_id}, request.app.state.settings.keepalive_s)
