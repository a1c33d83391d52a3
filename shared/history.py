"""What of a conversation an LLM role is shown: the one place history is cut for a prompt.

Two rules hold for every role:

- A HACK turn's visitor text never reaches a model. A turn counts as HACK when its intent
  is HACK and it was routed to REDIRECT (REDIRECT_HACK, or EXIT mid-booking), or is not
  routed yet; its message is replaced by `WITHHELD` (the fixed reply it got stays, so the
  model still sees that something was refused). The unsure HACK the router sends to the
  booking flow as a field's answer (routing rule 0) is an answer, not an attack.
- History fits the role's token budget (`LLM_HISTORY_TOKENS`, `LLM_<ROLE>_HISTORY_TOKENS`):
  whole turns are dropped, oldest first; the current turn is always kept, even when it
  alone is over the budget (the gateway caps a message at 15,000 characters).

Tokens are approximated as characters / 4, rounded up: close enough for English with
OpenAI-style tokenizers and cheap; the budget is a bound on cost and payload, not an exact
context-window fit.
"""

from __future__ import annotations

from shared.state import ConversationState, Message

WITHHELD = "[message withheld: it was flagged as an attempt to manipulate the assistant]"


def approx_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def hack_turns(state: ConversationState) -> set[int]:
    return {t for t, rec in state.turns.items() if rec.intent == "HACK" and rec.route in (None, "REDIRECT")}


def visible(state: ConversationState, withheld: set[int] | None = None) -> list[Message]:
    """Every message, with the visitor text of `withheld` turns (default: the HACK turns)
    replaced by `WITHHELD`."""
    hidden = hack_turns(state) if withheld is None else withheld
    return [Message(role=m.role, content=WITHHELD, turn=m.turn) if m.role == "user" and m.turn in hidden else m
            for m in state.messages]


def fit(messages: list[Message], turn: int, budget_tokens: int) -> list[Message]:
    """The messages of `turn` and of as many turns before it as the budget holds, newest
    first; what comes after `turn` is left out."""
    messages = [m for m in messages if m.turn <= turn]
    used = sum(approx_tokens(m.content) for m in messages if m.turn == turn)
    per_turn: dict[int, int] = {}
    for m in messages:
        if m.turn < turn:
            per_turn[m.turn] = per_turn.get(m.turn, 0) + approx_tokens(m.content)
    first = turn
    for earlier in sorted(per_turn, reverse=True):
        if used + per_turn[earlier] > budget_tokens:
            break
        used += per_turn[earlier]
        first = earlier
    return [m for m in messages if m.turn >= first]


def window(state: ConversationState, turn: int, budget_tokens: int, withheld: set[int] | None = None) -> list[Message]:
    """What a role may see of the conversation up to `turn`: HACK text withheld, then cut
    to the budget."""
    return fit(visible(state, withheld), turn, budget_tokens)


# Conversation queries: what nodes ask of the folded state about one turn.

def message_of(state: ConversationState, turn: int) -> str:
    """The visitor's message that started `turn` ("" when the state has none)."""
    for m in reversed(state.messages):
        if m.turn == turn and m.role == "user":
            return m.content
    return ""


def previous_message(state: ConversationState, turn: int) -> str:
    """The visitor's message before `turn`; "" when there is none or it was a HACK turn's
    (that text goes to no model and into no query)."""
    earlier = [m for m in state.messages if m.role == "user" and m.turn < turn]
    if not earlier or earlier[-1].turn in hack_turns(state):
        return ""
    return earlier[-1].content


def reply_before(state: ConversationState, turn: int) -> str:
    """The assistant's last message before `turn` ("" when none): what a short message
    answers or follows up on (the router's local intent model reads the two together)."""
    for m in reversed(state.messages):
        if m.role == "assistant" and m.turn < turn:
            return m.content
    return ""


def visitor_turns(state: ConversationState, turn: int) -> int:
    """How many messages the visitor has sent up to and including `turn` (at least 1)."""
    return max(1, sum(1 for m in state.messages if m.role == "user" and m.turn <= turn))


def before(state: ConversationState, turn: int, budget_tokens: int) -> list[dict]:
    """The exchanges before `turn` for an LLM prompt: HACK text withheld, within the budget
    (which the current message counts against; it goes into the prompt on its own)."""
    return [{"role": m.role, "content": m.content} for m in window(state, turn, budget_tokens) if m.turn < turn]
