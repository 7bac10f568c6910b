# Developer entry points; `.ci/run` uses the same targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv limiter lint generated-check test demo container-setup clean gpu-check gpu-check-bundle gpu-check-smoke \
	image base-images

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
	$(BIN)/clang-format --dry-run --Werror $$(git ls-files 'native/*.c' 'native/*.h' 2>/dev/null || find native -name '*.[ch]')
	$(BIN)/mypy
	$(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs --allow-any-generics --no-warn-return-any tests --exclude tests/container/
	MYPYPATH=tests $(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs --allow-any-generics --no-warn-return-any tests/container
	MYPYPATH=tests $(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs --allow-any-generics --no-warn-return-any bench e2e
	$(BIN)/mypy gpucheck

generated-check: venv
	$(BIN)/python tools/gen_protos.py --check
	$(BIN)/python tools/architecture.py --check
	$(BIN)/dra-gpu schema --check
	$(BIN)/dra-gpu manifests --check

# The local image the container tests run in (nothing pulled from a registry).
container-setup: limiter
	@if command -v podman >/dev/null && [ "$$(id -u)" = 0 ]; then tools/container-image.sh; \
	else echo "container tests will be skipped: they need podman and root (see docs/container-tests.md)"; fi

# Sets up everything the tests need, then runs lint, generated-file checks and every test.
test: venv limiter container-setup lint generated-check gpu-check-smoke
	$(BIN)/pytest

# The install image (README "Install on a cluster"), with docker, podman or buildah, whichever is there.
# Its reference is image.repository:image.tag of the values (VALUES=file: the same file the manifests
# are rendered from). PUSH=1 pushes it; ARCHIVE=file also saves it for `kind load image-archive`.
image: venv
	tools/build-image.sh $(if $(VALUES),--values $(VALUES)) $(if $(PUSH),--push) $(if $(ARCHIVE),--archive $(ARCHIVE))

# The Debian base images of the Dockerfile, made locally from the apt mirror (no registry needed).
base-images:
	tools/base-images.sh

# The local demo: simulated GPUs, in-process API, real gRPC sockets and CDI files.
demo: venv
	-$(MAKE) -s -C native/limiter
	$(BIN)/dra-gpu demo

# The GPU check (gpucheck/, README "Checking a GPU node"): the system python3, no .venv. Exits 77
# where there is no NVIDIA GPU, after building the CUDA programs. gpu-check-bundle fetches the wheels
# a GPU node lacks into GPU_CHECK_WHEELS (needs a package registry), for CPython 3.12 unless
# GPU_CHECK_PYTHON_VERSION says otherwise.
GPU_CHECK_WHEELS ?= .gpu-check-wheels
GPU_CHECK_PYTHON ?= python3

gpu-check:
	GPU_CHECK_WHEELS=$(GPU_CHECK_WHEELS) $(GPU_CHECK_PYTHON) -m gpucheck

gpu-check-bundle: venv
	$(BIN)/python -m gpucheck.bundle $(GPU_CHECK_WHEELS)

# In `make test`: 77 (no GPU here) counts as success.
gpu-check-smoke:
	@command -v nvcc >/dev/null || echo "gpu-check: nvcc not found, the CUDA programs are not built"
	@$(GPU_CHECK_PYTHON) -m gpucheck; rc=$$?; [ $$rc = 0 ] || [ $$rc = 77 ] || { echo "gpu-check failed (exit $$rc)"; exit 1; }

clean:
	rm -rf $(VENV) native/limiter/build build/gpu-check
