"""Persona tiers: a site's persona weight (0.0–1.0) adds progressively more of its persona
profile to the answer's system prompt, and warms the temperature a little.

| weight     | tier             | profile fields added                          |
|------------|------------------|-----------------------------------------------|
| < 0.2      | none             | (no persona block)                            |
| 0.2–0.39   | subtle reference | tone                                          |
| 0.4–0.59   | tone             | + descriptors, explanation approach           |
| 0.6–0.79   | voice            | + signature phrases (more with more weight)   |
| 0.8–0.89   | full voice       | + vocabulary, style markers                   |
| ≥ 0.9      | full embodiment  | + summary                                     |

temperature = 0.3 + 0.2 × weight. A persona with no profile at all (no name, no tone)
falls back to no persona whatever the weight.
"""

from __future__ import annotations

from shared.site_config import Persona

TIERS = ((0.9, "full embodiment", "Fully embody {name}."),
         (0.8, "full voice", "Speak in {name}'s voice."),
         (0.6, "voice", "Channel {name}'s voice."),
         (0.4, "tone", "Adopt {name}'s tone."),
         (0.2, "subtle reference", "Subtly reference {name}'s style."),
         (0.0, "none", ""))


def tier(persona: Persona) -> str:
    if not (persona.name or persona.tone):
        return "none"
    return next(name for floor, name, _ in TIERS if persona.weight >= floor)


def temperature(persona: Persona) -> float:
    weight = persona.weight if tier(persona) != "none" else 0.0
    return round(0.3 + 0.2 * weight, 3)


def block(persona: Persona) -> str:
    """The persona part of the system prompt (empty below 0.2 or without a profile)."""
    current = tier(persona)
    if current == "none":
        return ""
    w = persona.weight
    instruction = next(text for _, name, text in TIERS if name == current).format(name=persona.name or "this persona")
    lines = [instruction]
    if persona.tone:
        lines.append(f"Tone: {persona.tone}.")
    if w >= 0.4:
        if persona.descriptors:
            lines.append("Descriptors: " + ", ".join(persona.descriptors) + ".")
        if persona.explanation_approach:
            lines.append(f"How to explain: {persona.explanation_approach}.")
    if w >= 0.6 and persona.signature_phrases:
        count = max(1, round(len(persona.signature_phrases) * min(1.0, (w - 0.5) / 0.5)))
        lines.append("Signature phrases (use sparingly): " + "; ".join(persona.signature_phrases[:count]) + ".")
    if w >= 0.8:
        if persona.vocabulary:
            lines.append("Vocabulary: " + ", ".join(persona.vocabulary) + ".")
        if persona.style_markers:
            lines.append("Style markers: " + ", ".join(persona.style_markers) + ".")
    if w >= 0.9 and persona.summary:
        lines.append(persona.summary)
    return "\n## Persona\n" + "\n".join(lines) + "\nStay accurate: the persona changes how you say things, never what is true.\n"
