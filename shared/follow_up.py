"""Whether a visitor's message leans on their previous one: what the retriever searches
with and what the extractive answerer compares sentences to both read such a message
together with the one before it ("And Xero?", "How much does it cost per month?")."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+", re.UNICODE)
CONTINUATION = ("and ", "also ", "what about", "how about", "et ", "und ", "y ", "e ", "en ")
ELLIPTICAL_WORDS = 4  # this short, a message means little alone
BACK_REFERENCE_WORDS = 10  # a question this short that points back ("it") is read with the previous one
# Words that point back to something the previous message named (en, fr, de, es, it, pt).
BACK_REFERENCE = frozenset("it its they them their il elle ils elles ça cela es ihn dafür damit dazu davon "
                           "eso esto ello esso essa ciò isso isto".split())
# A longer message leans on the previous one too when it opens pointing back ("Does that also
# work for…", "It won't let me…") or says it asks about the same thing "also". Not French
# "ce" ("Est-ce que…") nor German "das" (an article): they open too many fresh questions.
LONGEST_FOLLOW_UP = 25  # words
OPENING = 3  # words
POINTING = BACK_REFERENCE | frozenset("that this those these dies diese dieser dieses questo quello".split())
ALSO = frozenset("also aussi auch también anche também ook".split())


def elliptical(message: str) -> bool:
    """A few words, or opening with "and", "what about" and the like."""
    lowered = message.strip().lower()
    return len(WORD.findall(lowered)) <= ELLIPTICAL_WORDS or lowered.startswith(CONTINUATION)


def follows_up(message: str) -> bool:
    """Elliptical, a short question that points back ("Which versions does it need?"), or a
    longer one that opens pointing back or asks "also" ("Does that also work for the surveys
    in our app?")."""
    words = WORD.findall(message.lower())
    if elliptical(message) or (len(words) <= BACK_REFERENCE_WORDS and any(w in BACK_REFERENCE for w in words)):
        return True
    return len(words) <= LONGEST_FOLLOW_UP and (any(w in POINTING for w in words[:OPENING])
                                                or any(w in ALSO for w in words))
