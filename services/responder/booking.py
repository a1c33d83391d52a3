"""The site's booking form, read without any conversation: how an answer to one field is
parsed, which required field comes next, and the booking link carrying the collected
values. booking_handler runs the flow with it; finalize fills the widget's CTA link."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from shared.privacy import EMAIL_RE
from shared.site_config import FormField, SiteConfig

LOOSE_EMAIL_RE = re.compile(r"\S+@\S*")
PHONE_RE = re.compile(r"^\+?[\d ().-]{7,20}$")
MAX_VALUE = 120


def booking_url(config: SiteConfig, values: dict[str, str], base: str = "") -> str:
    """The booking URL (`base`, else the site's) with the collected values as query
    parameters (existing parameters kept)."""
    base = base or config.cta.booking_url or config.cta.url
    if not base:
        return ""
    parts = urlsplit(base)
    query = dict(parse_qsl(parts.query))
    query.update({k: v for k, v in values.items() if v})
    return urlunsplit(parts._replace(query=urlencode(query)))


def parse_answer(field: FormField, message: str) -> tuple[str | None, str | None]:
    """(value, problem) for the visitor's answer to `field`."""
    text = " ".join(message.split())
    if field.kind == "email":
        match = EMAIL_RE.search(text)
        if match:
            return match.group(0).lower(), None
        return None, "not_an_email" if LOOSE_EMAIL_RE.search(text) else "no_email"
    if field.kind == "phone":
        return (text, None) if PHONE_RE.match(text) else (None, "not_a_phone")
    if field.kind == "choice":
        for choice in field.choices:
            if choice.lower() in text.lower():
                return choice, None
        return None, "not_a_choice"
    return (text[:MAX_VALUE], None) if text else (None, "empty")


def next_field(config: SiteConfig, collected: dict[str, str]) -> FormField | None:
    for field in config.booking.fields:
        if field.required and field.name not in collected:
            return field
    return None
