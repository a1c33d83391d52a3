"""Prompt-injection markers: the phrasings of `data/injection_markers.toml`, looked for in
every reading of a message an attacker may use to slip past a classifier.

Two HACK strikes block a session for good, so the classifier's HACK alone only strikes
when it is sure (routing.py). Markers are the other way to a strike: a decisive one
(`[markers]`: "ignore your previous instructions", chat-template tokens, ...) makes the
message HACK by rule, before any model or LLM reads it (an injection never reaches the
classifier LLM); a corroborating cue (`[cues]`: "the other visitors", "the leads you
collected", ...) is a fair phrase alone, so it only turns the model's unsure HACK into a
strike. The readings: the message folded (NFKC, lower case, format characters such as
zero-width spaces dropped), look-alike Cyrillic/Greek letters mapped to Latin, leetspeak
digits mapped to letters, letters spelled out with spaces or dots joined up, punctuation
turned into spaces, everything but letters dropped ("i g n o r e a l l" spelled with single
gaps), reversed, ROT13, and base64 / hex / %-encoded runs decoded.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
import tomllib
import unicodedata
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

MARKERS_FILE = Path(__file__).parent / "data" / "injection_markers.toml"
BASE64_RE = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")
HEX_RE = re.compile(r"\b(?:[0-9a-fA-F]{2}){8,}\b")
PERCENT_RE = re.compile(r"%[0-9a-fA-F]{2}")
# Single letters joined by one and the same separator: "i g n o r e", "s.y.s.t.e.m",
# "p-r-o-m-p-t" (so "d.i.s.r.e.g.a.r.d y.o.u.r" stays two words).
SPELLED_RE = re.compile(r"\b\w([ .\-_*])\w(?:\1\w)+\b")
NON_WORD_RE = re.compile(r"[\W_]+")
NON_LETTER_RE = re.compile(r"[\W\d_]+")


@dataclass(frozen=True)
class InjectionMarkers:
    # Each marker's and cue's phrasings, decisive markers first, then the cues; searched one
    # by one: a search for one alternation of a marker's twenty phrasings scans every
    # position with all twenty, where each phrasing alone is skipped through quickly by the
    # regex engine's own prefix checks (the same markers are found either way).
    patterns: dict[str, tuple[re.Pattern, ...]]
    decisive: frozenset[str]
    confusables: dict[int, str]
    leet: dict[int, str]

    @classmethod
    def load(cls, path: Path = MARKERS_FILE) -> "InjectionMarkers":
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        norm = raw["normalize"]
        for a, b in (("confusables_from", "confusables_to"), ("leet_from", "leet_to")):
            if len(norm[a]) != len(norm[b]):
                raise ValueError(f"{path}: {a} and {b} differ in length")
        patterns = {}
        if raw["markers"].keys() & raw.get("cues", {}).keys():
            raise ValueError(f"{path}: a name is both a marker and a cue")
        for name, items in (raw["markers"] | raw.get("cues", {})).items():
            try:
                patterns[name] = tuple(re.compile(p) for p in items)
            except re.error as exc:
                raise ValueError(f"{path}: marker {name!r}: {exc}") from None
        return cls(patterns=patterns, decisive=frozenset(raw["markers"]),
                   confusables=str.maketrans(norm["confusables_from"], norm["confusables_to"]),
                   leet=str.maketrans(norm["leet_from"], norm["leet_to"]))

    def find(self, message: str) -> list[str]:
        """The names of the markers and cues found in any reading of the message, in file order."""
        texts = readings(message, self.confusables, self.leet)
        return [name for name, phrasings in self.patterns.items()
                if any(phrasing.search(t) for phrasing in phrasings for t in texts)]


def fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    return "".join(c for c in text if unicodedata.category(c) != "Cf").lower()


def _join_spelled(text: str) -> str:
    return SPELLED_RE.sub(lambda m: re.sub(r"[ .\-_*]", "", m.group()), text)


def _decoded(text: str) -> list[str]:
    """Text hidden in base64, hex or %-escapes, when it decodes to UTF-8."""
    out = []
    for run in BASE64_RE.findall(text):
        try:
            out.append(base64.b64decode(run + "=" * (-len(run) % 4), validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            pass
    for run in HEX_RE.findall(text):
        try:
            out.append(bytes.fromhex(run).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
    if PERCENT_RE.search(text):
        out.append(urllib.parse.unquote(text))
    return [fold(t) for t in out if t.isprintable() or "\n" in t]


def readings(message: str, confusables: dict[int, str], leet: dict[int, str]) -> list[str]:
    folded = fold(message)
    latin = folded.translate(confusables)
    spelled = _join_spelled(latin)
    candidates = [folded, latin, latin.translate(leet), spelled, NON_WORD_RE.sub(" ", spelled),
                  NON_WORD_RE.sub(" ", latin.translate(leet)), NON_LETTER_RE.sub("", latin.translate(leet)),
                  latin[::-1], codecs.encode(latin, "rot13")]
    candidates += _decoded(message)
    return list(dict.fromkeys(" ".join(c.split()) for c in candidates))
