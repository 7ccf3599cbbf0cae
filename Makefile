# make setup: .venv with all four frameworks and the package; the other
# targets set up first when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# a second, small environment: an old NumPy and no ml_dtypes (the fallback's real check)
LEGACY := .venv-legacy
LEGACY_STAMP := $(LEGACY)/.installed
# a third: the oldest versions pyproject.toml declares (constraints-oldest.txt), all four
# frameworks and the tree libraries, running the whole suite; a feature those versions lack (ml_dtypes
# 0.3.1 has no float4_e2m1fn, float8_e8m0fnu, int2, ...) is tested to be our error naming the version
# that has it. Left out: test_dtype_docs.py, which compares docs/dtypes.md, generated at the newest set
# (other frameworks' findings, another page), with what this set finds.
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
OLDEST_SKIP := tests/cli/test_dtype_docs.py
OLDEST_TESTS := tests $(addprefix --ignore=,$(OLDEST_SKIP))
# a fourth: NumPy 2.5 (its DLPack dtype registry, for real) and jax 0.11.2, the device machine's
# versions (constraints-numpy25.txt), on Python 3.12 (numpy 2.5 needs it), numpy and jax only, no tree
# library: every test file, each test that needs torch, tensorflow or a tree library deselected
# (tests/conftest.py: its parameters, its frameworks and libraries marks; BF16BRIDGE_TEST_FRAMEWORKS and
# BF16BRIDGE_TEST_LIBRARIES below, which test_environment.py checks against what is installed).
# Left out: test_dtype_docs.py, which compares docs/dtypes.md, generated at the newest set (torch's and
# tensorflow's findings too), with what this set finds.
NUMPY25 := .venv-numpy25
NUMPY25_STAMP := $(NUMPY25)/.installed
NUMPY25_SKIP := tests/cli/test_dtype_docs.py
NUMPY25_TESTS := tests $(addprefix --ignore=,$(NUMPY25_SKIP))
# Python 3.12: python3.12 on PATH if it runs (a pyenv shim is on PATH but fails when 3.12 is not
# selected), else pyenv's own; none is an error, never a skip
PY312 ?= $(shell for p in python3.12 $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r); do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)

.PHONY: setup setup-legacy setup-oldest setup-numpy25 demo test check fuzz typecheck lint-imports test-legacy test-oldest test-numpy25 bench parity-docs dtype-docs matrix clean

setup: $(STAMP)

setup-legacy: $(LEGACY_STAMP)

setup-oldest: $(OLDEST_STAMP)

setup-numpy25: $(NUMPY25_STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[torch,jax,tensorflow-cpu,test,bench,lint,trees]'
	touch $(STAMP)

$(LEGACY_STAMP): pyproject.toml
	$(PY) -m venv $(LEGACY)
	$(LEGACY)/bin/python -m pip install --quiet 'numpy==1.26.4' 'torch==2.13.0' pytest
	$(LEGACY)/bin/python -m pip install --quiet --no-deps -e .
	touch $(LEGACY_STAMP)

# pip refuses this set if pyproject.toml's ranges do not admit it
$(OLDEST_STAMP): pyproject.toml constraints-oldest.txt
	$(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -c constraints-oldest.txt -e '.[torch,jax,tensorflow-cpu,test,trees]'
	touch $(OLDEST_STAMP)

$(NUMPY25_STAMP): pyproject.toml constraints-numpy25.txt
	@test -n "$(PY312)" || { echo "make: no Python 3.12 found (python3.12 on PATH, or $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12); NumPy 2.5 needs it: install one, or pass PY312=/path/to/python3.12" >&2; exit 1; }
	$(PY312) -m venv $(NUMPY25)
	$(NUMPY25)/bin/python -m pip install --quiet -c constraints-numpy25.txt -e '.[jax,test]'
	touch $(NUMPY25_STAMP)

demo: setup
	$(BIN)/bf16bridge demo

# docs/dtypes.md's generated block (the dtype support matrix), from this machine;
# tests/cli/test_dtype_docs.py fails until this is rerun after a route, a probe finding or a table row changes
dtype-docs: setup
	$(BIN)/python -m bf16bridge.cli.tables docs/dtypes.md

matrix: setup
	$(BIN)/bf16bridge matrix

# all four frameworks, whatever the caller's environment says (a leftover
# BF16BRIDGE_TEST_FRAMEWORKS would deselect most of the run)
# the suite runs on every core (pytest-xdist)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: setup typecheck lint-imports test-legacy test-oldest test-numpy25
	BF16BRIDGE_TEST_FRAMEWORKS=numpy,torch,jax,tensorflow $(BIN)/python -m pytest -q -n $(JOBS)

# the package's types (mypy.ini): the typed API (convert's overloads, Plan) and the code behind it
# the inner loop: the core, the trees and the numpy and torch adapters, no test that starts a process
# (conftest.py marks those "subprocess"), no tree library; meant to stay under two minutes
check: setup
	BF16BRIDGE_TEST_FRAMEWORKS=numpy,torch BF16BRIDGE_TEST_LIBRARIES= $(BIN)/python -m pytest -q -n $(JOBS) \
		-p no:cacheprovider -m "not subprocess" tests/core tests/trees tests/adapters

# the property tests (every test file with a hypothesis @given) on random inputs, the way a bug hunt
# runs them: a random seed, printed first, and FUZZ_EXAMPLES examples a test (tests/conftest.py's
# "campaign" profile; test_fuzz_routes.py counts its inputs and chains by FUZZ_ROUTES_EXAMPLES and
# FUZZ_ROUTES_SEQUENCES; a test with a count of its own keeps it). A failure replays from its seed:
#   make fuzz SEED=<the printed seed> FUZZ_TESTS=<the failing file>
# (the same as HYPOTHESIS_PROFILE=campaign pytest --hypothesis-seed=<seed> <file>). make test and CI keep
# the fixed, derandomized "ci" profile.
FUZZ_EXAMPLES ?= 1000
FUZZ_ROUTES_EXAMPLES ?= 3000
FUZZ_ROUTES_SEQUENCES ?= 600
FUZZ_TESTS ?= $(shell grep -rl --include='test_*.py' -e '@given' tests | sort)
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
fuzz: setup
	@echo "make fuzz: seed $(SEED), $(FUZZ_EXAMPLES) examples a test; replay: make fuzz SEED=$(SEED)"
	@HYPOTHESIS_PROFILE=campaign FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_ROUTES_EXAMPLES=$(FUZZ_ROUTES_EXAMPLES) \
		FUZZ_ROUTES_SEQUENCES=$(FUZZ_ROUTES_SEQUENCES) BF16BRIDGE_TEST_FRAMEWORKS=numpy,torch,jax,tensorflow \
		$(BIN)/python -m pytest -q -n $(JOBS) -p no:cacheprovider --hypothesis-seed=$(SEED) $(FUZZ_TESTS) \
		|| { echo "make fuzz: failed with seed $(SEED); replay: make fuzz SEED=$(SEED) FUZZ_TESTS=<the failing file>"; exit 1; }

# the layers: pyproject.toml's [tool.importlinter] contracts (docs/architecture.md)
lint-imports: setup
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# PRUNE=1 (what .ci/run sets) removes each side environment once its tests have run, so that at
# most two environments are on disk at once (about 6 GB instead of 7.5)
PRUNE ?=
prune = $(if $(PRUNE),rm -rf $(1))

test-legacy: setup-legacy
	$(LEGACY)/bin/python -m pytest -q -p no:cacheprovider legacy_tests
	$(call prune,$(LEGACY))

test-oldest: setup-oldest
	$(OLDEST)/bin/python -m pytest -q -n $(JOBS) -p no:cacheprovider $(OLDEST_TESTS)
	$(call prune,$(OLDEST))

# torch, tensorflow and the tree libraries are not installed there: the tests ask only for numpy and
# jax, and for no tree library (tests/conftest.py)
test-numpy25: setup-numpy25
	BF16BRIDGE_TEST_FRAMEWORKS=numpy,jax BF16BRIDGE_TEST_LIBRARIES= BF16BRIDGE_TEST_NUMPY=2.5 $(NUMPY25)/bin/python -m pytest -q -n $(JOBS) -p no:cacheprovider $(NUMPY25_TESTS)
	$(call prune,$(NUMPY25))

bench: setup
	$(BIN)/bf16bridge bench

# docs/parity.md's generated block, docs/parity-results.md and .json, from one run of the suite
parity-docs: setup
	$(BIN)/python -m bf16bridge.parity.docs

clean:
	rm -rf $(VENV) $(LEGACY) $(OLDEST) $(NUMPY25) build *.egg-info .pytest_cache
