# Two entry points: `make demo` (the main job) and `make test` (lint + test suite).
# Both create .venv and install everything from this repository's own files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-docs test-ray test-families test-families-large lint format clean node-example edge builtin-model wheel bench-marian docker-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[train,dev,serve,eval,bench,hf,split]"
	# onnxruntime-genai runs GPT bundles as is (tests/test_gpt_bert_export.py); --no-deps keeps its
	# `onnxruntime` dependency from overwriting the files of the installed onnxruntime-gpu.
	$(BIN)/pip install -q --no-deps "onnxruntime-genai==0.18.*"
	touch $(STAMP)

demo: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "not ray and not bench and not opus and not families and not families_large and not docs"

# The reference pages' commands run in page order, outputs compared (tests/test_doc_pages.py:
# docs/import.md's two tiny imports, exported, generated, verified; about 12 min on 2 cores).
test-docs: $(STAMP)
	EDGESEQ_DOCS_RUN=1 $(BIN)/python -m pytest -q -m docs tests/test_doc_pages.py

# The Ray Serve tests (tests/test_serve_ray*.py, the Ray part of tests/test_serve_auth.py):
# ray is a large install, and each of their three local clusters takes 30-60 s to start;
# one kills a replica under load and prints what the clients got. About 3 min in all.
test-ray: $(STAMP)
	$(BIN)/pip install -q -e ".[ray]"
	$(BIN)/python -m pytest -q -m ray

# Each Hugging Face family (m2m_100 / NLLB, mBART-50, BART, T5 v1.1) built at a realistic shape
# (d_model 512, 6 + 6 layers, 32,768 vocabulary rows, M2M-100 also with NLLB-200's 256,206;
# random weights) and exported by the default command, its three parity levels against the
# source model printed and checked (tests/test_families_realistic.py). Not part of `test`:
# 5-6 min per family on 2 idle cores, 30 min at 256,206 rows on busy ones.
test-families: $(STAMP)
	$(BIN)/python -m pytest -q -s -m families tests/test_families_realistic.py

# The real models' exact shapes (NLLB-200-distilled-600M, M2M-100-418M, mBART-large-50, T5-base,
# Flan-T5-base; random weights, tests/large_shapes.py) exported by the default command with 50
# inputs, each line of the export and a one-line summary printed: export time, peak RSS vs the
# checkpoint (at most 3x), bundle size per file, parity levels, ids vs the source's generate
# (tests/test_families_large.py). Not part of `test`: random weights never emit </s>, so level 3
# decodes every input to its budget (the checkpoint's max_length 200, T5's max_len 512): T5-base
# had not finished after 33 min on 2 cores (peak RSS 15.4 GB). EDGESEQ_LARGE_MAX_NEW_TOKENS=16
# adds --max-new-tokens 16 to the export (said in the summary): 4-9 min per shape, plus 1-8 min
# to build each checkpoint (docs/import-families.md). EDGESEQ_LARGE_DIR=DIR keeps the checkpoints.
test-families-large: $(STAMP)
	$(BIN)/python -m pytest -q -s -m families_large tests/test_families_large.py

# Edge targets (docs/edge.md): the bundle (two-graph loop and one-graph search variant, fp32
# and int8) on emulated ARM64 and in headless Chromium, compared with x86 output. Not part of
# `test`: it installs apt packages and downloads an arm64 root filesystem, aarch64 wheels and
# npm packages into .edge-cache/ (once; EDGESEQ_EDGE_CACHE=DIR puts that cache elsewhere).
# The demo page's screenshot goes to the cache too; `make edge SCREENSHOT=docs/edge-demo.png`
# refreshes the tracked picture of docs/edge.md. Another model (docs/import.md): `make edge
# EDGE_SOURCE=opus-mt-en-de EDGE_BUNDLE=bundles/opus EDGE_DATA=heldout.tsv` exports SOURCE
# there (never over an existing bundle) and checks it on DATA's inputs (the g2p words if unset).
# A model with a language list (NLLB, M2M-100, mBART-50) has no search variant: add
# EDGE_VARIANTS=fp32,int8 (the variants exported and checked) and optionally EDGE_TARGET_LANG.
EDGE_SOURCE ?= models/g2p-en
EDGE_BUNDLE ?= bundles/g2p-en
EDGE_DATA ?=
EDGE_VARIANTS ?= fp32,int8,search
EDGE_TARGET_LANG ?=
EDGE_HAS := $(if $(findstring search,$(EDGE_VARIANTS)),search.int8.onnx,decoder.int8.onnx)
EDGE_CACHE := $(or $(EDGESEQ_EDGE_CACHE),.edge-cache)
SCREENSHOT ?= $(EDGE_CACHE)/edge-demo.png
edge: $(STAMP)
	bash scripts/edge/setup.sh
	grep -qs '"$(EDGE_HAS)"' $(EDGE_BUNDLE)/manifest.json || $(BIN)/edgeseq export \
		$(EDGE_SOURCE) --out $(EDGE_BUNDLE) --variants $(EDGE_VARIANTS) \
		$(if $(EDGE_DATA),--data $(EDGE_DATA)) $(if $(filter bundles/g2p-en,$(EDGE_BUNDLE)),--force)
	$(BIN)/python scripts/edge/edge_check.py --bundle $(EDGE_BUNDLE) \
		$(if $(EDGE_DATA),--data $(EDGE_DATA)) --screenshot $(SCREENSHOT) \
		$(if $(EDGE_TARGET_LANG),--target-lang $(EDGE_TARGET_LANG))

# The g2p-en bundle shipped in the wheel (runtime/models/g2p-en), re-exported from the
# checkpoint in models/g2p-en with parity checks and the int8 accuracy gate; int8 graphs only.
builtin-model: $(STAMP)
	$(BIN)/python -m edgeseq.export.builtin models/g2p-en runtime/models/g2p-en

# The wheel and sdist in dist/ (what `pip install dist/edgeseq-*.whl` installs).
wheel: $(STAMP)
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist .
	$(BIN)/python -c "import setuptools.build_meta as b; b.build_sdist('dist')"

# edgeseq next to transformers, Optimum and CTranslate2 on an opus-mt-sized MarianMT built
# here (docs/compare.md, "What users run today"), at 1 intra-op thread and at every core,
# each engine in a process of its own, CTranslate2 at its best ISA. Not part of `test`:
# ~60 min on 2 cores. Optimum runs in its own venv (optimum-onnx 0.1 pins transformers
# 4.57); the checkpoint and every export stay in runs/vs-optimum for the next run.
OPTIMUM_VENV := .venv-optimum
$(OPTIMUM_VENV)/bin/python:
	$(PY) -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/pip install -q torch==2.13.0 optimum-onnx==0.1.0 optimum==2.1.0 \
		transformers==4.57.6 onnxruntime==1.31.1 sentencepiece==0.2.3
bench-marian: $(STAMP) $(OPTIMUM_VENV)/bin/python
	$(BIN)/python benchmarks/vs_optimum.py runs/vs-optimum --inputs 64 --passes 3 \
		--json runs/vs-optimum/report.json
	$(BIN)/python benchmarks/vs_optimum.py runs/vs-optimum --inputs 64 --passes 3 \
		--threads $$(nproc) --json runs/vs-optimum/report-all-cores.json

# deploy/Dockerfile built and run (docs/serve.md, "Docker"): the image serves an exported
# g2p-en bundle on 127.0.0.1; /health, outputs equal to offline generate, no torch, uid
# 10001, exit 0 on SIGTERM. Not part of `test`: needs root and podman (apt-get installs it);
# builds a stand-in python:3.11-slim with debootstrap when podman has none (no registry).
docker-check: $(STAMP)
	bash deploy/docker_check.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs bundles build dist *.egg-info .edge-cache

# onnxruntime-node for examples/node (the one-graph search variant from JavaScript); the
# tests skip the example until it is installed or when npm cannot reach the registry.
node-example:
	cd examples/node && npm run setup
