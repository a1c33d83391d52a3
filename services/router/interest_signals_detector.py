"""interest_signals_detector: this turn's buying signals and the cumulative interest score.

Local backend: the signal rules on the message (signals.py). LLM backend
(`ROUTER_SIGNALS_BACKEND=llm`): the classifier role says which signals it sees, the local
rules when its answer is unusable."""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.router import signals as sig
from services.router.runtime import RouterParts
from shared import events as ev
from shared import history
from shared.node import Context, Inputs, Needs, Node

NAME = "interest_signals_detector"
PROMPT = Path(__file__).parent / "prompts" / "interest_signals.md"


def make_node(parts: RouterParts) -> Node:
    async def detect(event: ev.TurnRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state = inputs.state
        previous = state.interest.score if state.interest.turn < event.turn else 0.0
        out = await parts.ask_llm(parts.signals_backend, PROMPT, event.site, inputs.config, state, event.turn,
                                  event.message, sig.SignalsOutput, ctx.record_llm)
        if out is not None:
            found, classifier = msgspec.structs.asdict(out), "llm"
        else:
            found = await parts.local_signals(event.message, history.visitor_turns(state, event.turn),
                                              history.reply_before(state, event.turn))
            classifier = "local"
        this_turn = sig.turn_score(parts.rules, found)
        return [ctx.follow(ev.InterestSignalsDetected, signals=found, turn_score=this_turn,
                           score=sig.cumulative(previous, this_turn), classifier=classifier)]

    return Node(name=NAME, consumes=("turn_requested",), handle=detect, needs=Needs(state=True, config=True))
