"""The API's description in /openapi.json: the request schemas come from the same msgspec
Structs that decode the bodies (schemas.py), so the spec cannot drift from what is enforced,
and schema-based fuzzers (the schemathesis run in tests/test_hostile.py) reach every endpoint.

Two APIs, each under its own prefixes and tag (`TAGS`): the visitor's, under `/v1/chat` and
`/v1/sites/{site}/…` (the widget's; CORS for the site's origins, cors.py), and the
operator's, under `/v1/admin/sites/{site}/…` (a bearer token, checked once for the prefix:
routes/operator.py); and health, `/healthz` and `/readyz`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import Header, Path
from fastapi.security import HTTPBearer

from services.gateway.schemas import ChatRequest, ErrorBody, FeedbackRequest, FeedbackStored, SignedIn, SignIn
from shared.accounts import Portfolio
from shared.site_config import SiteConfig, Widget

# Python's `\Z` is not in JSON Schema's (ECMA-262) regex dialect; there `$` already means
# the end of the text.
ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

SiteId = Annotated[str, Path(pattern=ID_PATTERN, description="a configured site")]
SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="a conversation's id")]
Turn = Annotated[int, Path(ge=1, le=1_000_000, description="the turn's number (the `start` frame's `turn`)")]
LastEventId = Annotated[str | None, Header(max_length=64, description="the id of the last frame received, `<turn>:<n>`")]
TokenHeader = Annotated[str | None, Header(max_length=256, description="the conversation's session token")]
bearer = HTTPBearer(auto_error=False, description="ADMIN_TOKEN, or the site's API key (ck_<site>_...)")

VISITOR_PREFIXES = ("/v1/chat", "/v1/sites/")
OPERATOR_PREFIX = "/v1/admin/sites/{site}"
TAGS = [
    {"name": "visitor", "description": "The widget's calls, under `/v1/chat` and `/v1/sites/{site}/`: a turn over "
                                       "server-sent events, its stream again, the visitor's own conversation and "
                                       "votes on its answers, what operators do in it, live (its session token), the "
                                       "widget's look. CORS for the "
                                       "site's allowed origins."},
    {"name": "operator", "description": "Everything an operator reads or does, under `/v1/admin/sites/{site}`: "
                                        "the site's config, versions and keys, conversations, their events and "
                                        "states, replay, lead briefs and triage, handoffs to a person, accounts and deals. A bearer token "
                                        "(ADMIN_TOKEN, or the "
                                        "site's API key); no CORS."},
    {"name": "console", "description": "The operator console's sign-in, `/v1/admin/session`: a key once, then an "
                                       "HttpOnly, SameSite=Strict session cookie that the operator API takes with the "
                                       "`X-Concierge-Console: 1` header instead of a bearer token; sign-out."},
    {"name": "health", "description": "Liveness and readiness (also on the ops port, with /metrics)."},
]


def _inline(schema: Any, defs: dict) -> Any:
    """msgspec's schema with its `$defs` references inlined (an operation has no `$defs`)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    if isinstance(schema, str):
        return schema.replace("\\Z", "$")
    return schema


def schema_of(struct: type) -> dict:
    full = msgspec.json.schema(struct)
    return _inline(full, full.get("$defs", {}))


ERROR = {"application/json": {"schema": schema_of(ErrorBody)}}


def _errors(**codes: str) -> dict:
    return {int(code[1:]): {"description": text, "content": ERROR} for code, text in codes.items()}


SIGN_IN_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema_of(SignIn)}}}}
CONSOLE_RESPONSES = {
    200: {"description": "who is signed in (the sign-in also sets the `concierge_console` cookie)",
          "content": {"application/json": {"schema": schema_of(SignedIn)}}},
    **_errors(s401="not a key of this deployment, or no valid session", s422="a body without `key`",
              s429="too many sign-ins from this address: wait Retry-After seconds"),
}
CHAT_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema_of(ChatRequest)}}}}
CHAT_RESPONSES = {
    200: {"description": "server-sent events: start, sources, token..., then complete (with session_token) or error",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **_errors(s403="a session id without its token, or an origin the site does not allow",
              s404="the site is not configured", s409="the conversation moved on; retry",
              s413="the body is too large", s422="the body is not valid (the field and why)",
              s429="rate limited, or a turn of this session is in flight", s503="the event bus is not reachable"),
}
RESUME_RESPONSES = {
    200: {"description": "server-sent events after the frame named by Last-Event-ID, live until complete or error",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **_errors(s400="a Last-Event-ID that is not <turn>:<n> of this turn",
              s403="no or a wrong session token, or an origin the site does not allow",
              s404="no such site, conversation or turn", s422="a malformed id or turn",
              s503="the event bus is not reachable"),
}
LIVE_RESPONSES = {
    200: {"description": "server-sent events: operator_joined, operator_message, operator_left, handoff_ended, "
                         "each with its log sequence as its id; live until the client goes",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **_errors(s400="a Last-Event-ID that is not a number", s403="no or a wrong session token, or an origin the "
              "site does not allow", s404="the site is not configured", s422="a malformed id",
              s503="the event bus is not reachable"),
}
FEED_RESPONSES = {
    200: {"description": "server-sent events: ready (its id: where the feed starts), then the site's handoff_requested, "
                         "operator_joined, operator_message, operator_left, handoff_ended and turn_requested, each with "
                         "its log sequence as its id; live until the client goes",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **_errors(s400="a Last-Event-ID that is not a number"),
}
FEEDBACK_OPENAPI = {"requestBody": {"required": True,
                                     "content": {"application/json": {"schema": schema_of(FeedbackRequest)}}}}
FEEDBACK_RESPONSES = {
    200: {"description": "the same vote was the turn's latest already: nothing more stored (`new`: false)",
          "content": {"application/json": {"schema": schema_of(FeedbackStored)}}},
    201: {"description": "the vote stored: the turn's latest, which counts (`new`: true)",
          "content": {"application/json": {"schema": schema_of(FeedbackStored)}}},
    **_errors(s403="no or a wrong session token, or an origin the site does not allow",
              s404="no such site, conversation or turn", s409="the turn has no answer to rate (not finished, "
              "blocked or failed)", s413="the body is too large",
              s422="a malformed id or turn, or a body that is not valid (the field and why)",
              s429="rate limited (Retry-After)", s503="the event bus is not reachable"),
}
SITE_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema_of(SiteConfig)}}}}
ACCOUNTS_IMPORT_OPENAPI = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": schema_of(Portfolio)},
    "text/csv": {"schema": {"type": "string", "description": "a CSV file of accounts (columns name, arr, ..., "
                                                             "usage:<metric>, usage:<metric>:limit, "
                                                             "usage:<metric>:unit) or of deals (an outcome column)"}}}}}
SITE_PATCH_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "a JSON merge patch of the site's config (RFC 7396): tables merge, lists are "
                                     "replaced, null puts a key back to its default"}}}}}
WIDGET_RESPONSES = {
    200: {"description": "the site's widget settings and languages: only what the widget shows",
          "content": {"application/json": {"schema": {"type": "object", "properties": {
              "site": {"type": "string"}, "languages": {"type": "array", "items": {"type": "string"}},
              "widget": schema_of(Widget)}}}}},
    **_errors(s403="an origin the site does not allow", s404="the site is not configured",
              s422="a malformed site id", s503="the event bus is not reachable"),
}
VISITOR_READ_RESPONSES = _errors(s403="no or a wrong session token", s404="no such site or conversation",
                                 s422="a malformed id", s503="the event bus is not reachable")
OPERATOR_RESPONSES = _errors(s401="no or a wrong bearer token",
                             s403="a site key asking to create or delete a site (ADMIN_TOKEN only)",
                             s404="no such site, conversation, brief or triage for this operator, or no handoff "
                                  "waiting or held", s409="the site kept changing while this change was tried, or "
                                  "another operator holds the handoff",
                             s422="a malformed id or body, or a site config that does not validate (every field's "
                                  "problem)", s503="the event bus is not reachable")
