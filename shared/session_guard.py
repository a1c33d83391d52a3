"""Per-session in-flight guard, shared through a KV bucket by every gateway replica and
by `concierge erase-visitor`.

A turn holds `site.session` until it ends; a second request meanwhile is refused, and so
is an erase (which holds the key itself while it rewrites the log, refusing turns). The
key carries a TTL, so a process that dies holding it cannot lock a session for ever.
"""

from __future__ import annotations

from nats.js.errors import APIError, KeyWrongLastSequenceError

from shared import subjects
from shared.bus import WRONG_LAST_SEQUENCE, Bus


class SessionGuard:
    def __init__(self, bus: Bus, ttl_s: float):
        self.kv = bus.bucket(subjects.SESSION_GUARD_BUCKET)
        self.ttl_s = max(1.0, ttl_s)

    async def acquire(self, site: str, session_id: str, holder: bytes = b"1") -> int | None:
        """The guard's revision when acquired, None when the session is already held.
        `holder` is what the key holds (a turn's b"1", an erase's b"erasing")."""
        try:
            return await self.kv.create(subjects.kv_key(site, session_id), holder, msg_ttl=self.ttl_s)
        except KeyWrongLastSequenceError:
            return None

    async def release(self, site: str, session_id: str, revision: int) -> None:
        # Only our own hold: after a TTL expiry the key may belong to a newer turn.
        try:
            await self.kv.delete(subjects.kv_key(site, session_id), last=revision)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:  # not ours any more: leave it
                raise
