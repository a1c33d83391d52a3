"""A site's triage: which open leads to call first, nurture or disqualify, each with a reason.

The open leads are those whose latest brief completed (shared/briefs.py). With a model:
one call over all of them (compact one-line summaries), validated: every lead classified
exactly once and no other, each with a reason; a reply that is not gets one repair round
with the problems named; still not: the rule ranks them instead, and the stored triage
says why (`TriageCompleted.model_error`). Without a model (`BRIEFS_BACKEND=data`): the rule
over each brief's metadata, its reason saying so.
"""

from __future__ import annotations

import msgspec

from services.enricher.briefs.writer import coverage, system, validated
from shared import events as ev
from shared.llm import LLMClient, Recorder


class TriageReply(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[ev.TriageItem]


class InvalidTriage(Exception):
    """The model's triage did not cover the open leads exactly, even after a repair round."""


def summary_line(brief: ev.BriefCompleted) -> str:
    return f"{brief.session_id}: {brief.summary}"


def by_rule(brief: ev.BriefCompleted) -> ev.TriageItem:
    meta = brief.metadata
    if meta.stage in ("support_only", "not_a_fit"):
        cls, why = "disqualify", f"stage {meta.stage.replace('_', ' ')}"
    elif meta.stage == "ready_to_buy" or meta.priority >= 7:
        cls, why = "call_first", f"priority {meta.priority}, stage {meta.stage.replace('_', ' ')}"
    else:
        cls, why = "nurture", f"priority {meta.priority}, stage {meta.stage.replace('_', ' ')}"
    seats = f", about {meta.estimated_seats} seats" if meta.estimated_seats else ""
    return ev.TriageItem(session_id=brief.session_id, classification=cls, reason=f"{why}{seats} (from the brief's metadata)")


def problems(reply: TriageReply, sessions: list[str]) -> list[str]:
    """What keeps a triage from being accepted: leads missing, unknown or repeated, reasons empty."""
    return coverage([i.session_id for i in reply.items], [i.reason for i in reply.items], sessions, "lead",
                    "classified")


async def with_llm(llm: LLMClient, site_name: str, briefs: list[ev.BriefCompleted], record: Recorder) -> list[ev.TriageItem]:
    sessions = [b.session_id for b in briefs]
    messages = [system("triage", site_name),
                {"role": "user", "content": "Open leads:\n" + "\n".join(summary_line(b) for b in briefs)}]
    reply = await validated(llm, record, messages, TriageReply, lambda r: problems(r, sessions), "triage",
                            "Classify every lead above exactly once.", InvalidTriage)
    return reply.items
