# The two commands: `make demo` (the main job on a fresh machine) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) demo/run.py

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check diagnoser tests bench demo
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/diagnose.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist *.egg-info
