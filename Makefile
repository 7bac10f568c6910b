# Developer entry points; `.ci/run` uses the same targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv limiter lint generated-check test demo container-setup clean

$(BIN)/dra-gpu: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/dra-gpu

limiter:
	$(MAKE) -C native/limiter

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs --allow-any-generics --no-warn-return-any tests
	$(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs --allow-any-generics --no-warn-return-any bench e2e

generated-check: venv
	$(BIN)/python tools/gen_protos.py --check
	$(BIN)/dra-gpu schema --check
	$(BIN)/dra-gpu manifests --check

# The local image the container tests run in (nothing pulled from a registry).
container-setup: limiter
	@if command -v podman >/dev/null && [ "$$(id -u)" = 0 ]; then tools/container-image.sh; \
	else echo "container tests will be skipped: they need podman and root (see docs/container-tests.md)"; fi

# Sets up everything the tests need, then runs lint, generated-file checks and every test.
test: venv limiter container-setup lint generated-check
	$(BIN)/pytest

# The local demo: simulated GPUs, in-process API, real gRPC sockets and CDI files.
demo: venv
	-$(MAKE) -s -C native/limiter
	$(BIN)/dra-gpu demo

clean:
	rm -rf $(VENV) native/limiter/build
