"""The sentences of a site's knowledge base as answers quote them: one document's text
cut into whole sentences without Markdown markup, each with its role in a list.

Shared by the responder's extractive answers (services/responder/extractive.py chooses
among them) and by whatever prepares their vectors ahead of the answers (shared/kb_vectors.py:
`concierge ingest`, and the retriever when a source's sync changed the knowledge base): a
sentence must be cut the same way where it is embedded and where it is looked up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from shared import events as ev

SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(«¿¡]?[A-Z0-9À-Ý])")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
BOLD_LINE = re.compile(r"^\s*(\*\*|__)[^*_]+\1\s*:?\s*$")  # a line all bold: a heading in all but name
LIST_MARKER = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
EMPHASIS = re.compile(r"(\*\*|__|\*|`)(?=\S)(.+?)(?<=\S)\1")
ENTITY_PREFIX = re.compile(r"^[^:\n]{1,80} \([^)\n]{1,80}\): ", re.MULTILINE)
WORD = re.compile(r"\w+", re.UNICODE)
FENCE = re.compile(r"^\s*(```|~~~)")
WRAPPED = 60  # a line this long that stops mid-sentence was wrapped: the next goes on with it
MIN_WORDS = 4  # shorter sentences ("Yes.") are joined to the next one
MAX_CHARS = 500  # longer "sentences" are tables or run-on lists, not answers
# Sentences that lean on the one before them (en, fr, de, es).
ANAPHOR = re.compile(r"^(?:it|its|they|their|them|this|these|that|those|he|she|il|elle|ils|elles|cela|ceci|ce|"
                     r"ces|es|sie|dies|diese|dieser|este|esta|esto|estos|estas|ello)\b", re.IGNORECASE)

# The text functions below are pure and see the same knowledge-base sentences turn after
# turn: cached, they cost a lookup instead of being worked out again for every answer.
CACHED_TEXTS = 16384


@dataclass(frozen=True)
class Candidate:
    text: str
    n: int  # the source it is cited to
    position: int  # its place in that source
    title: str = ""  # the source's title ("Integrations — Accounting"): what the sentence is about
    role: str = ""  # "intro" (it introduces a list), "item" (a list's item) or ""


def _clean_line(line: str) -> str:
    if TABLE_RULE.match(line):
        return ""
    line = LIST_MARKER.sub("", line)
    line = LINK.sub(r"\1", line)
    line = EMPHASIS.sub(r"\2", line)
    if line.strip().startswith("|"):
        line = ": ".join(cell.strip() for cell in line.strip().strip("|").split("|") if cell.strip())
    return " ".join(line.split())


def sentences(document: ev.RetrievedDocument) -> list[str]:
    """The document's text as whole sentences, without Markdown markup. A bare "Yes." or
    "No." (it answers a heading's question, not the visitor's) is dropped, another very
    short sentence joined to the next, and one that opens with a pronoun ("It adds…")
    kept with the sentence before it in a chunk (dropped elsewhere), so no sentence is
    quoted without what it refers to."""
    return [text for text, _, _ in _sentences(document.content, document.document_type)]


def units(document: ev.RetrievedDocument) -> list[tuple[str, str]]:
    """`sentences`, each with its role: "intro" for one that introduces a list (it ends with
    a colon), "item" for a list's item, "" otherwise: an intro is never said without its
    items."""
    return [(text, role) for text, role, _ in _sentences(document.content, document.document_type)]


@lru_cache(maxsize=CACHED_TEXTS // 4)
def _sentences(text: str, document_type: str) -> tuple[tuple[str, str, str], ...]:
    """(sentence, role, the section title over it: a heading naming a page's section in
    full, "Pricing — Office users", as the retriever writes the rest of a page it read
    whole; "" under no such heading)."""
    if document_type == "entity":
        text = ENTITY_PREFIX.sub("", text)
    out: list[str] = []
    roles: list[str] = []
    sections: list[str] = []
    section = ""
    for line in _lines(text):
        if HEADING.match(line) or BOLD_LINE.match(line):
            heading = HEADING.sub("", line).strip()
            if " — " in heading:
                section = heading
            continue
        item = bool(LIST_MARKER.match(line)) or line.lstrip().startswith("|")
        line = _clean_line(line)
        pending = ""
        for piece in (p.strip() for p in SENTENCE_END.split(line) if p.strip()):
            if len(WORD.findall(piece)) <= 2 and piece[-1] in ".!" and not pending:
                continue  # "Yes." / "No." / "Not yet."
            piece = f"{pending} {piece}" if pending else piece
            if len(WORD.findall(piece)) < MIN_WORDS:
                pending = piece
                continue
            pending = ""
            if ANAPHOR.match(piece):
                # An entity's or relationship's description strings together sentences from
                # several places, and an excerpt opening with "It adds…" does not say what
                # "it" is: there, such a sentence is left out.
                if out and document_type == "chunk":
                    out[-1] = f"{out[-1]} {piece}"
            else:
                out.append(piece)
                roles.append("item" if item else "")
                sections.append(section)
        if pending and len(WORD.findall(pending)) >= 2:
            out.append(pending)
            roles.append("item" if item else "")
            sections.append(section)
    roles = ["intro" if role == "" and text.rstrip().endswith(":") else role for text, role in zip(out, roles)]
    return tuple((s, role, title) for s, role, title in zip(out, roles, sections) if len(s) <= MAX_CHARS)


def _lines(text: str) -> list[str]:
    """The text's lines with a hard-wrapped paragraph's (or list item's) lines joined: docs
    written in Markdown often wrap at 80 or 120 columns, and a sentence cut at the wrap would
    be quoted in halves ("These updates keep", "your Project on the latest version…"). A line
    goes on the one before when that one stops mid-sentence and is either long enough to have
    been wrapped (`WRAPPED`) or the line opens in lower case; headings, table rows, list
    markers and code are never joined."""
    out: list[str] = []
    joinable = code = False
    for line in text.splitlines():
        if FENCE.match(line):
            code = not code
            out.append(line)
            joinable = False
            continue
        stripped = line.strip()
        # Text a wrapped line may go on (a list item's too): not a heading, a table or code.
        prose = bool(stripped) and not code and not (
            HEADING.match(line) or BOLD_LINE.match(line) or stripped.startswith("|") or TABLE_RULE.match(line))
        if prose and joinable and not LIST_MARKER.match(line) and (len(out[-1]) >= WRAPPED or stripped[0].islower()):
            out[-1] = f"{out[-1].rstrip()} {stripped}"
        else:
            out.append(line)
        joinable = prose and out[-1].rstrip()[-1:] not in ".!?:;"
    return out


def _key(text: str) -> str:
    return " ".join(WORD.findall(text.lower()))


def candidates(documents: list[ev.RetrievedDocument]) -> list[Candidate]:
    """Every sentence of the documents once; a sentence several documents hold is cited to
    the first chunk holding it (else the first document). A sentence's title is its
    document's, or the section's a heading in the document names in full."""
    ordered = sorted(documents, key=lambda d: (d.document_type != "chunk", d.n))
    seen: set[str] = set()
    out: list[Candidate] = []
    for document in ordered:
        for position, (text, role, section) in enumerate(_sentences(document.content, document.document_type)):
            key = _key(text)
            if key and key not in seen:
                seen.add(key)
                out.append(Candidate(text=text, n=document.n, position=position, title=section or document.title,
                                     role=role))
    return out


@lru_cache(maxsize=CACHED_TEXTS)
def masked(text: str, name: str) -> str:
    """The text with the site's name (and its possessive) taken out: "Which company powers
    Tidewise Pay?" compares with sentences about "Pay", not with every sentence saying
    "Tidewise"."""
    if not name.strip():
        return text
    return " ".join(re.sub(rf"(?<!\w){re.escape(name.strip())}(?:['’]s)?(?!\w)", " ", text, flags=re.IGNORECASE).split())
