"""A lead brief without a language model (the no-key default, `BRIEFS_BACKEND=data`): every
required section and a call script filled from the gathered data only, labelled as such.
It quotes the visitor and lists what is known; it infers nothing, so it writes no number
that is not in the data. The templates are in templates/."""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from services.enricher.briefs.document import profile_facts
from shared import events as ev

TEMPLATES = Path(__file__).parent / "templates"
# The interest signals (services/router/data/signals.toml) that say a buyer is close.
BUYING = ("pricing_interest", "demo_interest", "timeline")
SEATS_FIELDS = ("team_size", "seats", "employees")


def _template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text(encoding="utf-8"))


# What the sales rep should ask when the data leaves a fact open.
ASK = {"company": "Which company are they with?", "sector": "Which sector are they in?",
       "what they want to achieve": "What do they want to achieve, and by when?",
       "team size": "How many people would use it?"}


def company(inputs: ev.BriefInputs) -> str:
    """Who the lead works for: what they typed in the form, else enrichment's answer (a guess
    from their network)."""
    typed, known = inputs.form_fields.get("company", "").strip(), inputs.profile.company_name
    return typed or (known if known != ev.UNKNOWN else "company unknown")


def _questions(inputs: ev.BriefInputs) -> list[str]:
    """The visitor's own messages, without those that only answered a form field (an
    e-mail address, a company name)."""
    answers = {v.strip().lower() for v in inputs.form_fields.values()} | {inputs.email.lower()}
    return [m.content.strip() for m in inputs.transcript
            if m.role == "user" and m.content.strip() and m.content.strip().lower() not in answers]


def _unknowns(inputs: ev.BriefInputs, known: dict[str, str]) -> list[str]:
    facts = (("company", company(inputs) != "company unknown"), ("sector", "sector" in known),
             ("what they want to achieve", "job_to_be_done" in known), ("team size", seats(inputs) > 0))
    return [label for label, is_known in facts if not is_known]


def seats(inputs: ev.BriefInputs) -> int:
    """The team size the visitor gave in a form field ("51-200" → 51, "200+" → 200), else 0."""
    for name in SEATS_FIELDS:
        if match := re.search(r"\d+", inputs.form_fields.get(name, "").replace(",", "")):
            return int(match.group(0))
    return 0


def metadata(inputs: ev.BriefInputs) -> ev.BriefMetadata:
    """From the signals alone: priority follows the interest score; the stage, which buying
    signals fired; confidence stays low (no one read the conversation)."""
    on = {name for name, fired in inputs.interest_signals.items() if fired}
    stage = ("ready_to_buy" if {"demo_interest", "pricing_interest"} <= on
             else "evaluating" if on & {*BUYING, "competitor_mentioned"} else "exploring")
    score = min(max(inputs.interest_score, 0.0), 1.0)
    return ev.BriefMetadata(priority=1 + round(9 * score), stage=stage, estimated_seats=seats(inputs), confidence=30)


def brief(inputs: ev.BriefInputs) -> tuple[str, ev.BriefMetadata]:
    known, questions = profile_facts(inputs.profile), _questions(inputs)
    signals = [name.replace("_", " ") for name, on in inputs.interest_signals.items() if on]
    unknowns = _unknowns(inputs, known)
    meta = metadata(inputs)
    text = _template("plain_brief.md").substitute(
        email=inputs.email, company=company(inputs),
        capture_context=(inputs.capture_context or "the conversation").replace("_", " "),
        score=f"{inputs.interest_score:g}", signals=", ".join(signals) or "none",
        profile="\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in known.items()) or "- Nothing known about the company.",
        needs="\n".join(f"- Asked: \"{q}\"" for q in questions[:5]) or "- No question asked.",
        evidence="\n".join([*(f"> {q}" for q in questions[-5:]),
                            *(f"- {k.replace('_', ' ')}: {v}" for k, v in inputs.form_fields.items())])
                 or "No message from the visitor.",
        fit="\n".join(f"- [{s.number}] {s.title} ({s.url})" for s in inputs.sources) or "- No knowledge-base section was retrieved.",
        risks="\n".join(f"- Unknown: {u}." for u in unknowns) or "- None visible in the data.",
        next_steps="- Read the pages they were shown before calling." if inputs.sources else "",
        key_question=ASK[unknowns[0]] if unknowns else "When do they want to decide?",
    )
    return f"{text.strip()}\n", meta


def call_script(inputs: ev.BriefInputs) -> str:
    questions = _questions(inputs)
    known = profile_facts(inputs.profile)
    return _template("plain_call_script.md").substitute(
        topics="; ".join(f"\"{q}\"" for q in questions[:3]) or "the product",
        unknowns=", ".join(_unknowns(inputs, known)) or "nothing",
        talk_points="\n".join(f"- {s.title}: see [{s.number}]." for s in inputs.sources[:3]),
        pages=", ".join(s.title for s in inputs.sources[:3]) or "the site",
    ).strip()
