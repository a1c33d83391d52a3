"""The abuse gate: decided from conversation state before anything costs an LLM call.

Priority: hack > spam > length. Two HACK turns block the session for good; the same
message (case- and whitespace-insensitive) a third time in a row after the first blocks
until the visitor writes something else; a message over 15,000 characters is blocked.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from shared.state import ConversationState

HACK_LIMIT = 2
SPAM_LIMIT = 3
MAX_MESSAGE_CHARS = 15_000
LANGUAGES = ("en", "fr", "es", "de", "it", "pt", "nl")

with open(Path(__file__).parent / "data" / "block_messages.toml", "rb") as _f:
    MESSAGES: dict[str, dict[str, str]] = tomllib.load(_f)


def check(state: ConversationState, message: str) -> str | None:
    """The reason this turn is blocked (`hack`, `spam`, `length`), or None."""
    if state.hack_count >= HACK_LIMIT:
        return "hack"
    repeats = state.spam_count + 1 if message.strip().lower() == state.last_input else 0
    if repeats >= SPAM_LIMIT:
        return "spam"
    if len(message) > MAX_MESSAGE_CHARS:
        return "length"
    return None


def language(visitor: dict | None, accept_language: str | None) -> str:
    """The visitor's language if we have the block messages in it, else English."""
    candidates = []
    if visitor and isinstance(visitor.get("language"), str):
        candidates.append(visitor["language"])
    if accept_language:
        candidates += [part.split(";")[0] for part in accept_language.split(",")]
    for tag in candidates:
        code = tag.strip().lower()[:2]
        if code in LANGUAGES:
            return code
    return "en"


def reply(reason: str, lang: str) -> str:
    return MESSAGES[reason].get(lang, MESSAGES[reason]["en"])
