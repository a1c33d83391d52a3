"""Whether an answer holds a fact: the matching every answer evaluation uses (the shipped
answer evals, the real-content eval, a site's own test cases: shared/eval_runs.py).

A fact is given as its spellings (`["10 minutes", "ten minutes"]`); the answer holds it
when it holds any of them, case, whitespace, bold markers and curly quotes ignored, and a
number never matched inside a longer one ("$19" is not in "$199").
"""

from __future__ import annotations

import re
import unicodedata


def normalize(text: str) -> str:
    """Casefolded, NFKC (no-break spaces become spaces), curly quotes straightened, bold
    markers dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).replace("’", "'").replace("**", "").replace("__", "")
    return " ".join(text.casefold().split())


def _spelling_pattern(spelling: str) -> re.Pattern:
    s = normalize(spelling)
    return re.compile(("(?<!\\d)" if s[:1].isdigit() else "") + re.escape(s) + ("(?!\\d)" if s[-1:].isdigit() else ""))


def has_fact(text: str, spellings: list[str]) -> bool:
    flat = normalize(text)
    return any(_spelling_pattern(s).search(flat) for s in spellings)


def missing_facts(text: str, facts: list[list[str]]) -> list[list[str]]:
    return [spellings for spellings in facts if not has_fact(text, spellings)]


def forbidden_found(text: str, forbidden: list[str]) -> list[str]:
    return [statement for statement in forbidden if has_fact(text, [statement])]
