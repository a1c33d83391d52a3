"""The operator API: everything an operator reads or does, under one prefix,
`/v1/admin/sites/{site}[/…]`, behind one check for all of it (`access.operator_of_site`: a
bearer token, ADMIN_TOKEN or the site's API key; 401 without, 404 for another site's key,
as if the site had nothing). cors.py serves the visitor prefixes only, so no page can
read this API from a browser. What is under the prefix:

- the site itself: its config, versions and keys (sites.py);
- the site's conversations, their event logs and states (conversations.py);
- rerun, diff, fork and verify, by the replay worker (replay.py);
- the lead briefs and the triage (briefs.py);
- the knowledge sources: websites, uploads, text snippets and their sync runs (sources.py);
- the site's insight: figures, knowledge gaps, exports and curated answers (insight.py);
- the handoffs to a person: waiting and held conversations, claims, messages (handoffs.py);
- the site's existing customers: accounts and historical deals, imported or pulled (accounts.py);
- the site's own test cases: a visitor's message and what should have happened (evals.py).

The operator UI (`/admin`, pages.py) is a static page over this API.
"""

from fastapi import APIRouter, Depends

from services.gateway.access import operator_of_site
from services.gateway.openapi import OPERATOR_PREFIX, OPERATOR_RESPONSES
from services.gateway.routes import accounts, briefs, conversations, evals, handoffs, insight, replay, sites, sources

router = APIRouter(tags=["operator"], dependencies=[Depends(operator_of_site)], responses=OPERATOR_RESPONSES)
for part in (sites, conversations, replay, briefs, sources, insight, handoffs, accounts, evals):
    # The prefix given here, not the router's own: the site itself is the prefix's path ("").
    router.include_router(part.router, prefix=OPERATOR_PREFIX)
