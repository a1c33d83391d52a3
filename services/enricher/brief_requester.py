"""brief_requester: a captured lead becomes a work item for its brief.

`LeadCaptured` → a `BriefRequested` on the BRIEFS work queue (its id derived from the lead's
event, so a redelivered lead queues nothing twice). The brief itself is written by whichever
replica takes the item (brief_gatherer.py, then lead_briefer.py); operators queue more with
`concierge briefs generate` or the operator API. An erased lead (`concierge erase-visitor`
stores its log again, the e-mail redacted) is nobody to brief: not queued; nor is a lead
whose log holds a step of its brief already (the log stored again after another lead's
erase). A give-up is a `BriefFailed`, never the visitor's turn failing.
"""

from __future__ import annotations

from services.enricher.briefs.failure import brief_failed
from shared import events as ev
from shared import briefs
from shared.node import Context, Inputs, Needs, Node
from shared.privacy import REDACTED

NAME = "brief_requester"


async def request(event: ev.LeadCaptured, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    if await briefs.has_step(ctx.bus, event.site, event.session_id, event.event_id):
        return []  # the lead's log stored again (an erase rewrote it): its brief was asked for long ago
    await ctx.bus.publish_work(ctx.follow(ev.BriefRequested, reason="lead_captured", request_id=event.event_id))
    return []



def make_node() -> Node:
    return Node(name=NAME, consumes=("lead_captured",), handle=request,
                needs=Needs(when=lambda event: event.email != REDACTED), failure=brief_failed)
