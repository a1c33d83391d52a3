"""The conversation store over a log held in memory: a replay's sandbox (cli/replay), a node's
decision tested alone (tests/helpers.py `decide`). Nothing arrives live: a wait gets what the
log holds, a route is one the log has decided already.
"""

from __future__ import annotations

from typing import Callable

from shared import briefs, subjects
from shared.accounts import Portfolio
from shared import events as ev
from shared.bus import Position
from shared.state import ConversationState, Record, fold
from shared.store.routes import LoggedRoute, Route


class MemoryStore:
    """`records()`: the log as it is now. `given`: the state a handler is handed, when it is not
    the fold of the whole log (a replay hands each node the state its original saw)."""

    def __init__(self, records: Callable[[], list[Record]], given: ConversationState | None = None,
                 portfolio: Portfolio | None = None):
        self._records, self._given = records, given
        self._portfolio = portfolio or Portfolio()

    def _of(self, filter_subject: str) -> list[Record]:
        return [r for r in self._records() if subjects.matches(filter_subject, r.subject)]

    async def state(self, site: str, session_id: str, at: Position | None = None, turn: int = 0) -> ConversationState:
        if self._given is not None:
            return self._given
        state = fold(self._of(subjects.conversation(site, session_id)))
        if not state.site:
            state.site, state.session_id = site, session_id
        return state

    async def turn_state(self, event: ev.Envelope, wanted: set[str], timeout_s: float,
                         at: Position | None = None) -> ConversationState:
        return await self.state(event.site, event.session_id, at, event.turn)

    async def events(self, site: str, session_id: str, kind: str, at: Position | None = None) -> list[ev.Envelope]:
        return [r.event for r in self._of(subjects.conv(site, session_id, kind))]

    async def latest(self, site: str, session_id: str, kind: str, at: Position | None = None) -> ev.Envelope | None:
        found = await self.events(site, session_id, kind, at)
        return found[-1] if found else None

    async def open_briefs(self, site: str) -> list[ev.BriefCompleted]:
        captures = briefs.first_captures(self._of(subjects.conv_of_type("lead_captured", site)))
        outcomes = briefs.latest_outcomes([*self._of(subjects.conv(site, "*", "brief_completed")),
                                           *self._of(subjects.conv(site, "*", "brief_failed"))])
        return briefs.latest_open(captures, outcomes)

    async def portfolio(self, site: str, account_id: str) -> tuple[ev.Account | None, list[ev.Deal]]:
        """The portfolio given (a test's): accounts and deals of no site in particular."""
        found = next((a for a in self._portfolio.accounts if a.id == account_id), None)
        return found, list(self._portfolio.deals)

    async def accounts(self, site: str) -> list[ev.Account]:
        return list(self._portfolio.accounts)

    async def route(self, event: ev.Envelope, at: Position | None = None) -> Route:
        return LoggedRoute(event, [r.event for r in self._of(subjects.conv(event.site, event.session_id,
                                                                             "route_decided"))])

    def kb_vectors(self):
        return None  # no key-value bucket: what a handler would cache there it computes itself
