"""`concierge prepare`: build, once, what a system's processes would otherwise build at
their start: the ONNX export of the embedding model and the router's trained intent model,
both in the cache directory (CONCIERGE_CACHE_DIR, default ~/.cache/concierge).

Each is built under a file lock by whichever process needs it first, so a cold cache works
without this; but then the first system to start waits for both (about 17 s on a quiet
machine with two cores, a minute and more while three test workers start systems at once),
and its start wait must allow for it. `make test` runs this before any test starts;
`missing()` tells a supervisor what a start would still build (cli/harness/supervisor.py
waits longer for each). The last line printed is one JSON object: what was built, in how
many seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Mapping


def _settings(env: Mapping[str, str]):
    """The embedding settings (model, cache) a process started with `env` reads."""
    from shared.embeddings import EmbeddingSettings

    return EmbeddingSettings(**EmbeddingSettings.where(env))


def missing(env: Mapping[str, str]) -> list[str]:
    """What a process started with `env` would build before it is ready (nothing with a
    remote embeddings endpoint, or once `prepare` has run with the same cache)."""
    from services.router.local_model import LocalIntentModel
    from shared.embeddings import Embedder, onnx_target

    settings = _settings(env)
    if settings.base_url:
        return []
    found = []
    if not onnx_target(settings).exists():
        found.append("the embedding model's ONNX export")
    if not LocalIntentModel.cache_path(Embedder(settings)).exists():
        found.append("the router's intent model")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge prepare", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    from services.router.local_model import LocalIntentModel
    from shared.embeddings import Embedder, EmbeddingSettings

    settings = EmbeddingSettings.from_env()
    built = missing(os.environ)
    figures: dict[str, object] = {"cache_dir": str(Path(settings.cache_dir)), "built": built}
    started = time.monotonic()
    embedder = Embedder(settings).load()
    figures["embedding_model_s"] = round(time.monotonic() - started, 1)
    if not settings.base_url:
        started = time.monotonic()
        LocalIntentModel.load_or_train(embedder)
        figures["intent_model_s"] = round(time.monotonic() - started, 1)
    print(f"prepared in {settings.cache_dir}: {', '.join(built) or 'nothing to build'}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
