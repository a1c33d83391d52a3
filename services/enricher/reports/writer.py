"""The LLM passes of an account report (the `briefs` role), each a function of the gathered
inputs, the model and a recorder (every call is an `LLMCallRecorded` in the account's log):

1. `draft`: the report in markdown with its nine sections and a metadata line; sections
   missing → one focused re-prompt for those only (merged in canonical order); a metadata
   line that does not validate → structured-output extraction from the report, and when
   that fails too, no metadata (the caller fails the report: never silent defaults); the
   numeric consistency check (input figures left out; a warning past half).
2. `review`: the evaluator's rubric → pass / marginal / fail with its issues (a failed
   draft is written once more with them as feedback: account_reporter.py).
3. `sales_script`: the second pass, from the report: talk tracks, objection handlers, closing.

Prompts are data files in services/enricher/prompts/ (`report_*.md`, `sales_script.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from services.enricher.briefs.writer import ROLE, Review, evaluate, system, write
from services.enricher.reports import document
from services.enricher.reports.document import number, numeric_check
from shared import events as ev
from shared.llm import LLMClient, Recorder


@dataclass
class Draft:
    text: str  # the report without its metadata line
    metadata: ev.ReportMetadata | None
    metadata_method: str  # line | structured | none
    metadata_error: str = ""
    repaired_sections: list[str] = field(default_factory=list)
    missing_sections: list[str] = field(default_factory=list)
    missing_numbers: list[str] = field(default_factory=list)
    numbers_warning: bool = False


def render(inputs: ev.ReportInputs) -> str:
    """The account and its matched deals as the model reads them."""
    a = inputs.account
    lines = [f"Account: {a.name}" + (f" ({a.domain})" if a.domain else ""),
             f"Tier: {a.tier or 'unknown'}", f"ARR: {number(a.arr)} {a.currency}",
             f"Renewal date: {a.renewal_date or 'unknown'}", f"Today: {inputs.today or 'unknown'}",
             f"Industry: {a.industry or 'unknown'}"]
    if a.employees is not None:
        lines.append(f"Employees: {number(a.employees)}")
    if a.owner:
        lines.append(f"Account manager: {a.owner}")
    if a.notes:
        lines.append(f"Notes: {a.notes}")
    lines.append("\nUsage metrics (metric: current / limit unit):")
    lines += [f"- {m.metric}: {number(m.current)} / {number(m.limit) if m.limit is not None else 'no limit'}"
              f"{(' ' + m.unit) if m.unit else ''}" for m in a.usage] or ["none"]
    if inputs.kept_sections:
        lines.append("\nSections the account manager wrote by hand (kept as written; do not contradict them):")
        lines += [f"### {kept.name}\n{kept.text}" for kept in inputs.kept_sections]
    lines.append("\nHistorical deals (most relevant first):")
    lines += [f"- {m.deal.account} ({m.deal.tier or 'tier unknown'}, {m.deal.date or 'date unknown'}): "
              f"{m.deal.outcome}, {number(m.deal.value)} {m.deal.currency}. {m.deal.summary} {m.deal.lessons}".rstrip()
              for m in inputs.deals] or ["none"]
    return "\n".join(lines)


async def draft(llm: LLMClient, inputs: ev.ReportInputs, record: Recorder, feedback: list[str] | None = None) -> Draft:
    written = await write(llm, record, inputs.site_name, render(inputs), feedback, noun="report",
                          prompts=("report_writer", "report_sections", "report_metadata"), doc=document,
                          kind=ev.ReportMetadata, about=f"Account: {inputs.account.name}")
    text = document.keep(written.text, inputs.kept_sections)
    absent, warning = numeric_check(text, inputs.account)
    return Draft(text=text, metadata=written.metadata, metadata_method=written.method,
                 metadata_error=written.error, repaired_sections=written.repaired, missing_sections=written.missing,
                 missing_numbers=absent, numbers_warning=warning)


async def review(llm: LLMClient, inputs: ev.ReportInputs, report: Draft, record: Recorder) -> Review:
    """The evaluator. Its answer not validating is a failed review, not a pass."""
    absent = ", ".join(report.missing_numbers) or "none"
    user = (f"Account data:\n{render(inputs)}\n\nThe report:\n{report.text}\n\nMetadata: "
            f"{msgspec.json.encode(report.metadata).decode()}\n\nInput figures the report does not state: {absent}")
    return await evaluate(llm, record, inputs.site_name, "report_evaluator", user)


async def sales_script(llm: LLMClient, inputs: ev.ReportInputs, report: Draft, record: Recorder) -> str:
    user = f"Account: {inputs.account.name}\n\nThe report:\n{report.text}"
    return (await llm.complete(ROLE, [system("sales_script", inputs.site_name), {"role": "user", "content": user}],
                               record, temperature=0.3)).strip()
