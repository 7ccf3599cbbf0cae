# make setup: .venv with all four frameworks and the package; the other
# targets set up first when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# a second, small environment: an old NumPy and no ml_dtypes (the fallback's real check)
LEGACY := .venv-legacy
LEGACY_STAMP := $(LEGACY)/.installed

.PHONY: setup setup-legacy demo test test-legacy bench matrix clean

setup: $(STAMP)

setup-legacy: $(LEGACY_STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[torch,jax,tensorflow-cpu,test,bench]'
	touch $(STAMP)

$(LEGACY_STAMP): pyproject.toml
	$(PY) -m venv $(LEGACY)
	$(LEGACY)/bin/python -m pip install --quiet 'numpy==1.26.4' 'torch==2.13.0' pytest
	$(LEGACY)/bin/python -m pip install --quiet --no-deps -e .
	touch $(LEGACY_STAMP)

demo: setup
	$(BIN)/bf16bridge demo

matrix: setup
	$(BIN)/bf16bridge matrix

test: setup test-legacy
	$(BIN)/python -m pytest -q

test-legacy: setup-legacy
	$(LEGACY)/bin/python -m pytest -q -p no:cacheprovider legacy_tests

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) $(LEGACY) build *.egg-info .pytest_cache
