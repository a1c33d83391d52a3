"""lead_triager: a site's open leads → call first / nurture / disqualify, each with a reason.

Takes `TriageRequested` work items (session `TRIAGE_SESSION`) from the BRIEFS work queue,
reads the latest completed brief of each of the site's leads, and stores a `TriageCompleted`
in the site's triage log: one validated model call over all of them (briefs/triage.py), or
without a model the rule over each brief's metadata. A triage the model gets wrong twice
ends in `BriefFailed` on the triage log.
"""

from __future__ import annotations

import msgspec

from services.enricher.briefs import triage
from services.enricher.briefs.failure import brief_failed
from shared import events as ev
from shared import subjects
from shared.llm import LLMClient
from shared.node import Context, Inputs, Needs, Node, PermanentError

NAME = "lead_triager"


def make_node(llm: LLMClient | None) -> Node:
    backend = "llm" if llm is not None else "data"

    async def rank(event: ev.TriageRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        stored = [r.event for r in await ctx.bus.read(subjects.conv_of_type("brief_completed", event.site))]
        leads = triage.open_leads(stored)
        if not leads:
            items = []
        elif llm is None:
            items = [triage.by_rule(brief) for brief in leads]
        else:
            try:
                items = await triage.with_llm(llm, inputs.config.name or event.site, leads, ctx.record_llm)
            except (triage.InvalidTriage, msgspec.MsgspecError) as exc:
                raise PermanentError(f"the model's triage is not valid: {exc}") from exc
        return [ctx.follow(ev.TriageCompleted, request_id=event.request_id, backend=backend, items=items,
                           leads=len(leads))]

    return Node(name=NAME, consumes=("triage_requested",), handle=rank, needs=Needs(config=True),
                stream=subjects.BRIEFS_STREAM, max_in_flight=1,
                failure=lambda event, node, attempts, reason: brief_failed(event, node, attempts, reason, backend))
