"""What a reply's text says beyond its words: the markers the answer prompt ends a reply
with (data/dialog_markers.toml: 📅 a demo proposed, ✉️ an e-mail asked for...), and whether
the reply ends by asking the visitor something. dialog_state_extractor turns them into the
turn's flags; suggestion_router picks answer options for a reply that asks."""

from __future__ import annotations

import tomllib
from pathlib import Path

MARKERS: dict[str, str] = tomllib.loads((Path(__file__).parent / "data" / "dialog_markers.toml").read_text())["markers"]


def ends_with_question(text: str) -> bool:
    stripped = text.strip()
    for marker in MARKERS:
        stripped = stripped.replace(marker, "")
    return stripped.rstrip().endswith("?")
