"""eval_trigger: a site's test cases run again after its knowledge or its config changed.

On a `SyncCompleted` that changed the knowledge base (pages added, replaced or removed), a
`SourceForgotten` (a removed source's pages have left the knowledge base) or a `SiteChanged` (updated), a run of the site's cases is asked for (shared/eval_runs.py), once
the change has settled: triggers are gathered into windows of `EVAL_RUN_DEBOUNCE_S`, and
each is handled when its window has ended (deferred until then: shared/node.py `Later`),
asking for the window's one run (its id derived from the site and the window, so the
second sync of three that ended together asks for the run the first asked for). A site
with no case saved before the change asks for nothing.
"""

from __future__ import annotations

import time

from shared import eval_cases, eval_runs
from shared import events as ev
from shared.node import Context, Inputs, Later, Needs, Node

NAME = "eval_trigger"
SETTLE_S = 1.0  # past the window's end, for triggers stored just before it


def changed(event: ev.Envelope) -> bool:
    if isinstance(event, ev.SyncCompleted):
        return bool(event.added or event.replaced or event.removed)
    if isinstance(event, ev.SiteChanged):
        return event.change == "updated"
    return isinstance(event, ev.SourceForgotten) and event.documents > 0


def make_node(bus, debounce_s: float) -> Node:
    debounce_s = max(debounce_s, 1.0)

    async def trigger(event: ev.Envelope, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        window = int(event.ts // debounce_s)
        due = (window + 1) * debounce_s + SETTLE_S
        if (wait := due - time.time()) > 0:
            raise Later(wait)
        cases = await eval_cases.current(bus, event.site)
        if not any(not retired and saved.ts <= event.ts for saved, retired in cases.values()):
            return []  # no case the change could have broken (those saved since judge the new state)
        reason = "config" if isinstance(event, ev.SiteChanged) else "sync"
        await eval_runs.request(bus, event.site, reason, "system", cause=f"changed:{window}")
        return []

    return Node(NAME, consumes=("sync_completed", "source_forgotten", "site_changed"), handle=trigger,
                needs=Needs(when=changed))
