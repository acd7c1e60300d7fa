# Developer entry points. `make test` is what CI (.ci/run) and the README use.
#   make venv  - create .venv and install the project with extras [test,plot,peers,docs]
#                (re-installs only when pyproject.toml is newer than the stamp)
#   make label-studio - create .venv-label-studio with Label Studio (the bridge's tests and
#                demo; pinned in service/demo/label_studio.py; re-installs when that file is newer)
#   make test  - run the whole test suite, two pytest-xdist workers per core (creates both virtualenvs first)
#   make test-unit - the fast loop: tests/unit without the slow simulations (no broker, Redis or Label Studio)
#   make demo  - run the end-to-end demo (embedded broker + Redis)

SHELL := /bin/bash
VENV  := .venv
STAMP := $(VENV)/.stratameter-installed
# First interpreter >= 3.11 on PATH; override with `make PYTHON=/path/to/python3.12`.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { command -v $$p; break; }; done)
PIP_FLAGS := --disable-pip-version-check --no-input --retries 5 --timeout 60
# Label Studio in a virtualenv of its own (its pins clash with ours): the Label Studio bridge's tests and demo
LS_VENV := .venv-label-studio
LS_STAMP := $(LS_VENV)/.stratameter-installed
LS_REQUIREMENT := $(shell sed -n 's/^LABEL_STUDIO_REQUIREMENT = "\(.*\)"$$/\1/p' service/demo/label_studio.py)
LS_PINS := $(shell sed -n 's/^LABEL_STUDIO_PINS = "\(.*\)"$$/\1/p' service/demo/label_studio.py)

.PHONY: venv label-studio test test-unit demo clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(VENV)/bin/python ] || ! $(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		if [ -z "$(PYTHON)" ]; then echo "error: no python >= 3.11 found on PATH (set PYTHON=...)" >&2; exit 1; fi; \
		echo "creating $(VENV) with $(PYTHON)"; \
		rm -rf $(VENV) && "$(PYTHON)" -m venv $(VENV); \
	fi
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/python -m pip install $(PIP_FLAGS) -e '.[test,plot,peers,docs]'
	@touch $(STAMP)

label-studio: $(LS_STAMP)

$(LS_STAMP): service/demo/label_studio.py
	@if [ -z "$(LS_REQUIREMENT)" ]; then echo "error: no LABEL_STUDIO_REQUIREMENT in service/demo/label_studio.py" >&2; exit 1; fi
	@if [ ! -x $(LS_VENV)/bin/python ] || ! $(LS_VENV)/bin/python -m pip --version >/dev/null 2>&1; then \
		if [ -z "$(PYTHON)" ]; then echo "error: no python >= 3.11 found on PATH (set PYTHON=...)" >&2; exit 1; fi; \
		echo "creating $(LS_VENV) with $(PYTHON)"; \
		rm -rf $(LS_VENV) && "$(PYTHON)" -m venv $(LS_VENV); \
	fi
	$(LS_VENV)/bin/python -m pip install $(PIP_FLAGS) '$(LS_REQUIREMENT)' '$(LS_PINS)'
	rm -rf $(LS_VENV)/stratameter-data-template  # the migrated database the tests copy: made again on first use
	@touch $(LS_STAMP)

# Two workers a core: the suite mostly waits (on brokers, services and streams sent over time; it used
# a third of two cores), docs/decisions/test-workers.md.  `make test TEST_WORKERS=auto`: one a core.
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc 2>/dev/null || echo 1) )))

test: venv label-studio
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

test-unit: venv
	$(VENV)/bin/python -m pytest -q -n auto -m "unit and not slow and not integration and not system" tests/unit

demo: venv
	@echo "stratameter is installed in $(VENV): '. $(VENV)/bin/activate' puts it on PATH (stratameter --help)"
	$(VENV)/bin/stratameter demo

clean-venv:
	rm -rf $(VENV) $(LS_VENV)
