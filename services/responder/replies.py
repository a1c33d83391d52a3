"""Localized replies that come from no model: the texts of `data/replies.toml`, in the
visitor's language (the one the widget reports, else a guess from their messages)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from shared import language
from shared.site_config import SiteConfig
from shared.state import ConversationState

GUESS_MESSAGES = 3
NOT_WORDS = re.compile(r"\S+@\S+|\S+://\S+")  # e-mail addresses and links ("com" is Portuguese)
TEXTS = tomllib.loads((Path(__file__).parent / "data" / "replies.toml").read_text(encoding="utf-8"))
# The site's contacts (`[redirects]`) for what a visitor needs the team for, by intent.
TARGETS = {
    "SUPPORT": ("support",),
    "OTHER": ("careers", "press", "partnerships", "investors"),
    "OFFTOPIC": (),
}
WORD_RE = re.compile(r"[^\W\d_]+")


def text(key: str, lang: str, **fields: str) -> str:
    """The template at `key` ("booking.ask") in `lang`, else in English, filled in."""
    table = TEXTS
    for part in key.split("."):
        table = table[part]
    return table.get(lang, table["en"]).format(**fields)


def follow_up_offer(outcome: str, state: ConversationState, lang: str, **fields: str) -> str:
    """What a visitor nobody could take (`outcome`: out_of_hours / no_answer) is told: leave an
    e-mail address, or, once a lead was captured, that the team will write to the one given."""
    known = "_known" if state.booking.lead_captured else ""
    return text(f"handoff.{outcome}{known}", lang, **fields)


def lower_first(label: str) -> str:
    """A label inside a sentence: "Work email" -> "work email"; an acronym ("SIRET number") stays."""
    first = label.split(" ", 1)[0]
    return label if len(first) > 1 and first.isupper() else label[:1].lower() + label[1:]


def visitor_language(state: ConversationState, turn: int) -> str:
    """The language of this turn's visitor: the widget's report on the turn's
    `TurnRequested` when it has one (`TurnRecord.language`), else a guess from their recent
    messages (one message like "ada@example.com" or "11-50" says nothing about it)."""
    record = state.turns.get(turn)
    reported = {"language": record.language} if record is not None and record.language else None
    recent = [m.content for m in state.messages if m.role == "user" and m.turn <= turn][-GUESS_MESSAGES:]
    return language.guess(NOT_WORDS.sub(" ", " ".join(recent)), reported)


def chosen_targets(intent: str, message: str, config: SiteConfig) -> list[tuple[str, str]]:
    """(kind, address) of the configured targets for `intent`; of several, those the
    message is about by its words (a job, the press...), else all of them."""
    found = [(name, getattr(config.redirects, name)) for name in TARGETS.get(intent, ())
             if getattr(config.redirects, name)]
    if len(found) < 2:
        return found
    words = WORD_RE.findall(message.lower())
    keywords = TEXTS["redirect"]["keywords"]
    about = [(name, url) for name, url in found
             if any(word.startswith(key) for word in words for key in keywords.get(name, ()))]
    return about or found


def contacts(intent: str, message: str, config: SiteConfig, lang: str) -> list[str]:
    """Where the site points a visitor who needs its team for `intent` (a support request,
    a job, the press...), one localized line per configured target; [] when it has none."""
    return [text(f"redirect.{name}", lang, url=url.removeprefix("mailto:"))
            for name, url in chosen_targets(intent, message, config)]
