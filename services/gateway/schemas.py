"""What the HTTP API accepts, as Structs: decoding the body is validating it."""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from shared.subjects import TOKEN_RE

# Longer than this is not a chat message and is refused as a bad request; between the abuse
# gate's limit (15,000) and this, the message is recorded as a blocked turn.
MAX_BODY_MESSAGE_CHARS = 100_000

Id = Annotated[str, msgspec.Meta(pattern=TOKEN_RE.pattern, description="letters, digits, '-' or '_'; 1-64")]


class ChatRequest(msgspec.Struct, forbid_unknown_fields=True):
    site: Id
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BODY_MESSAGE_CHARS)]
    session_id: Id | None = None
    visitor: dict[str, Any] | None = None


class RequestError(Exception):
    """A client mistake, answered with 4xx and the field it concerns."""

    def __init__(self, field: str | None, message: str, status: int = 422):
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status

    def body(self) -> dict:
        return {"error": "invalid_request", "detail": [{"field": self.field, "message": self.message}]}


_FIELD_RE = re.compile(r"at `\$\.?([^`]*)`")
_decoder = msgspec.json.Decoder(ChatRequest)


def decode_chat(body: bytes) -> ChatRequest:
    try:
        request = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _FIELD_RE.search(text)
        field = match.group(1) if match else _missing_field(text)
        raise RequestError(field, text) from None
    except msgspec.DecodeError as exc:
        raise RequestError(None, f"body is not valid JSON: {exc}") from None
    if not request.message.strip():
        raise RequestError("message", "message is empty")
    return request


def _missing_field(text: str) -> str | None:
    match = re.search(r"required field `([^`]+)`", text)
    return match.group(1) if match else None


def check_id(field: str, value: str) -> None:
    if not TOKEN_RE.match(value):
        raise RequestError(field, f"{field} must match {TOKEN_RE.pattern}")
