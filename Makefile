# DevCloud. `make run` starts the portal on this machine; `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)

.PHONY: run test bench venv clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || PYTHON=python3; \
	  test -x $(PY) || $${PYTHON:-python3} -m venv $(VENV) || { apt-get install -y python3-venv && python3 -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

run: venv
	$(PY) scripts/run.py

test: venv
	bash scripts/test-services.sh
	$(PY) -m pytest $(PYTEST_ARGS)

bench: venv
	bash scripts/test-services.sh
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) var
