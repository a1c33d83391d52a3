"""A visitor's language, for the few replies that do not come from a model: the language
the widget reports, else a guess from the message's common words, else English."""

from __future__ import annotations

import re

LANGUAGES = ("en", "fr", "es", "de", "it", "pt", "nl")
_WORDS = {
    "en": "the and you your is are what how can do i we my to of with for this that",
    "fr": "le la les et vous est que je nous une des pour avec pas mon votre quel quelle",
    "es": "el la los las y usted es que yo una para con por mi su cómo qué no tienen",
    "de": "der die das und sie ist ich wir ein eine mit für nicht mein ihr wie was auch",
    "it": "il lo la gli e che è io noi una per con non mi mio vostro come cosa sono",
    "pt": "o os as e você é que eu nós uma para com não meu seu como vocês está",
    "nl": "de het een en jij u is ik wij met voor niet mijn jullie hoe wat zijn",
}
_SETS = {lang: set(words.split()) for lang, words in _WORDS.items()}
_TOKEN = re.compile(r"[a-zà-ÿ]+", re.IGNORECASE)


def guess(text: str, visitor: dict | None = None) -> str:
    if visitor and isinstance(visitor.get("language"), str) and visitor["language"][:2].lower() in LANGUAGES:
        return visitor["language"][:2].lower()
    tokens = [t.lower() for t in _TOKEN.findall(text)]
    if not tokens:
        return "en"
    scores = {lang: sum(t in words for t in tokens) for lang, words in _SETS.items()}
    best = max(scores, key=scores.get)
    return best if scores[best] > 0 else "en"
