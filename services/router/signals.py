"""Buying signals of one turn and the cumulative interest score.

Local backend: the multilingual patterns of `data/signals.toml`, plus the local intent
model's BOOKING probability for demo interest. LLM backend (`ROUTER_SIGNALS_BACKEND=llm`):
the classifier role answers a JSON schema, one repair retry, the local result when it
fails. The score of a turn is the sum of the weights of its signals; the cumulative score
adds it to the conversation's previous score, capped at 1.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec

SIGNALS_FILE = Path(__file__).parent / "data" / "signals.toml"
SIGNALS = ("pricing_interest", "timeline", "team_size", "competitor_mentioned", "demo_interest", "engagement")
BOOKING_PROBABILITY = 0.5


@dataclass(frozen=True)
class SignalRules:
    patterns: dict[str, re.Pattern | None]
    weights: dict[str, float]
    min_messages: int
    min_words: int

    @classmethod
    def load(cls, path: Path = SIGNALS_FILE) -> "SignalRules":
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        missing = set(SIGNALS) - raw.keys()
        if missing:
            raise ValueError(f"{path}: missing signals {sorted(missing)}")
        patterns = {name: re.compile("|".join(f"(?:{p})" for p in raw[name]["patterns"]), re.IGNORECASE)
                    if raw[name]["patterns"] else None for name in SIGNALS}
        return cls(patterns=patterns, weights={n: float(raw[n]["weight"]) for n in SIGNALS},
                   min_messages=int(raw["engagement"].get("min_messages", 3)),
                   min_words=int(raw["engagement"].get("min_words", 6)))


class SignalsOutput(msgspec.Struct, kw_only=True):
    """What the LLM backend answers."""

    pricing_interest: bool = False
    timeline: bool = False
    team_size: bool = False
    competitor_mentioned: bool = False
    demo_interest: bool = False
    engagement: bool = False


def detect(rules: SignalRules, message: str, visitor_messages: int,
           intent_scores: dict[str, float] | None = None) -> dict[str, bool]:
    """This turn's signals. `visitor_messages` counts this message too; `intent_scores` are
    the local intent model's probabilities: BOOKING raises demo interest, and a message
    that is most likely STOP_BOOKING ("no demo, thanks") shows none."""
    scores = intent_scores or {}
    found = {}
    for name in SIGNALS:
        pattern = rules.patterns[name]
        found[name] = bool(pattern and pattern.search(message))
    found["demo_interest"] = found["demo_interest"] or scores.get("BOOKING", 0.0) >= BOOKING_PROBABILITY
    if scores and max(scores, key=scores.get) == "STOP_BOOKING":
        found["demo_interest"] = False
    found["engagement"] = visitor_messages >= rules.min_messages and len(message.split()) >= rules.min_words
    return found


def turn_score(rules: SignalRules, signals: dict[str, bool]) -> float:
    return round(sum(rules.weights[name] for name, on in signals.items() if on and name in rules.weights), 4)


def cumulative(previous: float, this_turn: float) -> float:
    return round(min(1.0, previous + this_turn), 4)
