"""Subject names and stream/bucket names: the bus's address plan in one place.

    conv.<site>.<session>.<event_type>   stream CONV    the conversation log (one tenant = conv.<site>.>)
    tokens.<site>.<session>.<turn>       stream TOKENS  streamed answer chunks, short retention
    dlq.<node>                           stream DLQ     events a node could not handle
"""

from __future__ import annotations

import re

CONV_STREAM = "CONV"
TOKENS_STREAM = "TOKENS"
DLQ_STREAM = "DLQ"

SITE_CONFIG_BUCKET = "site_config"
SESSION_GUARD_BUCKET = "session_guards"
SNAPSHOT_BUCKET = "state_snapshots"
LEAD_CLAIM_BUCKET = "lead_claims"

# Site and session ids become subject tokens, so they may not contain '.', '*', '>' or spaces.
# `\Z`, not `$`: `$` also matches before a trailing newline, and "demo\n" is not a site.
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def conv(site: str, session_id: str, event_type: str) -> str:
    return f"conv.{site}.{session_id}.{event_type}"


def conversation(site: str, session_id: str) -> str:
    return f"conv.{site}.{session_id}.>"


def conv_of_type(event_type: str) -> str:
    """Every conversation's events of one type: what a node consumes."""
    return f"conv.*.*.{event_type}"


def tokens(site: str, session_id: str, turn: int) -> str:
    return f"tokens.{site}.{session_id}.{turn}"


def dlq(node: str) -> str:
    return f"dlq.{node}"


def kv_key(site: str, session_id: str) -> str:
    return f"{site}.{session_id}"
