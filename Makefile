# The two commands: `make demo` (the main job on a fresh machine) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean image

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) demo/run.py

# In parallel: TEST_WORKERS processes (pytest-xdist); the load-heavy tests all go to one of them,
# one at a time (tests/conftest.py, load_heavy). Most tests wait on servers, scrapes and
# subprocesses rather than compute, so there are more workers than this machine's two cores.
TEST_WORKERS ?= 3
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
