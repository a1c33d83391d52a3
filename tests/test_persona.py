"""Persona tiers: what each weight adds to the prompt, and the temperature."""

from __future__ import annotations

import pytest

from shared import persona
from shared.site_config import Persona

PROFILE = dict(name="Captain Ada", tone="warm and practical", descriptors=["patient", "precise"],
               explanation_approach="start from the visitor's example", signature_phrases=["Let's chart it", "Steady as she goes", "Aye"],
               vocabulary=["route", "crew"], style_markers=["short sentences"], summary="A retired ship captain who loves logistics.")


@pytest.mark.parametrize("weight,tier,present,absent", [
    (0.0, "none", [], ["Persona"]),
    (0.19, "none", [], ["Persona"]),
    (0.2, "subtle reference", ["Subtly reference Captain Ada", "warm and practical"], ["patient", "Let's chart it"]),
    (0.5, "tone", ["Adopt Captain Ada's tone", "patient, precise", "visitor's example"], ["Let's chart it", "crew"]),
    (0.6, "voice", ["Channel Captain Ada's voice", "Let's chart it"], ["Steady as she goes", "crew"]),
    (0.79, "voice", ["Let's chart it", "Steady as she goes"], ["crew"]),
    (0.85, "full voice", ["Speak in Captain Ada's voice", "route, crew", "short sentences"], ["retired ship captain"]),
    (0.95, "full embodiment", ["Fully embody Captain Ada", "retired ship captain"], []),
])
def test_each_tier_adds_more_of_the_profile(weight, tier, present, absent):
    p = Persona(weight=weight, **PROFILE)
    text = persona.block(p)
    assert persona.tier(p) == tier
    for needle in present:
        assert needle in text
    for needle in absent:
        assert needle not in text


def test_temperature_scales_with_weight_and_falls_back_without_a_profile():
    assert persona.temperature(Persona(weight=0.0, **PROFILE)) == 0.3
    assert persona.temperature(Persona(weight=1.0, **PROFILE)) == 0.5
    assert persona.temperature(Persona(weight=0.5, **PROFILE)) == 0.4
    empty = Persona(weight=0.95)
    assert persona.tier(empty) == "none" and persona.block(empty) == "" and persona.temperature(empty) == 0.3
