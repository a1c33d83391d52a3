"""What each recorded turn ran under, and what its rerun runs under.

A turn ran under LLM roles (which had an endpoint, and the settings that shape their
prompts), an answer backend and a site config. Its events say which:

- the LLM roles: the outputs that record them (`llm_roles` on the router's
  `IntentClassified`, the enricher's `ProfileInferred`, the responder's `ResponseCompleted`,
  each as its process had them). A role none of them names (a turn recorded before they did)
  is read from the turn's LLM calls: called, it had an endpoint (its JSON mode from the
  calls' response format, its history budget this deployment's); never called, none.
- the answer backend: the answer's `ResponseCompleted.backend` (llm or extractive); in a
  turn without an answer, by whether the answer role had an endpoint.
- the site config: the version its nodes' outputs record (`config_version`; each node is
  handed the version it recorded, sandbox.py, and a node with no record the turn's last).

By default a turn is re-run under what it ran under (`Setup`): a role without an endpoint
then has none in the rerun (its node takes the path without a model), one with an endpoint
is answered from the recording, the site config is the recorded version. With `current`,
every turn runs under this deployment's LLM roles and answer backend and the site's config
now (as a turn the recording does not have always does: a fork's new message). A turn that
cannot be re-run that way is copied as recorded and reported, not compared
(`NotRerunnable`): its site config version is no longer stored, or (found while it runs) a
role that had no endpoint then is called now and no call was recorded to answer it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import msgspec

from cli.replay.recorded_llm import RECORDED
from cli.replay.sandbox import Recording
from services.responder.answer_writer import NAME as ANSWER_WRITER
from shared import events as ev
from shared.config import LLM_ROLES, LLMRoleConfig
from shared.site_config import SiteConfig

ROLE_RECORDS = (ev.IntentClassified, ev.ProfileInferred, ev.ResponseCompleted)  # the outputs with `llm_roles`
JSON_MODES = ("json_schema", "json_object")


@dataclass(frozen=True)
class Recorded:
    """What a turn's events say it ran under."""

    roles: dict[str, ev.LLMRole]  # every role; an empty model: no endpoint
    answer_backend: str  # llm | extractive; "": the turn has no answer
    config_version: str  # "": no node output records one


@dataclass(frozen=True)
class Setup:
    """How a turn is re-run."""

    roles: dict[str, LLMRoleConfig]  # every role; one with an endpoint (`base_url`) is answered from the recording
    answer_backend: str  # "": the replaying process's (ANSWER_BACKEND, else by the answer role)
    config: SiteConfig
    keyless: frozenset[str]  # the roles that had no endpoint when the turn was recorded


@dataclass(frozen=True)
class NotRerunnable:
    reason: str


def recorded(events: list[ev.Envelope], deployment: dict[str, LLMRoleConfig]) -> Recorded:
    """What one turn's events (`events`, in log order) say it ran under; `deployment`: this
    deployment's roles, for what an older record does not say."""
    named: dict[str, ev.LLMRole] = {}
    for event in events:
        if isinstance(event, ROLE_RECORDS):
            for role, record in event.llm_roles.items():
                if record.model or role not in named:  # two processes disagreeing: the one with an endpoint
                    named[role] = record
    calls: dict[str, list[ev.LLMCall]] = defaultdict(list)
    for event in events:
        if isinstance(event, ev.LLMCallRecorded):
            calls[event.call.role].append(event.call)
    roles = {role: named[role] if role in named else _from_calls(calls[role], deployment[role]) for role in LLM_ROLES}
    answer = next((e.backend for e in events if isinstance(e, ev.ResponseCompleted) and e.node == ANSWER_WRITER), "")
    version = next((e.config_version for e in reversed(events) if e.config_version), "")
    return Recorded(roles=roles, answer_backend=answer, config_version=version)


def _from_calls(calls: list[ev.LLMCall], now: LLMRoleConfig) -> ev.LLMRole:
    """A role no output of the turn names: it had an endpoint when it was called."""
    if not calls:
        return ev.LLMRole()
    formats = [c.params["response_format"].get("type") for c in calls
               if isinstance(c.params.get("response_format"), dict)]
    json_mode = next((f for f in formats if f in JSON_MODES), now.json_mode)
    return ev.LLMRole(model=calls[0].model, history_tokens=now.history_tokens, json_mode=json_mode)


class Plan:
    """Each turn of a recording, set up for its rerun (`setup`), or why it cannot be."""

    def __init__(self, recording: Recording, deployment: dict[str, LLMRoleConfig], config: SiteConfig,
                 stored: dict[str, SiteConfig], current: bool = False):
        """`deployment`: this deployment's LLM roles; `config`: the site's config now;
        `stored`: the site's configs still stored, by version; `current`: every turn under
        the deployment's roles and `config`."""
        self.deployment, self.config, self.current = deployment, config, current
        self.stored = {**stored, config.version: config}
        by_turn: dict[int, list[ev.Envelope]] = defaultdict(list)
        for record in recording.records:
            by_turn[record.event.turn].append(record.event)
        self.recorded = {turn: recorded(events, deployment) for turn, events in by_turn.items()}

    def setup(self, turn: int) -> Setup | NotRerunnable:
        record = self.recorded.get(turn)
        if record is None:  # not in the recording: nothing to be faithful to
            return Setup(self.deployment, "", self.config, frozenset())
        keyless = frozenset(role for role, r in record.roles.items() if not r.model)
        if self.current:
            return Setup(self.deployment, "", self.config, keyless)
        version = record.config_version
        config = self.stored.get(version) if version else self.config
        if config is None:
            return NotRerunnable(f"recorded under site config {version}, which is no longer stored (the site's is "
                                 f"{self.config.version or 'the defaults'} now); --current-config reruns it under that")
        roles = {role: msgspec.structs.replace(self.deployment[role], base_url=RECORDED if r.model else "",
                                               model=r.model, history_tokens=r.history_tokens, json_mode=r.json_mode)
                 for role, r in record.roles.items()}
        answer = record.answer_backend or ("llm" if record.roles["answer"].model else "extractive")
        return Setup(roles, answer, config, keyless)


def unanswerable_reason(role: str) -> str:
    return (f"the {role} role has an endpoint now but had none when the turn was recorded: "
            f"no recorded call to answer it from")
