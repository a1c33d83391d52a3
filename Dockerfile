# One image for every Concierge process: the five services (`python -m services.<name>`),
# `concierge ingest` and the other operator commands. docs/deploy.md says how it is run.
#
#   docker build -t registry.example.com/concierge:0.1.0 .
#
# Build stage: the project and its pinned dependencies in /opt/venv, the CPU build of torch
# (only to export MiniLM to ONNX), then the cache every service would otherwise fill on its
# first start. The runtime stage copies the venv without torch, the code and the cache.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# The CPU build first, as the Makefile does: a plain resolve would pull GBs of CUDA.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml ./
COPY shared ./shared
COPY services ./services
COPY cli ./cli
# `compat`: a plain path entry for /app in the venv, so the runtime stage's copies of
# /opt/venv and /app (same paths) import the code from /app, where prompts are mounted.
RUN pip install --config-settings editable_mode=compat -e .
COPY deploy/bake_models.py ./deploy/bake_models.py
ENV CONCIERGE_CACHE_DIR=/opt/concierge/cache HF_HUB_OFFLINE=1
RUN python deploy/bake_models.py
# Serving runs on onnxruntime: torch and the packages that only export with it leave.
RUN pip uninstall -y torch sentence-transformers \
    && python -m compileall -q /app/shared /app/services /app/cli

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CONCIERGE_CACHE_DIR=/opt/concierge/cache \
    HF_HUB_OFFLINE=1 \
    HOME=/tmp
RUN groupadd --gid 10001 concierge && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin concierge
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY --from=build /opt/concierge/cache /opt/concierge/cache
COPY sites /app/sites
COPY knowledge /app/knowledge
WORKDIR /app
# Root owns every file: the processes (uid 10001) can read, not change, the code and cache.
USER 10001:10001
EXPOSE 8000 9000
CMD ["python", "-m", "services.gateway"]
