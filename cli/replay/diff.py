"""What a turn decided, and how two runs of a conversation differ, turn by turn.

A turn's outcome: its route and intent, the skills applied, the retrieved sources, the
answer's text, the suggestions, the `TurnCompleted` metadata, and which events it stored
(a count per type: nodes run concurrently, so the order of a turn's events is not part of
its outcome). LLM call records and the ids, clocks and attempts of events are left out: a
rerun makes its own; so are a lead's brief events and a site's changes (`ev.OUTSIDE_TURNS`),
written after or beside the turns, by what a replay does not run.

Beside the differences, what each run's nodes decided under (`version_changes`): the site
config's version, the intent model's and the embedding model's, as the events record them.
A rerun under another config or model is not a divergence (it is often the point), but a
reader of the diff needs to know.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared import events as ev

FIELDS = ("route", "intent", "skills", "sources", "answer", "suggestions", "metadata", "events")
NOT_COUNTED = ("llm_call_recorded",)


@dataclass
class Outcome:
    turn: int
    route: str | None = None
    intent: str | None = None
    skills: list[str] | None = None
    sources: list[str] = field(default_factory=list)
    answer: str | None = None
    suggestions: list[str] | None = None
    metadata: dict[str, Any] | None = None
    events: dict[str, int] = field(default_factory=dict)


def outcomes(events: list[ev.Envelope]) -> dict[int, Outcome]:
    """Each turn's outcome, the first stored event of a kind counting (as in the fold)."""
    out: dict[int, Outcome] = {}
    counts: dict[int, Counter] = {}
    for event in events:
        kind = ev.event_type(event)
        if kind in ev.OUTSIDE_TURNS:
            continue
        o = out.setdefault(event.turn, Outcome(turn=event.turn))
        if kind not in NOT_COUNTED:
            counts.setdefault(event.turn, Counter())[kind] += 1
        match event:
            case ev.RouteDecided() if o.route is None:
                o.route, o.intent = event.route, event.intent
            case ev.SkillsApplied() if o.skills is None:
                o.skills = list(event.skills)
            case ev.RetrievalCompleted() if not o.sources:
                o.sources = [d.doc_id or f"{d.document_type}:{d.title}" for d in event.documents]
            case ev.ResponseCompleted() if o.answer is None:
                o.answer = event.text
            case ev.SuggestionsGenerated() if o.suggestions is None:
                o.suggestions = list(event.suggestions)
            case ev.TurnCompleted() if o.metadata is None:
                o.metadata = msgspec.to_builtins(event.metadata)
            case ev.TurnBlocked() if o.route is None:
                o.route = "BLOCKED"
    for turn, o in out.items():
        o.events = dict(sorted(counts.get(turn, Counter()).items()))
    return out


@dataclass
class Difference:
    turn: int
    field: str
    original: Any
    rerun: Any

    def to_builtins(self) -> dict:
        return {"turn": self.turn, "field": self.field, "original": self.original, "rerun": self.rerun}


def diff(original: list[ev.Envelope], rerun: list[ev.Envelope]) -> list[Difference]:
    """Every field of every turn that differs between the two runs."""
    before, after = outcomes(original), outcomes(rerun)
    out = []
    for turn in sorted(set(before) | set(after)):
        a, b = before.get(turn, Outcome(turn)), after.get(turn, Outcome(turn))
        for name in FIELDS:
            if getattr(a, name) != getattr(b, name):
                out.append(Difference(turn, name, getattr(a, name), getattr(b, name)))
    return out


VERSIONED = ("site config", "intent model", "embedding model")


def versions(events: list[ev.Envelope]) -> dict[tuple[str, str], set[str]]:
    """Per (what, node): the versions the node's outputs record (old logs record none)."""
    out: dict[tuple[str, str], set[str]] = {}

    def add(what: str, event: ev.Envelope, version: str) -> None:
        if version:
            out.setdefault((what, event.producer), set()).add(version)

    for event in events:
        add("site config", event, event.config_version)
        match event:
            case ev.IntentClassified():
                add("intent model", event, event.classifier_version)
                add("embedding model", event, event.embedding_version)
            case ev.RetrievalCompleted() | ev.ResponseCompleted():
                add("embedding model", event, event.embedding_version)
    return out


@dataclass
class VersionChange:
    what: str  # site config | intent model | embedding model
    recorded: list[str]
    rerun: list[str]
    nodes: list[str]  # the nodes whose outputs say so

    def to_builtins(self) -> dict:
        return {"what": self.what, "recorded": self.recorded, "rerun": self.rerun, "nodes": self.nodes}


def version_changes(original: list[ev.Envelope], rerun: list[ev.Envelope]) -> list[VersionChange]:
    """What the rerun's nodes decided under that differs from what the original's did,
    node by node (a node copied from the recording keeps its versions), one entry per
    change; nothing where the original recorded no version."""
    before, after = versions(original), versions(rerun)
    changes: dict[tuple[str, tuple, tuple], list[str]] = {}
    for (what, node), was in before.items():
        now = after.get((what, node))
        if now and now != was:
            changes.setdefault((what, tuple(sorted(was)), tuple(sorted(now))), []).append(node)
    return [VersionChange(what, list(was), list(now), sorted(nodes))
            for (what, was, now), nodes in sorted(changes.items(), key=lambda item: VERSIONED.index(item[0][0]))]


def describe_versions(changes: list[VersionChange]) -> str:
    return "\n".join(f"note: the rerun ran under another {c.what}: {', '.join(c.rerun)} "
                     f"(recorded: {', '.join(c.recorded)}; {', '.join(c.nodes)}); not a divergence"
                     for c in changes)


def describe(differences: list[Difference], width: int = 160) -> str:
    """The differences for a person: one block per turn and field."""
    if not differences:
        return "no differences"
    lines = []
    for d in differences:
        lines.append(f"turn {d.turn} {d.field}:")
        lines.append(f"  - original: {_short(d.original, width)}")
        lines.append(f"  + rerun:    {_short(d.rerun, width)}")
    return "\n".join(lines)


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return text if len(text) <= width else text[: width - 1] + "…"
