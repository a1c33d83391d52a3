"""An LLM client that answers from a conversation's recorded calls and never calls a model.

A rerun hands nodes this instead of the real client: every call is matched to a recorded
`LLMCallRecorded` of the same role whose request (the messages, and the response format of
a structured call) is the same, each recording used once, in order. A call with no such
recording is a divergence, raised as an `LLMError` (the node fails or falls back as it would
with a failing provider) and listed in `missing`, never sent to a provider. A role counts as
configured when the conversation recorded calls for it or the deployment configures it, so
a node takes the path it took (and would take in production).
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


def request_key(role: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    """What identifies a request: its role, messages and output format (not sampling
    settings, so a changed temperature still finds its recording)."""
    return json.dumps([role, messages, params.get("response_format")], sort_keys=True, default=str)


class RecordedLLM(LLMClient):
    def __init__(self, calls: list[ev.LLMCall], settings: dict[str, LLMRoleConfig]):
        """`settings`: the deployment's role settings (history budget, JSON mode), which shape
        the prompts as they did there; only the endpoint is replaced."""
        roles = {call.role for call in calls} | {role for role, config in settings.items() if config.base_url}
        super().__init__({role: msgspec.structs.replace(settings[role], base_url="recorded://") for role in roles})
        self._recorded: dict[str, list[ev.LLMCall]] = defaultdict(list)
        for call in calls:
            self._recorded[request_key(call.role, call.messages, call.params)].append(call)
        self.missing: list[dict[str, Any]] = []  # the calls no recording answered
        self.used = 0

    async def stream(self, role: str, messages: list[dict[str, Any]], record: Recorder, *, _whole: bool = False,
                     **params: Any) -> AsyncIterator[str]:
        queue = self._recorded.get(request_key(role, messages, params))
        if not queue:
            node, turn = CURRENT_CALL.get()
            self.missing.append({"turn": turn, "node": node, "role": role,
                                 "last_message": str(messages[-1].get("content", ""))[:300] if messages else ""})
            raise LLMError(f"no recorded {role} call matches this request (the rerun diverged before it)")
        call = queue.pop(0)
        self.used += 1
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
