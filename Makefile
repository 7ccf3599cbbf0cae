# make setup: .venv with all four frameworks and the package; the other
# targets set up first when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench matrix clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[torch,jax,tensorflow-cpu,test]'
	touch $(STAMP)

demo: setup
	$(BIN)/bf16bridge demo

matrix: setup
	$(BIN)/bf16bridge matrix

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
