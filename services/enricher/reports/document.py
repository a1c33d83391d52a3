"""An account report as a document: its nine sections, its metadata line, its figures.

The sections and the merge of a focused re-prompt's answer follow the lead brief's rules
(services/enricher/briefs/document.py: `##` headings matched case-insensitively, numbering
and bold ignored, sub-headings kept with their section), over `REQUIRED_SECTIONS` here. The
metadata is the report's last non-empty line,

    METADATA: {"proposition": "upsell", "success_percent": 65, "priority": 7}

decoded into `ReportMetadata` (a proposition of upsell / negotiation / churn / healthy,
success 0-100, priority 1-10, no other key).

The numeric consistency check (`numeric_check`): every usage metric's current value and
limit is an input figure the report should state; those it leaves out are listed, and
more than half of them missing is a warning (never a block). `ungrounded_numbers` is the
other way round: figures of the report no input holds (the data-only report has none).
"""

from __future__ import annotations

from services.enricher.briefs import document as brief_document
from shared import citations
from shared import events as ev

REQUIRED_SECTIONS = ev.REPORT_SECTIONS
metadata_line = brief_document.metadata_line


def sections(markdown: str) -> dict[str, str]:
    return brief_document.sections(markdown, REQUIRED_SECTIONS)


def missing_sections(markdown: str) -> list[str]:
    return brief_document.missing_sections(markdown, REQUIRED_SECTIONS)


def merge(report: str, addition: str) -> str:
    return brief_document.merge(report, addition, REQUIRED_SECTIONS)


def split(markdown: str) -> tuple[str, list[ev.ReportSection]]:
    """(the text before the first section, the sections the report has in canonical order),
    the metadata line left out: what a completed report stores for its edits."""
    preamble, blocks = brief_document._parse(brief_document._split(markdown)[0], REQUIRED_SECTIONS)
    return preamble, [ev.ReportSection(name=name, text=blocks[name][1]) for name in REQUIRED_SECTIONS if name in blocks]


def replace(markdown: str, changes: dict[str, str]) -> str:
    """The report with these sections' bodies replaced (a section it lacks added in its
    place), everything else as written, its metadata line kept."""
    body, line, _ = brief_document._split(markdown)
    preamble, have = brief_document._parse(body, REQUIRED_SECTIONS)
    parts = [preamble]
    for name in REQUIRED_SECTIONS:
        if name not in have and name not in changes:
            continue
        heading, text = have.get(name, (f"## {name}", ""))
        text = changes.get(name, text)
        parts.append(f"{heading}\n\n{text}" if text else heading)
    parts.append(line)
    return "\n\n".join(part for part in parts if part)


def keep(markdown: str, kept: list[ev.ReportSection]) -> str:
    """The report with the account manager's hand-edited sections as they wrote them."""
    return replace(markdown, {section.name: section.text for section in kept}) if kept else markdown


def split_metadata(text: str) -> tuple[str, ev.ReportMetadata | None, str]:
    return brief_document.split_metadata(text, ev.ReportMetadata)


def number(value: float) -> str:
    """A figure as a report writes it: whole numbers with thousands separators ("12,000"),
    others with at most two decimals ("0.5")."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def input_numbers(account: ev.Account) -> list[str]:
    """The figures the report should state: each metric's current value and limit, each once."""
    out: dict[str, str] = {}
    for metric in account.usage:
        for figure in (metric.current, metric.limit):
            if figure is not None:
                written = number(figure)
                out.setdefault(citations.value(written), written)
    return list(out.values())


def numeric_check(text: str, account: ev.Account) -> tuple[list[str], bool]:
    """(the input figures the report does not state, whether that is more than half of them)."""
    wanted = input_numbers(account)
    found = citations.values(split_metadata(text)[0])
    missing = [figure for figure in wanted if citations.value(figure) not in found]
    return missing, len(missing) * 2 > len(wanted)


def references(inputs: ev.ReportInputs) -> list[str]:
    """Every text of the inputs a figure may come from."""
    account = inputs.account
    out = [inputs.site_name, inputs.today, account.name, account.domain, account.tier, number(account.arr),
           account.currency, account.renewal_date, account.owner, account.industry, account.notes,
           number(account.employees) if account.employees is not None else ""]
    for metric in account.usage:
        out += [metric.metric, metric.unit, number(metric.current),
                number(metric.limit) if metric.limit is not None else ""]
    for matched in inputs.deals:
        deal = matched.deal
        out += [deal.account, deal.tier, deal.outcome, number(deal.value), deal.date, deal.summary, deal.lessons]
    return out


def ungrounded_numbers(text: str, inputs: ev.ReportInputs) -> list[str]:
    """The report's figures no input holds, each once; the metadata line is not audited."""
    return citations.unsupported(split_metadata(text)[0], references(inputs))
