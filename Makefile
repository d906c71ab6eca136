# The two commands: `make demo` (the main job on a fresh machine) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# Bytecode is cached (__pycache__, ignored by git): with PYTHONDONTWRITEBYTECODE set, as some CI
# images do, every process the suite starts (the CLI, daemons, workers) would compile the whole
# package again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test lint bench clean image

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) demo/run.py

# In parallel: TEST_WORKERS processes (pytest-xdist); the load-heavy tests all go to one of them,
# one at a time, the live beds to another (tests/conftest.py, load_heavy and live_bed), and the
# other three share the rest. Most tests wait on servers, scrapes and subprocesses rather than
# compute (measured: 9 minutes of CPU in 8 minutes of wall time on this machine's two cores with
# four workers), so there are more workers than cores; with four, the two left for everything
# outside the two chains made the suite 8 min warm and 9 min on a fresh clone.
TEST_WORKERS ?= 5
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: setup
	$(VENV)/bin/ruff check diagnoser tests bench demo
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/diagnose.py

# The container image, with docker, podman or buildah (whichever is installed): IMAGE=name:tag,
# BASE_IMAGE=..., BUILDER=podman, BUILD_FLAGS=... are passed on (scripts/build-image.sh).
image:
	@bash scripts/build-image.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist *.egg-info
