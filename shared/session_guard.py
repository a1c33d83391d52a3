"""Per-session in-flight guard, shared through a KV bucket by every gateway replica and
by `concierge erase-visitor`.

A turn holds `site.session` until it ends; a second request meanwhile is refused, and so
is an erase (which holds the key itself while it rewrites the log, refusing turns). The
key carries a TTL, so a process that dies holding it cannot lock a session for ever; and
since a turn's key records when it was taken, a gateway that finds the key held while the
log says the last turn has ended (its gateway died before releasing it) takes it over
(`take_over_ended`) instead of refusing the visitor until the TTL.
"""

from __future__ import annotations

import time

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError

from shared import subjects
from shared.bus import WRONG_LAST_SEQUENCE, Bus


TURN = "turn"


class SessionGuard:
    def __init__(self, bus: Bus, ttl_s: float):
        self.kv = bus.bucket(subjects.SESSION_GUARD_BUCKET)
        self.ttl_s = max(1.0, ttl_s)

    async def acquire(self, site: str, session_id: str, holder: bytes | None = None) -> int | None:
        """The guard's revision when acquired, None when the session is already held.
        `holder` is what the key holds (a turn's b"turn <unix time>", an erase's b"erasing")."""
        value = holder if holder is not None else f"{TURN} {time.time():.3f}".encode()
        try:
            return await self.kv.create(subjects.kv_key(site, session_id), value, msg_ttl=self.ttl_s)
        except KeyWrongLastSequenceError:
            return None

    async def take_over_ended(self, site: str, session_id: str, min_age_s: float) -> int | None:
        """Take a turn's key held for at least `min_age_s`: the caller has seen in the log that
        the turn ended, so its holder is gone or done. Never an erase's key. None when the key
        is not such a key, or moved meanwhile (another gateway was quicker)."""
        key = subjects.kv_key(site, session_id)
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return await self.acquire(site, session_id)
        kind, _, taken = (entry.value or b"").decode(errors="replace").partition(" ")
        try:
            age = time.time() - float(taken)
        except ValueError:
            return None
        if kind != TURN or age < min_age_s:
            return None
        try:
            await self.kv.delete(key, last=entry.revision)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return None
            raise
        return await self.acquire(site, session_id)

    async def release(self, site: str, session_id: str, revision: int) -> None:
        # Only our own hold: after a TTL expiry the key may belong to a newer turn.
        try:
            await self.kv.delete(subjects.kv_key(site, session_id), last=revision)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:  # not ours any more: leave it
                raise
