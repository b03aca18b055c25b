# Two entry points: `make demo` (the main job) and `make test` (lint + test suite).
# Both create .venv and install everything from this repository's own files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean builtin-model wheel

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[train,dev]"
	touch $(STAMP)

demo: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

# The g2p-en bundle shipped in the wheel (runtime/models/g2p-en), re-exported from the
# checkpoint in models/g2p-en with parity checks and the int8 accuracy gate; int8 graphs only.
builtin-model: $(STAMP)
	$(BIN)/python -m edgeseq.export.builtin models/g2p-en runtime/models/g2p-en

# The wheel and sdist in dist/ (what `pip install dist/edgeseq-*.whl` installs).
wheel: $(STAMP)
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist .
	$(BIN)/python -c "import setuptools.build_meta as b; b.build_sdist('dist')"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs bundles build dist *.egg-info
