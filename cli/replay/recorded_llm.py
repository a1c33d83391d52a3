"""An LLM client that answers from a conversation's recorded calls and never calls a model.

A rerun hands nodes this instead of the real client: every call is matched to a recorded
`LLMCallRecorded` of the same role whose request (the messages, and the response format of
a structured call) is the same, each recording used once, in order (`RecordedCalls`, one
per rerun, shared by the clients of its turns). A call with no such recording is raised as
an `LLMError` (the node fails or falls back as it would with a failing provider) and never
sent to a provider: listed in `missing` (a divergence) when its role had an endpoint when
the turn was recorded, in `unanswerable` when it had none (nothing was recorded to answer
from: the turn cannot be re-run as asked, turn_config.py). A role counts as configured when
the rerun's setup of the turn gives it an endpoint, so a node takes the path it took.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any, AsyncIterator

import msgspec

from cli.replay.sandbox import CURRENT_CALL
from shared import events as ev
from shared.config import LLMRoleConfig
from shared.llm import LLMClient, LLMError, Recorder

PIECE = re.compile(r"\S+\s*|\s+")
RECORDED = "recorded://"  # the endpoint of a role answered from the recording


def request_key(role: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    """What identifies a request: its role, messages and output format (not sampling
    settings, so a changed temperature still finds its recording)."""
    return json.dumps([role, messages, params.get("response_format")], sort_keys=True, default=str)


class RecordedCalls:
    """A conversation's recorded calls by request, each used once, and the requests none answered."""

    def __init__(self, calls: list[ev.LLMCall]):
        self._by_request: dict[str, list[ev.LLMCall]] = defaultdict(list)
        for call in calls:
            self._by_request[request_key(call.role, call.messages, call.params)].append(call)
        self.missing: list[dict[str, Any]] = []  # {turn, node, role, last_message}: the rerun diverged
        self.unanswerable: list[dict[str, Any]] = []  # the same, for roles that had no endpoint then

    def take(self, role: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> ev.LLMCall | None:
        queue = self._by_request.get(request_key(role, messages, params))
        return queue.pop(0) if queue else None


class RecordedLLM(LLMClient):
    def __init__(self, calls: RecordedCalls, roles: dict[str, LLMRoleConfig], keyless: frozenset[str] = frozenset()):
        """`roles`: every role of the rerun's turn with the settings that shape its prompts
        (history budget, JSON mode); one with an endpoint (`base_url`) is answered from
        `calls`. `keyless`: the roles that had no endpoint when the turn was recorded."""
        super().__init__({role: msgspec.structs.replace(config, base_url=RECORDED) if config.base_url else config
                          for role, config in roles.items()})
        self.calls, self.keyless = calls, keyless

    async def stream(self, role: str, messages: list[dict[str, Any]], record: Recorder, *, _whole: bool = False,
                     **params: Any) -> AsyncIterator[str]:
        call = self.calls.take(role, messages, params)
        if call is None:
            node, turn = CURRENT_CALL.get()
            unmatched = {"turn": turn, "node": node, "role": role,
                         "last_message": str(messages[-1].get("content", ""))[:300] if messages else ""}
            if role in self.keyless:
                self.calls.unanswerable.append(unmatched)
                raise LLMError(f"the {role} role had no endpoint when this turn was recorded: no call to answer from")
            self.calls.missing.append(unmatched)
            raise LLMError(f"no recorded {role} call matches this request (the rerun diverged before it)")
        await record(ev.LLMCall(role=role, model=call.model, base_url=call.base_url, messages=messages, params=params,
                                response_text=call.response_text, usage=dict(call.usage), attempts=call.attempts,
                                error=call.error, fallback_used=call.fallback_used, served_model=call.served_model,
                                system_fingerprint=call.system_fingerprint))
        if call.error and not call.response_text:
            raise LLMError(f"recorded failure: {call.error}")
        if _whole:
            yield call.response_text
            return
        for piece in PIECE.findall(call.response_text):
            yield piece
