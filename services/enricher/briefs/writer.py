"""The LLM passes of a lead brief, each a function of the lead data, the model and a recorder
(every call is recorded by the caller's `record`, an `LLMCallRecorded` in the lead's log):

1. `draft`: the brief in markdown with its required sections and a metadata line; sections
   still missing → one focused re-prompt for those only (merged in canonical order); a
   metadata line that does not validate → structured-output extraction from the brief, and
   when that fails too, no metadata (the caller fails the brief: never silent defaults);
   numbers found in no input → flagged, never blocking.
2. `review`: the evaluator's rubric → pass / marginal / fail with its issues (a failed draft
   is written once more with the issues as feedback: lead_briefer.py).
3. `call_script`: the second pass, a talk track, objection handlers and a close.

Prompts are data files in services/enricher/prompts/; the lead data is rendered once
(`render`) and given to every pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable
from pathlib import Path
from string import Template

import msgspec

from services.enricher.briefs import document
from services.enricher.briefs.document import profile_facts, ungrounded_numbers
from shared import events as ev
from shared.llm import LLMClient, Recorder

ROLE = "briefs"
PROMPTS = Path(__file__).parent.parent / "prompts"


class Review(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    verdict: ev.Verdict
    issues: list[str] = []


@dataclass
class Draft:
    text: str  # the brief without its metadata line
    metadata: ev.BriefMetadata | None
    metadata_method: str  # line | structured | none
    metadata_error: str = ""
    repaired_sections: list[str] = field(default_factory=list)
    missing_sections: list[str] = field(default_factory=list)
    ungrounded_numbers: list[str] = field(default_factory=list)


def system(name: str, site_name: str) -> dict:
    text = Template((PROMPTS / f"{name}.md").read_text(encoding="utf-8")).safe_substitute(site_name=site_name)
    return {"role": "system", "content": text.strip()}


def render(inputs: ev.BriefInputs) -> str:
    """The lead data as the model reads it: known facts only, unknown ones left out."""
    profile = profile_facts(inputs.profile)
    lines = [f"Lead e-mail: {inputs.email}", f"Captured during: {inputs.capture_context or 'unknown'}"]
    if inputs.language:
        lines.append(f"Conversation language: {inputs.language}")
    lines.append("Visitor profile: " + (", ".join(f"{k}: {v}" for k, v in profile.items()) or "nothing known"))
    signals = [name for name, on in inputs.interest_signals.items() if on]
    lines.append(f"Interest signals: {', '.join(signals) or 'none'} (score {inputs.interest_score:g})")
    lines.append("Captured form fields: " + (", ".join(f"{k}: {v}" for k, v in inputs.form_fields.items()) or "none"))
    lines.append("\nConversation:")
    lines += [f"{'visitor' if m.role == 'user' else 'assistant'}: {m.content}" for m in inputs.transcript]
    lines.append("\nKnowledge-base sources:")
    lines += [f"[{s.number}] {s.title} ({s.url}): {s.text}" for s in inputs.sources] or ["none"]
    if inputs.similar_leads:
        lines.append("\nSimilar earlier leads of this site:")
        lines += [f"- {lead.summary}" for lead in inputs.similar_leads]
    return "\n".join(lines)


@dataclass
class Written:
    """A sectioned document as the model wrote it (`write`), its metadata found one way or
    another, or not."""

    text: str  # without its metadata line
    metadata: Any
    method: str  # line | structured | none
    error: str  # why the metadata line did not validate ("" when it did)
    repaired: list[str]  # sections the focused re-prompt supplied
    missing: list[str]  # sections still missing after it


async def write(llm: LLMClient, record: Recorder, site_name: str, data: str, feedback: list[str] | None, *,
                noun: str, prompts: tuple[str, str, str], doc, kind: type, about: str) -> Written:
    """A brief or an account report, the same way: the writer's pass on `data` (with a
    reviewer's `feedback` when it is a second try); sections missing → one focused re-prompt
    for those only, merged in canonical order; a metadata line that does not validate →
    structured extraction from the text (`about` names the subject for it), and when that
    fails too, no metadata. `prompts`: the writer's, the sections', the metadata's; `doc`:
    the document module (its `split_metadata`, `missing_sections`, `merge`); `kind`: the
    metadata's type."""
    writer, sections_prompt, metadata_prompt = prompts
    user = data if not feedback else data + f"\n\nReviewer feedback: the previous {noun} was rejected for:\n" + \
        "\n".join(f"- {issue}" for issue in feedback) + f"\nWrite the {noun} again without these problems."
    text = await llm.complete(ROLE, [system(writer, site_name), {"role": "user", "content": user}],
                              record, temperature=0.2)
    body, metadata, error = doc.split_metadata(text)
    missing, repaired = doc.missing_sections(body), []
    if missing:
        ask = f"{data}\n\nThe {noun} so far:\n{body}\n\nWrite only these sections: " + ", ".join(missing) + "."
        addition = await llm.complete(ROLE, [system(sections_prompt, site_name),
                                             {"role": "user", "content": ask}], record, temperature=0)
        body = doc.merge(body, doc.split_metadata(addition)[0])
        still = doc.missing_sections(body)
        repaired, missing = [s for s in missing if s not in still], still
    method = "line"
    if metadata is None:
        try:
            metadata = await llm.structured(ROLE, [
                system(metadata_prompt, site_name),
                {"role": "user", "content": f"{about}\n\n{noun.capitalize()}:\n{body}"}],
                record, kind, temperature=0)
            method = "structured"
        except msgspec.MsgspecError as exc:
            method, error = "none", f"{error}; structured extraction: {exc}"
    return Written(text=body, metadata=metadata, method=method, error=error if method != "line" else "",
                   repaired=repaired, missing=missing)


async def draft(llm: LLMClient, inputs: ev.BriefInputs, record: Recorder, feedback: list[str] | None = None) -> Draft:
    written = await write(llm, record, inputs.site_name, render(inputs), feedback, noun="brief",
                          prompts=("brief_writer", "brief_sections", "brief_metadata"), doc=document,
                          kind=ev.BriefMetadata, about=f"Lead e-mail: {inputs.email}")
    return Draft(text=written.text, metadata=written.metadata, metadata_method=written.method,
                 metadata_error=written.error, repaired_sections=written.repaired, missing_sections=written.missing,
                 ungrounded_numbers=ungrounded_numbers(written.text, inputs))


async def review(llm: LLMClient, inputs: ev.BriefInputs, brief: Draft, record: Recorder) -> Review:
    """The evaluator. Its answer not validating (after the structured call's repair round)
    is a failed review, not a pass."""
    flagged = ", ".join(brief.ungrounded_numbers) or "none"
    user = (f"Lead data:\n{render(inputs)}\n\nThe brief:\n{brief.text}\n\nMetadata: "
            f"{msgspec.json.encode(brief.metadata).decode()}\n\nNumbers in the brief found in no input: {flagged}")
    return await evaluate(llm, record, inputs.site_name, "brief_evaluator", user)


async def evaluate(llm: LLMClient, record: Recorder, site_name: str, prompt: str, user: str) -> Review:
    """The evaluator's rubric (`prompt`) on `user`, a brief's or a report's: an answer that does
    not validate is a failed review, not a pass."""
    try:
        return await llm.structured(ROLE, [system(prompt, site_name), {"role": "user", "content": user}],
                                    record, Review, temperature=0)
    except msgspec.MsgspecError as exc:
        return Review(verdict="fail", issues=[f"the review did not validate: {exc}"])


def coverage(named: list[str], reasons: list[str], wanted: list[str], noun: str, done: str) -> list[str]:
    """What keeps a model's judgement of a batch from being accepted: each of `wanted` judged
    exactly once (`named`, in the reply's order, with its `reasons`), none other, each with a
    reason ("lead x is not classified", "account y is ranked more than once", ...)."""
    found = [f"{noun} {i} is not {done}" for i in wanted if i not in named]
    found += [f"{i} is not one of the {noun}s" for i in dict.fromkeys(named) if i not in wanted]
    found += [f"{noun} {i} is {done} more than once" for i in dict.fromkeys(named) if named.count(i) > 1]
    found += [f"{noun} {i} has no reason" for i, why in zip(named, reasons) if not why.strip()]
    return found


async def validated(llm: LLMClient, record: Recorder, messages: list[dict], cls: type,
                    problems: Callable[[Any], list[str]], what: str, ask: str, invalid: type[Exception]) -> Any:
    """A structured answer (`cls`) that `problems` finds nothing wrong with: one repair round
    naming the problems ("That <what> is not valid: …. <ask>"), then `invalid` raised with
    them. A triage, an opportunity search and a report's edit are checked so."""
    reply = await llm.structured(ROLE, messages, record, cls, temperature=0)
    if wrong := problems(reply):
        messages = [*messages, {"role": "assistant", "content": msgspec.json.encode(reply).decode()},
                    {"role": "user", "content": f"That {what} is not valid: " + "; ".join(wrong) + f". {ask}"}]
        reply = await llm.structured(ROLE, messages, record, cls, temperature=0)
        if wrong := problems(reply):
            raise invalid("; ".join(wrong))
    return reply


async def call_script(llm: LLMClient, inputs: ev.BriefInputs, brief: Draft, record: Recorder) -> str:
    user = f"Lead e-mail: {inputs.email}\n\nThe brief:\n{brief.text}"
    return (await llm.complete(ROLE, [system("call_script", inputs.site_name), {"role": "user", "content": user}],
                               record, temperature=0.3)).strip()
