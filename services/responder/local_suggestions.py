"""Suggestions without a model, for when the `suggestions` role has no LLM endpoint.

Follow-up questions come from the knowledge base as this turn's retrieval saw it: a chunk
is titled "<document> — <section heading>", so
- a heading that is a question ("Frequently asked questions — Is there a free trial?")
  is offered as it stands;
- another heading becomes a question a visitor would ask, from a localized template, the
  heading written as the section's own text writes it mid-sentence ("Pricing — Discounts":
  "Can you tell me about discounts?"; "Pricing — Growth plan": "Can you tell me about the
  Growth plan?"), see `as_topic`.
A question the visitor already asked (most of its words in one of their messages), an FAQ
whose answer the assistant already gave, and a section whose topic words the conversation
already used are left out. Nothing good means no suggestions, never a placeholder.

Answer options: a booking field of kind `choice` offers its choices; a yes/no question
offers yes and no; any other question offers nothing (a form cannot guess free text).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from shared import events as ev
from shared.site_config import SiteConfig
from shared.state import ConversationState, Message

DATA = tomllib.loads((Path(__file__).parent / "data" / "suggestions.toml").read_text(encoding="utf-8"))
STOPWORDS = frozenset(DATA["stopwords"]["words"].split())
MAX_FOLLOW_UPS = 3
MAX_CHOICES = 8  # a choice field's options are all offered, up to this many
ASKED_SHARE = 0.6  # this share of a question's words in one visitor message: already asked
ANSWERED_SHARE = 0.8  # this share of an FAQ answer's first sentence in one reply: already answered
WORD_RE = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
NOT_A_SECTION = re.compile(r"^page \d+$", re.IGNORECASE)  # a PDF page, not a topic


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD_RE.findall(text)]


def _stem(word: str) -> str:
    """Enough folding to match "integrations" with "integration"."""
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def content_words(text: str) -> set[str]:
    return {_stem(w) for w in words(text) if w not in STOPWORDS and not w.isdigit()}


def _share(part: set[str], whole: set[str]) -> float:
    return len(part & whole) / len(part) if part else 0.0


def _first_sentence(text: str) -> str:
    body = " ".join(text.split())
    return SENTENCE_END.split(body, 1)[0] if body else ""


def as_topic(heading: str, content: str, lang: str) -> str:
    """The heading as a topic inside a sentence. Headings capitalize their first word, a
    sentence does not unless it is a name: the section's text decides. Where the text uses
    the heading mid-sentence, its spelling there ("route optimisation", "Growth plan"), with
    the English "the" it takes there; else its first word in lower case unless that word is
    an acronym or the text capitalizes it mid-sentence ("Zapier"), or German (its nouns are
    capitalized)."""
    text = " ".join(content.split())
    return _as_visitor(_as_in_text(heading, text, lang), lang)


def _as_in_text(heading: str, text: str, lang: str) -> str:
    for found in re.finditer(r"(?<![.!?:]\s)(?<=\s)(?:(the) )?(" + re.escape(heading) + r")\b", text, re.IGNORECASE):
        article = "the " if found.group(1) and lang == "en" else ""
        return article + found.group(2)
    first, _, rest = heading.partition(" ")
    if lang != "de" and first[:1].isupper() and not first.isupper() and not re.search(
            r"(?<![.!?:]\s)(?<=\s)" + re.escape(first) + r"\b", text):
        first = first[0].lower() + first[1:]
    return f"{first} {rest}".strip()


# English heading nouns a visitor names with "the" ("the Growth plan", "the status page").
THE_NOUNS = frozenset(DATA["follow_up_the"]["nouns"].split())
SITE_VOICE = {"we": "you", "our": "your", "us": "you", "ours": "yours"}


def _as_visitor(topic: str, lang: str) -> str:
    """In English, the site's voice turned to the visitor's ("how we hire": "how you hire"),
    and "the" before a singular thing a heading names bare ("Starter plan")."""
    if lang != "en":
        return topic
    found = topic.split()
    found = [SITE_VOICE.get(w.lower(), w) for w in found]
    listing = any(w.lower() in ("and", "or", "&") for w in found)  # "Zapier and the API": a list, no "the"
    if not listing and found[0].lower() not in ("the", "a", "an", "your") and found[-1].lower() in THE_NOUNS:
        found.insert(0, "the")
    return " ".join(found)


def follow_ups(documents: list[ev.RetrievedDocument], messages: list[Message], lang: str,
               limit: int = MAX_FOLLOW_UPS, cited: frozenset[int] = frozenset()) -> list[str]:
    """Up to `limit` questions from the retrieved chunks' headings that the conversation has
    not covered: question headings first, then other sections, each in retrieval order. The
    sections this turn's answer cited (`cited`) were just discussed, whatever words they use."""
    asked = [content_words(m.content) for m in messages if m.role == "user"]
    replies = [content_words(m.content) for m in messages if m.role == "assistant"]
    said = set().union(*asked, *replies)
    template = DATA["follow_up"].get(lang, DATA["follow_up"]["en"])
    questions: list[str] = []
    topics: list[str] = []
    for doc in sorted(documents, key=lambda d: d.n):
        if doc.document_type != "chunk" or " — " not in doc.title or doc.n in cited:
            continue
        heading = " ".join(doc.title.split(" — ", 1)[1].split())
        topic = content_words(heading)
        if not topic or NOT_A_SECTION.match(heading):
            continue
        if heading.endswith("?"):
            answer = content_words(_first_sentence(doc.content))
            if any(_share(topic, m) >= ASKED_SHARE for m in asked) or any(
                    _share(answer, r) >= ANSWERED_SHARE for r in replies):
                continue
            questions.append(heading)
        elif not topic <= said:
            topics.append(template.format(topic=as_topic(heading.rstrip(".:"), doc.content, lang)))
    out: list[str] = []
    for text in questions + topics:
        if text.lower() not in {o.lower() for o in out}:
            out.append(text)
    return out[:limit]


def _has(found: list[str], term: str) -> bool:
    """A term of the data file in the words: a phrase as it stands, a short word whole,
    a longer one as the start of a word ("indicar" in "indicarme"), also after an elision
    ("indiquer" in "m'indiquer")."""
    if " " in term:
        return f" {term} " in f" {' '.join(found)} "
    bare = [part for w in found for part in {w, re.split(r"['’]", w)[-1]}]
    return any(w == term or (len(term) >= 4 and w.startswith(term)) for w in bare)


def last_question(reply: str) -> str:
    """The reply's last sentence that asks something."""
    asking = [s for s in SENTENCE_END.split(" ".join(reply.split())) if "?" in s]
    return asking[-1] if asking else ""


def is_yes_no(question: str, lang: str) -> bool:
    found = words(question)
    table = DATA["yes_no"]
    starts = table["starts"].get(lang, table["starts"]["en"])
    if not found or not any(found[0] == s or (s.startswith("-") and found[0].endswith(s)) for s in starts):
        return False
    return not any(_has(found, term) for term in table["not_when"].get(lang, table["not_when"]["en"]))


def answer_options(state: ConversationState, turn: int, reply: str, config: SiteConfig, lang: str) -> list[str]:
    """Options for answering the question this turn's reply ended with."""
    record = state.turns.get(turn)
    if record is not None and record.route == "BOOKING" and state.booking.pending_field:
        # The booking flow asked for this field; only a choice has answers to offer.
        field = next((f for f in config.booking.fields if f.name == state.booking.pending_field), None)
        return list(dict.fromkeys(field.choices))[:MAX_CHOICES] if field and field.kind == "choice" else []
    if is_yes_no(last_question(reply), lang):
        yes_no = DATA["yes_no"]["answers"]
        return list(yes_no.get(lang, yes_no["en"]))
    return []
