"""A lead brief as a document: its sections, its metadata line, its figures. Pure checks of
what a model wrote, so that a draft can be repaired (a focused re-prompt for the missing
sections, merged in) and audited (figures no input holds) before a sales team reads it.

Sections are markdown headings, `#` to `###`, naming one of `REQUIRED_SECTIONS`: the name
is matched case-insensitively, a trailing colon, bold markers and a numbering are ignored
("## Needs", "### needs:", "## **Needs**", "## 3. Needs"). A section's body runs to the next
section's heading. Any other heading, and a second heading naming a section already
started, belongs to the body of the section above it: a writer's sub-headings ("### Must
haves" under Needs) stay with their section, and a merge drops nothing the model wrote.
Text before the first section (a title) is the preamble, kept at the top by a merge.

The metadata is the brief's last non-empty line,

    METADATA: {"priority": 7, "stage": "evaluating", "estimated_seats": 40, "confidence": 60}

possibly wrapped in backticks or alone in a code fence. Decoding it into `BriefMetadata`
is its validation (priority 1-10, a known stage, seats >= 0, confidence 0-100, no other key).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from shared import citations
from shared.events import UNKNOWN, BriefInputs, BriefMetadata, VisitorProfile

REQUIRED_SECTIONS = ("Executive summary", "Situation", "Needs", "Evidence from the conversation",
                     "Product fit", "Risks", "Next steps", "Key question")
CANONICAL = {name.casefold(): name for name in REQUIRED_SECTIONS}
HEADING = re.compile(r"^ {0,3}#{1,3}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
HEADING_NUMBER = re.compile(r"^\d{1,2}[.)]\s*")
METADATA = re.compile(r"^[`\s]*METADATA\s*:(.*)$", re.IGNORECASE)
# A whole-line fence: an opening one may name a language ("```json"); "```METADATA: {}```"
# is a line in backticks, not a fence.
FENCE = re.compile(r"^(?:`{3,}|~{3,})[\w-]*$")


def _section_name(heading: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> str | None:
    canonical = CANONICAL if required is REQUIRED_SECTIONS else {name.casefold(): name for name in required}
    return canonical.get(HEADING_NUMBER.sub("", heading.strip(" *_:")).strip(" *_:").casefold())


def _parse(markdown: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> tuple[str, dict[str, tuple[str, str]]]:
    """(preamble, section name → (its heading line as written, its body))."""
    starts: list[tuple[str, re.Match[str]]] = []
    for match in HEADING.finditer(markdown):
        name = _section_name(match.group(1), required)
        if name and name not in (started for started, _ in starts):
            starts.append((name, match))
    if not starts:
        return markdown.strip(), {}
    blocks = {}
    for i, (name, match) in enumerate(starts):
        end = starts[i + 1][1].start() if i + 1 < len(starts) else len(markdown)
        blocks[name] = (match.group(0).strip(), markdown[match.end():end].strip())
    return markdown[:starts[0][1].start()].strip(), blocks


def _split(text: str) -> tuple[str, str, str | None]:
    """(body, the metadata line or fenced block as written, its JSON); (text, "", None)
    when the last non-empty line holds no metadata."""
    lines = text.rstrip().splitlines()
    start, line = len(lines) - 1, lines[-1].strip() if lines else ""
    if FENCE.match(line):
        opening = next((i for i in range(len(lines) - 2, -1, -1) if FENCE.match(lines[i].strip())), None)
        inside = [l.strip() for l in lines[opening + 1:-1] if l.strip()] if opening is not None else []
        if len(inside) != 1:
            return text, "", None
        start, line = opening, inside[0]
    match = METADATA.match(line)
    if not match:
        return text, "", None
    return "\n".join(lines[:start]).rstrip(), "\n".join(lines[start:]).strip(), match.group(1).strip(" `")


def sections(markdown: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> dict[str, str]:
    """Canonical section name → body, for the required sections the brief has (an empty
    body included), the metadata line left out. `required`: another document's sections
    (an account report's: services/enricher/reports/document.py)."""
    _, blocks = _parse(_split(markdown)[0], required)
    return {name: body for name, (_, body) in blocks.items()}


def missing_sections(markdown: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> list[str]:
    """The required sections the brief lacks or left empty, in canonical order."""
    found = sections(markdown, required)
    return [name for name in required if not found.get(name)]


def merge(brief: str, addition: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> str:
    """The brief with the sections it lacks (or left empty) taken from `addition` (a focused
    re-prompt's answer): its preamble, then every section either has in canonical order,
    the brief's as they were, then the brief's metadata line (the addition's if the brief
    has none). The addition's preamble is dropped ("Here are the missing sections:")."""
    body, line, _ = _split(brief)
    added_body, added_line, _ = _split(addition)
    preamble, have = _parse(body, required)
    _, added = _parse(added_body, required)
    parts = [preamble]
    for name in required:
        heading, text = have.get(name, ("", ""))
        if not text and added.get(name, ("", ""))[1]:
            heading, text = f"## {name}", added[name][1]
        parts.append(f"{heading}\n\n{text}" if text else heading)
    parts.append(line or added_line)
    return "\n\n".join(part for part in parts if part)


def split_metadata(text: str, kind: type = BriefMetadata) -> tuple[str, Any, str]:
    """(the brief without its metadata line, the metadata, why there is none: "" when valid).
    An invalid metadata line is still left out of the body. `kind`: the metadata's type
    (an account report's: `ReportMetadata`)."""
    body, _, payload = _split(text)
    if payload is None:
        # With a JSON object: prose may well start with "Metadata:".
        if any(METADATA.match(line.strip()) and "{" in line for line in text.splitlines()):
            return text, None, "the METADATA line is not the brief's last non-empty line"
        return text, None, "no METADATA line at the end of the brief"
    try:
        return body, msgspec.json.decode(payload, type=kind), ""
    except msgspec.DecodeError as e:  # a ValidationError too: the value is out of its bounds
        return body, None, f"invalid METADATA line: {e}"


def metadata_line(meta: BriefMetadata) -> str:
    return f"METADATA: {msgspec.json.encode(meta).decode()}"


def _references(inputs: BriefInputs) -> list[str]:
    """Every text of the inputs a figure may come from: the interest score in its shortest
    form ("0.72"), a similar lead's priority with its summary (the writer sees both)."""
    return [inputs.site_name, inputs.email, inputs.capture_context, f"{inputs.interest_score:g}",
            *(message.content for message in inputs.transcript),
            *msgspec.structs.astuple(inputs.profile),
            *inputs.form_fields.values(),
            *(text for source in inputs.sources for text in (source.title, source.url, source.text)),
            *(f"{lead.summary} {lead.priority}" for lead in inputs.similar_leads)]


def ungrounded_numbers(text: str, inputs: BriefInputs) -> list[str]:
    """The brief's figures that no input holds, each once, as written in the brief; the
    metadata line is not audited (its figures are the writer's estimates)."""
    return citations.unsupported(split_metadata(text)[0], _references(inputs))


# Enrichment's own bookkeeping (its status, which source answered, the IP's hash): nothing a
# brief should say about the lead.
INTERNAL_PROFILE_FIELDS = ("status", "source", "ip")


def profile_facts(profile: VisitorProfile) -> dict[str, str]:
    """What is known about the lead's company and aims, unknown and internal fields left out."""
    return {k: v for k, v in msgspec.structs.asdict(profile).items()
            if v and v != UNKNOWN and k not in INTERNAL_PROFILE_FIELDS}
