"""`concierge replay SITE SESSION`: a conversation's timeline, and its state after each turn.

Reads the conversation log from JetStream (no snapshot: the fold starts from the first
event), prints one line per event — sequence, time, event type, producing node, turn
and the event's key fields — and, after each `TurnCompleted` or `TurnFailed`, the
folded state at that point. `--json` prints the same as JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import msgspec

from shared import events as ev
from shared import subjects
from shared.bus import connect
from shared.config import BusConfig
from shared.state import ConversationState, apply

KEY_FIELDS = {
    "turn_requested": ("message",),
    "route_decided": ("route", "reason", "intent"),
    "intent_classified": ("intent", "confidence", "classifier"),
    "llm_call_recorded": ("call.role", "call.model", "call.latency_ms", "call.attempts", "call.error"),
    "response_completed": ("token_count", "attempt", "fallback_used", "text"),
    "turn_completed": ("metadata",),
    "turn_failed": ("node", "reason", "attempts"),
}


def summarize(event: ev.Envelope, width: int = 80) -> str:
    fields = KEY_FIELDS.get(ev.event_type(event), ())
    parts = []
    for name in fields:
        value = event
        for part in name.split("."):
            value = getattr(value, part)
        name = name.rsplit(".", 1)[-1]
        if isinstance(value, float):
            value = round(value, 1)
        text = value if isinstance(value, str) else json.dumps(msgspec.to_builtins(value), default=str)
        if len(text) > width:
            text = text[: width - 1] + "…"
        parts.append(f"{name}={text}")
    return " ".join(parts)


def state_summary(state: ConversationState) -> dict:
    return {
        "turn": state.turn,
        "turns": {t: r.status for t, r in sorted(state.turns.items())},
        "messages": len(state.messages),
        "hack_count": state.hack_count,
        "spam_count": state.spam_count,
        "llm_calls": state.llm_calls,
        "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        "interest": msgspec.to_builtins(state.interest),
        "form": msgspec.to_builtins(state.form),
        "dialog": msgspec.to_builtins(state.dialog),
    }


async def replay(site: str, session_id: str, config: BusConfig, as_json: bool, out=sys.stdout) -> int:
    bus = await connect(config, name="replay")
    try:
        records = await bus.read(subjects.conversation(site, session_id))
    finally:
        await bus.close()
    if not records:
        print(f"no events for conversation {site}/{session_id}", file=sys.stderr)
        return 1
    state = ConversationState()
    for record in records:
        event = record.event
        apply(state, record)
        kind = ev.event_type(event)
        if as_json:
            out.write(json.dumps({"seq": record.seq, "type": kind, "event": ev.to_builtins(event)}) + "\n")
        else:
            stamp = time.strftime("%H:%M:%S", time.gmtime(event.ts)) + f".{int(event.ts % 1 * 1000):03d}"
            out.write(f"{record.seq:>6}  {stamp}  turn {event.turn:<3} {kind:<26} {event.producer:<16} "
                      f"{summarize(event)}\n")
        if kind in ("turn_completed", "turn_failed"):
            summary = state_summary(state)
            if as_json:
                out.write(json.dumps({"state_after_turn": event.turn, "state": summary}) + "\n")
            else:
                out.write(f"        state after turn {event.turn}: {json.dumps(summary)}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("site")
    parser.add_argument("session_id")
    parser.add_argument("--nats-url", default=None, help="default: $NATS_URL or nats://127.0.0.1:4222")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    args = parser.parse_args(argv)
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    return asyncio.run(replay(args.site, args.session_id, config, args.json))
