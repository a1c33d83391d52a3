"""The gateway's routes, a router a module; create_app includes `ROUTERS`.

| module | paths | who |
|---|---|---|
| chat.py | `POST /v1/chat` | visitors |
| visitor.py | `GET /v1/sites/{site}/widget` | anyone (the site's origins) |
| visitor.py | `GET /v1/sites/{site}/conversations/{session_id}`, its `/live` channel and its turns' `/stream` | the conversation's token |
| feedback.py | `POST /v1/sites/{site}/conversations/{session_id}/turns/{turn}/feedback` | the conversation's token |
| console.py | `/v1/admin/session` (sign in, who, sign out) | a key once, then the console's cookie |
| operator.py | `/v1/admin/sites/{site}` and everything under it: sites.py, conversations.py, replay.py, briefs.py, sources.py, insight.py, handoffs.py, accounts.py | operators |
| health.py | `/healthz`, `/readyz` | anyone (probes) |
| pages.py | `/`, `/widget.js`, `/admin` (files) | anyone |

Routes find what they use on `request.app.state` (app.py's lifespan) or through FastAPI
dependencies (access.py), never in a closure.
"""

from services.gateway.routes import chat, console, feedback, health, operator, pages, visitor

ROUTERS = (chat.router, visitor.router, feedback.router, console.router, operator.router, health.router, pages.router)
