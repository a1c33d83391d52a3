"""What the HTTP API accepts, as Structs: decoding the body is validating it.

Every limit is here, so nothing unbounded reaches the bus: the body's size (checked while it
is read, 413), each field's length, the `visitor` object's shape. A body that is not UTF-8,
not JSON, nested too deep, or not of this shape is a 422 naming the problem.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from shared import events as ev
from shared.subjects import TOKEN_RE

# Longer than this is not a chat message and is refused as a bad request; between the abuse
# gate's limit (15,000) and this, the message is recorded as a blocked turn.
MAX_BODY_MESSAGE_CHARS = 100_000
# A request body above this is refused (413) before it is read whole: the longest message
# (100,000 characters, up to 4 bytes each in UTF-8) and a full visitor object fit.
MAX_BODY_BYTES = 512 * 1024
# A vote's body: the longest reason (ev.FEEDBACK_REASON_CHARS) with every character escaped
# as a JSON surrogate pair (12 bytes each), and its rating.
MAX_FEEDBACK_BODY_BYTES = 8 * 1024

Id = Annotated[str, msgspec.Meta(pattern=TOKEN_RE.pattern, description="letters, digits, '-' or '_'; 1-64")]
Short = Annotated[str, msgspec.Meta(max_length=256)]
Url = Annotated[str, msgspec.Meta(max_length=2048)]
MessageId = Annotated[str, msgspec.Meta(
    pattern=TOKEN_RE.pattern,
    description="the client's id for this message, the same when it sends the message again after a try that "
                "failed in transit: if that try started the turn, the answer is that turn's stream, not a second turn")]
Token = Annotated[str, msgspec.Meta(max_length=256, description="the session_token of the conversation's last `complete`")]


class Visitor(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What the widget may tell about the visitor; all optional, all bounded."""

    language: Annotated[str, msgspec.Meta(max_length=35)] | None = None  # a BCP 47 tag, e.g. "de-CH"
    email: Annotated[str, msgspec.Meta(max_length=254)] | None = None
    session_uuid: Short | None = None  # a session-identification provider's id
    # What a browser-side reveal script found, e.g. {"company": "Acme", "domain": "acme.com"}.
    reveal: Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], Short],
                      msgspec.Meta(max_length=20)] | None = None
    page_url: Url | None = None
    referrer: Url | None = None
    # Who the site already knows this visitor to be (its own page passes them to the widget:
    # `window.ConciergeIdentity`): its id for the person, and the SHA-256 of their lower-case
    # e-mail address (the address itself stays with the site).
    person_id: Annotated[str, msgspec.Meta(pattern=r"^[\x21-\x7e]{1,128}\Z",
                                           description="the site's own id of the person: 1-128 visible ASCII "
                                                       "characters")] | None = None
    email_hash: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z",
                                            description="SHA-256 of the lower-case e-mail address, hex")] | None = None


class ChatRequest(msgspec.Struct, forbid_unknown_fields=True):
    site: Id
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BODY_MESSAGE_CHARS)]
    session_id: Id | None = None  # null or absent: a new conversation (the server names it)
    session_token: Token | None = None  # or the X-Session-Token header
    visitor: Visitor | None = None
    client_message_id: MessageId | None = None


class FeedbackRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The visitor's vote on a turn's answer (the widget's thumbs)."""

    rating: ev.Rating
    reason: Annotated[str, msgspec.Meta(
        max_length=ev.FEEDBACK_REASON_CHARS,
        description="what the visitor wrote, if anything; blanks around it are trimmed")] = ""


class FeedbackStored(msgspec.Struct):
    """The turn's vote as stored: its latest, which counts. `new`: this request stored it
    (false: the same vote was the turn's latest already, nothing more was stored)."""

    turn: int
    rating: ev.Rating
    reason: str
    stored: bool
    new: bool


class RequestError(Exception):
    """A client mistake, answered with 4xx and the field it concerns."""

    def __init__(self, field: str | None, message: str, status: int = 422):
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status

    CODES = {403: "forbidden", 404: "not_found", 409: "conflict", 413: "too_large"}

    def body(self) -> dict:
        code = self.CODES.get(self.status, "invalid_request")
        return {"error": code, "detail": [{"field": self.field, "message": self.message}]}


class ErrorDetail(msgspec.Struct):
    field: str | None
    message: str


class ErrorBody(msgspec.Struct):
    """Every 4xx/5xx answer: a code, and a detail (the fields concerned, or a sentence)."""

    error: str
    detail: list[ErrorDetail] | str


_FIELD_RE = re.compile(r"at `\$\.?([^`]*)`")
_decoder = msgspec.json.Decoder(ChatRequest)


def decode_chat(body: bytes) -> ChatRequest:
    request = decode(body, _decoder)
    if not request.message.strip():
        raise RequestError("message", "message is empty")
    return request


_feedback_decoder = msgspec.json.Decoder(FeedbackRequest)


class SignIn(msgspec.Struct, forbid_unknown_fields=True):
    """The console's sign-in (routes/console.py)."""

    key: Annotated[str, msgspec.Meta(min_length=1, max_length=512,
                                     description="ADMIN_TOKEN, the site's API key or a named operator's key")]


class SignedIn(msgspec.Struct):
    """Who the console is signed in as: `kind` admin (every site; `sites` lists them), site_key
    (the site's shared key) or operator (a named operator's key; `name`)."""

    kind: str
    site: str | None
    name: str
    sites: list[str] | None = None
    expires_in_s: int | None = None


_sign_in_decoder = msgspec.json.Decoder(SignIn)


def decode_sign_in(body: bytes) -> SignIn:
    return decode(body, _sign_in_decoder)


def decode_feedback(body: bytes) -> FeedbackRequest:
    """The vote, its reason trimmed."""
    request = decode(body, _feedback_decoder)
    return msgspec.structs.replace(request, reason=request.reason.strip())


def decode(body: bytes, decoder: msgspec.json.Decoder):
    """`body` decoded, or a RequestError (422) naming the field and the problem."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _FIELD_RE.search(text)
        field = match.group(1) if match else _top_level_field(text)
        raise RequestError(field, text) from None
    except msgspec.DecodeError as exc:
        raise RequestError(None, f"body is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RequestError(None, f"body is not valid UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise RequestError(None, "body is nested too deeply") from None


def _top_level_field(text: str) -> str | None:
    """The body's own field a message names (one missing, or one it may not have), or None."""
    match = re.search(r"(?:required|unknown) field `([^`]+)`", text)
    return match.group(1) if match else None


def check_id(field: str, value: str) -> None:
    if not TOKEN_RE.match(value):
        raise RequestError(field, f"{field} must be letters, digits, '-' or '_' (1-64)")


async def read_body(request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` (never read whole)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(None, "Content-Length is not a number", status=400)
        if int(declared) > limit:
            raise RequestError(None, f"body is larger than {limit} bytes", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(None, f"body is larger than {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)
