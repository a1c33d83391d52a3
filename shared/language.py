"""A visitor's language, for the replies that do not come from a model: the language the
widget reports, else a guess from the message, else English.

The guess adds two kinds of evidence, because each fails where the other holds:
- py3langid (BSD-3, a naive Bayes model over byte n-grams, restricted to `LANGUAGES`): it
  reads accents and word shapes ("hébergées", "unterstützt"), but a message of two or
  three words gives it little ("And Xero?" comes out Italian);
- the message's function words (data/function_words.toml: "and", "est-ce", "welche",
  "¿cuánto"): a short question is made mostly of them, and one of them is strong evidence.

The best total wins if it has a function word or a confident n-gram score; otherwise
("Pricing?", "Tarifs ?") the answer is English:
a wrong guess in a short reply costs more than the default.
"""

from __future__ import annotations

import re
import threading
import tomllib
import unicodedata
from pathlib import Path

LANGUAGES = ("en", "fr", "es", "de", "it", "pt", "nl")
FUNCTION_WORDS: dict[str, frozenset[str]] = {
    lang: frozenset(words.split())
    for lang, words in tomllib.loads((Path(__file__).parent / "data" / "function_words.toml")
                                     .read_text(encoding="utf-8")).items()}
ALL_FUNCTION_WORDS = frozenset().union(*FUNCTION_WORDS.values())
TOKEN = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*", re.UNICODE)
WORD_WEIGHT = 0.25  # one function word weighs a quarter of the n-gram model's whole probability
MIN_CONFIDENCE = 0.5  # below it, and without any function word, the n-gram model's guess is not taken

_identifier = None
_lock = threading.Lock()


def load():
    """The n-gram model (slow to read); services call it at start so that no visitor's
    first message waits for it."""
    global _identifier
    if _identifier is None:
        with _lock:
            if _identifier is None:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier

                identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
                identifier.set_languages(list(LANGUAGES))
                _identifier = identifier
    return _identifier


def words(text: str) -> list[str]:
    """The text's words, lowercased (NFC; "est-ce" and "t-il" stay whole, then also count
    by their parts)."""
    out: list[str] = []
    for token in TOKEN.findall(unicodedata.normalize("NFC", text).lower()):
        out.append(token)
        if "-" in token:
            out.extend(token.split("-"))
    return out


# A name in a message: a capitalised word or an acronym that does not open a sentence
# ("Salesforce", "OneDrive", "SLA"), as English writes them (German capitalises every noun).
NAME = re.compile(r"(?<![.?!:]\s)(?<!^)(?<![\w'’-])(?:[A-Z][a-z]*[A-Z0-9][A-Za-z0-9]*|[A-Z][a-z]{2,}|[A-Z]{2,}\d*)"
                  r"(?![\w'’-])")
NOT_NAMES = frozenset("I I'm I'd I've OK Ok Hi Hello Thanks Please Monday Tuesday Wednesday Thursday Friday Saturday "
                      "Sunday January February March April May June July August September October November "
                      "December".split())


def names(text: str) -> list[str]:
    """The names an English message mentions (`NAME`), each once, in order."""
    return list(dict.fromkeys(m.group(0) for m in NAME.finditer(text) if m.group(0) not in NOT_NAMES))


def evidence(text: str) -> tuple[dict[str, float], dict[str, int]]:
    """(the n-gram model's probability, the number of function words) per language."""
    probabilities = dict(load().rank(text))
    tokens = words(text)
    return ({lang: probabilities.get(lang, 0.0) for lang in LANGUAGES},
            {lang: sum(t in FUNCTION_WORDS[lang] for t in tokens) for lang in LANGUAGES})


def known(tags: list[str]) -> str | None:
    """The first of these language tags ("fr-CA", "de") that is one of `LANGUAGES`, as its code."""
    for tag in tags:
        code = tag.strip().lower()[:2]
        if code in LANGUAGES:
            return code
    return None


def declared(visitor: dict | None, accept_language: str | None = None) -> str | None:
    """The language the visitor's side names, when it is one of ours: the widget's
    `visitor.language`, else the browser's Accept-Language, in its order."""
    tags = [visitor["language"]] if visitor and isinstance(visitor.get("language"), str) else []
    if accept_language:
        tags += [part.split(";")[0] for part in accept_language.split(",")]
    return known(tags)


def guess(text: str, visitor: dict | None = None) -> str:
    if lang := declared(visitor):
        return lang
    if not words(text):
        return "en"
    probability, hits = evidence(text)
    # ties: LANGUAGES order, English first
    best = max(LANGUAGES, key=lambda lang: probability[lang] + WORD_WEIGHT * hits[lang])
    return best if hits[best] or probability[best] >= MIN_CONFIDENCE else "en"
