"""Subject names and stream/bucket names: the bus's address plan in one place.

    conv.<site>.<session>.<event_type>   stream CONV    the conversation log (one tenant = conv.<site>.>)
    tokens.<site>.<session>.<turn>       stream TOKENS  streamed answer chunks, short retention
    progress.<site>.<session>.<turn>     (no stream)    a node is at work on the turn (the gateway's stall clock)
    briefs.<site>.<session>.<type>       stream BRIEFS  work items (a lead's brief, a site's triage): each
                                                        handled once by one replica, gone once acked
    dlq.<node>                           stream DLQ     events a node could not handle
    replay.request.<op>                  (no stream)    operator reruns, request-reply to `concierge replay serve`
"""

from __future__ import annotations

import re

CONV_STREAM = "CONV"
TOKENS_STREAM = "TOKENS"
DLQ_STREAM = "DLQ"
BRIEFS_STREAM = "BRIEFS"
# What each stream holds.
CONV_SUBJECTS = "conv.>"
TOKENS_SUBJECTS = "tokens.>"
DLQ_SUBJECTS = "dlq.>"
BRIEFS_SUBJECTS = "briefs.>"
# The streams of events nodes consume, by the first token of their subjects.
EVENT_STREAMS = {"conv": CONV_STREAM, "briefs": BRIEFS_STREAM}

SITE_CONFIG_BUCKET = "site_config"
SESSION_GUARD_BUCKET = "session_guards"
SNAPSHOT_BUCKET = "state_snapshots"
LEAD_CLAIM_BUCKET = "lead_claims"
HANDOFF_CLAIM_BUCKET = "handoff_claims"  # who holds a conversation's handoff (services/gateway/handoffs.py)
# Who delivers each handoff request's webhook (services/responder/webhook_claims.py).
HANDOFF_DELIVERY_BUCKET = "handoff_deliveries"
KB_SNAPSHOT_BUCKET = "kb_snapshots"  # object store: each site's knowledge-base snapshot
KB_VECTORS_BUCKET = "kb_vectors"  # vectors of knowledge-base sentences (shared/kb_vectors.py)
INSIGHT_BUCKET = "insight"  # each conversation's insight record (shared/insight.py)
ACCOUNTS_BUCKET = "accounts"  # each site's accounts and historical deals (shared/accounts.py)

# Site and session ids become subject tokens, so they may not contain '.', '*', '>' or spaces.
# `\Z`, not `$`: `$` also matches before a trailing newline, and "demo\n" is not a site.
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def conv(site: str, session_id: str, event_type: str) -> str:
    return f"conv.{site}.{session_id}.{event_type}"


def conversation(site: str, session_id: str) -> str:
    return f"conv.{site}.{session_id}.>"


def conversation_of(subject: str) -> tuple[str, str] | None:
    """(site, session) of a conversation event's subject `conv.<site>.<session>.<type>`, or None."""
    parts = subject.split(".", 3)
    return (parts[1], parts[2]) if len(parts) == 4 and parts[0] == "conv" else None


def in_conversation(subject: str, site: str, session_id: str) -> bool:
    """Whether `subject` is one of this conversation's event subjects."""
    return subject.startswith(f"conv.{site}.{session_id}.")


def matches(filter_subject: str, subject: str) -> bool:
    """Whether `filter_subject` names `subject`, with NATS's wildcards (`*` one token, `>`
    one or more at the end)."""
    wanted, tokens = filter_subject.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(wanted) == len(tokens)


def conv_of_type(event_type: str, site: str = "*") -> str:
    """Every conversation's events of one type (what a node consumes), or one site's."""
    return f"conv.{site}.*.{event_type}"


def of_type(stream: str, event_type: str) -> str:
    """Every event of one type on a stream nodes consume (CONV or BRIEFS)."""
    prefix = next(p for p, name in EVENT_STREAMS.items() if name == stream)
    return f"{prefix}.*.*.{event_type}"


def work(site: str, session_id: str, event_type: str) -> str:
    """A work item on the BRIEFS work queue."""
    return f"briefs.{site}.{session_id}.{event_type}"


def tokens(site: str, session_id: str, turn: int) -> str:
    return f"tokens.{site}.{session_id}.{turn}"


def progress(site: str, session_id: str, turn: int) -> str:
    """Where a node handling an event of the turn says it is still at work (plain NATS, never
    stored): the gateway's stall clock (services/gateway/relay.py) runs only while nobody does."""
    return f"progress.{site}.{session_id}.{turn}"


def session_tokens(site: str, session_id: str) -> str:
    """Every turn's tokens of one conversation."""
    return f"tokens.{site}.{session_id}.>"


def dlq(node: str) -> str:
    return f"dlq.{node}"


REPLAY_OPS = ("rerun", "diff", "fork", "verify")


def replay_request(op: str) -> str:
    """Where the operator API asks `concierge replay serve` (request-reply, queue group
    `replay`) to rerun, diff, fork or verify."""
    if op not in REPLAY_OPS:
        raise ValueError(f"unknown replay operation {op!r}")
    return f"replay.request.{op}"


def kv_key(site: str, session_id: str) -> str:
    return f"{site}.{session_id}"


def envelope_mismatch(subject: str, site: str, session_id: str, event_type: str, turn: int) -> str | None:
    """Why an event's envelope disagrees with the subject it was stored or delivered on, or
    None when it agrees. The subject is what NATS permissions and stream filters saw; a
    body that names another site, session, type (or, on `tokens.*`, turn) was crafted or
    misrouted, and trusting it would let one publish write into another conversation."""
    # The common case first: the subject is exactly the one the envelope names (every event
    # a reader folds is checked, so the common case must not pay for the full comparison's
    # set-up). Four tokens, so a name with a dot in it never agrees.
    prefix, _, rest = subject.partition(".")
    if subject.count(".") == 3 and (
            rest == f"{site}.{session_id}.{event_type}" if prefix in EVENT_STREAMS
            else prefix == "tokens" and rest == f"{site}.{session_id}.{turn}"):
        return None
    parts = subject.split(".")
    if len(parts) == 4 and parts[0] in EVENT_STREAMS:
        expected = {"site": parts[1], "session_id": parts[2], "type": parts[3]}
    elif len(parts) == 4 and parts[0] == "tokens":
        expected = {"site": parts[1], "session_id": parts[2], "turn": parts[3]}
    else:
        return f"{subject!r} is not a conversation, work or token subject"
    got = {"site": site, "session_id": session_id, "type": event_type, "turn": str(turn)}
    wrong = [f"{k} {got[k]!r} != {v!r}" for k, v in expected.items() if got[k] != v]
    return f"envelope disagrees with subject {subject}: " + ", ".join(wrong) if wrong else None
