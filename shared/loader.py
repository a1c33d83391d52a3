"""Rebuild a conversation's state: the latest KV snapshot plus the log after it.

Snapshots are an optimisation only: `load` gives the same state as folding the whole
log (the property tests hold it to that), and a missing, stale or unreadable snapshot
just means a longer fold.
"""

from __future__ import annotations

import logging

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, BadRequestError

from shared import subjects
from shared.bus import Bus
from shared.events import SCHEMA_VERSION
from shared.state import ConversationState, fold

log = logging.getLogger(__name__)


class Snapshot(msgspec.Struct, kw_only=True):
    schema_version: int
    state: ConversationState


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Snapshot)


async def read_snapshot(bus: Bus, site: str, session_id: str) -> tuple[ConversationState | None, int | None]:
    """The stored snapshot and its KV revision, or (None, None)."""
    try:
        entry = await bus.bucket(subjects.SNAPSHOT_BUCKET).get(subjects.kv_key(site, session_id))
    except KeyNotFoundError:
        return None, None
    if not entry.value:
        return None, entry.revision
    try:
        snap = _decoder.decode(entry.value)
    except msgspec.MsgspecError as exc:
        log.warning("unreadable snapshot ignored", extra={"site": site, "session_id": session_id, "error": str(exc)})
        return None, entry.revision
    if snap.schema_version != SCHEMA_VERSION:
        return None, entry.revision
    return snap.state, entry.revision


async def write_snapshot(bus: Bus, state: ConversationState, revision: int | None) -> bool:
    """Compare-and-set, so a slower writer never replaces a newer snapshot."""
    kv = bus.bucket(subjects.SNAPSHOT_BUCKET)
    key = subjects.kv_key(state.site, state.session_id)
    data = _encoder.encode(Snapshot(schema_version=SCHEMA_VERSION, state=state))
    try:
        if revision is None:
            await kv.create(key, data)
        else:
            await kv.update(key, data, last=revision)
    except (KeyWrongLastSequenceError, BadRequestError):
        return False
    return True


async def load(bus: Bus, site: str, session_id: str, use_snapshot: bool = True) -> ConversationState:
    snapshot, revision = await read_snapshot(bus, site, session_id) if use_snapshot else (None, None)
    after = snapshot.last_seq if snapshot else 0
    tail = await bus.read(subjects.conversation(site, session_id), after_seq=after)
    state = fold(tail, initial=snapshot)
    if not state.site:
        state.site, state.session_id = site, session_id
    if use_snapshot and tail and len(tail) >= bus.config.snapshot_every:
        try:
            await write_snapshot(bus, state, revision)
        except Exception:
            log.exception("snapshot write failed", extra={"site": site, "session_id": session_id})
    return state
