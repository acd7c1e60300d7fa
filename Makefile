# Developer entry points. `make test` is what CI (.ci/run) and the README use.
#   make venv  - create .venv and install the project with extras [test,plot]
#                (re-installs only when pyproject.toml is newer than the stamp)
#   make test  - run the whole test suite
#   make demo  - run the end-to-end demo (embedded broker + Redis)

SHELL := /bin/bash
VENV  := .venv
STAMP := $(VENV)/.stratameter-installed
# First interpreter >= 3.11 on PATH; override with `make PYTHON=/path/to/python3.12`.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { command -v $$p; break; }; done)
PIP_FLAGS := --disable-pip-version-check --no-input --retries 5 --timeout 60

.PHONY: venv test demo clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(VENV)/bin/python ] || ! $(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		if [ -z "$(PYTHON)" ]; then echo "error: no python >= 3.11 found on PATH (set PYTHON=...)" >&2; exit 1; fi; \
		echo "creating $(VENV) with $(PYTHON)"; \
		rm -rf $(VENV) && "$(PYTHON)" -m venv $(VENV); \
	fi
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) -e '.[test,plot]'
	@touch $(STAMP)

test: venv
	$(VENV)/bin/python -m pytest -q

demo: venv
	$(VENV)/bin/stratameter demo

clean-venv:
	rm -rf $(VENV)
