"""A company's size as providers and sites write it: a range of employees ("51-200",
"1,001-5,000", "10001+", "11 to 50 employees") read as (low, high). Read from browsers,
providers and site configs alike, so it refuses at once what it cannot read."""

from __future__ import annotations

import re

from shared.events import UNKNOWN

# A count: 1-9 digits, or groups of three after a comma or a dot ("10,001"). No part of the
# pattern can match what another part does, so a long odd input fails at once (it comes from
# browsers and providers as well as from the site's config).
COUNT = r"(\d{1,3}(?:[,.]\d{3}){1,2}|\d{1,9})"
RANGE_RE = re.compile(rf"{COUNT} ?(?:(?:-|–| ?to ?| - | – ){COUNT}|(\+))?(?: employees)?", re.IGNORECASE)
MAX_RANGE_CHARS = 40


def employees(text: str) -> tuple[int, int] | None:
    """An employee range as (low, high): "51-200" → (51, 200), "1000+" → (1000, ∞), "42" →
    (42, 42), "10,001+" → (10001, ∞); None for anything else (unknown, words, over 40 characters)."""
    if not text or text == UNKNOWN or len(text) > MAX_RANGE_CHARS:
        return None
    match = RANGE_RE.fullmatch(" ".join(text.split()))
    if match is None:
        return None
    low = int(re.sub(r"\D", "", match.group(1)))
    if match.group(3):
        return low, 10**9
    high = int(re.sub(r"\D", "", match.group(2))) if match.group(2) else low
    return (low, high) if low <= high else None
