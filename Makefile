# The two commands a user needs: `make bench` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GLOG_v ?= 3

.PHONY: bench test test-quick docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[all]'
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/mindstep bench

# two workers; tests sharing a module fixture carry one xdist_group, so it runs once
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=15

# Only the quick tests, for the edit-run loop.
test-quick: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not slow"

# The docs site in site/ (`mkdocs serve` previews it).
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache
