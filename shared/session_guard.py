"""Per-session in-flight guard, shared through a KV bucket by every gateway replica and
by `concierge erase-visitor`.

A turn holds `site.session` until it ends; a second request meanwhile is refused, and so
is an erase (which holds the key itself while it rewrites the log, refusing turns). The
key carries a TTL, so a process that dies holding it cannot lock a session for ever; and
since a turn's key records when it was taken, a gateway that finds the key held while the
log says the last turn has ended (its gateway died before releasing it) takes it over
(`take_over_ended`) instead of refusing the visitor until the TTL.

A released key leaves a delete marker, which a plain create cannot replace: nats-py's
`create` then reads the key and writes again (three round trips). The guard remembers the
marker its own release left, so the session's next turn on this replica takes the key in
one write expecting that marker (`Nats-Expected-Last-Subject-Sequence`, as KV updates do);
any other case goes the long way.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from nats.js import api
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_OP

from shared import subjects
from shared.bus import WRONG_LAST_SEQUENCE, Bus


TURN = "turn"
REMEMBERED = 10_000  # released keys whose delete marker this guard remembers (the newest)


class SessionGuard:
    def __init__(self, bus: Bus, ttl_s: float):
        self.js = bus.js
        self.kv = bus.bucket(subjects.SESSION_GUARD_BUCKET)
        self.ttl_s = max(1.0, ttl_s)
        self._markers: OrderedDict[str, int] = OrderedDict()  # key → revision of our release's delete marker

    @staticmethod
    def _subject(key: str) -> str:
        return f"$KV.{subjects.SESSION_GUARD_BUCKET}.{key}"

    async def acquire(self, site: str, session_id: str, holder: bytes | None = None) -> int | None:
        """The guard's revision when acquired, None when the session is already held.
        `holder` is what the key holds (a turn's b"turn <unix time>", an erase's b"erasing")."""
        value = holder if holder is not None else f"{TURN} {time.time():.3f}".encode()
        key = subjects.kv_key(site, session_id)
        marker = self._markers.pop(key, None)
        if marker is not None:  # our release was the key's last write, unless someone wrote since
            try:
                ack = await self.js.publish(self._subject(key), value, msg_ttl=self.ttl_s,
                                            headers={api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(marker)})
                return ack.seq
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
        try:
            return await self.kv.create(key, value, msg_ttl=self.ttl_s)
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
        # Only our own hold: after a TTL expiry the key may belong to a newer turn. The delete
        # marker written the way KeyValue.delete writes it, so its revision is known here.
        key = subjects.kv_key(site, session_id)
        try:
            ack = await self.js.publish(self._subject(key), b"", headers={
                KV_OP: KV_DEL, api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(revision)})
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:  # not ours any more: leave it
                raise
            return
        self._markers[key] = ack.seq
        if len(self._markers) > REMEMBERED:
            self._markers.popitem(last=False)
