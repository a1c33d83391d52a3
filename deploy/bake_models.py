"""Build-time step of the container image (Dockerfile): fill CONCIERGE_CACHE_DIR with what
the services would otherwise make on their first start, so the image runs without torch
and on a read-only root filesystem.

    CONCIERGE_CACHE_DIR=/opt/concierge/cache python deploy/bake_models.py

For both settings of EMBEDDINGS_QUANTIZE (int8, the default, and float32): MiniLM exported
to ONNX (shared/embeddings.py; needs torch, which only the build stage has) and the
router's intent model trained on those embeddings (services/router/local_model.py).
"""

from __future__ import annotations

import msgspec

from services.router.local_model import LocalIntentModel
from shared.embeddings import Embedder, EmbeddingSettings, onnx_path


def main() -> None:
    for quantize in (True, False):
        settings = msgspec.structs.replace(EmbeddingSettings.from_env(), quantize=quantize)
        print(f"EMBEDDINGS_QUANTIZE={int(quantize)}: {onnx_path(settings)}", flush=True)
        LocalIntentModel.load_or_train(Embedder(settings).load())


if __name__ == "__main__":
    main()
