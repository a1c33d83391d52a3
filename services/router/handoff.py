"""When a conversation goes to a person (routing.py's HANDOFF rules), from what needs no model:

- `asks_for_person`: phrases in every supported language (shared/language.py's) that ask to
  talk to a human, someone of the team or sales: a rule, not a classifier intent, so it is
  the same in every backend (rule P);
- `unanswered`: how many answers in a row found nothing or were rated down (rule N).
"""

from __future__ import annotations

import re

from shared.state import ConversationState

_PEOPLE = {
    "en": r"(?:a |an |some |the |your |one of your |real |live )*(?:human|person|people|someone|somebody|agent|"
          r"representative|rep|operator|sales(?:person| team| rep)?|team|staff|consultant|advisor|adviser)\b",
    "fr": r"(?:à |a |avec )(?:un |une |l'|le |la |vrai |véritable |quelqu'un|votre )*(?:humain|personne|quelqu'un|"
          r"conseiller|conseillère|agent|opérateur|commercial|équipe|vendeur)",
    "es": r"con (?:un |una |alguien|el |la |su |tu |agente|persona real)*(?:humano|persona|alguien|agente|asesor|"
          r"operador|comercial|vendedor|equipo|ventas)",
    "de": r"mit (?:einem |einer |jemandem|dem |der |ihrem |eurem |echten )*(?:menschen|mensch|person|jemandem|"
          r"mitarbeiter|mitarbeiterin|berater|vertrieb|team|verkäufer)",
    "it": r"con (?:un |una |qualcuno|il |la |un'|vostro |vostra )*(?:umano|persona|qualcuno|operatore|operatrice|"
          r"consulente|commerciale|team|venditore)",
    "pt": r"com (?:um |uma |alguém|o |a |seu |sua )*(?:humano|pessoa|alguém|atendente|agente|consultor|vendedor|"
          r"comercial|equipe|vendas)",
    "nl": r"met (?:een |iemand|de |het |jullie |uw )*(?:mens|persoon|iemand|medewerker|adviseur|verkoper|verkoop|team)",
}
_ASK = {
    "en": r"\b(?:talk|speak|chat|connect me|put me through|get me|transfer me)(?: (?:to|with|through to))? ",
    "fr": r"\b(?:parler|discuter|échanger|mettre en relation|contacter) ",
    "es": r"\b(?:hablar|conversar|comunicarme|contactar) ",
    "it": r"\b(?:parlare|comunicare|mettermi in contatto) ",
    "pt": r"\b(?:falar|conversar) ",
    "nl": r"\b(?:praten|spreken|chatten) ",
}
_PATTERNS = [re.compile(_ASK[lang] + _PEOPLE[lang], re.IGNORECASE) for lang in ("en", "fr", "es", "it", "pt", "nl")]
# German and Dutch put the verb last ("mit einem Menschen sprechen", "met iemand praten").
_PATTERNS.append(re.compile(r"\b" + _PEOPLE["de"] + r"\b.*\b(?:sprechen|reden|chatten|verbunden)", re.IGNORECASE))
_PATTERNS.append(re.compile(r"\b" + _PEOPLE["nl"] + r"\b.*\b(?:praten|spreken|chatten)", re.IGNORECASE))
_PATTERNS.append(re.compile(r"\b(?:human|real person|live agent|humain|humano|mensch|umano)\s*(?:please|pls|"
                            r"s'il vous plaît|por favor|bitte|per favore|alsjeblieft)?\s*[?!.]*\s*$", re.IGNORECASE))


def asks_for_person(message: str) -> bool:
    text = " ".join(message.split())
    return any(p.search(text) for p in _PATTERNS)


def unanswered(state: ConversationState) -> int:
    """The conversation's answers in a row, newest first, that cited nothing (found nothing in
    the knowledge base) or that the visitor rated down; turns routed elsewhere are passed over,
    and nothing before the last handoff request counts (its rule fired already)."""
    count = 0
    for turn in sorted(state.turns, reverse=True):
        if state.handoff.handoffs and turn <= state.handoff.requested_turn:
            break
        record = state.turns[turn]
        if record.status != "completed" or record.route != "ANSWER":
            continue
        cited = any(isinstance(s, dict) and s.get("cited") for s in record.metadata.get("sources") or [])
        if cited and record.rating != "down":
            break
        count += 1
    return count
