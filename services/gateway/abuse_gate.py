"""The abuse gate: decided from conversation state before anything costs an LLM call.

Priority: hack > spam > length. Two HACK turns block the session for good; the same
message (case- and whitespace-insensitive) a third time in a row after the first blocks
until the visitor writes something else; a message over 15,000 characters is blocked.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from shared import language as languages
from shared.state import ConversationState

HACK_LIMIT = 2
SPAM_LIMIT = 3
MAX_MESSAGE_CHARS = 15_000

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
    """The language the visitor's side names (widget, then browser), else English. Not a
    guess from the message: a blocked message is hostile, repeated or too long, and the
    block messages exist in every language of `shared.language.LANGUAGES`."""
    return languages.declared(visitor, accept_language) or "en"


def reply(reason: str, lang: str) -> str:
    return MESSAGES[reason].get(lang, MESSAGES[reason]["en"])
